//! Who is on the other end of an endpoint.

use crate::wire::Hello;

/// Who is on the other end.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// Its process id.
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its host name.
    pub hostname: String,
    /// Its GPUs, by UUID, in its own device order.
    pub gpus: Vec<[u8; 16]>,
    /// Whether its UCX handles CUDA memory (`None`: it has no UCX).
    pub ucx_cuda_aware: Option<bool>,
}

impl std::fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {}", self.pid, self.hostname)
    }
}

impl PeerInfo {
    /// What a peer's introduction says about it.
    pub fn from_hello(hello: Hello) -> Self {
        Self {
            pid: hello.pid,
            uid: hello.uid,
            gpus: hello.gpus.iter().map(|g| g.uuid).collect(),
            ucx_cuda_aware: hello.ucx.as_ref().map(|u| u.cuda_aware),
            hostname: hello.host.hostname,
        }
    }
}
