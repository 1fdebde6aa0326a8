//! This side's gate words on one connection (docs/decisions/0029-copies-signal-their-own-end.md): the connector writes
//! the first half of the control rings' gate words, the acceptor the second. A device
//! transfer this side runs takes a word while its copies run; their end writes the
//! word's next value (registered with the copying device on first use), which ends the
//! transfer here and opens its notification's gate at the peer. A word goes back once
//! its value was seen; one whose copies failed is never used again (its value might
//! still land). No words left, or a device that refuses the registration: transfers
//! complete by this side's own flags and notify after their copies, as before.

use crate::device::{read_gate, GateSignal, GateWords};
use ferrylink_ipc::control_ring::{ControlRingMemory, GATE_WORDS};
use ferrylink_memory::cuda::Gpu;
use ferrylink_proto::wire::NotifyGate;
use std::collections::HashMap;
use std::sync::Arc;

/// Gate words each side writes.
const WORDS_PER_SIDE: usize = GATE_WORDS / 2;

/// The gate words of one connection, as this side uses them.
pub(super) struct Gates {
    ring: Arc<ControlRingMemory>,
    /// The words, registered with the device of this side's first gated copies.
    registered: Option<Arc<GateWords>>,
    /// The registration was refused: no gates on this connection.
    refused: bool,
    /// Words free to take, with the last value written to each.
    free: Vec<(usize, u32)>,
    /// Words taken by the transfers running, by transfer id.
    taken: HashMap<u64, GateSignal>,
}

impl Gates {
    /// The gates of a connection whose control rings are `ring`; `connector`: this side
    /// connected (its words are the first half).
    pub fn new(ring: Arc<ControlRingMemory>, connector: bool) -> Gates {
        let first = if connector { 0 } else { WORDS_PER_SIDE };
        let free = (first..first + WORDS_PER_SIDE).rev().map(|i| (i, read_gate(&ring, i).unwrap_or(0))).collect();
        Gates { ring, registered: None, refused: false, free, taken: HashMap::new() }
    }

    /// A word for transfer `id`, whose copies run on device `ordinal`; `None` where there
    /// is none (all taken, the registration refused, or registered for another device).
    pub fn take(&mut self, id: u64, ordinal: usize) -> Option<GateSignal> {
        if self.refused || self.free.is_empty() {
            return None;
        }
        let words = match &self.registered {
            Some(words) => words.clone(),
            None => match Gpu::get(ordinal).and_then(|gpu| GateWords::register(&gpu, self.ring.clone())) {
                Ok(words) => self.registered.insert(words).clone(),
                Err(e) => {
                    tracing::debug!(error = %e, "no gate words on this connection: notifications follow the copies");
                    self.refused = true;
                    return None;
                }
            },
        };
        if words.device() != ordinal {
            return None;
        }
        let (index, last) = self.free.pop()?;
        let signal = GateSignal::new(words, index, last.wrapping_add(1))?;
        self.taken.insert(id, signal.clone());
        Some(signal)
    }

    /// The gate transfer `id` took, as the peer is told of it.
    pub fn notify_gate(&self, id: u64) -> Option<NotifyGate> {
        self.taken.get(&id).map(GateSignal::notify_gate)
    }

    /// Transfer `id` ended (`written`: its copies completed, so its value is in the
    /// word); a word whose value may still land is kept out of use.
    pub fn release(&mut self, id: u64, written: bool) {
        let Some(signal) = self.taken.remove(&id) else { return };
        if written {
            self.free.push((signal.index(), signal.value()));
        } else {
            tracing::debug!(word = signal.index(), "a gate word left out of use after failed copies");
        }
    }

    /// Transfer or send `id` took a word and enqueued nothing that writes it: the word
    /// goes back with its last value.
    pub fn unused(&mut self, id: u64) {
        if let Some(signal) = self.taken.remove(&id) {
            self.free.push((signal.index(), signal.value().wrapping_sub(1)));
        }
    }

    /// Whether the peer's gate `gate` opened; an error for a word that does not exist.
    pub fn is_open(&self, gate: NotifyGate) -> Result<bool, String> {
        match read_gate(&self.ring, gate.index as usize) {
            Some(word) => Ok(gate.opened_by(word)),
            None => Err(format!("a notification gated on word {} of {GATE_WORDS}", gate.index)),
        }
    }
}
