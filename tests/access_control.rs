//! Only processes of the listener's user can connect. CI runs as root, so the peer is a
//! re-executed child that drops its privileges first; without root the test skips, or
//! fails under `FERRYLINK_REQUIRE_ROOT=1`. The uid comparison itself is tested without
//! root on faked credentials (`transport/src/driver/listen.rs`).

mod common;

use common::*;
use ferrylink::transport::{Config, ConnectError, Context, Listener};
use nix::unistd::{Gid, Uid};
use std::time::Duration;

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
const NOBODY: u32 = 65534;
/// Set to 1 where the tests run as root (CI): the test then fails rather than skips
/// when it is not root.
const REQUIRE_ROOT: &str = "FERRYLINK_REQUIRE_ROOT";

/// Exit codes the child reports its observation with.
const REFUSED_BY_LISTENER: i32 = 10;
const NO_PERMISSION: i32 = 11;
const CONNECTED: i32 = 12;
const OTHER: i32 = 13;

fn child_connect() -> i32 {
    let path = std::env::var(PATH_VAR).unwrap();
    let ctx = Context::new(Config::default()).unwrap();
    match ctx.connect(&path) {
        Ok(_) => CONNECTED,
        Err(ConnectError::Rejected { reason }) if reason.contains(&format!("uid {NOBODY}")) => REFUSED_BY_LISTENER,
        Err(ConnectError::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => NO_PERMISSION,
        Err(e) => {
            eprintln!("unexpected connect error: {e}");
            OTHER
        }
    }
}

peer_test! {
    fn other_users_are_kept_out(peers) {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os(REQUIRE_ROOT).is_none_or(|v| v != "1"),
                "{REQUIRE_ROOT}=1 and not root: dropping privileges needs root"
            );
            println!("skipped: dropping privileges needs root ({REQUIRE_ROOT}=1 makes this a failure)");
            return;
        }
        let dir = socket_dir();
        let ctx = Context::new(Config::default()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let env = [(PATH_VAR, listener.path().display().to_string())];
        for (role, expected) in [("stranger", NO_PERMISSION), ("impostor", REFUSED_BY_LISTENER)] {
            let mut child = peers.spawn(role, &env);
            let status = child.wait_end(Duration::from_secs(30)).status;
            assert_eq!(status.code(), Some(expected), "{role}: {status}\n{}", child.output_so_far());
        }
        assert!(listener.accept_timeout(Duration::from_millis(100)).is_err(), "no endpoint for another user");
        // The listener still serves its own user.
        let _ep = ctx.connect(listener.path()).unwrap();
        listener.accept_timeout(Duration::from_secs(5)).unwrap();
    }
    peer(role) => {
        match role {
            // Fully another user: the private directory keeps it from the socket.
            "stranger" => {
                nix::unistd::setgid(Gid::from_raw(NOBODY)).unwrap();
                nix::unistd::setuid(Uid::from_raw(NOBODY)).unwrap();
            }
            // Another effective user that can still reach the socket (file-system uid 0):
            // the listener must refuse it after reading SO_PEERCRED.
            "impostor" => {
                nix::unistd::seteuid(Uid::from_raw(NOBODY)).unwrap();
                nix::unistd::setfsuid(Uid::from_raw(0));
            }
            other => panic!("unknown role {other}"),
        }
        std::process::exit(child_connect());
    },
}
