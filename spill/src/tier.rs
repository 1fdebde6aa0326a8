//! The three tiers an entry can live in.

/// Where an entry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Device memory (the message has device frames).
    Device = 0,
    /// Host memory.
    Host = 1,
    /// A file in the store's directory.
    Disk = 2,
}
