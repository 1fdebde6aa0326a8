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
//! buffer, whose message it echoes; they are dropped after the iteration. The last echo's
//! contents are checked against what was sent.
//!
//! Either way the client posts its receive before its send, so the echo never waits for a
//! receive.

use crate::error::BenchError;
use crate::memory_kind::{FreshBuffers, MemoryKind};
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
}

impl RoundTripOptions {
    fn total(&self) -> usize {
        self.n_warmup_iter + self.n_iter
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

/// The server's side: receive and echo `n_warmup_iter + n_iter` messages. Fresh receive
/// buffers are made one round trip ahead, while the previous receive waits: allocating
/// is the application's cost, and a real server would not make the peer wait for it
/// (cudarc's stock pool trims its memory at every synchronisation, so an allocation
/// there can map memory anew).
pub fn serve(ep: &Endpoint, o: &RoundTripOptions) -> Result<(), BenchError> {
    let mut receives = Receives::new(o, o.server_dev)?;
    let fresh = matches!(receives, Receives::Fresh(_));
    let mut ahead = if fresh { receives.next()? } else { None };
    for i in 0..o.total() {
        let buffers = if fresh { ahead.take() } else { receives.next()? };
        let request = match buffers {
            Some(b) => ep.recv_into(b),
            None => ep.recv(),
        };
        if fresh && i + 1 < o.total() {
            ahead = receives.next()?;
        }
        let got = request.wait().map_err(|e| transport(i, "receive", e))?;
        let back = ep.send(got).wait().map_err(|e| transport(i, "echo", e))?;
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
        match &mut frame {
            Frame::Host(h) => h.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8),
            Frame::Device(d) => d.fill(0x5a)?,
        }
        Ok(Sends::Reuse(Some(Message::new(Vec::new(), vec![frame]))))
    }

    /// The message of round trip `i`.
    fn next(&mut self, i: usize) -> Result<Message, BenchError> {
        match self {
            Sends::Reuse(kept) => kept.take().ok_or_else(|| BenchError::Other("the send buffer was lost".into())),
            Sends::Fresh(fresh) => {
                let buf = fresh.alloc()?;
                buf.fill(fill_value(i))?;
                Ok(Message::new(Vec::new(), vec![Frame::Device(buf)]))
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

/// The client's side: `n_warmup_iter + n_iter` round trips; returns their times. The last
/// echo's contents are checked (host memory, and fresh device buffers) outside the timing.
pub fn run_client(ep: &Endpoint, o: &RoundTripOptions) -> Result<ClientTimes, BenchError> {
    let mut sends = Sends::new(o)?;
    let mut receives = Receives::new(o, o.client_dev)?;
    let mut timed = Vec::with_capacity(o.n_iter);
    let mut first = None;
    for i in 0..o.total() {
        let message = sends.next(i)?;
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
        if i + 1 == o.total() {
            check_echo(&sent, &got, o.memory.is_fresh().then(|| fill_value(i)))?;
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

/// Host echoes must equal what was sent; fresh device echoes must hold `fill` throughout.
fn check_echo(sent: &Message, got: &Message, fill: Option<u8>) -> Result<(), BenchError> {
    match (sent.frames.first(), got.frames.first(), fill) {
        (Some(Frame::Host(a)), Some(Frame::Host(b)), _) if a.as_slice() != b.as_slice() => {
            Err(BenchError::Transport("the echo differs from what was sent".into()))
        }
        (_, Some(Frame::Device(b)), Some(value)) => match b.to_vec()?.iter().position(|&x| x != value) {
            Some(at) => Err(BenchError::Transport(format!(
                "the echo differs from what was sent: byte {at} is not {value:#04x}"
            ))),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}
