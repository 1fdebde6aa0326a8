//! `ferrylink-transport` (being written).
pub mod ucx;
