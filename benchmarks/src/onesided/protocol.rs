//! What the client and the server of a one-sided round trip say to each other besides
//! the transfers: the setup ([`Hello`]: the options both must share and the key of the
//! region the peer is to use, a two-sided message each way, then each imports the
//! other's key), the notifications (the round trip's number), the end of the run
//! ([`DONE`]) and the test hook's stand-in for a skipped transfer ([`SKIPPED`]).

use super::layout::BlockLayout;
use super::{OneSided, Side};
use crate::BenchError;
use ferrylink::transport::onesided::KEY_LEN;
use ferrylink::transport::{
    Endpoint, NotificationRequest, PreparedTransfer, RecvRequest, Registration, RemoteKey, RemoteRegion, Span,
    TransferRequest,
};
use ferrylink::Message;

const MAGIC: [u8; 4] = *b"FLB1";
/// Bytes of an encoded [`Hello`].
pub const HELLO_LEN: usize = 24 + KEY_LEN;

/// The client's last message: it has checked what it needed of the server's region, which
/// may go now.
pub const DONE: &[u8] = b"done";

/// Test only (`--skip-transfer-for-test`): the message that stands in for a transfer's
/// notification when a side skips its transfer of a round trip.
pub const SKIPPED: &[u8] = b"skipped";

/// One side's setup message: who sends it, the operation, bytes and blocks it runs (both
/// sides must agree) and the key of its region the peer is to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The side that sends it (an `--op send` server echoes the client's own).
    pub side: Side,
    /// Put or get.
    pub op: OneSided,
    /// Bytes per direction.
    pub n_bytes: u64,
    /// Spans per request.
    pub blocks: u64,
    /// The region the peer imports.
    pub key: RemoteKey,
}

impl Hello {
    /// Magic, the operation (1 put, 2 get), the side (1 client, 2 server), two zero bytes,
    /// `n_bytes` and `blocks` (little-endian), the key's bytes.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HELLO_LEN);
        out.extend_from_slice(&MAGIC);
        out.push(match self.op {
            OneSided::Put => 1,
            OneSided::Get => 2,
        });
        out.push(match self.side {
            Side::Client => 1,
            Side::Server => 2,
        });
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&self.n_bytes.to_le_bytes());
        out.extend_from_slice(&self.blocks.to_le_bytes());
        out.extend_from_slice(&self.key.to_bytes());
        out
    }

    /// Parses [`Hello::to_bytes`]; anything else is an error saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Hello, String> {
        const SEND: &str = "is the peer an --op send run? Start both sides with the same --op";
        if bytes.len() != HELLO_LEN {
            return Err(format!("a setup message has {HELLO_LEN} bytes, not {} ({SEND})", bytes.len()));
        }
        if bytes[..4] != MAGIC || bytes[6..8] != [0; 2] {
            return Err(format!("not a one-sided setup message of this benchmark ({SEND})"));
        }
        let op = match bytes[4] {
            1 => OneSided::Put,
            2 => OneSided::Get,
            b => return Err(format!("a setup message with an unknown operation {b}")),
        };
        let side = match bytes[5] {
            1 => Side::Client,
            2 => Side::Server,
            b => return Err(format!("a setup message from an unknown side {b}")),
        };
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let key = RemoteKey::from_bytes(&bytes[24..]).map_err(|e| format!("the setup message's key: {e}"))?;
        Ok(Hello { side, op, n_bytes: u64_at(8), blocks: u64_at(16), key })
    }

    /// Whether the peer (the other side) runs what this side runs; the error names both.
    pub fn check_matches(&self, mine: &Hello) -> Result<(), String> {
        if self.side == mine.side {
            return Err(
                "the peer answered with this side's own setup message: it echoes messages, as an --op send server \
                 does; start both sides with the same --op"
                    .into(),
            );
        }
        let describe = |h: &Hello| format!("--op {} -n {} --blocks {}", h.op, h.n_bytes, h.blocks);
        if (self.op, self.n_bytes, self.blocks) == (mine.op, mine.n_bytes, mine.blocks) {
            return Ok(());
        }
        Err(format!(
            "the peer runs {}, this side {}: start both sides with the same --op, -n and --blocks",
            describe(self),
            describe(mine)
        ))
    }
}

fn setup_error(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Transport(format!("one-sided setup: {what}: {e}"))
}

/// Sends `side`'s hello (with `key`, the region the peer is to use).
fn send_hello(
    ep: &Endpoint,
    side: Side,
    op: OneSided,
    layout: &BlockLayout,
    key: RemoteKey,
) -> Result<Hello, BenchError> {
    let mine = Hello { side, op, n_bytes: layout.n() as u64, blocks: layout.blocks() as u64, key };
    ep.send(Message::new(mine.to_bytes(), Vec::new())).wait().map_err(|e| setup_error("sending the key", e))?;
    Ok(mine)
}

/// Receives the peer's hello and checks it against `mine`.
fn recv_hello(ep: &Endpoint, mine: &Hello) -> Result<Hello, BenchError> {
    let got = ep.recv().wait().map_err(|e| setup_error("receiving the peer's key", e))?;
    let theirs = Hello::from_bytes(&got.header).map_err(|e| setup_error("the peer's setup message", e))?;
    theirs.check_matches(mine).map_err(|e| setup_error("options", e))?;
    Ok(theirs)
}

fn import(ep: &Endpoint, theirs: &Hello) -> Result<RemoteRegion, BenchError> {
    ep.import(&theirs.key).wait().map_err(|e| setup_error("importing the peer's region", e))
}

/// The client's setup: sends its hello, receives the server's, imports its region.
pub fn client_setup(
    ep: &Endpoint,
    op: OneSided,
    layout: &BlockLayout,
    key: RemoteKey,
) -> Result<RemoteRegion, BenchError> {
    let mine = send_hello(ep, Side::Client, op, layout, key)?;
    import(ep, &recv_hello(ep, &mine)?)
}

/// The server's setup: receives the client's hello, checks it, answers with its own
/// (after a mismatch too, so that the client says what differs), imports the client's
/// region.
pub fn server_setup(
    ep: &Endpoint,
    op: OneSided,
    layout: &BlockLayout,
    key: RemoteKey,
) -> Result<RemoteRegion, BenchError> {
    let got = ep.recv().wait().map_err(|e| setup_error("receiving the client's key", e))?;
    let mine = send_hello(ep, Side::Server, op, layout, key)?;
    let theirs = Hello::from_bytes(&got.header).map_err(|e| setup_error("the client's setup message", e))?;
    theirs.check_matches(&mine).map_err(|e| setup_error("options", e))?;
    import(ep, &theirs)
}

/// The notification of round trip `round_trip`: its number, little-endian.
pub fn note(round_trip: usize) -> Vec<u8> {
    (round_trip as u64).to_le_bytes().to_vec()
}

/// A put or get of `spans` from / into `local` on `remote`, with `notify`.
pub fn transfer(
    ep: &Endpoint,
    op: OneSided,
    local: &Registration,
    remote: &RemoteRegion,
    spans: &[Span],
    notify: Option<Vec<u8>>,
) -> TransferRequest {
    match op {
        OneSided::Put => ep.put_batch(local, remote, spans, notify),
        OneSided::Get => ep.get_batch(local, remote, spans, notify),
    }
}

/// How a side issues its round trips' transfers: with their spans each time, or
/// prepared once and posted (`--prepared`).
pub enum Issuer {
    /// `put_batch` / `get_batch` with these spans.
    Spans(Vec<Span>),
    /// `post` of this.
    Prepared(PreparedTransfer),
}

impl Issuer {
    /// The issuer of `op`s of `spans` between `local` and `remote` on `ep`, prepared now
    /// when `prepared`.
    pub fn new(
        ep: &Endpoint,
        op: OneSided,
        (local, remote): (&Registration, &RemoteRegion),
        spans: Vec<Span>,
        prepared: bool,
    ) -> Result<Issuer, BenchError> {
        if !prepared {
            return Ok(Issuer::Spans(spans));
        }
        let made = match op {
            OneSided::Put => ep.prepare_put_batch(local, remote, &spans),
            OneSided::Get => ep.prepare_get_batch(local, remote, &spans),
        };
        made.map(Issuer::Prepared).map_err(|e| BenchError::Transport(format!("preparing the {op}: {e}")))
    }

    /// One transfer, with `notify`.
    pub fn issue(
        &self,
        ep: &Endpoint,
        op: OneSided,
        (local, remote): (&Registration, &RemoteRegion),
        notify: Option<Vec<u8>>,
    ) -> TransferRequest {
        match self {
            Issuer::Spans(spans) => transfer(ep, op, local, remote, spans, notify),
            Issuer::Prepared(prepared) => ep.post(prepared, notify),
        }
    }
}

/// What ends a side's wait in a round trip: the peer's notification, or (test hook) the
/// message that stands in for it.
pub enum Incoming {
    /// A notification.
    Note(NotificationRequest),
    /// A [`SKIPPED`] message.
    Skipped(RecvRequest),
}

impl Incoming {
    /// Posts the wait for round trip `round_trip`'s answer: [`SKIPPED`] when the peer
    /// skips its transfer then, else its notification.
    pub fn post(ep: &Endpoint, peer_skips: bool) -> Incoming {
        if peer_skips {
            Incoming::Skipped(ep.recv())
        } else {
            Incoming::Note(ep.recv_notification())
        }
    }

    /// Waits for it; a notification must name `round_trip`.
    pub fn wait(self, round_trip: usize) -> Result<(), BenchError> {
        let error = |what: String| BenchError::Transport(format!("round trip {round_trip}: {what}"));
        match self {
            Incoming::Note(request) => {
                let got = request.wait().map_err(|e| error(format!("waiting for the peer's notification: {e}")))?;
                if got.data != note(round_trip) {
                    return Err(error(format!(
                        "the peer's notification is {:?}, expected {:?}",
                        got.data,
                        note(round_trip)
                    )));
                }
            }
            Incoming::Skipped(request) => {
                let got = request.wait().map_err(|e| error(format!("waiting for the peer's message: {e}")))?;
                if got.header != SKIPPED {
                    return Err(error(format!("the peer's message is {:?}, expected {SKIPPED:?}", got.header)));
                }
            }
        }
        Ok(())
    }
}

/// Sends a message of `header` alone.
pub fn send_header(ep: &Endpoint, header: &[u8]) -> Result<(), ferrylink::transport::SendError> {
    ep.send(Message::new(header.to_vec(), Vec::new())).wait().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrylink::ipc::shared_host_buffer;
    use ferrylink::transport::{Access, Config, Context};

    fn key() -> RemoteKey {
        let ctx = Context::new(Config::default()).unwrap();
        ctx.register(shared_host_buffer(64).unwrap(), Access::Write).unwrap().key()
    }

    #[test]
    fn hellos_round_trip_and_refuse_other_bytes() {
        let h = Hello { side: Side::Server, op: OneSided::Get, n_bytes: 65_536_000, blocks: 1000, key: key() };
        let bytes = h.to_bytes();
        assert_eq!(bytes.len(), HELLO_LEN);
        assert_eq!(Hello::from_bytes(&bytes).unwrap(), h);
        assert!(Hello::from_bytes(&bytes[1..]).unwrap_err().contains("72 bytes"));
        assert!(Hello::from_bytes(&[]).unwrap_err().contains("--op send"), "an --op send peer's empty header");
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(Hello::from_bytes(&bad).unwrap_err().contains("not a one-sided setup message"));
        let mut bad = bytes.clone();
        bad[4] = 3;
        assert!(Hello::from_bytes(&bad).unwrap_err().contains("unknown operation 3"));
        let mut bad = bytes.clone();
        bad[5] = 0;
        assert!(Hello::from_bytes(&bad).unwrap_err().contains("unknown side 0"));
        let mut bad = bytes;
        bad[40] ^= 0xff;
        assert!(Hello::from_bytes(&bad).is_ok(), "the key's context id is any 16 bytes");
        bad[24] = 0;
        assert!(Hello::from_bytes(&bad).unwrap_err().contains("key"));
    }

    #[test]
    fn hellos_must_agree_on_op_size_and_blocks() {
        let k = key();
        let a = Hello { side: Side::Client, op: OneSided::Put, n_bytes: 1000, blocks: 10, key: k };
        let server = Hello { side: Side::Server, key: key(), ..a };
        assert!(server.check_matches(&a).is_ok() && a.check_matches(&server).is_ok(), "keys differ by nature");
        let e = a.check_matches(&a).unwrap_err();
        assert!(e.contains("this side's own setup message") && e.contains("--op send server"), "{e}");
        for other in
            [Hello { op: OneSided::Get, ..server }, Hello { n_bytes: 2000, ..server }, Hello { blocks: 1, ..server }]
        {
            let e = other.check_matches(&a).unwrap_err();
            assert!(e.contains("--op put -n 1000 --blocks 10") && e.contains("the same --op"), "{e}");
        }
    }

    #[test]
    fn notes_name_the_round_trip() {
        assert_eq!(note(0x0102), [2, 1, 0, 0, 0, 0, 0, 0]);
        assert_ne!(note(1), note(2));
    }
}
