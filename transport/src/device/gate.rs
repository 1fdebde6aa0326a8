//! Gate words written by this side's GPU: a connection's control rings hold words both
//! processes read (`ferrylink_ipc::control_ring`, the header page's second half). This
//! side registers that page with the device that runs its one-sided copies, and the
//! copies' end writes a word's next value there instead of a private completion flag;
//! the peer, told of the word by a `Notify` sent while the copies run, delivers the
//! notification once the word holds the value (docs/decisions/0029-copies-signal-their-own-end.md).

use ferrylink_ipc::control_ring::{ControlRingMemory, GATE_WORDS};
use ferrylink_memory::cuda::{CudaResult, Gpu, MappedHostRange};
use ferrylink_proto::wire::NotifyGate;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A control ring's gate words, registered with one device.
pub(crate) struct GateWords {
    /// Unregistered before the ring below may be unmapped (fields drop in order).
    _registration: MappedHostRange,
    ring: Arc<ControlRingMemory>,
    /// The device the registration serves.
    device: usize,
    /// The device address of word 0.
    device_base: u64,
}

impl GateWords {
    /// Registers `ring`'s header page with `gpu`'s device.
    pub fn register(gpu: &Gpu, ring: Arc<ControlRingMemory>) -> CudaResult<Arc<GateWords>> {
        let (page, len, offset) = ring.header_page();
        // SAFETY: the header page is part of the ring's live mapping, which the Arc held
        // next to the registration keeps until after it is unregistered; the words the
        // device writes are only read atomically.
        let registration = unsafe { MappedHostRange::register(gpu, page.as_ptr(), len)? };
        let device_base = registration.device_ptr() + offset as u64;
        Ok(Arc::new(GateWords { _registration: registration, ring, device: gpu.ordinal(), device_base }))
    }

    /// The device the words were registered with.
    pub fn device(&self) -> usize {
        self.device
    }
}

/// One gate word and the value the copies' end writes there.
#[derive(Clone)]
pub(crate) struct GateSignal {
    words: Arc<GateWords>,
    index: usize,
    value: u32,
}

impl GateSignal {
    /// Word `index` (below [`GATE_WORDS`]) of `words`, to be written with `value`.
    pub fn new(words: Arc<GateWords>, index: usize, value: u32) -> Option<GateSignal> {
        (index < GATE_WORDS).then_some(GateSignal { words, index, value })
    }

    /// The device address the GPU writes.
    pub fn address(&self) -> u64 {
        self.words.device_base + (self.index * 4) as u64
    }

    /// The word's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The value the GPU writes.
    pub fn value(&self) -> u32 {
        self.value
    }

    /// The device the words are registered with.
    pub fn device(&self) -> usize {
        self.words.device
    }

    /// The gate as the peer is told of it.
    pub fn notify_gate(&self) -> NotifyGate {
        NotifyGate { index: self.index as u32, value: self.value }
    }

    /// Whether the word reached the value (`NotifyGate::opened_by`, as the peer reads it).
    pub fn is_set(&self) -> bool {
        read_gate(&self.words.ring, self.index).is_some_and(|word| self.notify_gate().opened_by(word))
    }
}

/// Reads word `index` of `ring` (the peer's GPU writes it); `None` beyond the words.
pub(crate) fn read_gate(ring: &ControlRingMemory, index: usize) -> Option<u32> {
    ring.gate_word(index).map(|w: &AtomicU32| w.load(Ordering::Acquire))
}
