//! Safe UCX layer (being written).
