//! A parent that listens and the peer process that connects to it: the socket path
//! travels in `PATH_VAR`, the peer builds its context from the environment the parent
//! gave it (`FERRYLINK_DEVICE_COPIES`, `FERRYLINK_TRANSPORT`, ...).

use super::{socket_dir, stop_echo, Ferry, Peer, Peers};
use ferrylink::transport::{Config, Context, Endpoint, Listener};
use ferrylink::Message;
use std::time::Duration;

/// The variable that tells the peer where the parent listens.
pub const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";

/// The peer's side: a context from the environment, connected to the parent.
pub fn connect_from_env() -> (Context, Endpoint) {
    let ctx = Context::new(Config::from_env().unwrap()).unwrap();
    let ep = ctx.connect(std::env::var(PATH_VAR).unwrap()).unwrap();
    (ctx, ep)
}

/// The peer's side: connects and echoes every message (the kit's echo) until "stop".
pub fn serve_echo_from_env() {
    let (_ctx, ep) = connect_from_env();
    super::echo::serve(&Ferry, &ep);
}

/// The peer's side: echoes like [`serve_echo_from_env`], then answers "stop" with its
/// context's IPC mapping counts (see [`ListeningParent::stop_reporting_mappings`]).
pub fn serve_echo_reporting_mappings() {
    let (ctx, ep) = connect_from_env();
    super::echo::serve(&Ferry, &ep);
    let s = ctx.stats().unwrap();
    let reply = format!("{} {}", s.ipc_mapping_opens, s.ipc_mappings);
    ep.send(Message::new(reply.into_bytes(), vec![])).wait().unwrap();
}

/// The parent's side: its context, the peer process and the accepted endpoint.
pub struct ListeningParent {
    _dir: tempfile::TempDir,
    pub ctx: Context,
    pub peer: Peer,
    pub ep: Endpoint,
}

impl ListeningParent {
    /// Listens with `ctx`, starts the peer in `role` with `env` (and `PATH_VAR`), accepts.
    pub fn start(peers: &Peers, role: &str, ctx: Context, env: &[(&str, String)]) -> Self {
        let dir = socket_dir();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let mut env = env.to_vec();
        env.push((PATH_VAR, listener.path().display().to_string()));
        let peer = peers.spawn(role, &env);
        let ep = listener.accept_timeout(Duration::from_secs(60)).expect("peer connects");
        ListeningParent { _dir: dir, ctx, peer, ep }
    }

    /// One-sided tests: listens and starts the peer on `transport` (both sides with the
    /// same config and variables), with UCX's RMA `rma` and, when `staged`, every
    /// one-sided transfer over UCX through pinned host memory (`FERRYLINK_UCX_STAGED=1`).
    pub fn start_onesided(peers: &Peers, role: &str, transport: &str, (rma, staged): (bool, bool)) -> Self {
        let lane_policy = transport.parse().unwrap();
        let config = Config::default().with_lane_policy(lane_policy).with_ucx_rma(rma).with_ucx_staged(staged);
        let env = [
            ("FERRYLINK_TRANSPORT", transport.to_string()),
            ("FERRYLINK_UCX_RMA", u8::from(rma).to_string()),
            ("FERRYLINK_UCX_STAGED", u8::from(staged).to_string()),
        ];
        Self::start(peers, role, Context::new(config).unwrap(), &env)
    }

    /// Stops an echo peer and waits for it to end well.
    pub fn stop(mut self) {
        stop_echo(&self.ep);
        self.peer.wait_success(Duration::from_secs(60));
    }

    /// Stops a peer of [`serve_echo_reporting_mappings`] and waits for it to end well;
    /// its (IPC mappings opened, IPC mappings open at the end).
    pub fn stop_reporting_mappings(mut self) -> (u64, u64) {
        stop_echo(&self.ep);
        let reply = self.ep.recv().wait().unwrap();
        let text = String::from_utf8(reply.header).unwrap();
        let mut counts = text.split(' ').map(|n| n.parse::<u64>().unwrap());
        self.peer.wait_success(Duration::from_secs(60));
        (counts.next().unwrap(), counts.next().unwrap())
    }
}
