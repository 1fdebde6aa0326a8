//! Receive targets the caller may still be using on a stream. A target that names its
//! producer stream (every cudarc slice does, `DeviceBuffer::produced_on` names one) can
//! have work queued there that the transport's write must come after: a kernel still
//! writing or reading the buffer, or the stream-ordered allocation itself, whose memory
//! may be a block freed on that stream by work that is still running. This process's own
//! copies into the target wait on the GPU (an event recorded on the producer stream,
//! waited on by the copy stream); before another process writes the target (the
//! connector pushing into it, UCX receiving into it) the progress thread waits for that
//! event on the host.

//!
//! A listener's receive targets are the connector's push targets: their pool-pointer
//! exports and the events on their producer streams are made when the receive is posted,
//! on the caller's thread ([`DeviceState::prepare_receive_targets`]), so a receive posted
//! before its message arrives does not pay `cuMemPoolExportPointer` (13–19 µs at 1 MB,
//! 0.36–0.5 ms at 1 GB on the H200) between the message's arrival and the connector's
//! copy, and its offer finds the producers' events complete instead of recording them
//! on the progress thread and trying again on a later turn.

use super::{DeviceFrameError, DeviceState, PerDevice};
use ferrylink_memory::cuda::{self, ExportRoute, Gpu, PooledEvent, Stream};
use ferrylink_memory::{DeviceBuffer, Frame};
use std::collections::VecDeque;

impl DeviceState {
    /// Makes `stream` (a stream of `dev`, the target's device) wait on the GPU for the
    /// work queued so far on `target`'s producer stream; nothing when it names none.
    pub(super) fn order_after_target_producer(
        &self,
        dev: &PerDevice,
        target: &DeviceBuffer,
        stream: &Stream,
    ) -> Result<(), DeviceFrameError> {
        let Some(producer) = target.producer_stream() else { return Ok(()) };
        let mark = dev.marks.acquire()?;
        mark.record_on_producer(producer)?;
        // The wait takes the record made above; the event may be recorded again later.
        stream.wait_event(&mark)?;
        Ok(())
    }

    /// Waits on the host for the work queued so far on each target's producer stream, so
    /// another process may write the targets; targets naming none cost nothing.
    pub fn wait_for_target_producers<'a>(
        &self,
        targets: impl IntoIterator<Item = &'a DeviceBuffer>,
    ) -> Result<(), DeviceFrameError> {
        for mark in self.record_on_producers(targets)? {
            mark.synchronize()?;
        }
        tracing::trace!("receive targets: their producer streams' work is done");
        Ok(())
    }

    /// Whether the work queued on each target's producer stream before receive `recv`
    /// was posted (the marks its posting thread recorded, kept in `marks`), or else
    /// before it was first offered, is done: marks are recorded on those streams the
    /// first time and polled after, never waited for.
    pub fn target_producers_done(
        &self,
        recv: u64,
        targets: &[&DeviceBuffer],
        marks: &mut ReceiveMarks,
    ) -> Result<bool, DeviceFrameError> {
        if !marks.polls(recv) {
            let recorded = match marks.take_ahead(recv) {
                Some(TargetMarks(recorded)) => recorded,
                None => self.record_on_producers(targets.iter().copied())?,
            };
            marks.polling = Some((recv, recorded));
        }
        for mark in marks.polling.iter().flat_map(|(_, recorded)| recorded) {
            if !mark.query()? {
                return Ok(false);
            }
        }
        marks.polling = None;
        Ok(true)
    }

    /// An event recorded on each target's producer stream (targets naming none: none).
    fn record_on_producers<'a>(
        &self,
        targets: impl IntoIterator<Item = &'a DeviceBuffer>,
    ) -> Result<Vec<PooledEvent>, DeviceFrameError> {
        let mut recorded = Vec::new();
        for target in targets {
            let Some(producer) = target.producer_stream() else { continue };
            let mark = self.device(target.device_ordinal())?.marks.acquire()?;
            mark.record_on_producer(producer)?;
            recorded.push(mark);
        }
        Ok(recorded)
    }

    /// On the calling thread, for a receive the connector will push into: exports its
    /// device targets that lie in an exportable stream-ordered pool (the export data is
    /// remembered per allocation, [`cuda::export_allocation`], so the progress thread's
    /// export of the targets is a table hit; other memory needs nothing ahead: legacy IPC
    /// handles are cached per allocation, VMM chunks per peer), and records an event on
    /// each target's producer stream, returned for the offer to poll. Failures are left
    /// for the progress thread, which meets them again and refuses the message with the
    /// reason (or records the events itself).
    pub fn prepare_receive_targets(&self, targets: &[Frame]) -> Option<TargetMarks> {
        let devices = targets.iter().filter_map(Frame::as_device);
        if devices.clone().next().is_none() || self.cuda().is_err() {
            return None;
        }
        let _restore = cuda::CurrentContextGuard::save().ok()?;
        self.export_targets_ahead(targets);
        self.record_on_busy_producers(devices).ok().map(TargetMarks)
    }

    /// [`DeviceState::record_on_producers`] on the posting thread, but a producer stream
    /// found idle (`cuStreamQuery`: its work queued before the post is done) needs no
    /// mark, so the offer of the receive goes out without a poll. A Python receive into a
    /// PyTorch tensor names the legacy default stream, usually idle by then; recording
    /// and polling an event there delayed the offer past the connector's next send
    /// (docs/decisions/0022-pytorch-default-stream-named.md).
    fn record_on_busy_producers<'a>(
        &self,
        targets: impl IntoIterator<Item = &'a DeviceBuffer>,
    ) -> Result<Vec<PooledEvent>, DeviceFrameError> {
        targets.into_iter().filter_map(|target| self.mark_busy_named_producer(target).transpose()).collect()
    }

    fn export_targets_ahead(&self, targets: &[Frame]) {
        for target in targets.iter().filter_map(Frame::as_device) {
            if let Ok(ExportRoute::Pool(_)) = cuda::export_route(target) {
                let exported =
                    Gpu::get(target.device_ordinal()).and_then(|g| cuda::export_buffer_allocation(&g, target));
                if let Err(e) = exported {
                    tracing::debug!(error = %e, "receive target: export ahead failed");
                }
            }
        }
    }
}

/// Events recorded on a posted receive's buffers' producer streams by its posting thread
/// ([`DeviceState::prepare_receive_targets`]).
pub(crate) struct TargetMarks(Vec<PooledEvent>);

/// Listener side, per connection: the marks on receive buffers' producer streams. Those
/// the posting threads recorded for the receives posted last, by receive id, until their
/// offer takes them; bounded: the oldest go first (a receive whose marks went records
/// its own when offered), so receives that are never offered (their message came another
/// way) leave nothing behind for long. And the marks of the receive being offered, polled
/// until they completed.
#[derive(Default)]
pub(crate) struct ReceiveMarks {
    ahead: VecDeque<(u64, TargetMarks)>,
    polling: Option<(u64, Vec<PooledEvent>)>,
}

impl ReceiveMarks {
    /// At most this many receives' marks are kept ahead.
    const KEPT: usize = 16;

    /// Keeps receive `recv`'s marks, recorded by its posting thread.
    pub fn note(&mut self, recv: u64, marks: TargetMarks) {
        if self.ahead.len() == Self::KEPT {
            self.ahead.pop_front();
        }
        self.ahead.push_back((recv, marks));
    }

    /// Whether receive `recv`'s marks are the ones being polled.
    fn polls(&self, recv: u64) -> bool {
        self.polling.as_ref().is_some_and(|(id, _)| *id == recv)
    }

    /// Receive `recv`'s marks, if kept (and those of receives posted before it, which
    /// can no longer be offered, are dropped).
    fn take_ahead(&mut self, recv: u64) -> Option<TargetMarks> {
        let at = self.ahead.iter().position(|(id, _)| *id == recv)?;
        let (_, marks) = self.ahead.drain(..=at).next_back()?;
        Some(marks)
    }
}

#[cfg(test)]
mod tests {
    use super::{ReceiveMarks, TargetMarks};

    #[test]
    fn marks_ahead_are_bounded_and_taken_once_in_posting_order() {
        let mut marks = ReceiveMarks::default();
        for recv in 1..=20u64 {
            marks.note(recv, TargetMarks(Vec::new()));
        }
        assert_eq!(marks.ahead.len(), ReceiveMarks::KEPT, "the oldest go first");
        assert!(marks.take_ahead(1).is_none(), "receive 1's marks were dropped to keep the bound");
        assert!(marks.take_ahead(10).is_some());
        assert!(marks.take_ahead(10).is_none(), "taken once");
        assert!(marks.take_ahead(7).is_none(), "receives posted before an offered one are dropped with it");
        assert_eq!(marks.ahead.front().map(|(id, _)| *id), Some(11));
        assert!(marks.take_ahead(21).is_none(), "never noted");
        assert_eq!(marks.ahead.len(), 10, "a miss drops nothing");
        assert!(!marks.polls(10), "nothing is polled before an offer starts it");
    }
}
