//! `local-send-recv --timeline`: where a round trip's time goes, step by step, in both
//! processes.
//!
//! The transport emits `tracing` events at TRACE level at each step of a transfer (targets
//! `ferrylink_transport`: "send called", "control message read", "message landed", …;
//! and `ferrylink_memory`: the span kernel's steps).
//! With `--timeline`, each process of a run records those events with a `CLOCK_MONOTONIC`
//! timestamp (one clock for all processes of a machine) and the name of the thread that
//! emitted them ([`TimelineLayer`]). The server writes its records to a file the client
//! names ([`write_marks`]); the client merges both and prints, for every step seen in at
//! least half of the timed round trips, its median offset from the start of the round trip
//! ([`summarize`]). Recording takes time at every event, so the steps come out longer
//! than they are; their order and their relative size are what it is for.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;

/// The event that starts each round trip (emitted by the client, see `roundtrip.rs`).
pub const ROUND_TRIP_STARTS: &str = "round trip starts";

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// `CLOCK_MONOTONIC`, nanoseconds.
    pub t_ns: u64,
    /// "process thread: message \[kind\]".
    pub label: String,
}

/// What a process recorded: each event's time and its label's index in `labels`.
/// Labels are built once per (callsite, kind, thread), so recording an event costs a
/// clock read, a hash lookup and a push: building the label each time (three strings
/// formatted) added about 0.5 µs to every step.
struct Recorded {
    marks: Vec<(u64, u32)>,
    labels: Vec<String>,
    index: HashMap<LabelKey, u32>,
}

/// An event's callsite, the hash of its `kind` field, its thread.
type LabelKey = (usize, u64, std::thread::ThreadId);

static RECORDED: Mutex<Option<Recorded>> = Mutex::new(None);

fn recorded() -> std::sync::MutexGuard<'static, Option<Recorded>> {
    RECORDED.lock().unwrap_or_else(|p| p.into_inner())
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`; CLOCK_MONOTONIC always exists
    // on Linux.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Records every event it sees, labelled with `process` and the thread's name. Give it a
/// filter ([`timeline_filter`]): it records whatever reaches it.
pub struct TimelineLayer {
    process: &'static str,
}

impl TimelineLayer {
    /// A layer labelling its records with `process` ("client", "server").
    pub fn new(process: &'static str) -> Self {
        *recorded() = Some(Recorded { marks: Vec::with_capacity(1 << 16), labels: Vec::new(), index: HashMap::new() });
        Self { process }
    }
}

/// The events a timeline records: the transport's and the benchmark's, at TRACE level.
pub fn timeline_filter() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_target("ferrylink_transport", tracing::Level::TRACE)
        .with_target("ferrylink_memory", tracing::Level::TRACE)
        .with_target("ferrylink_benchmarks", tracing::Level::TRACE)
}

/// An event's message and kind, formatted (once per label).
#[derive(Default)]
struct Fields {
    message: String,
    kind: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "kind" => self.kind = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "kind" => self.kind = format!("{value:?}"),
            _ => {}
        }
    }
}

/// The hash of an event's `kind` field (0 without one), formatting nothing else.
#[derive(Default)]
struct KindHash(u64);

impl Visit for KindHash {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "kind" {
            self.0 = hash_of(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "kind" {
            self.0 = hash_of(&format!("{value:?}"));
        }
    }
}

fn hash_of(text: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    // Fixed keys: the same text hashes the same in every call.
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(text) | 1
}

impl TimelineLayer {
    fn label_of(&self, event: &Event<'_>) -> String {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let thread = std::thread::current();
        let mut label = format!("{} {}: {}", self.process, thread.name().unwrap_or("unnamed"), fields.message);
        if !fields.kind.is_empty() {
            let _ = write!(label, " [{}]", fields.kind);
        }
        label
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for TimelineLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let t_ns = now_ns();
        let mut kind = KindHash::default();
        event.record(&mut kind);
        let key = (event.metadata() as *const _ as usize, kind.0, std::thread::current().id());
        let mut guard = recorded();
        let Some(rec) = guard.as_mut() else { return };
        let label = match rec.index.get(&key) {
            Some(&label) => label,
            None => {
                let label = rec.labels.len() as u32;
                rec.labels.push(self.label_of(event));
                rec.index.insert(key, label);
                label
            }
        };
        rec.marks.push((t_ns, label));
    }
}

/// Takes this process's records.
pub fn take_marks() -> Vec<Mark> {
    let mut guard = recorded();
    let Some(rec) = guard.as_mut() else { return Vec::new() };
    let marks = std::mem::take(&mut rec.marks);
    marks.into_iter().map(|(t_ns, label)| Mark { t_ns, label: rec.labels[label as usize].clone() }).collect()
}

/// Writes records as text, one "nanoseconds TAB label" line each.
pub fn write_marks(path: &std::path::Path, marks: &[Mark]) -> std::io::Result<()> {
    let mut out = String::with_capacity(marks.len() * 64);
    for m in marks {
        let _ = writeln!(out, "{}\t{}", m.t_ns, m.label.replace(['\t', '\n'], " "));
    }
    std::fs::write(path, out)
}

/// Reads what [`write_marks`] wrote; lines that do not parse are an error.
pub fn read_marks(path: &std::path::Path) -> std::io::Result<Vec<Mark>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .map(|line| {
            let parsed = line.split_once('\t').and_then(|(t, label)| Some((t.parse().ok()?, label.to_owned())));
            parsed.map(|(t_ns, label)| Mark { t_ns, label }).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad timeline line {line:?}"))
            })
        })
        .collect()
}

/// One step of the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Median offset from the start of the round trip, µs.
    pub median_us: f64,
    /// The label, with " (2nd)", " (3rd)", … for later occurrences within a round trip.
    pub label: String,
    /// In how many round trips it occurred.
    pub seen: usize,
}

/// One round trip's marks: their labels (numbered by occurrence) and offsets from its
/// start, µs, and its length, µs.
struct Window {
    offsets: Vec<(String, f64)>,
    length_us: f64,
}

/// The round trips in `marks` (both processes, any order): each runs from one mark whose
/// label ends with `start_label` to the next; the first `skip` are left out (warm-up),
/// and so is the last (it has no end).
fn windows_of(marks: &[Mark], start_label: &str, skip: usize) -> Vec<Window> {
    let mut sorted: Vec<&Mark> = marks.iter().collect();
    sorted.sort_by_key(|m| m.t_ns);
    let starts: Vec<usize> =
        sorted.iter().enumerate().filter(|(_, m)| m.label.ends_with(start_label)).map(|(i, _)| i).collect();
    let us = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1000.0;
    starts
        .windows(2)
        .skip(skip)
        .map(|pair| {
            let (first, end) = (pair[0], pair[1]);
            let t0 = sorted[first].t_ns;
            let mut occurrences: std::collections::HashMap<&str, usize> = Default::default();
            let offsets = sorted[first..end]
                .iter()
                .map(|m| {
                    let n = occurrences.entry(&m.label).or_default();
                    *n += 1;
                    let key = match *n {
                        1 => m.label.clone(),
                        2 => format!("{} (2nd)", m.label),
                        3 => format!("{} (3rd)", m.label),
                        k => format!("{} ({k}th)", m.label),
                    };
                    (key, us(t0, m.t_ns))
                })
                .collect();
            Window { offsets, length_us: us(t0, sorted[end].t_ns) }
        })
        .collect()
}

/// The median timeline of `windows`: steps seen in fewer than half of them are left
/// out; the rest come in the order of their medians.
fn steps_of(windows: &[&Window]) -> Vec<Step> {
    let mut offsets: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for w in windows {
        for (label, offset) in &w.offsets {
            offsets.entry(label).or_default().push(*offset);
        }
    }
    let mut steps: Vec<Step> = offsets
        .into_iter()
        .filter(|(_, v)| v.len() * 2 >= windows.len().max(1))
        .map(|(label, mut v)| {
            v.sort_by(f64::total_cmp);
            Step { median_us: v[v.len() / 2], seen: v.len(), label: label.to_string() }
        })
        .collect();
    steps.sort_by(|a, b| a.median_us.total_cmp(&b.median_us));
    steps
}

/// The median timeline of the round trips in `marks` (both processes, any order): each
/// round trip runs from one mark whose label ends with `start_label` to the next; the
/// first `skip` are left out (warm-up), and so is the last (it has no end). Steps seen in
/// fewer than half of the round trips are left out; the rest come in the order of their
/// medians. Also returns the number of round trips summarized.
pub fn summarize(marks: &[Mark], start_label: &str, skip: usize) -> (Vec<Step>, usize) {
    let windows = windows_of(marks, start_label, skip);
    let all: Vec<&Window> = windows.iter().collect();
    (steps_of(&all), windows.len())
}

/// The slowest round trips of [`summarize`]'s, those at or beyond the `quantile` of the
/// round trips' lengths (at least one): their median timeline (read beside the one of
/// all round trips, it shows which steps the tail's time goes to), how many they are and
/// the length they start from, µs. `None` without round trips.
pub fn summarize_slowest(
    marks: &[Mark],
    start_label: &str,
    skip: usize,
    quantile: f64,
) -> Option<(Vec<Step>, usize, f64)> {
    let windows = windows_of(marks, start_label, skip);
    let mut lengths: Vec<f64> = windows.iter().map(|w| w.length_us).collect();
    lengths.sort_by(f64::total_cmp);
    let at = ((lengths.len() as f64 * quantile) as usize).min(lengths.len().checked_sub(1)?);
    let from = lengths[at];
    let slowest: Vec<&Window> = windows.iter().filter(|w| w.length_us >= from).collect();
    Some((steps_of(&slowest), slowest.len(), from))
}

/// The summary as a table: offset, increment over the step before, step, how often seen.
pub fn format_steps(steps: &[Step], windows: usize) -> String {
    let title = format!("median µs from the start of a round trip, over {windows} round trips");
    format_steps_titled(steps, windows, &title)
}

/// [`format_steps`] under another title ("Timeline: {title} (process thread: step)").
pub fn format_steps_titled(steps: &[Step], windows: usize, title: &str) -> String {
    let mut out = format!("Timeline: {title} (process thread: step)\n");
    let mut previous = 0.0;
    for s in steps {
        let _ = writeln!(
            out,
            "{:9.2}  (+{:6.2})  {}{}",
            s.median_us,
            s.median_us - previous,
            s.label,
            if s.seen < windows { format!("   [{} of {windows}]", s.seen) } else { String::new() }
        );
        previous = s.median_us;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(t_us: u64, label: &str) -> Mark {
        Mark { t_ns: t_us * 1000, label: label.into() }
    }

    #[test]
    fn summarize_gives_median_offsets_in_order_and_numbers_repeats() {
        let s = ROUND_TRIP_STARTS;
        let marks = vec![
            // Warm-up round trip (skipped).
            mark(0, s),
            mark(50, "server x: late"),
            // Three timed round trips, out of order on purpose (two processes' files).
            mark(200, s),
            mark(203, "client main: send"),
            mark(210, "server p: read"),
            mark(212, "server p: read"),
            mark(100, s),
            mark(102, "client main: send"),
            mark(108, "server p: read"),
            mark(109, "server p: read"),
            mark(300, s),
            mark(301, "client main: send"),
            mark(309, "server p: read"),
            mark(399, "client main: only once"),
            mark(400, s),
        ];
        let (steps, windows) = summarize(&marks, s, 1);
        assert_eq!(windows, 3);
        let labels: Vec<&str> = steps.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [ROUND_TRIP_STARTS, "client main: send", "server p: read", "server p: read (2nd)"],
            "steps seen in fewer than half of the round trips are dropped; order by median"
        );
        assert_eq!(steps[1].median_us, 2.0);
        assert_eq!(steps[2].median_us, 9.0);
        assert_eq!((steps[3].median_us, steps[3].seen), (12.0, 2));
        let table = format_steps(&steps, windows);
        assert!(table.contains("over 3 round trips"), "{table}");
        assert!(table.contains("server p: read (2nd)   [2 of 3]"), "{table}");
    }

    #[test]
    fn the_slowest_round_trips_are_summarized_alone() {
        let s = ROUND_TRIP_STARTS;
        let mut marks = Vec::new();
        // 100 round trips of 10 µs with a step at 4 µs; two of them take 50 µs, their
        // step at 40 µs. Each starts where the one before ended.
        let mut t0 = 0;
        for i in 0..100u64 {
            let slow = i == 30 || i == 70;
            marks.push(mark(t0, s));
            marks.push(mark(t0 + if slow { 40 } else { 4 }, "server p: read"));
            t0 += if slow { 50 } else { 10 };
        }
        marks.push(mark(t0, s));
        let (steps, n, from) = summarize_slowest(&marks, s, 0, 0.99).unwrap();
        assert_eq!((n, from), (2, 50.0), "the two slow round trips");
        assert_eq!(steps[1].median_us, 40.0);
        let (all, windows) = summarize(&marks, s, 0);
        assert_eq!((windows, all[1].median_us), (100, 4.0));
        assert!(summarize_slowest(&[], s, 0, 0.99).is_none());
        let table = format_steps_titled(&steps, n, "the slowest");
        assert!(table.starts_with("Timeline: the slowest (process thread: step)"), "{table}");
    }

    #[test]
    fn the_layer_labels_each_event_by_message_kind_and_thread() {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(TimelineLayer::new("client"));
        tracing::subscriber::with_default(subscriber, || {
            for kind in ["Notify", "Transfer", "Notify"] {
                tracing::trace!(kind, "control message read");
            }
            tracing::trace!(n = 3, "copies enqueued");
        });
        let labels: Vec<String> = take_marks().into_iter().map(|m| m.label).collect();
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        let expected = [
            format!("client {thread}: control message read [Notify]"),
            format!("client {thread}: control message read [Transfer]"),
            format!("client {thread}: control message read [Notify]"),
            format!("client {thread}: copies enqueued"),
        ];
        assert_eq!(labels, expected);
    }

    #[test]
    fn marks_survive_the_file_between_the_processes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.timeline");
        let marks = vec![mark(5, "server main: a\tb"), mark(7, "server ferrylink-progress: c [Data]")];
        write_marks(&path, &marks).unwrap();
        let back = read_marks(&path).unwrap();
        assert_eq!(back[0], mark(5, "server main: a b"));
        assert_eq!(back[1], marks[1]);
        std::fs::write(&path, "not a number\tx\n").unwrap();
        assert!(read_marks(&path).is_err());
    }
}
