//! Opening the lane the handshake chose.

use crate::config::Config;
use crate::device::DeviceState;
use crate::lanes::native::{NativeLane, NativeSettings};
use crate::lanes::ucx::{direct_device, UcxConn, UcxEngine, UcxLane, UcxSettings};
use crate::lanes::Lane;
use crate::payload::Registry;
use ferrylink_proto::connection::PushRole;
use ferrylink_proto::lane_kind::LaneKind;
use ferrylink_proto::wire::Hello;
use std::rc::Rc;
use std::sync::Arc;

/// What every connection's lane is made from.
pub(crate) struct LaneContext {
    pub device: Arc<DeviceState>,
    /// The context's one-sided registrations.
    pub registry: Arc<Registry>,
    /// The UCX worker, when UCX is loaded.
    pub ucx: Option<Rc<UcxEngine>>,
    pub native: NativeSettings,
    pub ucx_settings: UcxSettings,
}

impl LaneContext {
    pub fn new(config: &Config, device: Arc<DeviceState>, registry: Arc<Registry>, ucx: Option<Rc<UcxEngine>>) -> Self {
        Self {
            device,
            registry,
            ucx,
            native: NativeSettings::from_config(config),
            ucx_settings: UcxSettings {
                inline_threshold: config.inline_threshold,
                max_message_bytes: config.max_message_bytes,
                staging_region_bytes: config.staging_region_bytes,
                landing_max_bytes: config.landing_max_bytes,
                staged_onesided: config.ucx_staged,
            },
        }
    }
}

/// The UCX tag prefix of a connection: unique among the connections alive at once.
pub(crate) fn conn_tag_prefix(conn_id: usize) -> u16 {
    conn_id as u16
}

/// Opens `lane` to the peer that introduced itself with `remote`; why not, if it fails.
pub(super) fn open_lane(
    lane: LaneKind,
    push: PushRole,
    remote: &Hello,
    ctx: &LaneContext,
    conn_id: usize,
) -> Result<Box<dyn Lane>, String> {
    match lane {
        LaneKind::Native => {
            let lane = NativeLane::new(ctx.device.clone(), push, remote.pid, ctx.native.clone());
            Ok(Box::new(lane.with_registry(ctx.registry.clone())))
        }
        LaneKind::Ucx => {
            let engine = ctx.ucx.as_ref().ok_or("UCX is not loaded on this side")?;
            let info = remote.ucx.as_ref().ok_or("the peer offered no UCX worker")?;
            let direct = direct_device(engine.cuda_aware, info.cuda_aware);
            let recv_prefix = conn_tag_prefix(conn_id);
            let conn = UcxConn::connect(&engine.worker, &info.worker_address, info.tag_prefix, recv_prefix, direct)
                .map_err(|e| format!("connecting to the peer's UCX worker failed: {e}"))?;
            let lane = UcxLane::new(engine.clone(), conn, ctx.device.clone(), ctx.ucx_settings.clone());
            Ok(Box::new(lane.with_registry(ctx.registry.clone())))
        }
    }
}
