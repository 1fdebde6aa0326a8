//! Connector-copies mode, connector side: copies of a send's device frames into buffers
//! the listener exported, on the legacy default stream or the lane's own stream.

use super::completion::Completion;
use super::gate::GateSignal;
use super::{DeviceFrameError, DeviceState, ImportedDeviceRegions, PeerMemory, PerDevice, ProducerMarks};
use ferrylink_memory::cuda::copy_kernel::{kernel_copy_signalling, SIGNALLED_MAX_BYTES};
use ferrylink_memory::cuda::{ImportedPool, Stream};
use ferrylink_memory::DeviceBuffer;
use ferrylink_proto::wire::{DeviceFrameDescriptor, DeviceMemory};
use std::sync::Arc;

/// Copies into a peer's offer, enqueued: `done` completes with them, or `gated` where a
/// gate word the listener reads marks their end instead of interprocess events; the
/// leases keep the peer's mappings open until then (pool pointers are freed in the copy
/// stream's order before `done` is recorded; their pools stay alive here).
pub(crate) struct PushInFlight {
    pub done: ProducerMarks,
    gated: Option<Completion>,
    _leases: Vec<PeerMemory>,
    _pools: Vec<Arc<ImportedPool>>,
}

impl PushInFlight {
    /// Whether the copies completed (never blocks).
    pub fn is_done(&mut self) -> Result<bool, DeviceFrameError> {
        match &mut self.gated {
            Some(done) => Ok(done.is_done()?),
            None => self.done.all_done(),
        }
    }

    /// Waits for the copies (a failing connection's last moment); whether they completed
    /// (a gate word, if written, holds its value).
    pub fn wait(&mut self) -> bool {
        match &mut self.gated {
            Some(done) => match done.wait() {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for the copies into an offer");
                    false
                }
            },
            None => {
                self.done.wait_all();
                true
            }
        }
    }

    /// Whether the copies' end writes the gate word given (else interprocess events).
    pub fn gated(&self) -> bool {
        self.gated.is_some()
    }
}

impl PerDevice {
    /// The stream a connector's copies of a send run on: the legacy default stream when
    /// that orders them after the producer, else the lane's own stream.
    fn copy_stream(&self, producer: &ProducerMarks) -> &Stream {
        self.stream_for(producer.on_legacy_stream)
    }
}

impl DeviceState {
    /// Connector-copies mode, connector side: copies each source into the listener's
    /// exported target (after the producer's marks, when given) and waits for the copies
    /// (by polling, as `copy_in` does).
    pub fn push_into(
        &self,
        peer_pid: u32,
        sources: &[&DeviceBuffer],
        targets: &[DeviceFrameDescriptor],
        producer: &ProducerMarks,
        regions: &mut ImportedDeviceRegions,
    ) -> Result<(), DeviceFrameError> {
        let started = std::time::Instant::now();
        let (leases, used, _) = self.enqueue_push(peer_pid, sources, targets, producer, regions, Vec::new(), None)?;
        for dev in used {
            dev.copy_stream(producer).wait_by_polling()?;
        }
        tracing::trace!(us = started.elapsed().as_micros() as u64, "device push: copies into the listener's buffers");
        drop(leases);
        Ok(())
    }

    /// Enqueues the copies of a push (after the producer's marks) on each source device's
    /// stream; the leases must live until those streams' work completed. `opened`: the
    /// targets opened ahead (`open_ahead`), by index, when they were. With `gate`, a push
    /// of one small copy may be made by the kernel that writes the gate word itself
    /// (`signalled_push`): the third value says it was.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn enqueue_push(
        &self,
        peer_pid: u32,
        sources: &[&DeviceBuffer],
        targets: &[DeviceFrameDescriptor],
        producer: &ProducerMarks,
        regions: &mut ImportedDeviceRegions,
        opened: Vec<Option<PeerMemory>>,
        gate: Option<&GateSignal>,
    ) -> Result<(Vec<PeerMemory>, Vec<Arc<PerDevice>>, bool), DeviceFrameError> {
        if sources.len() != targets.len() {
            return Err(DeviceFrameError::BadDescriptor(format!(
                "{} push targets for {} device frames",
                targets.len(),
                sources.len()
            )));
        }
        if let Some((i, _)) = sources.iter().zip(targets).enumerate().find(|(_, (s, t))| s.len() as u64 != t.len) {
            return Err(DeviceFrameError::BadDescriptor(format!("push target {i} has the wrong length")));
        }
        let copiers: Vec<usize> = sources.iter().map(|s| s.device_ordinal()).collect();
        let leases = self.map_with_opened(peer_pid, targets, &copiers, regions, opened)?;
        let mut used: Vec<Arc<PerDevice>> = Vec::new();
        let signalled = match gate {
            Some(gate) => self.signalled_push(sources, targets, producer, &leases, gate, &mut used),
            None => Ok(false),
        };
        let enqueued = match signalled {
            Ok(false) => self.enqueue_push_copies(sources, targets, producer, &leases, &mut used).map(|()| false),
            other => other,
        };
        match enqueued {
            Ok(signalled) => Ok((leases, used, signalled)),
            Err(e) => {
                // Copies already enqueued read and write through the leases: let them
                // finish before the leases go.
                for dev in &used {
                    let _ = dev.copy_stream(producer).synchronize();
                }
                Err(e)
            }
        }
    }

    /// A push of one frame of at most `SIGNALLED_MAX_BYTES` into one piece of the same
    /// device: one launch of the copy kernel that writes `gate`'s word itself after the
    /// bytes (a fence first), instead of a copy and a `cuStreamWriteValue32` after it
    /// (1.7 µs of the connector's time on the H200). `Ok(false)`: it does not apply
    /// (several frames or pieces, another device, a pool pointer that must be freed in
    /// the stream's order before the listener sees the word, alignment): no copy was
    /// enqueued, and the producer's waits, if enqueued, are noted in `used`.
    fn signalled_push(
        &self,
        sources: &[&DeviceBuffer],
        targets: &[DeviceFrameDescriptor],
        producer: &ProducerMarks,
        leases: &[PeerMemory],
        gate: &GateSignal,
        used: &mut Vec<Arc<PerDevice>>,
    ) -> Result<bool, DeviceFrameError> {
        let ([src], [target], [lease]) = (sources, targets, leases) else { return Ok(false) };
        if matches!(lease, PeerMemory::Pool { .. }) || gate.device() != src.device_ordinal() {
            return Ok(false);
        }
        if target.len > SIGNALLED_MAX_BYTES as u64 {
            return Ok(false);
        }
        let pieces = lease.pieces(target.offset, target.len)?;
        let [piece] = pieces.as_slice() else { return Ok(false) };
        if piece.device_ordinal != src.device_ordinal() || piece.len != src.len() as u64 {
            return Ok(false);
        }
        let dev = self.device(src.device_ordinal())?;
        let stream = dev.copy_stream(producer);
        wait_for_producer_once(&dev, stream, producer, used)?;
        let signal = (gate.address(), gate.value());
        // SAFETY: the piece lies in the opened target (checked by `pieces`), the source is
        // the live buffer of the in-flight message (lengths checked equal); both outlive
        // the completion that holds the leases. The gate's words stay registered while
        // the completion built from it holds them.
        if !unsafe { kernel_copy_signalling(piece.ptr, src.device_ptr(), piece.len as usize, stream, signal) }? {
            return Ok(false);
        }
        tracing::trace!("device push: copy enqueued, writing the gate");
        dev.signalled_pushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    fn enqueue_push_copies(
        &self,
        sources: &[&DeviceBuffer],
        targets: &[DeviceFrameDescriptor],
        producer: &ProducerMarks,
        leases: &[PeerMemory],
        used: &mut Vec<Arc<PerDevice>>,
    ) -> Result<(), DeviceFrameError> {
        for ((src, target), lease) in sources.iter().zip(targets).zip(leases) {
            let dev = self.device(src.device_ordinal())?;
            let stream = dev.copy_stream(producer);
            wait_for_producer_once(&dev, stream, producer, used)?;
            let mut from = src.device_ptr();
            for piece in lease.pieces(target.offset, target.len)? {
                // SAFETY: the piece lies in the opened target (checked by `pieces`), the
                // source range in the live buffer of the in-flight message (lengths checked
                // equal above); both outlive the stream's synchronisation by the caller.
                unsafe {
                    super::copy_between(
                        piece.ptr,
                        piece.device_ordinal,
                        from,
                        src.device_ordinal(),
                        piece.len as usize,
                        stream,
                    )?
                };
                from += piece.len;
            }
            tracing::trace!("device push: copy enqueued");
        }
        Ok(())
    }

    /// Connector-copies mode, connector side, into an offer: enqueues each copy (after
    /// the producer's marks) and records an interprocess event after them on each
    /// device used; the listener polls those before it delivers, and this side before it
    /// hands the message back. Returns the events, by device. `opened`: the offer's
    /// targets opened when it arrived (`open_ahead`), by index.
    ///
    /// `gate`: where every copy runs on the gate's device, the copies' end writes the gate
    /// word instead (`cuStreamWriteValue32` after them, or the copy kernel itself for one
    /// small frame; the listener reads the word, no interprocess event is recorded or
    /// queried).
    #[allow(clippy::too_many_arguments)]
    pub fn push_into_offer(
        &self,
        peer_pid: u32,
        sources: &[&DeviceBuffer],
        targets: &[DeviceFrameDescriptor],
        producer: &ProducerMarks,
        regions: &mut ImportedDeviceRegions,
        opened: Vec<Option<PeerMemory>>,
        gate: Option<&GateSignal>,
    ) -> Result<PushInFlight, DeviceFrameError> {
        let (leases, used, gate_written) =
            self.enqueue_push(peer_pid, sources, targets, producer, regions, opened, gate)?;
        // The listener lets its user free the targets once it sees the events below: an
        // imported pool pointer must be freed here before that (CUDA's rule for pool
        // pointers), so it is freed in the copy stream's order, ahead of the events.
        let mut kept = Vec::with_capacity(leases.len());
        let mut pools = Vec::new();
        for (lease, src) in leases.into_iter().zip(sources) {
            match lease {
                PeerMemory::Pool { pointer, device_ordinal } if device_ordinal == src.device_ordinal() => {
                    let dev = self.device(device_ordinal)?;
                    match pointer.free_in_order(dev.copy_stream(producer)) {
                        Ok(pool) => pools.push(pool),
                        Err((pointer, e)) => {
                            // Freed once the copies are done (the listener may deliver
                            // before: no worse than a lease).
                            tracing::debug!(error = %e, "imported pool pointer not freed in stream order");
                            kept.push(PeerMemory::Pool { pointer, device_ordinal });
                        }
                    }
                }
                other => kept.push(other),
            }
        }
        let gated = match (gate, used.as_slice()) {
            (Some(gate), [dev]) if gate_written => Some(Completion::gate_written(dev, producer.on_legacy_stream, gate)),
            (Some(gate), [dev]) if gate.device() == dev.gpu.ordinal() => {
                Some(Completion::after_copies_writing(dev, producer.on_legacy_stream, gate)?)
            }
            _ => None,
        };
        let mut marks = Vec::new();
        if gated.is_none() {
            for dev in used {
                let ev = dev.ready_marks.acquire()?;
                ev.record(dev.copy_stream(producer))?;
                marks.push((dev.gpu.ordinal(), ev));
            }
        }
        let done = ProducerMarks { marks, on_legacy_stream: false };
        Ok(PushInFlight { done, gated, _leases: kept, _pools: pools })
    }

    /// Opens, ahead of a push, the targets of an offer that are a peer's pool pointers
    /// (importing one costs 2–4 µs; legacy IPC mappings and VMM chunks are cached
    /// already): by index, `None` where nothing was opened (the push opens it then, and
    /// meets any error there).
    pub fn open_ahead(
        &self,
        targets: &[DeviceFrameDescriptor],
        regions: &mut ImportedDeviceRegions,
    ) -> Vec<Option<PeerMemory>> {
        if self.cuda().is_err() {
            return Vec::new();
        }
        let _restore = ferrylink_memory::cuda::CurrentContextGuard::save().ok();
        targets
            .iter()
            .map(|t| match &t.memory {
                DeviceMemory::PoolPointer { .. } => regions.open(t).ok(),
                _ => None,
            })
            .collect()
    }

    /// The leases of a push's targets: those opened ahead (when one was opened for each
    /// index), the others mapped now.
    fn map_with_opened(
        &self,
        peer_pid: u32,
        targets: &[DeviceFrameDescriptor],
        copiers: &[usize],
        regions: &mut ImportedDeviceRegions,
        opened: Vec<Option<PeerMemory>>,
    ) -> Result<Vec<PeerMemory>, DeviceFrameError> {
        if opened.len() != targets.len() {
            let refs: Vec<&DeviceFrameDescriptor> = targets.iter().collect();
            return self.map_all(peer_pid, &refs, copiers, regions);
        }
        let mut leases = Vec::with_capacity(targets.len());
        for ((target, &copier), ahead) in targets.iter().zip(copiers).zip(opened) {
            match ahead {
                Some(lease) => leases.push(lease),
                None => leases.extend(self.map_all(peer_pid, &[target], &[copier], regions)?),
            }
        }
        Ok(leases)
    }
}

/// Makes `stream`, `dev`'s copy stream, wait for the producer's marks on `dev` the first
/// time a push uses `dev`; `used` lists the devices whose streams already wait (and so
/// carry the push's copies, which a failure must let finish).
fn wait_for_producer_once(
    dev: &Arc<PerDevice>,
    stream: &Stream,
    producer: &ProducerMarks,
    used: &mut Vec<Arc<PerDevice>>,
) -> Result<(), DeviceFrameError> {
    if used.iter().any(|u| Arc::ptr_eq(u, dev)) {
        return Ok(());
    }
    used.push(dev.clone());
    for mark in producer.all_on_device(dev.gpu.ordinal()) {
        stream.wait_event(mark)?;
    }
    Ok(())
}
