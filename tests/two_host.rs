//! The UCX lane between two hosts on one machine (the kit's `two_host`: the test's thread
//! in one network namespace, its peers in another with their own mount, UTS and PID
//! namespaces, `/dev/shm`, `/tmp` and hostname, joined by a veth pair in 198.18.0.0/15):
//! lane negotiation across and within hosts, host frames, device frames (GPU machine),
//! one-sided transfers with notifications, many endpoints at once. The faults:
//! `two_host_faults.rs`. Where namespaces cannot be made these tests skip, unless
//! `FERRYLINK_REQUIRE_NETNS=1`; without UCX likewise, unless `FERRYLINK_REQUIRE_UCX=1`.

mod common;
mod two_host_kit;

use common::onesided::{bytes, recv_key, registered, send_key};
use common::*;
use ferrylink::transport::onesided::{Access, Span};
use ferrylink::transport::{Config, Context, LaneKind, LanePolicy, Listener};
use ferrylink::Message;
use ferrylink_testkit::two_host::SECOND_ADDR;
use std::time::Duration;
use two_host_kit::*;

const MIB: usize = 1 << 20;

fn auto() -> Config {
    Config::default().with_lane_policy(LanePolicy::Auto)
}

/// Round trips of host frames of every size class (inline, eager, rendezvous), then 16
/// multi-frame messages in flight at once.
fn host_round_trips(ep: &ferrylink::transport::Endpoint) {
    for (i, &size) in [0usize, 1, 8 << 10, (8 << 10) + 1, MIB, 16 * MIB].iter().enumerate() {
        let data = pattern(size, i as u64);
        ep.send(Message::new(b"h".to_vec(), vec![data.clone().into()])).wait().unwrap();
        verify_echo(b"h", &[data], &ep.recv().wait().unwrap());
    }
    let sent: Vec<Vec<Vec<u8>>> = (0..16u64)
        .map(|m| [0, 100, 20_000, 300_000, 2 * MIB].iter().map(|&n| pattern(n, m + n as u64)).collect())
        .collect();
    let sends: Vec<_> = sent
        .iter()
        .map(|frames| ep.send(Message::new(vec![], frames.iter().cloned().map(Into::into).collect())))
        .collect();
    let recvs: Vec<_> = (0..sent.len()).map(|_| ep.recv()).collect();
    for s in sends {
        s.wait().unwrap();
    }
    for (frames, r) in sent.iter().zip(recvs) {
        verify_echo(&[], frames, &r.wait().unwrap());
    }
}

peer_test! {
    /// `auto` on both sides: the UCX lane across the hosts, the native lane between two
    /// processes of the first host.
    fn two_host_auto_picks_ucx_across_hosts_and_native_within_one(peers) {
        let Some(first) = FirstHost::start(auto()) else { return };
        let mut across = first.spawn_on_second(&peers, "second", &[]);
        let ep = first.accept();
        assert_eq!(ep.lane(), LaneKind::Ucx, "across hosts");
        assert_eq!(ep.peer().hostname, first.hosts.second_hostname(), "the peer reports the second host's name");
        host_round_trips(&ep);
        stop_echo(&ep);
        across.wait_success(Duration::from_secs(30));

        // A peer on this host (this thread's network, mounts and hostname): native.
        let dir = socket_dir();
        let local = Listener::bind(&first.ctx, dir.path().join("p/s.sock")).unwrap();
        let mut within = peers.spawn("first", &[("FERRYLINK_TEST_SOCKET", local.path().display().to_string())]);
        let ep = local.accept_timeout(Duration::from_secs(30)).expect("the local peer connects");
        assert_eq!(ep.lane(), LaneKind::Native, "within one host");
        host_round_trips(&ep);
        stop_echo(&ep);
        within.wait_success(Duration::from_secs(30));
    }
    "second" => serve_echo_on_second(auto()),
    "first" => {
        let ctx = Context::new(auto()).unwrap();
        let ep = ctx.connect(std::env::var("FERRYLINK_TEST_SOCKET").unwrap()).unwrap();
        assert_eq!(ep.lane(), LaneKind::Native);
        echo::serve(&Ferry, &ep);
    },
}

fn native() -> Config {
    Config::default().with_lane_policy(LanePolicy::Native)
}

peer_test! {
    /// `native` forced on both sides across hosts is refused, with the reason (different
    /// machines, named), whichever side listens: the connecting side's connect fails with
    /// it, the listening side makes no endpoint.
    fn two_host_forced_native_is_refused_on_both_sides(peers) {
        let Some(first) = FirstHost::start(native()) else { return };
        // The second host connects.
        let mut peer = first.spawn_on_second(&peers, "connects", &[]);
        let reason = peer.expect_line_with("REFUSED ", Duration::from_secs(30));
        peer.wait_success(Duration::from_secs(30));
        println!("refused on the second host: {reason}");
        assert!(reason.contains("different machines"), "the second host's reason: {reason}");
        assert!(reason.contains(first.hosts.second_hostname()), "the reason names the hosts: {reason}");
        assert!(first.listener.accept_timeout(Duration::from_secs(2)).is_err(), "no endpoint across hosts");
        // The first host connects.
        let mut peer = first.spawn_on_second(&peers, "listens", &[]);
        let port = peer.expect_line_with("PORT ", Duration::from_secs(30));
        let err = first.ctx.connect_tcp(format!("{SECOND_ADDR}:{}", port.trim())).expect_err("refused");
        let reason = err.to_string();
        println!("refused on the first host: {reason}");
        assert!(reason.contains("different machines"), "the first host's reason: {reason}");
        assert!(reason.contains(first.hosts.second_hostname()), "the reason names the hosts: {reason}");
        peer.wait_success(Duration::from_secs(30));
    }
    "connects" => {
        let ctx = Context::new(native()).unwrap();
        let addr = std::env::var(ADDR_VAR).unwrap();
        match ctx.connect_tcp(addr.strip_prefix("tcp:").unwrap()) {
            Err(e) => println!("\nREFUSED {e}"),
            Ok(ep) => panic!("connected across hosts on the {:?} lane", ep.lane()),
        }
    },
    "listens" => {
        let ctx = Context::new(native()).unwrap();
        let listener = Listener::bind_tcp(&ctx, format!("{SECOND_ADDR}:0")).unwrap();
        println!("\nPORT {}", listener.tcp_addr().unwrap().port());
        assert!(listener.accept_timeout(Duration::from_secs(10)).is_err(), "no endpoint across hosts");
    },
}

peer_test! {
    fn two_host_host_frames_cross_over_ucx(peers) {
        let Some(first) = FirstHost::start(Config::default().with_lane_policy(LanePolicy::Ucx)) else { return };
        let mut peer = first.spawn_on_second(&peers, "echo", &[]);
        let ep = first.accept();
        host_round_trips(&ep);
        stop_echo(&ep);
        peer.wait_success(Duration::from_secs(30));
    }
    "echo" => serve_echo_on_second(Config::default().with_lane_policy(LanePolicy::Ucx)),
}

peer_test! {
    /// Device frames sent from a GPU on the first host land on the second host's GPU
    /// (both namespaces see the machine's devices), and come back as checksums and frames.
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn two_host_device_frames_cross_over_ucx(peers) {
        require_gpu();
        let Some(first) = FirstHost::start(Config::default().with_lane_policy(LanePolicy::Ucx)) else { return };
        let mut peer = first.spawn_on_second(&peers, "echo", &[]);
        let ep = first.accept();
        for (i, &size) in [1usize, 64 << 10, 8 * MIB].iter().enumerate() {
            let data = pattern(size, 90 + i as u64);
            let device = common::onesided::device_memory(0, size, 90 + i as u64);
            ep.send(Message::new(b"d".to_vec(), vec![device.into()])).wait().unwrap();
            let back = ep.recv().wait().unwrap();
            verify_echo(b"d", &[data], &back);
        }
        stop_echo(&ep);
        peer.wait_success(Duration::from_secs(60));
    }
    "echo" => serve_echo_on_second(Config::default().with_lane_policy(LanePolicy::Ucx)),
}

fn rma() -> Config {
    Config::default().with_lane_policy(LanePolicy::Ucx).with_ucx_rma(true)
}

peer_test! {
    /// One-sided put and get across the hosts, each way, with notifications to the owner.
    fn two_host_one_sided_puts_and_gets_notify_the_owner(peers) {
        let Some(first) = FirstHost::start(rma()) else { return };
        let mut peer = first.spawn_on_second(&peers, "initiator", &[]);
        let ep = first.accept();
        let target = registered(&first.ctx, 2 * MIB, 80, Access::ReadWrite);
        send_key(&ep, &target);
        // The peer puts 1 MiB at offset 1 MiB, then gets the first 4 KiB back.
        assert_eq!(ep.recv_notification().wait().unwrap().data, b"put");
        assert!(bytes(&target)[MIB..] == pattern(MIB, 71)[..], "the peer's put landed");
        assert_eq!(ep.recv_notification().wait().unwrap().data, b"get");
        let got = ep.recv().wait().unwrap();
        assert!(frame_bytes(&got.frames[0]) == pattern(2 * MIB, 80)[..4096], "the peer read this host");
        // This side puts into the peer's region and reads it back.
        let region = ep.import(&recv_key(&ep)).wait().unwrap();
        let mine = registered(&first.ctx, MIB, 81, Access::ReadWrite);
        ep.put(&mine, &region, Span { local_offset: 0, remote_offset: 0, len: MIB as u64 }, Some(b"back".to_vec()))
            .wait()
            .unwrap();
        let read = registered(&first.ctx, MIB, 82, Access::Write);
        ep.get(&read, &region, Span { local_offset: 0, remote_offset: 0, len: MIB as u64 }, None).wait().unwrap();
        assert!(*bytes(&read) == pattern(MIB, 81)[..], "read back what this side put");
        peer.wait_success(Duration::from_secs(60));
    }
    "initiator" => {
        let (ctx, ep) = connect_to_first(rma());
        let theirs = ep.import(&recv_key(&ep)).wait().unwrap();
        let source = registered(&ctx, MIB, 71, Access::Read);
        let put = Span { local_offset: 0, remote_offset: MIB as u64, len: MIB as u64 };
        ep.put(&source, &theirs, put, Some(b"put".to_vec())).wait().unwrap();
        let back = registered(&ctx, 4096, 72, Access::Write);
        ep.get(&back, &theirs, Span { local_offset: 0, remote_offset: 0, len: 4096 }, Some(b"get".to_vec()))
            .wait()
            .unwrap();
        ep.send(Message::new(vec![], vec![bytes(&back).to_vec().into()])).wait().unwrap();
        let mine = registered(&ctx, MIB, 73, Access::ReadWrite);
        send_key(&ep, &mine);
        assert_eq!(ep.recv_notification().wait().unwrap().data, b"back");
        assert!(*bytes(&mine) == pattern(MIB, 81)[..], "the first host's put landed here");
        // The first host's get follows; it drops the endpoint once done.
        let _ = ep.recv().wait_timeout(Duration::from_secs(30));
    },
}

/// Endpoints the many-endpoints test opens at once, and the messages in flight on each.
const ENDPOINTS: usize = 16;
const IN_FLIGHT: usize = 8;

peer_test! {
    /// Many endpoints from the second host at once, every echo checked.
    fn two_host_many_endpoints_at_once(peers) {
        let bound = Duration::from_secs(60);
        let config = Config::default().with_lane_policy(LanePolicy::Ucx).with_request_timeout(bound);
        let Some(first) = FirstHost::start(config) else { return };
        let mut peer = first.spawn_on_second(&peers, "echo-many", &[]);
        let eps: Vec<_> = (0..ENDPOINTS).map(|_| first.accept()).collect();
        assert!(eps.iter().all(|ep| ep.lane() == LaneKind::Ucx));
        let load = echo::Load { messages: IN_FLIGHT * 2, in_flight: IN_FLIGHT, bound };
        let r = echo::check_load(&Ferry, &eps, load, |e, m| {
            let frames = vec![pattern(100, (e * 100 + m) as u64).into(), pattern(64 << 10, m as u64).into()];
            Message::new([e as u8, m as u8].to_vec(), frames)
        }, || first.ctx.stats().unwrap().sends_in_flight);
        assert_eq!(r.total, ENDPOINTS * IN_FLIGHT * 2);
        r.assert_intact();
        for ep in &eps {
            stop_echo(ep);
        }
        peer.wait_success(Duration::from_secs(30));
    }
    "echo-many" => {
        let config = Config::default().with_lane_policy(LanePolicy::Ucx).with_request_timeout(Duration::from_secs(60));
        let ctx = Context::new(config).unwrap();
        let addr = std::env::var(ADDR_VAR).unwrap();
        let eps: Vec<_> =
            (0..ENDPOINTS).map(|_| ctx.connect_tcp(addr.strip_prefix("tcp:").unwrap()).unwrap()).collect();
        echo::serve_all(&Ferry, &eps);
    },
}
