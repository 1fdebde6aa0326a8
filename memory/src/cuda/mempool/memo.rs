//! What the driver said about a live buffer's export, kept with the buffer.
//!
//! A buffer's memory cannot change while the `DeviceBuffer` lives (its owner keeps the
//! allocation), so its [`ExportRoute`] and, for pool memory, its allocation's export data
//! are answered once per buffer. A listener's receive buffer is asked on the posting
//! thread ([`export_route`](super::export_route) and
//! [`export_buffer_allocation`](super::export_buffer_allocation) when the receive is
//! posted); the progress thread's offer of it, and the echo of what landed in it, then
//! make no driver call to export it (on the H200, 1 MB cudarc round trip: a pointer query
//! and an address-range query of about a microsecond each, twice per round trip).

use super::export_cache::PoolPointerExport;
use super::route::ExportRoute;
use std::sync::OnceLock;

/// A buffer's export route and pool export, once known (boxed, made on the first
/// answer: most buffers are never exported, and a `DeviceBuffer` stays small).
#[derive(Default)]
pub(crate) struct ExportMemo(OnceLock<Box<Known>>);

#[derive(Default)]
struct Known {
    route: OnceLock<KnownRoute>,
    pool_export: OnceLock<PoolPointerExport>,
}

/// An [`ExportRoute`] kept across threads.
struct KnownRoute(ExportRoute);

// SAFETY: the only non-`Send` part is the pool handle of `ExportRoute::Pool`, an opaque
// driver handle valid on every thread of the process and never dereferenced here.
unsafe impl Send for KnownRoute {}
// SAFETY: as above; it is only copied out.
unsafe impl Sync for KnownRoute {}

impl ExportMemo {
    fn known(&self) -> &Known {
        self.0.get_or_init(Box::default)
    }

    /// The route, when known.
    pub(crate) fn route(&self) -> Option<ExportRoute> {
        self.0.get()?.route.get().map(|r| r.0)
    }

    /// Remembers the route (the first answer stays).
    pub(crate) fn remember_route(&self, route: ExportRoute) {
        let _ = self.known().route.set(KnownRoute(route));
    }

    /// The allocation's export data, when known.
    pub(crate) fn pool_export(&self) -> Option<PoolPointerExport> {
        self.0.get()?.pool_export.get().copied()
    }

    /// Remembers the allocation's export data (the first answer stays).
    pub(crate) fn remember_pool_export(&self, export: PoolPointerExport) {
        let _ = self.known().pool_export.set(export);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_answer_stays() {
        let memo = ExportMemo::default();
        assert_eq!(memo.route(), None);
        assert_eq!(memo.pool_export(), None);
        memo.remember_route(ExportRoute::Vmm);
        memo.remember_route(ExportRoute::NotExportable);
        assert_eq!(memo.route(), Some(ExportRoute::Vmm));
        let export = PoolPointerExport { base: 0x1000, alloc_len: 4096, data: [7; 64] };
        memo.remember_pool_export(export);
        memo.remember_pool_export(PoolPointerExport { data: [8; 64], ..export });
        assert_eq!(memo.pool_export(), Some(export));
    }
}
