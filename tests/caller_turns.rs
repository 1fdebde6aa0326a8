//! A caller waiting on a request of a native-lane endpoint takes the progress thread's
//! turns for it (`Config::caller_turns`): some of the control messages of a round trip are
//! then published into the ring by the callers' own threads. With the setting off, and on
//! the UCX lane whatever the setting, only the progress threads publish.
//!
//! A subscriber records the thread of every "control message published in the ring"
//! event; two contexts of this process talk, so both sides are seen.

use ferrylink::transport::{Config, Context, LaneKind, LanePolicy, Listener};
use ferrylink::{Frame, Message};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::Layer;

const PUBLISHED: &str = "control message published in the ring";
const PROGRESS_THREAD: &str = "ferrylink-progress";

/// The names of the threads that published control messages into a ring.
#[derive(Clone, Default)]
struct Publishers(Arc<Mutex<Vec<String>>>);

struct PublishedCheck<'a>(&'a mut bool);

impl tracing::field::Visit for PublishedCheck<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}") == PUBLISHED {
            *self.0 = true;
        }
    }
}

impl<S: Subscriber> Layer<S> for Publishers {
    fn on_event(&self, event: &Event<'_>, _ctx: LayerContext<'_, S>) {
        let mut published = false;
        event.record(&mut PublishedCheck(&mut published));
        if published {
            let name = std::thread::current().name().unwrap_or("(unnamed)").to_owned();
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(name);
        }
    }
}

impl Publishers {
    /// The publishers recorded since the last call.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `rounds` round trips of 1 kB between two contexts with `config`, the echo checked; the
/// endpoints' lane.
fn round_trips(config: Config, rounds: usize) -> LaneKind {
    let dir = tempfile::Builder::new().prefix("ferrylink-test-").tempdir().unwrap();
    let server_ctx = Context::new(config.clone()).unwrap();
    let listener = Listener::bind(&server_ctx, dir.path().join("p/s.sock")).unwrap();
    let client_ctx = Context::new(config).unwrap();
    let client = client_ctx.connect(listener.path()).unwrap();
    let server = listener.accept_timeout(Duration::from_secs(10)).unwrap();
    let lane = client.lane();
    let echo = std::thread::Builder::new()
        .name("echo".into())
        .spawn(move || {
            for _ in 0..rounds {
                let message = server.recv().wait().unwrap();
                server.send(message).wait().unwrap();
            }
        })
        .unwrap();
    for round in 0..rounds {
        let bytes = vec![round as u8; 1000];
        let reply = client.recv();
        client.send(Message::new(Vec::new(), vec![Frame::from(bytes.clone())])).wait().unwrap();
        let got = reply.wait().unwrap();
        assert_eq!(got.frames[0].as_host().unwrap().as_slice(), &bytes[..], "round trip {round}");
    }
    echo.join().unwrap();
    lane
}

#[test]
fn waiting_callers_publish_on_the_native_lane_and_never_on_the_ucx_lane() {
    let publishers = Publishers::default();
    let subscriber = tracing_subscriber::registry()
        .with(publishers.clone().with_filter(tracing_subscriber::filter::LevelFilter::from_level(Level::TRACE)));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
    let native = Config::default().with_lane_policy(LanePolicy::Native);

    assert_eq!(round_trips(native.clone(), 200), LaneKind::Native);
    let seen = publishers.take();
    let by_callers = seen.iter().filter(|name| *name != PROGRESS_THREAD).count();
    assert!(by_callers > 0, "none of the {} control messages of 200 round trips was published by a caller", seen.len());
    let others: Vec<&String> =
        seen.iter().filter(|n| *n != PROGRESS_THREAD && *n != "echo" && !n.starts_with("waiting_callers")).collect();
    assert!(others.is_empty(), "published by threads that neither wait nor progress: {others:?}");

    round_trips(native.with_caller_turns(false), 200);
    let seen = publishers.take();
    let by_callers = seen.iter().filter(|name| *name != PROGRESS_THREAD).count();
    assert!(!seen.is_empty() && by_callers == 0, "caller turns off: {by_callers} of {} by callers", seen.len());

    // The UCX lane's worker stays on the progress thread, so its connections do too.
    let ucx = Config::default().with_lane_policy(LanePolicy::Ucx);
    if Context::new(ucx.clone()).is_err() {
        eprintln!("skipping the UCX lane: UCX cannot be loaded here");
        return;
    }
    assert_eq!(round_trips(ucx, 100), LaneKind::Ucx);
    let seen = publishers.take();
    let by_callers = seen.iter().filter(|name| *name != PROGRESS_THREAD).count();
    assert!(!seen.is_empty() && by_callers == 0, "UCX lane: {by_callers} of {} by callers", seen.len());
}
