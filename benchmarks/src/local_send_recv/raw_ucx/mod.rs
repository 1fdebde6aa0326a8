//! The raw UCX reference of a send run on the UCX lane ([`RawUcx`]), measured after the
//! ferrylink round trips by the same two processes:
//!
//! 1. each side makes a UCX context as the lane makes its own (the library
//!    `FERRYLINK_UCX_LIB` names, else `libucp.so.0`, so the one the lane loaded;
//!    ferrylink's defaults; RMA as the lane has it) and one worker;
//! 2. each sends the other its worker's address (or why it cannot take part: device
//!    memory through a UCX that is not CUDA-aware) over the ferrylink endpoint, a
//!    [`Note`] each way, and connects to the peer's worker;
//! 3. the tag ping-pong of the run's bytes and memory (`ping_pong.rs`): the run's warm-up
//!    round trips, then `n_iter` timed on the client;
//! 4. each side says how its round trips ended ([`Note::Done`] or [`Note::Failed`]) and
//!    keeps progressing its worker until the peer has said so too, so that neither side
//!    drops an endpoint or a worker the other's last operations still need.
//!
//! Every failure is the reference's alone: the client reports why it was left out and
//! the run goes on ([`super::runs`]); the server's goes to its stderr.

mod note;
mod ping_pong;

use crate::onesided::Op;
use crate::raw_ucx::RawUcx;
use crate::roundtrip::RoundTripOptions;
use crate::ObjectType;
use ferrylink::transport::{Context, Endpoint, LaneKind, RecvRequest};
use ferrylink::Message;
use ferrylink_ucx::{UcxConfig, UcxContext, UcxWorker, WorkerAddress};
use note::Note;
use ping_pong::{Stop, Waits};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Whether a run measures the reference: sends on the UCX lane.
pub(super) fn applies(o: &RoundTripOptions, lane: LaneKind) -> bool {
    o.op == Op::Send && lane == LaneKind::Ucx
}

/// One side of the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

impl Side {
    /// The other side, as errors name it.
    fn peer(self) -> &'static str {
        match self {
            Side::Client => "the server",
            Side::Server => "the client",
        }
    }
}

/// The client's side: the timed raw UCX round trips, or why there are none.
pub(super) fn measure(ctx: &Context, ep: &Endpoint, o: &RoundTripOptions) -> Result<RawUcx, String> {
    let (times, version) = take_part(ctx, ep, o, Side::Client, ping_pong::client)?;
    Ok(RawUcx::from_times(&times, method(&version, o)))
}

/// The server's side: answers the client's raw UCX round trips.
pub(super) fn serve(ctx: &Context, ep: &Endpoint, o: &RoundTripOptions) -> Result<(), String> {
    take_part(ctx, ep, o, Side::Server, ping_pong::server).map(drop)
}

/// What the reference's method says: the UCX version and the memory.
fn method(version: &str, o: &RoundTripOptions) -> String {
    let memory = match o.object_type {
        ObjectType::Host => "host memory".to_owned(),
        ObjectType::Device => format!("device memory (pool), client GPU {}, server GPU {}", o.client_dev, o.server_dev),
    };
    format!("UCX {version} tag send + receive each way, {memory}")
}

/// This side's UCX: a context as the lane's (see the module) and a worker; the UCX
/// version; or why this side cannot take part.
fn open(ctx: &Context, o: &RoundTripOptions) -> Result<(UcxWorker, String), String> {
    let config = ctx.config();
    let mut ucx = UcxConfig::new().rma(config.ucx_rma);
    if let Some(path) = &config.ucx_library {
        ucx = ucx.library_path(path);
    }
    let context = UcxContext::new(&ucx).map_err(|e| format!("making a UCX context: {e}"))?;
    let version = context.version().to_string();
    if o.object_type == ObjectType::Device && !context.supports_cuda_memory() {
        return Err(format!("UCX {version} is not CUDA-aware: it cannot move device memory"));
    }
    let worker = UcxWorker::new(&context).map_err(|e| format!("making a UCX worker: {e}"))?;
    Ok((worker, version))
}

/// Steps 1 and 2: this side's worker and the peer's address, once both can take part.
fn meet(
    ctx: &Context,
    ep: &Endpoint,
    o: &RoundTripOptions,
    side: Side,
) -> Result<(UcxWorker, String, Vec<u8>), String> {
    let peer = side.peer();
    let local = open(ctx, o).and_then(|(worker, version)| {
        let address = worker.address().map_err(|e| format!("this worker's address: {e}"))?;
        Ok((worker, version, address.into_bytes()))
    });
    let mine = match &local {
        Ok((_, _, address)) => Note::Ready(address.clone()),
        Err(why) => Note::Unable(why.clone()),
    };
    // Posted before this side's note goes, so neither side's send waits on the other.
    let theirs = ep.recv();
    ep.send(Message::new(mine.to_bytes(), Vec::new())).wait().map_err(|e| format!("sending to {peer}: {e}"))?;
    let got = theirs.wait().map_err(|e| format!("receiving {peer}'s worker address: {e}"))?;
    let theirs = Note::from_bytes(&got.header).map_err(|e| format!("{peer}'s first message: {e}"))?;
    let (worker, version, _) = local?;
    match theirs {
        Note::Ready(address) => Ok((worker, version, address)),
        Note::Unable(why) => Err(format!("{peer} cannot take part: {why}")),
        other => Err(format!("{peer} sent {other:?} where its worker address belongs")),
    }
}

/// This side's round trips of `round_trips`, between meeting the peer and the end
/// (see the module); their result and the UCX version.
fn take_part<T>(
    ctx: &Context,
    ep: &Endpoint,
    o: &RoundTripOptions,
    side: Side,
    round_trips: impl FnOnce(&ferrylink_ucx::UcxEndpoint, &Waits<'_>, &RoundTripOptions) -> Result<T, Stop>,
) -> Result<(T, String), String> {
    let (worker, version, address) = meet(ctx, ep, o, side)?;
    let timeout = ctx.config().request_timeout;
    let peer_end = RefCell::new(PeerEnd { request: ep.recv(), note: None });
    // SAFETY: the bytes are the peer's `UcxWorker::address`, carried unchanged by the
    // ferrylink endpoint's framed, checked messages; the peer loaded the same UCX (its
    // context is made from the same configuration).
    let address = unsafe { WorkerAddress::from_bytes_unchecked(address) };
    let (result, ucx_ep) = match worker.connect(&address) {
        Ok(ucx_ep) => {
            let waits = Waits { worker: &worker, peer_end: &peer_end, timeout };
            (round_trips(&ucx_ep, &waits, o), Some(ucx_ep))
        }
        Err(e) => (Err(Stop::Failed(format!("connecting to {}'s worker: {e}", side.peer()))), None),
    };
    let result = end(ep, &worker, peer_end.into_inner(), result, timeout, side.peer());
    // Only now, both sides done: the endpoint, then the worker (and its context).
    drop(ucx_ep);
    drop(worker);
    result.map(|value| (value, version))
}

/// The peer's last note: a ferrylink receive posted before the round trips, looked at
/// while this side waits on UCX (`ping_pong::Waits`).
struct PeerEnd {
    request: RecvRequest,
    /// The note, once taken from the request.
    note: Option<Result<Note, String>>,
}

impl PeerEnd {
    /// The note, if it came (never blocks).
    fn poll(&mut self) -> Option<&Result<Note, String>> {
        if self.note.is_none() && self.request.is_complete() {
            self.note = self.request.wait_timeout(Duration::ZERO).map(|got| {
                got.map_err(|e| format!("receiving the peer's last message: {e}"))
                    .and_then(|m| Note::from_bytes(&m.header))
            });
        }
        self.note.as_ref()
    }
}

/// Step 4: tells the peer how this side's round trips ended, progresses the worker until
/// the peer's note came (at most `timeout`), and puts both together.
fn end<T>(
    ep: &Endpoint,
    worker: &UcxWorker,
    mut peer_end: PeerEnd,
    result: Result<T, Stop>,
    timeout: Duration,
    peer: &str,
) -> Result<T, String> {
    let mine = match &result {
        Ok(_) => Note::Done,
        Err(Stop::PeerStopped) => Note::Failed(format!("{peer} stopped")),
        Err(Stop::Failed(why)) => Note::Failed(why.clone()),
    };
    let sent = ep.send(Message::new(mine.to_bytes(), Vec::new()));
    let deadline = Instant::now() + timeout;
    while peer_end.poll().is_none() && Instant::now() < deadline {
        worker.progress();
    }
    let theirs = peer_end.note.unwrap_or_else(|| Err(format!("{peer} said nothing within {timeout:?}")));
    sent.wait().map_err(|e| format!("telling {peer} the round trips ended: {e}"))?;
    match (result, theirs) {
        (Ok(value), Ok(Note::Done)) => Ok(value),
        (Err(Stop::Failed(why)), _) => Err(why),
        (_, Ok(Note::Failed(why))) => Err(format!("{peer}: {why}")),
        (_, Ok(other)) => Err(format!("{peer} ended with {other:?}")),
        (_, Err(e)) => Err(e),
    }
}
