//! A device message pushed before its receive waits briefly for it (the grace of decision
//! 0018), between two processes on GPU 0. Alone in its test binary: the grace is 1 ms, and
//! the other device tests' processes, run in parallel threads of one binary, can hold this
//! one's progress thread off the CPU for longer, and allocate from the same device pool.
//! Needs a GPU: ignored unless built with `--features gpu-tests`.

mod common;

use common::*;
use ferrylink::memory::cuda;
use ferrylink::transport::{Config, Context};
use ferrylink::Message;
use std::time::Duration;

/// Listens, starts the peer in `role` as the connector (which copies) and accepts it.
fn start(peers: &Peers, role: &str) -> ListeningParent {
    let ctx = Context::new(Config::default()).unwrap();
    ListeningParent::start(peers, role, ctx, &[("FERRYLINK_DEVICE_COPIES", "connector".to_string())])
}

/// The size of the pushes of the next test.
const PUSH_LEN: usize = 4 << 20;
/// Receives within the grace the next test makes (then one late).
const PUSH_TRIES: u64 = 5;

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn a_push_waits_briefly_for_its_receive_and_lands_in_the_callers_buffer(peers) {
        require_gpu();
        let mut p = start(&peers, "pusher");
        let pool = cuda::DevicePool::shared(0).unwrap();
        // Rounds 0..PUSH_TRIES: the receive comes 300 µs after "go", within the grace: the
        // connector copies straight into the caller's buffer (no pool allocation on this
        // side). A round can still miss the grace when the machine is busy, so one of the
        // tries without an allocation is enough.
        // Last round: it comes 50 ms after: the message landed in pool memory first, then
        // is copied (an allocation, whatever other tests do).
        let mut direct_rounds = 0;
        for round in 0..=PUSH_TRIES {
            let late = round == PUSH_TRIES;
            let delay = if late { Duration::from_millis(50) } else { Duration::from_micros(300) };
            let target = pool.alloc(PUSH_LEN).unwrap();
            let before = pool.stats().allocations_total;
            p.ep.send(Message::new(b"go".to_vec(), vec![])).wait().unwrap();
            std::thread::sleep(delay);
            let got = p.ep.recv_into(vec![target.into()]).wait().unwrap();
            assert!(frame_bytes(&got.frames[0]) == pattern(PUSH_LEN, 300 + round), "message {round} differs");
            let allocated = pool.stats().allocations_total - before;
            if late {
                assert!(allocated > 0, "a receive 50 ms late found the message in its buffer, not landed before");
            } else if allocated == 0 {
                direct_rounds += 1;
            }
        }
        assert!(direct_rounds > 0, "none of {PUSH_TRIES} receives within the grace got the push into its buffer");
        p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
        p.peer.wait_success(Duration::from_secs(60));
    }
    peer(role) => {
        assert_eq!(role, "pusher");
        let (_ctx, ep) = connect_from_env();
        for round in 0..=PUSH_TRIES {
            ep.recv().wait().unwrap(); // "go"
            let buf = device_buffer_with(0, &pattern(PUSH_LEN, 300 + round));
            ep.send(Message::new(vec![], vec![buf.into()])).wait().unwrap();
        }
        ep.recv().wait().unwrap();
        return;
    },
}
