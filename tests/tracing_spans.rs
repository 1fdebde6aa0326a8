//! The events of a transfer carry the spans of its context, its connection (the peer's
//! pid and uid, the lane) and the transfer itself (its id, bytes and direction).
//!
//! A subscriber that records, for every event, the fields of the spans it happened in is
//! the process's global one (the progress threads are not the test's thread); two
//! contexts of this process talk over the native lane, so the peer is this process.

use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::{Access, Config, Context, LaneKind, LanePolicy, Listener, Span as RegionSpan};
use ferrylink::{Frame, Message};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Field name → value, as text.
#[derive(Debug, Default, Clone)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// An event: its fields (the message among them) and the spans it happened in, outermost
/// first, with their fields.
#[derive(Debug)]
struct Seen {
    fields: Fields,
    spans: Vec<(&'static str, Fields)>,
}

impl Seen {
    fn message(&self) -> &str {
        self.fields.0.get("message").map_or("", String::as_str)
    }
    /// The fields of the innermost span named `name` the event happened in.
    fn span(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.spans.iter().rev().find(|(n, _)| *n == name).map(|(_, f)| &f.0)
    }
}

/// Records every event with its spans' fields.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: LayerContext<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: LayerContext<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|s| (s.name(), s.extensions().get::<Fields>().cloned().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        self.seen().push(Seen { fields, spans });
    }
}

impl Recorder {
    /// The events recorded so far (a test that failed while holding them poisons nothing).
    fn seen(&self) -> std::sync::MutexGuard<'_, Vec<Seen>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The first event whose message is `message` and that happened in a transfer span going
/// `direction`.
fn find<'a>(seen: &'a [Seen], message: &str, direction: &str) -> Option<&'a Seen> {
    seen.iter().find(|e| {
        e.message() == message
            && e.span("transfer").is_some_and(|t| t.get("direction").map(String::as_str) == Some(direction))
    })
}

/// Checks the spans of the event `message` of a `direction` transfer of `bytes` bytes.
fn check_event(recorder: &Recorder, message: &str, direction: &str, bytes: u64) {
    let seen = recorder.seen();
    let event = find(&seen, message, direction)
        .unwrap_or_else(|| panic!("no {message:?} event in a {direction} transfer span"));
    let transfer = event.span("transfer").unwrap();
    assert_eq!(transfer.get("bytes"), Some(&bytes.to_string()), "{event:?}");
    assert!(transfer.get("id").is_some_and(|id| id.parse::<u64>().is_ok()), "{event:?}");
    let connection = event.span("connection").unwrap_or_else(|| panic!("no connection span: {event:?}"));
    assert_eq!(connection.get("peer_pid"), Some(&std::process::id().to_string()), "{event:?}");
    assert_eq!(connection.get("peer_uid"), Some(&nix::unistd::getuid().as_raw().to_string()), "{event:?}");
    assert_eq!(connection.get("lane").map(String::as_str), Some("native"), "{event:?}");
    let context = event.span("context").unwrap_or_else(|| panic!("no context span: {event:?}"));
    assert!(context.get("context").is_some_and(|n| n.parse::<u64>().is_ok()), "{event:?}");
}

#[test]
fn the_events_of_a_transfer_carry_its_context_connection_and_transfer_spans() {
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .expect("the only subscriber of this test binary");

    let config = Config::default().with_lane_policy(LanePolicy::Native);
    let dir = tempfile::Builder::new().prefix("ferrylink-test-").tempdir().unwrap();
    let receiver_ctx = Context::new(config.clone()).unwrap();
    let listener = Listener::bind(&receiver_ctx, dir.path().join("p/s.sock")).unwrap();
    let sender_ctx = Context::new(config).unwrap();
    let sender = sender_ctx.connect(listener.path()).unwrap();
    let receiver = listener.accept_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(receiver.lane(), LaneKind::Native);

    let pending = receiver.recv();
    sender.send(Message::new(b"h".to_vec(), vec![Frame::from(vec![7u8; 1024])])).wait().unwrap();
    let got = pending.wait().unwrap();
    assert_eq!(got.payload_len(), 1024);

    // One-sided: the receiver's context owns a region the sender puts into.
    let region = receiver_ctx.register(shared_host_buffer(4096).unwrap(), Access::ReadWrite).unwrap();
    let source = sender_ctx.register(shared_host_buffer(4096).unwrap(), Access::Read).unwrap();
    let remote = sender.import(&region.key()).wait().unwrap();
    sender.put(&source, &remote, RegionSpan::at(0, 512), None).wait().unwrap();

    check_event(&recorder, "send completed", "send", 1024);
    check_event(&recorder, "receive completed", "recv", 1024);
    check_event(&recorder, "transfer completed", "put", 512);
    // The core's own events of the send's work carry the spans too.
    check_event(&recorder, "data message queued", "send", 1024);
    assert!(find(&recorder.seen(), "data message queued", "recv").is_none(), "a send's event in a receive's span");
}
