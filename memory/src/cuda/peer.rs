//! Peer access between devices: asked once, enabled once per ordered pair.

use super::context::Gpu;
use super::error::{check, codes, CudaResult};
use cudarc::driver::sys;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

static ENABLED: OnceLock<Mutex<HashSet<(usize, usize)>>> = OnceLock::new();

static CAN_ACCESS: OnceLock<Mutex<HashMap<(usize, usize), bool>>> = OnceLock::new();

/// Whether `from` can access `to`'s memory directly (`cuDeviceCanAccessPeer`, asked once
/// per ordered pair: the answer is a property of the hardware, and the copy paths ask it
/// for every message). A device and itself: `true`.
pub fn can_access_peer(from: &Gpu, to: &Gpu) -> CudaResult<bool> {
    if from == to {
        return Ok(true);
    }
    let key = (from.ordinal(), to.ordinal());
    let known = CAN_ACCESS.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(&can) = known.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(can);
    }
    let mut can: std::ffi::c_int = 0;
    // SAFETY: both are valid device handles; the call writes one int.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, from.raw_device(), to.raw_device())
    })?;
    known.lock().unwrap_or_else(|p| p.into_inner()).insert(key, can != 0);
    Ok(can != 0)
}

/// Lets `from`'s context access `to`'s memory (`cuCtxEnablePeerAccess`). Idempotent:
/// enabled once per ordered pair per process; `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` is
/// success. A device and itself: nothing to do.
pub fn enable_peer_access(from: &Gpu, to: &Gpu) -> CudaResult<()> {
    if from == to {
        return Ok(());
    }
    let key = (from.ordinal(), to.ordinal());
    let set = ENABLED.get_or_init(|| Mutex::new(HashSet::new()));
    let mut enabled = set.lock().unwrap_or_else(|p| p.into_inner());
    if enabled.contains(&key) {
        return Ok(());
    }
    from.bind_to_current_thread()?;
    // SAFETY: `from`'s context is bound; `to`'s context is a retained primary context.
    let res = check("cuCtxEnablePeerAccess", unsafe { sys::cuCtxEnablePeerAccess(to.raw_context(), 0) });
    match res {
        Ok(()) => {}
        Err(e) if e.is_code(codes::PEER_ACCESS_ALREADY_ENABLED) => {}
        Err(e) => return Err(e),
    }
    tracing::debug!(from = from.ordinal(), to = to.ordinal(), "peer access enabled");
    enabled.insert(key);
    Ok(())
}
