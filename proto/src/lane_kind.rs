//! [`LaneKind`]: which lane a connection's data travels on, as negotiation picks it and
//! the transport's `Endpoint::lane` reports it. The lanes themselves are the transport's.

/// How an endpoint's data travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaneKind {
    /// Same machine and user: Unix socket control, CUDA IPC handles and memfds for data.
    Native,
    /// UCX (InfiniBand, RoCE, TCP).
    Ucx,
}

impl std::fmt::Display for LaneKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LaneKind::Native => "native",
            LaneKind::Ucx => "ucx",
        })
    }
}
