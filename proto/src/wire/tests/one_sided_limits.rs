//! Every bound `validate` puts on the one-sided messages, one row each: the message at the
//! bound passes, one past it is refused with that bound's own reason, and its frame does
//! not decode (so removing or loosening any one check fails a row).

use super::super::codec::*;
use super::super::*;
use super::limits;

/// A message at a bound, the same message one past it, and the reason it is refused.
struct Row {
    what: &'static str,
    at_the_bound: WireMessage,
    past_it: WireMessage,
    reason: String,
}

fn row(what: &'static str, at_the_bound: WireMessage, past_it: WireMessage, reason: impl Into<String>) -> Row {
    Row { what, at_the_bound, past_it, reason: reason.into() }
}

fn span(i: u64) -> WireSpan {
    WireSpan { local_offset: i * 8, remote_offset: i * 8, len: 8 }
}

fn transfer_with(spans: Vec<WireSpan>, local: GrantedMemory, notify: Option<Vec<u8>>) -> Box<TransferMessage> {
    let t = TransferMessage { id: 1, op: TransferOp::Put, grant: 2, local, local_len: 1 << 40, spans, notify };
    Box::new(t)
}

fn host() -> GrantedMemory {
    GrantedMemory::Host { region_id: 3, offset: 0 }
}

fn spans(n: usize) -> Vec<WireSpan> {
    (0..n as u64).map(span).collect()
}

fn rma(rkey_len: usize) -> GrantedMemory {
    GrantedMemory::Rma { address: 0x1000, rkey: vec![7; rkey_len], device: false }
}

fn staging(rkey_len: usize) -> GrantedMemory {
    GrantedMemory::Staging { address: 0x1000, rkey: vec![7; rkey_len], device: true }
}

fn device(offset: u64, len: u64) -> GrantedMemory {
    let memory = DeviceMemory::LegacyIpc { handle: [5; 64], buffer_id: 1, alloc_len: 4096 };
    GrantedMemory::Device(DeviceFrameDescriptor { memory, offset, len, device_uuid: [1; 16], event: None })
}

fn granted(memory: GrantedMemory) -> WireMessage {
    let region = GrantedRegion { grant: 4, len: 4096, access: WireAccess::ReadWrite, memory };
    WireMessage::ImportAnswer { request: 5, answer: ImportAnswer::Granted(region) }
}

/// The rows one transfer description gives, wrapped by `wrap` (`Transfer` or `Prepare`).
fn transfer_rows(name: &'static str, wrap: fn(Box<TransferMessage>) -> WireMessage) -> Vec<Row> {
    let plain = |spans, local| wrap(transfer_with(spans, local, None));
    let overflowing = |local_offset, remote_offset| {
        let mut s = spans(2);
        s[1] = WireSpan { local_offset, remote_offset, len: 8 };
        s
    };
    let initiator = "the initiator's memory: ";
    vec![
        row(name, plain(spans(1), host()), plain(vec![], host()), format!("a transfer of 0 spans (1 to {MAX_SPANS})")),
        row(
            name,
            plain(spans(MAX_SPANS), host()),
            plain(spans(MAX_SPANS + 1), host()),
            format!("a transfer of {} spans (1 to {MAX_SPANS})", MAX_SPANS + 1),
        ),
        row(
            name,
            plain(overflowing(u64::MAX - 8, 0), host()),
            plain(overflowing(u64::MAX - 7, 0), host()),
            "span 1: offset + length overflows",
        ),
        row(
            name,
            plain(overflowing(0, u64::MAX - 8), host()),
            plain(overflowing(0, u64::MAX - 7), host()),
            "span 1: offset + length overflows",
        ),
        row(
            name,
            plain(spans(1), rma(MAX_RKEY_BYTES)),
            plain(spans(1), rma(MAX_RKEY_BYTES + 1)),
            format!("{initiator}a remote key of {} bytes (at most {MAX_RKEY_BYTES})", MAX_RKEY_BYTES + 1),
        ),
        row(
            name,
            plain(spans(1), staging(MAX_RKEY_BYTES)),
            plain(spans(1), staging(MAX_RKEY_BYTES + 1)),
            format!("{initiator}a remote key of {} bytes (at most {MAX_RKEY_BYTES})", MAX_RKEY_BYTES + 1),
        ),
        row(
            name,
            plain(spans(1), device(4000, 96)),
            plain(spans(1), device(4000, 97)),
            format!("{initiator}4000+97 lies outside its allocation of 4096 bytes"),
        ),
    ]
}

fn every_one_sided_row() -> Vec<Row> {
    let notify = |n: usize| Some(vec![9u8; n]);
    let key = |n: usize| WireMessage::ImportKey { request: 1, key: vec![2; n] };
    let run = |n| WireMessage::RunPrepared { id: 1, prepared: 2, notify: notify(n) };
    let note = |n: usize| WireMessage::Notify { grant: 1, data: vec![9; n], gate: None };
    let put_with = |n| WireMessage::Transfer(transfer_with(spans(1), host(), notify(n)));
    let over = MAX_NOTIFY_BYTES + 1;
    let mut rows = vec![
        row(
            "ImportKey",
            key(MAX_KEY_BYTES),
            key(MAX_KEY_BYTES + 1),
            format!("a key of 65 bytes (at most {MAX_KEY_BYTES})"),
        ),
        row(
            "ImportAnswer",
            granted(rma(MAX_RKEY_BYTES)),
            granted(rma(MAX_RKEY_BYTES + 1)),
            format!("grant: a remote key of {} bytes (at most {MAX_RKEY_BYTES})", MAX_RKEY_BYTES + 1),
        ),
        row(
            "ImportAnswer",
            granted(device(4000, 96)),
            granted(device(4000, 97)),
            "grant: 4000+97 lies outside its allocation of 4096 bytes",
        ),
        row("ImportAnswer", granted(device(0, 1)), granted(device(u64::MAX, 1)), "grant: offset + length overflows"),
        row(
            "Transfer",
            put_with(MAX_NOTIFY_BYTES),
            put_with(over),
            format!("a notification over {MAX_NOTIFY_BYTES} bytes"),
        ),
        row(
            "Prepare",
            WireMessage::Prepare(transfer_with(spans(1), host(), None)),
            WireMessage::Prepare(transfer_with(spans(1), host(), Some(vec![]))),
            "a prepared transfer with a notification",
        ),
        row("RunPrepared", run(MAX_NOTIFY_BYTES), run(over), format!("a notification of {over} bytes")),
        row("Notify", note(MAX_NOTIFY_BYTES), note(over), format!("a notification of {over} bytes")),
    ];
    rows.extend(transfer_rows("Transfer", WireMessage::Transfer));
    rows.extend(transfer_rows("Prepare", WireMessage::Prepare));
    rows
}

#[test]
fn every_one_sided_limit_refuses_one_past_its_bound_and_passes_at_it() {
    let limits = limits();
    for Row { what, at_the_bound, past_it, reason } in every_one_sided_row() {
        assert_eq!(validate(&at_the_bound, &limits), Ok(()), "{what} at the bound of {reason:?}");
        assert_eq!(validate(&past_it, &limits), Err(WireError::LimitExceeded(reason.clone())), "{what}");
        let decoded = decode_frame(&encode_frame(&past_it), &limits);
        assert!(decoded.is_err(), "{what}: a peer's frame past {reason:?} decoded: {decoded:?}");
    }
}

#[test]
fn one_sided_messages_within_the_body_limit_decode_at_their_bounds() {
    let limits = limits();
    for Row { what, at_the_bound, reason, .. } in every_one_sided_row() {
        let frame = encode_frame(&at_the_bound);
        if frame.len() - FRAME_PREFIX_LEN > limits.max_body_bytes() {
            continue; // the most spans: refused for its size first (`transfer_codec.rs`)
        }
        let (back, used) = decode_frame(&frame, &limits).unwrap_or_else(|e| panic!("{what} ({reason}): {e}")).unwrap();
        assert_eq!((back, used), (at_the_bound, frame.len()), "{what}");
    }
}
