//! Where a standalone server listens and a standalone client connects
//! (`-s/--server-address`, `-p/--port`).

use super::args::Args;
use crate::BenchError;
use std::path::PathBuf;

/// Where a standalone server listens / a standalone client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Address {
    /// A Unix socket on this machine (native lane).
    Unix(PathBuf),
    /// A TCP address (another machine: the UCX lane).
    Tcp(String, u16),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(h, p) => write!(f, "tcp {h}:{p}"),
        }
    }
}

/// `-s/--server-address` and `-p/--port`: a Unix socket path (`unix:/path`, or anything
/// with a `/`), or a host name / IP address with a port.
pub(super) fn server_address(args: &Args) -> Result<Option<Address>, BenchError> {
    let standalone = args.server_only || args.client_only;
    if !standalone && (args.server_address.is_some() || args.port.is_some()) {
        return Err(BenchError::Usage(
            "-s/--server-address and -p/--port are for runs in two processes started separately: \
             use --server-only on one side and --client-only on the other"
                .into(),
        ));
    }
    match (args.server_address.as_deref(), args.port) {
        (None, None) => Ok(None),
        (Some(a), None) if a.starts_with("unix:") => Ok(Some(Address::Unix(PathBuf::from(&a["unix:".len()..])))),
        (Some(a), None) if a.contains('/') => Ok(Some(Address::Unix(PathBuf::from(a)))),
        (Some(a), None) => {
            Err(BenchError::Usage(format!("-s/--server-address {a} is a network address: give -p/--port too")))
        }
        (None, Some(port)) if args.server_only => Ok(Some(Address::Tcp("0.0.0.0".into(), port))),
        (None, Some(_)) => Err(BenchError::Usage("--client-only -p/--port needs -s/--server-address HOST".into())),
        (Some(a), Some(port)) if !a.contains('/') => Ok(Some(Address::Tcp(a.to_owned(), port))),
        (Some(a), Some(_)) => Err(BenchError::Usage(format!("-p/--port does not go with the Unix socket {a}"))),
    }
}
