//! The round trip `local-send-recv` times, as ucx-py's benchmark does it: the client sends
//! n bytes, the server receives them and sends them back; one iteration is the client's
//! send + receive.
//!
//! With `--memory pool` (the default, and every host run):
//! - The client's **send** buffer is made once and reused (the transport hands it back);
//!   host send buffers are memfd shared buffers ([`ferrylink::ipc::shared_host_buffer`]),
//!   which the native lane sends without a copy; device ones come from the exportable
//!   device pool.
//! - Without `reuse_alloc` every **receive** lands in fresh memory of the transport's choice
//!   (`ep.recv()`), and the server echoes that very message, as ucx-py's server echoes a
//!   freshly allocated array. With `reuse_alloc` both sides receive into one preallocated
//!   buffer (`ep.recv_into`), allocated like the send buffer.
//!
//! With the other memory kinds ([`crate::memory_kind`]) every iteration makes fresh
//! buffers of that kind before its timed part: the client a send buffer (filled with a
//! value of that iteration) and a receive buffer (`ep.recv_into`), the server a receive
//! buffer, whose message it echoes; they are dropped after the iteration.
//!
//! Either way the client posts its receive before its send, so the echo never waits for a
//! receive. After the timed part of the first and the last round trip (of every one with
//! `check_every`, `--check`) the client compares the echo with what it sent
//! ([`crate::echo_check`]); host send buffers hold the pattern `i % 251`, device pool ones
//! the same pattern copied in once, fresh device ones a byte of that round trip.

use crate::digest::source_pattern;
use crate::echo_check::{check_echo, corrupt_for_test, stamp_round_trip};
use crate::error::BenchError;
use crate::memory_kind::{FreshBuffers, MemoryKind};
use crate::onesided::{Op, SkipTransfer};
use crate::report::ObjectType;
use ferrylink::memory::cuda::DevicePool;
use ferrylink::transport::Endpoint;
use ferrylink::{Frame, Message};
use std::time::{Duration, Instant};

/// What one run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundTripOptions {
    /// Bytes per message.
    pub n_bytes: usize,
    /// Timed round trips.
    pub n_iter: usize,
    /// Untimed round trips first.
    pub n_warmup_iter: usize,
    /// Host or device memory.
    pub object_type: ObjectType,
    /// Where device buffers come from (always [`MemoryKind::Pool`] for host runs).
    pub memory: MemoryKind,
    /// The server's device.
    pub server_dev: usize,
    /// The client's device.
    pub client_dev: usize,
    /// Receive into one preallocated buffer instead of fresh memory each time.
    pub reuse_alloc: bool,
    /// Compare every echo with what was sent (`--check`), not only the first and the last.
    pub check_every: bool,
    /// Test only (`--corrupt-echo-for-test`): the server flips one byte of the echo of
    /// this round trip (counted from 0, warm-up round trips first), so that a test can see
    /// the client's check fail the run. `None` in every real run.
    pub corrupt_echo: Option<usize>,
    /// What a round trip does (`--op`): send and receive (this module), or a one-sided
    /// put or get ([`crate::onesided`]).
    pub op: Op,
    /// One-sided round trips: the spans each request moves the `n_bytes` as (`--blocks`;
    /// 1 without it, and for sends).
    pub blocks: usize,
    /// One-sided round trips: each side prepares its request once and posts it
    /// (`--prepared`).
    pub prepared: bool,
    /// Test only (`--skip-transfer-for-test`, one-sided round trips): a side skips its
    /// transfer of a round trip, so that a test can see the check fail. `None` in every
    /// real run.
    pub skip_transfer: Option<SkipTransfer>,
}

impl RoundTripOptions {
    /// Round trips in all, warm-up ones first.
    pub fn total(&self) -> usize {
        self.n_warmup_iter + self.n_iter
    }

    /// Whether the client checks what round trip `i` brought back (the first and the last
    /// round trip, every one with `check_every`).
    pub fn checks(&self, i: usize) -> bool {
        self.check_every || i == 0 || i + 1 == self.total()
    }
}

/// The client's times of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTimes {
    /// The timed round trips.
    pub timed: Vec<Duration>,
    /// The very first round trip (the first warm-up one, or the first timed one without
    /// warm-up): where the first export and import of the memory happen.
    pub first: Duration,
}

/// A buffer of `n` bytes on `dev` (device) or in shared host memory (host).
pub fn alloc_frame(object_type: ObjectType, dev: usize, n: usize) -> Result<Frame, BenchError> {
    Ok(match object_type {
        ObjectType::Host => Frame::Host(
            ferrylink::ipc::shared_host_buffer(n)
                .map_err(|e| BenchError::Other(format!("allocating {n} bytes of shared host memory: {e}")))?,
        ),
        ObjectType::Device => Frame::Device(DevicePool::shared(dev)?.alloc(n)?),
    })
}

fn transport(i: usize, what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Transport(format!("round trip {i}: {what}: {e}"))
}

/// Where one side's receive buffers come from, iteration after iteration.
enum Receives {
    /// The transport's own memory (`ep.recv()`).
    Transport,
    /// One buffer, handed back after each round trip (`--reuse-alloc`).
    Reuse(Option<Vec<Frame>>),
    /// A fresh buffer of a memory kind each time.
    Fresh(FreshBuffers),
}

impl Receives {
    fn new(o: &RoundTripOptions, dev: usize) -> Result<Receives, BenchError> {
        if let Some(fresh) = FreshBuffers::new(o.memory, dev, o.n_bytes)? {
            return Ok(Receives::Fresh(fresh));
        }
        Ok(if o.reuse_alloc {
            Receives::Reuse(Some(vec![alloc_frame(o.object_type, dev, o.n_bytes)?]))
        } else {
            Receives::Transport
        })
    }

    /// The buffers of the next receive (`None`: the transport's).
    fn next(&mut self) -> Result<Option<Vec<Frame>>, BenchError> {
        Ok(match self {
            Receives::Transport => None,
            Receives::Reuse(kept) => kept.take(),
            Receives::Fresh(fresh) => Some(vec![Frame::Device(fresh.alloc()?)]),
        })
    }

    /// Takes back the frames of a finished round trip (kept only by [`Receives::Reuse`]).
    fn done(&mut self, frames: Vec<Frame>) {
        if let Receives::Reuse(kept) = self {
            *kept = Some(frames);
        }
    }
}

/// Posts the next receive: into `buffers`, or into the transport's memory.
fn post(ep: &Endpoint, buffers: Option<Vec<Frame>>) -> ferrylink::transport::RecvRequest {
    match buffers {
        Some(b) => ep.recv_into(b),
        None => ep.recv(),
    }
}

/// Receives the server keeps posted ahead of the messages (one with `--reuse-alloc`).
pub const SERVER_RECEIVES_POSTED: usize = 2;

/// The server's side: receive and echo `n_warmup_iter + n_iter` messages, keeping
/// [`SERVER_RECEIVES_POSTED`] receives posted, as a server does: a receive's fresh
/// buffers are allocated and posted (the transport exports them then, and offers them to
/// the client once the receive is next in line) while earlier round trips run, so the
/// per-allocation export is paid before its message exists. Allocating and posting are
/// the application's cost, which a real server would not make the peer wait for. With
/// `--reuse-alloc` the one buffer is posted again once the echo gave it back.
pub fn serve(ep: &Endpoint, o: &RoundTripOptions) -> Result<(), BenchError> {
    let mut receives = Receives::new(o, o.server_dev)?;
    let depth = if matches!(receives, Receives::Reuse(_)) { 1 } else { SERVER_RECEIVES_POSTED };
    let mut posted = std::collections::VecDeque::new();
    for _ in 0..depth.min(o.total()) {
        posted.push_back(post(ep, receives.next()?));
    }
    for i in 0..o.total() {
        let request = match posted.pop_front() {
            Some(r) => r,
            None => post(ep, receives.next()?),
        };
        let mut got = request.wait().map_err(|e| transport(i, "receive", e))?;
        if o.corrupt_echo == Some(i) {
            let at = corrupt_for_test(&mut got)?;
            eprintln!("--corrupt-echo-for-test: the echo of round trip {i} has its byte {at} flipped");
        }
        let echo = ep.send(got);
        if depth > 1 && i + depth < o.total() {
            posted.push_back(post(ep, receives.next()?));
        }
        let back = echo.wait().map_err(|e| transport(i, "echo", e))?;
        receives.done(back.frames);
    }
    Ok(())
}

/// Where the client's send buffers come from.
enum Sends {
    /// One message, sent again and again.
    Reuse(Option<Message>),
    /// A fresh buffer each time.
    Fresh(FreshBuffers),
}

impl Sends {
    fn new(o: &RoundTripOptions) -> Result<Sends, BenchError> {
        if let Some(fresh) = FreshBuffers::new(o.memory, o.client_dev, o.n_bytes)? {
            return Ok(Sends::Fresh(fresh));
        }
        let mut frame = alloc_frame(o.object_type, o.client_dev, o.n_bytes)?;
        let pattern = source_pattern(o.n_bytes);
        match &mut frame {
            Frame::Host(h) => h.as_mut_slice().copy_from_slice(&pattern),
            Frame::Device(d) => d.copy_from_host(&pattern)?,
        }
        Ok(Sends::Reuse(Some(Message::new(Vec::new(), vec![frame]))))
    }

    /// The message of round trip `i`; a reused one stamped with `i` when its echo will be
    /// `checked`.
    fn next(&mut self, i: usize, checked: bool) -> Result<Message, BenchError> {
        match self {
            Sends::Reuse(kept) => {
                let mut message = kept.take().ok_or_else(|| BenchError::Other("the send buffer was lost".into()))?;
                if checked {
                    stamp_round_trip(&mut message, i)?;
                }
                Ok(message)
            }
            Sends::Fresh(fresh) => {
                Ok(Message::new(Vec::new(), vec![Frame::Device(fresh.alloc_filled(fill_value(i))?)]))
            }
        }
    }

    /// Takes back the message of a finished round trip (kept only by [`Sends::Reuse`]).
    fn done(&mut self, message: Message) {
        if let Sends::Reuse(kept) = self {
            *kept = Some(message);
        }
    }
}

/// The byte fresh send buffers of round trip `i` are filled with (1..=251, so a stale
/// buffer of an earlier round trip does not pass the check).
fn fill_value(i: usize) -> u8 {
    (i % 251 + 1) as u8
}

/// The client's side: `n_warmup_iter + n_iter` round trips; returns their times. The echoes
/// of the first and the last round trip (of every one with `check_every`) are compared
/// with what was sent, outside the timing; a difference is an error.
pub fn run_client(ep: &Endpoint, o: &RoundTripOptions) -> Result<ClientTimes, BenchError> {
    let mut sends = Sends::new(o)?;
    let mut receives = Receives::new(o, o.client_dev)?;
    let mut timed = Vec::with_capacity(o.n_iter);
    let mut first = None;
    for i in 0..o.total() {
        let checked = o.checks(i);
        let message = sends.next(i, checked)?;
        let into = receives.next()?;
        let start = Instant::now();
        tracing::trace!("{}", crate::timeline::ROUND_TRIP_STARTS);
        let request = match into {
            Some(b) => ep.recv_into(b),
            None => ep.recv(),
        };
        let sent = ep.send(message).wait().map_err(|e| transport(i, "send", e))?;
        let got = request.wait().map_err(|e| transport(i, "receive", e))?;
        let elapsed = start.elapsed();
        if got.payload_len() != o.n_bytes {
            return Err(transport(
                i,
                "echo",
                format!("{} bytes came back, {} were sent", got.payload_len(), o.n_bytes),
            ));
        }
        if checked {
            check_echo(i, &sent, &got)?;
        }
        first.get_or_insert(elapsed);
        if i >= o.n_warmup_iter {
            timed.push(elapsed);
        }
        sends.done(sent);
        receives.done(got.frames);
    }
    let first = first.ok_or_else(|| BenchError::Usage("no round trip to time".into()))?;
    Ok(ClientTimes { timed, first })
}
