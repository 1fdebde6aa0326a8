//! The worker's event fd wakes a receiver asleep on it, with the sender in another
//! process (two workers of one process over TCP loopback do not get their wake-ups
//! reliably: UCX 1.13 missed some under load, 1.16 all of them).
//!
//! The receiver sleeps like the transport's progress thread: armed, on the fd, re-polling
//! after [`REPOLL`] at the latest. A re-poll also delivers, later, so the test counts for
//! every message what woke the receiver: the fd, or a re-poll that found work (which a
//! live fd would have signalled first). A dead fd makes every wake-up a re-poll.

use super::*;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

/// The sender's worker address (hex), for the receiver.
const ADDRESS_VAR: &str = "FERRYLINK_UCX_TEST_ADDRESS";
/// How long the receiver sleeps at most before it looks again (the progress thread's
/// tick).
const REPOLL: Duration = Duration::from_millis(50);
const MESSAGES: u64 = 12;

/// What woke the sleeping receiver.
#[derive(Debug, Default)]
struct Wakeups {
    /// The event fd became readable.
    by_fd: usize,
    /// The sleep timed out and progress then found work.
    repolls_with_work: usize,
    /// The sleep timed out with nothing to do (the message was not sent yet).
    idle_repolls: usize,
    /// Messages whose last wake-up, the one that delivered them, came from the fd.
    delivered_after_fd: u64,
}

/// Progresses until `worker.arm()` says it is safe to sleep.
fn arm(worker: &UcxWorker) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        while worker.progress() > 0 {}
        if worker.arm().expect("arm") {
            return;
        }
        assert!(Instant::now() < deadline, "arm never succeeded");
    }
}

/// Sleeps on the fd until `recv` completes, counting the wake-ups.
fn sleep_until_delivered(worker: &UcxWorker, poll: &mut Poll, recv: &mut TagRecv<Vec<u8>>, wakeups: &mut Wakeups) {
    let mut events = Events::with_capacity(4);
    let deadline = Instant::now() + DEADLINE;
    loop {
        assert!(Instant::now() < deadline, "no delivery within {DEADLINE:?}: {wakeups:?}");
        poll.poll(&mut events, Some(REPOLL)).expect("poll");
        let by_fd = events.iter().any(|e| e.token() == Token(0));
        let mut progressed = 0;
        while worker.progress() > 0 {
            progressed += 1;
        }
        let delivered = recv.is_complete();
        match (by_fd, progressed > 0 || delivered) {
            (true, _) => wakeups.by_fd += 1,
            (false, true) => wakeups.repolls_with_work += 1,
            (false, false) => wakeups.idle_repolls += 1,
        }
        if delivered {
            wakeups.delivered_after_fd += u64::from(by_fd);
            return;
        }
        arm(worker);
    }
}

peer_test! {
    fn event_fd_wakes_a_sleeping_receiver(peers) {
        let Some(context) = context_or_skip() else { return };
        let worker = UcxWorker::new(&context).expect("worker");
        let address = to_hex(worker.address().expect("address").as_bytes());
        let mut sender = peers.spawn_with("sender", &[(ADDRESS_VAR, address)], true);
        let mut poll = Poll::new().expect("poll");
        let fd = worker.event_fd().expect("event fd").as_raw_fd();
        poll.registry().register(&mut SourceFd(&fd), Token(0), Interest::READABLE).expect("register");
        let mut wakeups = Wakeups::default();
        for seq in 0..MESSAGES {
            let mut recv = worker.tag_recv(seq, u64::MAX, vec![0u8; 100]).expect("post recv");
            arm(&worker);
            assert!(!recv.is_complete());
            sender.write_line(&format!("SEND {seq}"));
            sleep_until_delivered(&worker, &mut poll, &mut recv, &mut wakeups);
            assert_eq!(recv.poll(), Some(Ok(100)));
            assert!(recv.into_buf().expect("complete") == pattern(100, seq), "message {seq} intact");
        }
        sender.write_line("STOP");
        sender.wait_success(DEADLINE);
        println!("{wakeups:?}");
        // A message sent just as a sleep times out is found by the re-poll: allow one.
        assert!(wakeups.delivered_after_fd + 1 >= MESSAGES, "the fd woke the receiver for too few messages: {wakeups:?}");
        assert!(wakeups.repolls_with_work <= 1, "re-polls found work the fd did not signal: {wakeups:?}");
    }
    // Connects to the receiver; sends message `seq` when told "SEND seq", until "STOP".
    "sender" => {
        let context = UcxContext::new(&tcp_config()).expect("UCX in the sender");
        let worker = UcxWorker::new(&context).expect("worker");
        let address = from_hex(&std::env::var(ADDRESS_VAR).expect("the receiver's address"));
        // SAFETY: the bytes are the receiver's UcxWorker::address, passed intact in the
        // environment.
        let ep = worker.connect(&unsafe { WorkerAddress::from_bytes_unchecked(address) }).expect("connect");
        for line in std::io::stdin().lines() {
            let line = line.expect("a line from the receiver");
            let Some(seq) = line.strip_prefix("SEND ") else { break };
            let seq: u64 = seq.parse().expect("a sequence number");
            let mut send = ep.tag_send(seq, pattern(100, seq)).expect("send");
            let deadline = Instant::now() + DEADLINE;
            while !send.is_complete() {
                assert!(Instant::now() < deadline, "send {seq} never completed");
                worker.progress();
            }
            assert_eq!(send.poll(), Some(Ok(100)));
        }
        // The receiver no longer progresses: a flush would wait for it in vain.
        ep.close(CloseMode::Force).wait(DEADLINE).expect("forced close");
    },
}
