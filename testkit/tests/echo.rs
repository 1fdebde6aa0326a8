//! The echo peer and the load check over an in-process loopback transport.

use ferrylink_testkit::echo::{self, Load, Transport};
use ferrylink_testkit::pattern;
use std::borrow::Cow;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Msg = (Vec<u8>, Vec<Vec<u8>>);

/// One end of a pair of channels; receives are taken in the order they were posted.
struct End {
    tx: Sender<Msg>,
    rx: Arc<Mutex<Receiver<Msg>>>,
}

fn pair() -> (End, End) {
    let (a_tx, b_rx) = channel();
    let (b_tx, a_rx) = channel();
    (End { tx: a_tx, rx: Arc::new(Mutex::new(a_rx)) }, End { tx: b_tx, rx: Arc::new(Mutex::new(b_rx)) })
}

/// Loopback; `flip`: the echo side corrupts the first byte of every echoed frame.
struct Loopback {
    flip: bool,
}

impl Transport for Loopback {
    type Endpoint = End;
    type Message = Msg;
    type Sending = ();
    type Receiving = Arc<Mutex<Receiver<Msg>>>;

    fn send(&self, ep: &End, mut message: Msg) -> Self::Sending {
        if self.flip && message.0.len() > 16 {
            for f in message.1.iter_mut().filter(|f| !f.is_empty()) {
                f[0] ^= 1;
            }
        }
        let _ = ep.tx.send(message);
    }
    fn recv(&self, ep: &End) -> Self::Receiving {
        ep.rx.clone()
    }
    fn wait_sent(&self, _req: &mut (), _bound: Duration) -> Option<Result<(), String>> {
        Some(Ok(()))
    }
    fn wait_received(&self, req: &mut Self::Receiving, bound: Duration) -> Option<Result<Msg, String>> {
        match req.lock().unwrap().recv_timeout(bound) {
            Ok(m) => Some(Ok(m)),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err("closed".into())),
        }
    }
    fn message(&self, header: Vec<u8>, frames_of: Option<Msg>) -> Msg {
        (header, frames_of.map(|m| m.1).unwrap_or_default())
    }
    fn header<'m>(&self, message: &'m Msg) -> &'m [u8] {
        &message.0
    }
    fn frames<'m>(&self, message: &'m Msg) -> Vec<Cow<'m, [u8]>> {
        message.1.iter().map(|f| Cow::Borrowed(&f[..])).collect()
    }
}

fn run(flip: bool, in_flight: usize) -> echo::LoadReport {
    let t = Loopback { flip };
    let (ours, theirs): (Vec<End>, Vec<End>) = (0..4).map(|_| pair()).unzip();
    std::thread::scope(|s| {
        s.spawn(|| echo::serve_all(&t, &theirs));
        let load = Load { messages: 10, in_flight, bound: Duration::from_secs(10) };
        let report = echo::check_load(
            &t,
            &ours,
            load,
            |e, m| ([(e as u64).to_le_bytes(), (m as u64).to_le_bytes()].concat(), vec![pattern(e * 10 + m, m as u64)]),
            || 0,
        );
        for ep in &ours {
            echo::stop(&t, ep, Duration::from_secs(1));
        }
        report
    })
}

#[test]
fn every_echo_comes_back_and_the_window_is_kept() {
    for in_flight in [1, 3, 10, 50] {
        let report = run(false, in_flight);
        report.assert_intact();
        assert_eq!(report.total, 40);
        assert_eq!(report.posted_depth, 4 * in_flight.min(10), "window {in_flight}");
    }
}

#[test]
fn corrupted_echoes_are_counted() {
    let report = run(true, 4);
    // Frames of 0 bytes cannot be corrupted: messages (0, 0) only.
    assert_eq!((report.received, report.corrupted), (40, 39), "{report:?}");
}

#[test]
fn verify_checks_header_sums_and_frames() {
    let t = Loopback { flip: false };
    let sent = vec![pattern(10, 1), pattern(0, 2)];
    let mut header = b"h".to_vec();
    header.extend(sent.iter().flat_map(|f| ferrylink_testkit::checksum(f).to_le_bytes()));
    echo::verify(&t, b"h", &sent, &(header.clone(), sent.clone()));
    let mut bad = sent.clone();
    bad[0][3] ^= 1;
    let r = std::panic::catch_unwind(|| echo::verify(&t, b"h", &sent, &(header.clone(), bad)));
    assert!(r.is_err(), "a changed frame fails the check");
}
