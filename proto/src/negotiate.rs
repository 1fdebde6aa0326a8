//! Lane negotiation: a pure function of the two sides' [`Hello`]s.

use crate::lane_kind::LaneKind;
use crate::policy::LanePolicy;
use crate::wire::Hello;
use thiserror::Error;

/// Why the two sides share no lane. The text is what both sides report.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum NoCommonLane {
    /// Each side forces a different lane.
    #[error("the sides force different lanes (this side FERRYLINK_TRANSPORT={local}, the peer {remote})")]
    ConflictingPolicies {
        /// This side's policy.
        local: LanePolicy,
        /// The peer's policy.
        remote: LanePolicy,
    },
    /// The native lane is forced but cannot work.
    #[error("FERRYLINK_TRANSPORT=native was forced, but the native lane is impossible: {why}")]
    NativeImpossible {
        /// Why.
        why: String,
    },
    /// The UCX lane is forced but cannot work.
    #[error("FERRYLINK_TRANSPORT=ucx was forced, but the UCX lane is impossible: {why}")]
    UcxImpossible {
        /// Why.
        why: String,
    },
    /// Neither lane can work.
    #[error("no lane can connect these sides: native is impossible ({native}); UCX is impossible ({ucx})")]
    Neither {
        /// Why not native.
        native: String,
        /// Why not UCX.
        ucx: String,
    },
    /// The sides speak different protocol versions.
    #[error("protocol versions differ (this side {local}, the peer {remote})")]
    VersionMismatch {
        /// Ours.
        local: u16,
        /// Theirs.
        remote: u16,
    },
}

/// Picks the lane both sides will use. Symmetric: `negotiate(a, b)` and `negotiate(b, a)`
/// agree, so each side can compute (and check) the choice on its own.
pub fn negotiate(local: &Hello, remote: &Hello) -> Result<LaneKind, NoCommonLane> {
    if local.protocol_version != remote.protocol_version {
        return Err(NoCommonLane::VersionMismatch { local: local.protocol_version, remote: remote.protocol_version });
    }
    let policy = match (LanePolicy::from(local.policy), LanePolicy::from(remote.policy)) {
        (LanePolicy::Auto, p) | (p, LanePolicy::Auto) => p,
        (a, b) if a == b => a,
        (a, b) => return Err(NoCommonLane::ConflictingPolicies { local: a, remote: b }),
    };
    let native = why_not_native(local, remote);
    let ucx = why_not_ucx(local, remote);
    match policy {
        LanePolicy::Native => native.map_or(Ok(LaneKind::Native), |why| Err(NoCommonLane::NativeImpossible { why })),
        LanePolicy::Ucx => ucx.map_or(Ok(LaneKind::Ucx), |why| Err(NoCommonLane::UcxImpossible { why })),
        LanePolicy::Auto => match (native, ucx) {
            (None, _) => Ok(LaneKind::Native),
            (Some(_), None) => Ok(LaneKind::Ucx),
            (Some(native), Some(ucx)) => Err(NoCommonLane::Neither { native, ucx }),
        },
    }
}

fn why_not_native(a: &Hello, b: &Hello) -> Option<String> {
    if a.host != b.host {
        return Some(format!("the sides are on different machines ({} and {})", a.host.hostname, b.host.hostname));
    }
    if a.uid != b.uid {
        return Some(format!("the sides run as different users (uid {} and {})", a.uid, b.uid));
    }
    if !a.native_available || !b.native_available {
        return Some("a side has the native lane disabled".into());
    }
    None
}

fn why_not_ucx(a: &Hello, b: &Hello) -> Option<String> {
    match (&a.ucx, &b.ucx) {
        (Some(x), Some(y)) => match (&x.tcp_segment, &y.tcp_segment) {
            (Some(sx), Some(sy)) if sx != sy => Some(format!(
                "the two sides' UCX TCP receive segments differ (process {}: {sx}, process {}: {sy}); UCX would \
                 abort the receiver with the smaller one. Set UCX_TCP_RX_SEG_SIZE alike on both sides",
                a.pid, b.pid
            )),
            _ => None,
        },
        (None, None) => Some("neither side could load UCX (libucp.so.0)".into()),
        (None, Some(_)) => Some(format!("UCX could not be loaded in process {}", a.pid)),
        (Some(_), None) => Some(format!("UCX could not be loaded in process {}", b.pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{HostIdentity, UcxInfo, PROTOCOL_VERSION};
    use proptest::prelude::*;

    fn side(host: &str, uid: u32, policy: LanePolicy, native: bool, ucx: bool) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            host: HostIdentity { hostname: host.into(), boot_id: "boot".into() },
            uid,
            pid: 1,
            policy: policy.into(),
            native_available: native,
            ucx: ucx.then(|| UcxInfo {
                cuda_aware: false,
                worker_address: vec![],
                tag_prefix: 0,
                tcp_segment: Some("524288".into()),
            }),
            gpus: vec![],
            peer_access: vec![],
            device_copies: crate::wire::WireCopies::Receiver,
            control_ring: None,
        }
    }

    use LanePolicy::{Auto, Native as ForceNative, Ucx as ForceUcx};

    /// The negotiation table: (same host, same uid, ucx on both, local policy, remote
    /// policy) → expected lane or error kind.
    #[test]
    fn negotiation_table() {
        type Row = (bool, bool, bool, LanePolicy, LanePolicy, Result<LaneKind, &'static str>);
        let table: &[Row] = &[
            (true, true, true, Auto, Auto, Ok(LaneKind::Native)),
            (true, true, false, Auto, Auto, Ok(LaneKind::Native)),
            (true, false, true, Auto, Auto, Ok(LaneKind::Ucx)),
            (false, true, true, Auto, Auto, Ok(LaneKind::Ucx)),
            (false, true, false, Auto, Auto, Err("no lane")),
            (true, true, true, ForceUcx, Auto, Ok(LaneKind::Ucx)),
            (true, true, true, Auto, ForceUcx, Ok(LaneKind::Ucx)),
            (true, true, false, ForceUcx, Auto, Err("ucx was forced")),
            (false, true, true, ForceNative, Auto, Err("native was forced")),
            (true, false, true, Auto, ForceNative, Err("native was forced")),
            (true, true, true, ForceNative, ForceNative, Ok(LaneKind::Native)),
            (true, true, true, ForceNative, ForceUcx, Err("force different lanes")),
            (true, true, true, ForceUcx, ForceNative, Err("force different lanes")),
        ];
        for (i, &(same_host, same_uid, ucx, lp, rp, ref expected)) in table.iter().enumerate() {
            let a = side("a", 1, lp, true, ucx);
            let b = side(if same_host { "a" } else { "b" }, if same_uid { 1 } else { 2 }, rp, true, ucx);
            let got = negotiate(&a, &b);
            match (expected, &got) {
                (Ok(lane), Ok(g)) => assert_eq!(lane, g, "row {i}"),
                (Err(text), Err(e)) => assert!(e.to_string().contains(text), "row {i}: {e}"),
                _ => panic!("row {i}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn one_side_without_ucx_is_named() {
        let mut a = side("a", 1, ForceUcx, true, true);
        a.pid = 77;
        a.ucx = None;
        let b = side("a", 1, Auto, true, true);
        let err = negotiate(&a, &b).unwrap_err();
        assert!(err.to_string().contains("process 77"), "{err}");
    }

    #[test]
    fn different_ucx_tcp_segments_rule_the_ucx_lane_out() {
        let mut a = side("a", 1, Auto, true, true);
        let mut b = side("b", 1, Auto, true, true);
        b.pid = 9;
        b.ucx.as_mut().unwrap().tcp_segment = Some("65536".into());
        let err = negotiate(&a, &b).unwrap_err();
        assert!(err.to_string().contains("TCP receive segments differ"), "{err}");
        assert!(err.to_string().contains("65536") && err.to_string().contains("524288"), "{err}");
        // Forcing UCX says why it cannot be.
        a.policy = ForceUcx.into();
        assert!(negotiate(&a, &b).unwrap_err().to_string().contains("UCX_TCP_RX_SEG_SIZE"));
        // Agreeing sides, or one without TCP, are fine.
        b.ucx.as_mut().unwrap().tcp_segment = Some("524288".into());
        assert_eq!(negotiate(&a, &b).unwrap(), LaneKind::Ucx);
        b.ucx.as_mut().unwrap().tcp_segment = None;
        assert_eq!(negotiate(&a, &b).unwrap(), LaneKind::Ucx);
    }

    #[test]
    fn version_mismatch_is_an_error() {
        let a = side("a", 1, Auto, true, true);
        let mut b = a.clone();
        b.protocol_version += 1;
        assert!(matches!(negotiate(&a, &b), Err(NoCommonLane::VersionMismatch { .. })));
    }

    fn any_policy() -> impl Strategy<Value = LanePolicy> {
        prop_oneof![Just(Auto), Just(ForceNative), Just(ForceUcx)]
    }

    proptest! {
        #[test]
        fn negotiation_is_symmetric(
            ha in 0..2u8, hb in 0..2u8, ua in 0..2u32, ub in 0..2u32,
            pa in any_policy(), pb in any_policy(),
            na: bool, nb: bool, xa: bool, xb: bool,
        ) {
            let a = side(&ha.to_string(), ua, pa, na, xa);
            let b = side(&hb.to_string(), ub, pb, nb, xb);
            let ab = negotiate(&a, &b).ok();
            let ba = negotiate(&b, &a).ok();
            prop_assert_eq!(ab, ba);
        }
    }
}
