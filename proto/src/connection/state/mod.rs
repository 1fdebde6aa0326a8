//! The state a [`super::Connection`] holds, one part per file: what each part is and
//! what it answers of itself. How the connection acts on it (the `impl Connection`
//! blocks) is in the sibling files of `proto/` (`send.rs`, `recv.rs`, `offers.rs`,
//! `onesided.rs`, …), which use these parts and are never used by them.

pub(super) mod hangup;
pub(super) mod offers;
pub(super) mod onesided;
pub(super) mod recv;
pub(super) mod send;
