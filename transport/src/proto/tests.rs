//! In-memory tests of the protocol core.
