//! Unit tests of slots and request handles, with a link that records what the handles
//! ask of the progress thread.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Wake, Waker};

type SendResult = Result<Message, SendError>;
type RecvResult = Result<Message, RecvError>;

/// Records every call; `on_cancel` plays the progress thread answering a cancel.
struct Recorder<T> {
    calls: Arc<Mutex<Vec<&'static str>>>,
    unclaimed: Arc<Mutex<Vec<T>>>,
    deadlines: Arc<Mutex<Vec<Instant>>>,
    on_cancel: Box<dyn Fn() + Send + Sync>,
}

/// What a [`Recorder`] saw, kept by the test.
struct Seen<T> {
    calls: Arc<Mutex<Vec<&'static str>>>,
    unclaimed: Arc<Mutex<Vec<T>>>,
    deadlines: Arc<Mutex<Vec<Instant>>>,
}

impl<T> Seen<T> {
    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
}

fn recorder<T>(on_cancel: impl Fn() + Send + Sync + 'static) -> (Box<Recorder<T>>, Seen<T>) {
    let seen = Seen { calls: Arc::default(), unclaimed: Arc::default(), deadlines: Arc::default() };
    let link = Recorder {
        calls: seen.calls.clone(),
        unclaimed: seen.unclaimed.clone(),
        deadlines: seen.deadlines.clone(),
        on_cancel: Box::new(on_cancel),
    };
    (Box::new(link), seen)
}

impl<T: Send> Link<T> for Recorder<T> {
    fn cancel(&self) {
        self.calls.lock().unwrap().push("cancel");
        (self.on_cancel)();
    }
    fn withdraw(&self) {
        self.calls.lock().unwrap().push("withdraw");
    }
    fn unclaimed(&self, value: T) {
        self.calls.lock().unwrap().push("unclaimed");
        self.unclaimed.lock().unwrap().push(value);
    }
    fn expire_at(&self, at: Instant) {
        self.calls.lock().unwrap().push("expire_at");
        self.deadlines.lock().unwrap().push(at);
    }
}

fn message(header: &[u8]) -> Message {
    Message::new(header.to_vec(), vec![])
}

#[test]
fn first_completion_wins_and_wait_returns_it() {
    let slot = Slot::new();
    assert!(slot.complete(Ok(Message::default())).is_ok());
    let late = slot.complete(Err(SendError::new(TransportError::EndpointClosed, None)));
    assert!(late.is_err(), "a second completion is handed back");
    let (link, seen) = recorder::<SendResult>(|| {});
    let req = SendRequest::new(slot, Duration::from_secs(1), Duration::ZERO, link);
    assert!(req.is_complete());
    assert!(req.wait().is_ok());
    assert!(seen.calls().is_empty(), "a taken result leaves nothing to do: {:?}", seen.calls());
}

#[test]
fn wait_times_out_cancels_and_reports_timeout() {
    let cancelled = Arc::new(AtomicBool::new(false));
    let c = cancelled.clone();
    let slot = Slot::new();
    let s2 = slot.clone();
    // The "progress thread" answers the cancel with the timeout error.
    let (link, _seen) = recorder::<RecvResult>(move || {
        c.store(true, Ordering::SeqCst);
        let error = TransportError::TimedOut(Duration::from_millis(20));
        let _ = s2.complete(Err(RecvError::new(error, None)));
    });
    let req = RecvRequest::new(slot, Duration::from_millis(20), Duration::from_micros(100), link);
    let err = req.wait().unwrap_err();
    assert!(cancelled.load(Ordering::SeqCst));
    assert!(matches!(err.error, TransportError::TimedOut(_)));
}

#[test]
fn a_completion_racing_the_cancel_is_not_lost() {
    let slot = Slot::new();
    let s2 = slot.clone();
    let (link, _seen) = recorder::<RecvResult>(move || {
        let _ = s2.complete(Ok(message(b"late")));
    });
    let req = RecvRequest::new(slot, Duration::from_millis(10), Duration::ZERO, link);
    assert_eq!(req.wait().unwrap().header, b"late");
}

#[test]
fn wait_timeout_leaves_the_request_usable() {
    let slot = Slot::new();
    let (link, _seen) = recorder::<SendResult>(|| {});
    let mut req = SendRequest::new(slot.clone(), Duration::from_secs(1), Duration::from_micros(50), link);
    assert!(req.wait_timeout(Duration::from_millis(1)).is_none());
    assert!(slot.complete(Ok(Message::default())).is_ok());
    assert!(req.wait_timeout(Duration::from_millis(1)).unwrap().is_ok());
}

#[test]
fn dropping_a_pending_request_withdraws_it_and_later_completions_come_back() {
    let slot = Slot::new();
    let (link, seen) = recorder::<RecvResult>(|| {});
    drop(RecvRequest::new(slot.clone(), Duration::from_secs(1), Duration::ZERO, link));
    assert_eq!(seen.calls(), ["withdraw"]);
    let back = slot.complete(Ok(message(b"m"))).expect_err("nobody takes it: it comes back");
    assert_eq!(back.unwrap().header, b"m");
}

#[test]
fn dropping_a_completed_request_hands_the_untaken_result_to_the_link() {
    let slot = Slot::new();
    let (link, seen) = recorder::<RecvResult>(|| {});
    let req = RecvRequest::new(slot.clone(), Duration::from_secs(1), Duration::ZERO, link);
    assert!(slot.complete(Ok(message(b"m"))).is_ok());
    drop(req);
    assert_eq!(seen.calls(), ["unclaimed"]);
    let unclaimed = seen.unclaimed.lock().unwrap().pop().unwrap();
    assert_eq!(unclaimed.unwrap().header, b"m");
}

/// The progress thread completes a slot while its handle is being dropped: whichever
/// wins, the message reaches exactly one of the two (never neither, never both).
#[test]
fn a_completion_racing_the_drop_reaches_exactly_one_side() {
    let (mut via_link, mut via_complete) = (0, 0);
    for _ in 0..2000 {
        let slot = Slot::new();
        let (link, seen) = recorder::<RecvResult>(|| {});
        let req = RecvRequest::new(slot.clone(), Duration::from_secs(1), Duration::ZERO, link);
        let completer = std::thread::spawn(move || slot.complete(Ok(message(b"m"))).is_err());
        drop(req);
        let handed_back = completer.join().unwrap();
        let unclaimed = seen.unclaimed.lock().unwrap().len();
        assert_eq!(usize::from(handed_back) + unclaimed, 1, "calls: {:?}", seen.calls());
        via_link += unclaimed;
        via_complete += usize::from(handed_back);
    }
    assert_eq!(via_link + via_complete, 2000);
}

struct Flag(AtomicBool);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn future_is_woken_on_completion_and_gives_its_deadline_once() {
    let slot = Slot::new();
    let (link, seen) = recorder::<SendResult>(|| {});
    let timeout = Duration::from_secs(7);
    let mut req = SendRequest::new(slot.clone(), timeout, Duration::from_micros(50), link);
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = TaskContext::from_waker(&waker);
    let before = Instant::now();
    assert!(Pin::new(&mut req).poll(&mut cx).is_pending());
    assert!(Pin::new(&mut req).poll(&mut cx).is_pending());
    assert_eq!(seen.calls(), ["expire_at"], "one deadline, however often it is polled");
    let at = seen.deadlines.lock().unwrap()[0];
    assert!(at >= before + timeout && at <= Instant::now() + timeout, "the bound of wait(): {timeout:?}");
    assert!(slot.complete(Ok(Message::default())).is_ok());
    assert!(flag.0.load(Ordering::SeqCst));
    assert!(matches!(Pin::new(&mut req).poll(&mut cx), Poll::Ready(Ok(_))));
    drop(req);
    assert_eq!(seen.calls(), ["expire_at"], "a taken result leaves nothing to withdraw");
}

#[test]
fn a_future_ready_at_its_first_poll_gives_no_deadline() {
    let slot = Slot::new();
    assert!(slot.complete(Ok(Message::default())).is_ok());
    let (link, seen) = recorder::<SendResult>(|| {});
    let mut req = SendRequest::new(slot, Duration::from_secs(1), Duration::ZERO, link);
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag);
    assert!(Pin::new(&mut req).poll(&mut TaskContext::from_waker(&waker)).is_ready());
    drop(req);
    assert!(seen.calls().is_empty(), "{:?}", seen.calls());
}
