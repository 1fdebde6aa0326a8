//! `ferrylink-spill`: tiered device → host → disk store (being written).
