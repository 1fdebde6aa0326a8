//! The raw UCX round trips: buffers of the run's memory, and each side's loop.
//!
//! The client posts its receive of the echo, sends `n` bytes and busy-progresses its
//! worker until both complete: one timed round trip (the clock starts before the receive
//! is posted, as the lane's round trip does). The server keeps a receive posted ahead
//! (into the spare of its two buffers) before it sends each message back from the buffer
//! it landed in. Neither side sleeps: each busy-progresses its worker, and yields its core
//! now and then, as the transport's own waits do, for a machine with more busy threads
//! than cores, where the peer may be waiting for it.

use super::note::Note;
use super::PeerEnd;
use crate::digest::source_pattern;
use crate::roundtrip::{alloc_frame, RoundTripOptions};
use crate::ObjectType;
use ferrylink::{Frame, HostBuffer};
use ferrylink_ucx::{Rejected, Status, UcxEndpoint, UcxWorker};
use std::borrow::Cow;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The tag of the client's messages (`FLRU` and 1).
const PING: u64 = 0x464c_5255_0000_0001;
/// The tag of the server's echoes.
const ECHO: u64 = 0x464c_5255_0000_0002;
/// Progress calls between two looks at the clock and at the peer's last note (and two
/// yields of the core).
const SPINS_PER_LOOK: u32 = 1024;

/// Why a side stopped its round trips.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stop {
    /// The peer sent its last note, other than done, before the round trips were over (it
    /// stopped; its note says why).
    PeerStopped,
    /// This side failed, and why.
    Failed(String),
}

/// This side's worker, busy-progressed while it waits. A wait fails when the peer's last
/// note says it stopped, and after `timeout`; a peer that is done goes on progressing its
/// worker until this side is done too (`super::end`), so this side's last completions
/// still come.
pub(super) struct Waits<'a> {
    pub(super) worker: &'a UcxWorker,
    pub(super) peer_end: &'a RefCell<PeerEnd>,
    pub(super) timeout: Duration,
}

impl Waits<'_> {
    /// Progresses the worker until `done()`. The clock and the peer's note are looked at,
    /// and the core yielded, only every [`SPINS_PER_LOOK`] progress calls, so a short round
    /// trip does none of it; the description (`round trip {i}: {what}`) is made only for an
    /// error.
    fn until(&self, i: usize, what: &str, mut done: impl FnMut() -> bool) -> Result<(), Stop> {
        let mut deadline = None;
        let mut spins = 0u32;
        while !done() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_LOOK) {
                if matches!(self.peer_end.borrow_mut().poll(), Some(note) if *note != Ok(Note::Done)) {
                    return Err(Stop::PeerStopped);
                }
                let now = Instant::now();
                if now > *deadline.get_or_insert(now + self.timeout) {
                    return Err(failed(format!("round trip {i}: {what} did not complete within {:?}", self.timeout)));
                }
                std::thread::yield_now();
            }
            self.worker.progress();
        }
        Ok(())
    }
}

fn failed(what: impl std::fmt::Display) -> Stop {
    Stop::Failed(what.to_string())
}

fn rejected<B>(what: &str) -> impl FnOnce(Rejected<B>) -> Stop + '_ {
    move |r| failed(format!("{what}: {}", r.error))
}

/// The bytes a completed request of round trip `i` reports against the `n` it should.
fn check_len(i: usize, what: &str, result: Option<Result<usize, Status>>, n: usize) -> Result<(), Stop> {
    match result {
        Some(Ok(len)) if len == n => Ok(()),
        Some(Ok(len)) => Err(failed(format!("round trip {i}: {what}: {len} bytes, not {n}"))),
        Some(Err(status)) => Err(failed(format!("round trip {i}: {what}: {status}"))),
        None => Err(failed(format!("round trip {i}: {what}: not complete"))),
    }
}

/// A buffer of `o.n_bytes` of the run's memory on `dev`: host bytes all written with
/// `fill` (pre-touched: `fill` is not 0, which would leave the pages unmapped), or device
/// memory allocated as the benchmark's own device buffers are.
fn buffer(o: &RoundTripOptions, dev: usize, fill: u8) -> Result<Frame, Stop> {
    match o.object_type {
        ObjectType::Host => Ok(Frame::Host(HostBuffer::from_vec(vec![fill; o.n_bytes]))),
        ObjectType::Device => alloc_frame(ObjectType::Device, dev, o.n_bytes).map_err(failed),
    }
}

/// The client's send buffer, holding the benchmark's source pattern.
fn send_buffer(o: &RoundTripOptions) -> Result<Frame, Stop> {
    match o.object_type {
        ObjectType::Host => Ok(Frame::Host(HostBuffer::from_vec(source_pattern(o.n_bytes)))),
        ObjectType::Device => {
            let frame = buffer(o, o.client_dev, 0)?;
            if let Frame::Device(d) = &frame {
                d.copy_from_host(&source_pattern(o.n_bytes)).map_err(failed)?;
            }
            Ok(frame)
        }
    }
}

/// Whether the echo holds what was sent (compared once, after the round trips).
fn check_echo(sent: &Frame, echo: &Frame) -> Result<(), Stop> {
    let expected: Cow<'_, [u8]> = match sent {
        Frame::Host(h) => Cow::Borrowed(h.as_slice()),
        Frame::Device(d) => Cow::Owned(source_pattern(d.len())),
    };
    let got: Cow<'_, [u8]> = match echo {
        Frame::Host(h) => Cow::Borrowed(h.as_slice()),
        Frame::Device(d) => {
            let mut back = vec![0u8; d.len()];
            d.copy_to_host(&mut back).map_err(failed)?;
            Cow::Owned(back)
        }
    };
    match expected.iter().zip(got.iter()).position(|(a, b)| a != b) {
        None if expected.len() == got.len() => Ok(()),
        None => Err(failed(format!("the last echo has {} bytes, {} were sent", got.len(), expected.len()))),
        Some(at) => Err(failed(format!("the last echo differs from what was sent at byte offset {at}"))),
    }
}

/// The client's round trips on `ep`: `o.n_warmup_iter` untimed, then `o.n_iter` timed;
/// returns the timed ones. The last echo is compared with what was sent.
pub(super) fn client(ep: &UcxEndpoint, waits: &Waits<'_>, o: &RoundTripOptions) -> Result<Vec<Duration>, Stop> {
    let n = o.n_bytes;
    let mut send = send_buffer(o)?;
    let mut echo = buffer(o, o.client_dev, 0x5a)?;
    let mut timed = Vec::with_capacity(o.n_iter);
    for i in 0..o.total() {
        let start = Instant::now();
        let mut r = waits.worker.tag_recv(ECHO, u64::MAX, echo).map_err(rejected("posting the echo's receive"))?;
        let mut s = ep.tag_send(PING, send).map_err(rejected("sending"))?;
        waits.until(i, "the send and the echo", || s.is_complete() && r.is_complete())?;
        let elapsed = start.elapsed();
        check_len(i, "the send", s.poll(), n)?;
        check_len(i, "the echo", r.poll(), n)?;
        send = s.into_buf().map_err(|_| failed("the send buffer did not come back"))?;
        echo = r.into_buf().map_err(|_| failed("the echo's buffer did not come back"))?;
        if i >= o.n_warmup_iter {
            timed.push(elapsed);
        }
    }
    check_echo(&send, &echo)?;
    Ok(timed)
}

/// The server's round trips on `ep`: receives each message (a receive always posted
/// before it can arrive) and sends it back from the buffer it landed in.
pub(super) fn server(ep: &UcxEndpoint, waits: &Waits<'_>, o: &RoundTripOptions) -> Result<(), Stop> {
    let (n, total) = (o.n_bytes, o.total());
    let post = |buf: Frame| waits.worker.tag_recv(PING, u64::MAX, buf).map_err(rejected("posting a receive"));
    let mut spare = Some(buffer(o, o.server_dev, 0x5a)?);
    let mut posted = if total > 0 { Some(post(buffer(o, o.server_dev, 0x5a)?)?) } else { None };
    for i in 0..total {
        let Some(mut r) = posted.take() else { return Err(failed(format!("round trip {i}: no receive posted"))) };
        waits.until(i, "the receive", || r.is_complete())?;
        check_len(i, "the receive", r.poll(), n)?;
        let got = r.into_buf().map_err(|_| failed("a receive buffer did not come back"))?;
        if i + 1 < total {
            let next = spare.take().ok_or_else(|| failed("no spare buffer"))?;
            posted = Some(post(next)?);
        }
        let mut s = ep.tag_send(ECHO, got).map_err(rejected("sending the echo"))?;
        waits.until(i, "the echo", || s.is_complete())?;
        check_len(i, "the echo", s.poll(), n)?;
        spare = Some(s.into_buf().map_err(|_| failed("the echo's buffer did not come back"))?);
    }
    Ok(())
}
