//! The baseline of the leak tests (`reliability_leaks.rs`, `reliability_ucx_load.rs`):
//! what must come back after a load. The contexts' levels (`Context::stats`, which fails
//! closed), the open fds, and this process's footprint as the kernel lists it (the kit's
//! [`Footprint`]: memfd mappings exactly, the rest within [`LEAK_TOLERANCE`]).

use ferrylink::transport::{Context, ContextStats};
use ferrylink_testkit::leaks::{assert_footprint_returns, Footprint, Tolerance};
use std::time::Duration;

/// What the footprint may keep beyond the baseline without a leak.
///
/// Mappings: glibc keeps the stacks of ended threads (up to 40 MiB) and the malloc arenas
/// threads made (at most 8 per core), two mappings each (usable part and guard). The leak
/// loads start no thread but a peer's two output readers at a time (two stacks, two
/// arenas: 8 mappings); UCX's memory pools, grown before the baseline by a warm-up cycle,
/// do not grow for cycles run one at a time. Measured on the dev VM: +1 after 1000
/// cycles, 0 after the crashes, on both lanes. A leaked shared region is a memfd mapping,
/// which must return exactly.
///
/// Device memory (where a GPU is present): these loads send no device frames, and the
/// driver rounds to 2 MiB pages; a peer's CUDA context (hundreds of MiB) or a device pool
/// slab left behind is far above 8 MiB.
pub const LEAK_TOLERANCE: Tolerance = Tolerance { mappings: 8, device_bytes: 8 << 20 };

/// What must return to the baseline of a context's stats (the cumulative CUDA IPC
/// counters are not levels).
pub fn levels(mut s: ContextStats) -> ContextStats {
    s.ipc_mapping_opens = 0;
    s.ipc_handles_exported = 0;
    s.lingering_copies = 0;
    s.lingering_kernel_launches = 0;
    s.signalled_pushes = 0;
    s
}

pub struct LeakBaseline {
    pub stats: Vec<ContextStats>,
    pub fds: usize,
    pub footprint: Footprint,
    /// Fewer open fds than `fds` count as back (sockets of earlier tests' contexts may
    /// still have been closing when the baseline was taken).
    fewer_fds_allowed: bool,
}

impl LeakBaseline {
    /// The contexts' levels and this process's footprint now, with `fds` open fds (to
    /// come back exactly).
    pub fn take(contexts: &[&Context], fds: usize) -> Self {
        let stats = contexts.iter().map(|c| levels(c.stats().unwrap())).collect();
        Self { stats, fds, footprint: Footprint::now(), fewer_fds_allowed: false }
    }

    /// The same baseline, fewer open fds counting as back.
    pub fn allowing_fewer_fds(self) -> Self {
        Self { fewer_fds_allowed: true, ..self }
    }

    fn fds_back(&self, now: usize) -> bool {
        now == self.fds || (self.fewer_fds_allowed && now < self.fds)
    }

    /// Waits at most `bound` for the contexts' levels and the open fds, then at most
    /// `bound` for the footprint, to come back (`what`: the moment, for the message); the
    /// footprint it settled at.
    #[track_caller]
    pub fn assert_back(&self, what: &str, contexts: &[&Context], bound: Duration) -> Footprint {
        let settled = crate::common::eventually(bound, || {
            contexts.iter().zip(&self.stats).all(|(c, b)| levels(c.stats().unwrap()) == *b)
                && self.fds_back(crate::common::open_fds())
        });
        if !settled {
            let now: Vec<_> = contexts.iter().map(|c| levels(c.stats().unwrap())).collect();
            panic!(
                "{what}: not back to the baseline\n  now:      {now:?} fds {}\n  baseline: {:?} fds {}",
                crate::common::open_fds(),
                self.stats,
                self.fds
            );
        }
        assert_footprint_returns(what, &self.footprint, LEAK_TOLERANCE, bound)
    }
}
