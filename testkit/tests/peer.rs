//! The re-exec harness, tested with itself: peers that succeed, fail, print, read stdin
//! and reach steps; a parent that looks at a peer's failure.

use ferrylink_testkit::peer::reached;
use ferrylink_testkit::peer_test;
use std::io::BufRead;
use std::time::Duration;

const BOUND: Duration = Duration::from_secs(30);

peer_test! {
    /// A peer per role; each prints, reaches a step and ends well.
    fn peers_run_their_roles_and_report_their_steps(peers) {
        for role in ["one", "two"] {
            let mut peer = peers.spawn(role, &[("TESTKIT_SELF_TEST", format!("hello {role}"))]);
            peer.wait_reached("greeted", BOUND);
            assert_ne!(peer.id(), std::process::id());
            let out = peer.wait_success(BOUND);
            assert!(out.stdout.contains(&format!("said: hello {role}")), "{}", out.stdout);
        }
    }
    "one" => greet(),
    "two" => greet(),
}

fn greet() {
    println!("said: {}", std::env::var("TESTKIT_SELF_TEST").unwrap());
    reached("greeted");
}

peer_test! {
    /// A peer that reads lines from its stdin and answers on stdout.
    fn a_peer_answers_over_its_pipes(peers) {
        let mut peer = peers.spawn_with("doubler", &[], true);
        for n in [1, 21, 500] {
            peer.write_line(&n.to_string());
            assert_eq!(peer.expect_line_with("DOUBLED ", BOUND), (2 * n).to_string());
        }
        peer.write_line("quit");
        peer.wait_success(BOUND);
    }
    "doubler" => {
        for line in std::io::stdin().lock().lines() {
            let line = line.unwrap();
            if line == "quit" {
                break;
            }
            println!("\nDOUBLED {}", 2 * line.parse::<u64>().unwrap());
        }
    },
}

peer_test! {
    /// A failing peer fails `wait_success`, its output in the message.
    fn a_failing_peer_fails_the_wait(peers) {
        for role in ["panics", "exits-early", "unknown"] {
            let mut peer = peers.spawn(role, &[]);
            let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| peer.wait_success(BOUND)));
            let message = *failure.expect_err("the wait fails").downcast::<String>().unwrap();
            assert!(message.contains(&format!("peer {role:?}")), "{message}");
            if role == "panics" {
                assert!(message.contains("the peer body panicked"), "{message}");
            }
            if role == "exits-early" {
                assert!(message.contains("without running its body to the end"), "{message}");
            }
        }
    }
    peer(role) => match role {
        "panics" => panic!("the peer body panicked"),
        // Exit status 0, but the body never returned: not a success.
        "exits-early" => std::process::exit(0),
        other => panic!("unknown peer role {other:?}"),
    },
}

peer_test! {
    /// A peer killed at a step, and one that never reaches it.
    fn a_killed_peer_and_a_missing_step(peers) {
        let mut peer = peers.spawn("waits", &[]);
        peer.wait_reached("waiting", BOUND);
        peer.kill();
        assert!(peer.has_exited());
        let mut silent = peers.spawn("silent", &[]);
        let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            silent.wait_reached("waiting", Duration::from_millis(500))
        }));
        let message = *failure.expect_err("no such step").downcast::<String>().unwrap();
        assert!(message.contains("did not reach \"waiting\""), "{message}");
        assert!(silent.has_exited(), "a peer that failed a wait is killed");
    }
    "waits" => {
        reached("waiting");
        std::thread::sleep(Duration::from_secs(60));
    },
    "silent" => std::thread::sleep(Duration::from_secs(60)),
}

/// A peer dropped without a wait or a kill fails its test (and is killed).
#[test]
fn dropping_an_unchecked_peer_fails() {
    let peers = ferrylink_testkit::Peers::__new("peer::a_killed_peer_and_a_missing_step::peer_process");
    let peer = peers.spawn("silent", &[]);
    let pid = peer.id();
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(peer)));
    let message = *failure.expect_err("an unchecked peer").downcast::<String>().unwrap();
    assert!(message.contains("its end was never checked"), "{message}");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the peer is killed and reaped");
}

/// The entry point's name is what the harness spawns.
#[test]
fn entry_points_are_named_after_their_test() {
    let peers = ferrylink_testkit::Peers::__new("peer::some_test::peer_process");
    assert_eq!(peers.entry(), "some_test::peer_process");
}
