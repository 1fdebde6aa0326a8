//! The cache's limits ([`CacheConfig`]) and counters ([`CacheStats`]).

/// Limits of a [`MappingCache`](super::MappingCache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheConfig {
    /// Unused mappings are closed (LRU) while the mapped bytes exceed this.
    pub max_mapped_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { max_mapped_bytes: 64 << 30 }
    }
}

impl CacheConfig {
    /// This config with [`CacheConfig::max_mapped_bytes`] set to `bytes`.
    #[must_use]
    pub fn with_max_mapped_bytes(mut self, bytes: u64) -> Self {
        self.max_mapped_bytes = bytes;
        self
    }
}

/// What a cache holds and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Mappings open now.
    pub open_mappings: usize,
    /// Bytes of those mappings.
    pub mapped_bytes: u64,
    /// Mappings with a lease outstanding.
    pub leased_mappings: usize,
    /// Successful opens since the cache was made.
    pub opens_total: u64,
    /// Closes since the cache was made.
    pub closes_total: u64,
    /// Acquisitions served by an open mapping.
    pub hits: u64,
    /// Acquisitions that opened a mapping.
    pub misses: u64,
    /// Mappings closed to respect the limit or after `CUDA_ERROR_ALREADY_MAPPED`.
    pub evictions: u64,
}
