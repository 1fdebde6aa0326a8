//! `ferrylink-transport` (being written).
pub mod config;
pub mod negotiate;
pub mod ucx;
pub mod wire;
