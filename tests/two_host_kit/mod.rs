//! What the two-host tests share (`two_host.rs`, `two_host_faults.rs`): the first host (the
//! test's thread, in its own network namespace, listening on TCP at the link's first
//! address) and the peers' side on the second host (the kit's `two_host`).
#![allow(dead_code)]

use crate::common::*;
use ferrylink::transport::{Config, Context, Endpoint, LaneKind, Listener};
use ferrylink_testkit::two_host::{two_hosts_or_skip, use_the_link_for_ucx, TwoHosts, FIRST_ADDR};
use std::time::Duration;

/// Where the first host listens (`tcp:198.18.0.1:PORT`), for the peers.
pub const ADDR_VAR: &str = "FERRYLINK_TEST_ADDR";

/// The test's side: a context on the first host listening on the link.
pub struct FirstHost {
    pub ctx: Context,
    pub listener: Listener,
    pub addr: String,
    /// Last: the namespaces go after the context that uses them.
    pub hosts: TwoHosts,
}

impl FirstHost {
    /// The first host with a context of `config`; `None` (skipped) without namespaces or
    /// UCX (failing instead under `FERRYLINK_REQUIRE_NETNS=1` / `FERRYLINK_REQUIRE_UCX=1`).
    pub fn start(config: Config) -> Option<Self> {
        use_the_link_for_ucx();
        let mut hosts = two_hosts_or_skip()?;
        hosts.enter_first_host().expect("entering the first host's network");
        let ctx = ucx_context_or_skip_with(config)?;
        let listener = Listener::bind_tcp(&ctx, format!("{FIRST_ADDR}:0")).expect("listening on the link");
        let addr = format!("tcp:{}", listener.tcp_addr().unwrap());
        Some(Self { ctx, listener, addr, hosts })
    }

    /// Starts the peer `role` on the second host, told where this host listens.
    pub fn spawn_on_second(&self, peers: &Peers, role: &str, env: &[(&str, String)]) -> Peer {
        let mut all = env.to_vec();
        all.push((ADDR_VAR, self.addr.clone()));
        self.hosts.spawn_on_second_host(peers, role, &all)
    }

    /// The next peer's endpoint (within 30 s).
    pub fn accept(&self) -> Endpoint {
        self.listener.accept_timeout(Duration::from_secs(30)).expect("the peer connects")
    }
}

/// The peer's side: connects to the first host over the link with a context from the
/// environment plus `config`'s changes.
pub fn connect_to_first(config: Config) -> (Context, Endpoint) {
    let ctx = Context::new(config).expect("the peer's context");
    let addr = std::env::var(ADDR_VAR).expect("the first host's address");
    let hostport = addr.strip_prefix("tcp:").expect("a TCP address");
    let ep = ctx.connect_tcp(hostport).expect("connecting to the first host");
    (ctx, ep)
}

/// The peer's hostname, as this process sees it.
pub fn hostname() -> String {
    nix::unistd::gethostname().unwrap().into_string().unwrap()
}

/// An echo peer on the second host: checks it is on another host (its own hostname and
/// `/dev/shm`), connects with `config` over UCX, echoes until "stop".
pub fn serve_echo_on_second(config: Config) {
    assert!(hostname().starts_with("ferrylink-second-host-"), "the peer's hostname is {}", hostname());
    assert!(
        std::fs::read_dir("/dev/shm").unwrap().next().is_none(),
        "the second host's /dev/shm starts empty (its own)"
    );
    let (_ctx, ep) = connect_to_first(config);
    assert_eq!(ep.lane(), LaneKind::Ucx, "across hosts the UCX lane");
    echo::serve(&Ferry, &ep);
}
