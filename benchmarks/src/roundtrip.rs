//! The round trip `local-send-recv` times, as ucx-py's benchmark does it: the client sends
//! n bytes, the server receives them and sends them back; one iteration is the client's
//! send + receive.
//!
//! - The client's **send** buffer is made once and reused (the transport hands it back);
//!   host send buffers are memfd shared buffers ([`ferrylink::ipc::shared_host_buffer`]),
//!   which the native lane sends without a copy; device ones come from the exportable
//!   device pool.
//! - Without `reuse_alloc` every **receive** lands in fresh memory of the transport's choice
//!   (`ep.recv()`), and the server echoes that very message, as ucx-py's server echoes a
//!   freshly allocated array. With `reuse_alloc` both sides receive into one preallocated
//!   buffer (`ep.recv_into`), allocated like the send buffer.
//! - The client posts its receive before its send, so the echo never waits for a receive.

use crate::error::BenchError;
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

/// The server's side: receive and echo `n_warmup_iter + n_iter` messages.
pub fn serve(ep: &Endpoint, o: &RoundTripOptions) -> Result<(), BenchError> {
    let mut buffers =
        if o.reuse_alloc { Some(vec![alloc_frame(o.object_type, o.server_dev, o.n_bytes)?]) } else { None };
    for i in 0..o.total() {
        let request = match buffers.take() {
            Some(b) => ep.recv_into(b),
            None => ep.recv(),
        };
        let got = request.wait().map_err(|e| transport(i, "receive", e))?;
        let back = ep.send(got).wait().map_err(|e| transport(i, "echo", e))?;
        if o.reuse_alloc {
            buffers = Some(back.frames);
        }
    }
    Ok(())
}

/// The client's side: `n_warmup_iter + n_iter` round trips; returns the timed ones'
/// durations. The last echo's contents are checked (host memory) outside the timing.
pub fn run_client(ep: &Endpoint, o: &RoundTripOptions) -> Result<Vec<Duration>, BenchError> {
    let mut frame = alloc_frame(o.object_type, o.client_dev, o.n_bytes)?;
    match &mut frame {
        Frame::Host(h) => h.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8),
        Frame::Device(d) => d.fill(0x5a)?,
    }
    let mut message = Message::new(Vec::new(), vec![frame]);
    let mut buffers =
        if o.reuse_alloc { Some(vec![alloc_frame(o.object_type, o.client_dev, o.n_bytes)?]) } else { None };
    let mut times = Vec::with_capacity(o.n_iter);
    for i in 0..o.total() {
        let start = Instant::now();
        tracing::trace!("{}", crate::timeline::ROUND_TRIP_STARTS);
        let request = match buffers.take() {
            Some(b) => ep.recv_into(b),
            None => ep.recv(),
        };
        message = ep.send(message).wait().map_err(|e| transport(i, "send", e))?;
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
            check_echo(&message, &got)?;
        }
        if i >= o.n_warmup_iter {
            times.push(elapsed);
        }
        if o.reuse_alloc {
            buffers = Some(got.frames);
        }
    }
    Ok(times)
}

fn check_echo(sent: &Message, got: &Message) -> Result<(), BenchError> {
    if let (Some(Frame::Host(a)), Some(Frame::Host(b))) = (sent.frames.first(), got.frames.first()) {
        if a.as_slice() != b.as_slice() {
            return Err(BenchError::Transport("the echo differs from what was sent".into()));
        }
    }
    Ok(())
}
