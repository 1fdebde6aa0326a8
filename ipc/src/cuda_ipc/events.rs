//! The receiver's cache of peers' interprocess events: opened once per
//! (exporter pid, handle, local device), waited on by copy streams.

use super::descriptor::IpcEventDescriptor;
use super::error::CudaIpcError;
use ferrylink_memory::cuda::{Event, Stream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A peer's interprocess event opened in this process (`cuIpcOpenEventHandle`); destroyed
/// when the last user drops it.
pub type ImportedEvent = Arc<Event>;

#[derive(Default)]
struct State {
    events: HashMap<(u32, [u8; 64], usize), (ImportedEvent, u64)>,
    tick: u64,
    opens_total: u64,
}

/// Opened peer events, bounded (least recently used dropped first).
pub struct ImportedEventCache {
    state: Mutex<State>,
    max_events: usize,
}

impl Default for ImportedEventCache {
    fn default() -> Self {
        ImportedEventCache::new(1024)
    }
}

impl ImportedEventCache {
    /// A cache holding at most `max_events` opened events.
    pub fn new(max_events: usize) -> Self {
        ImportedEventCache { state: Mutex::new(State::default()), max_events: max_events.max(1) }
    }

    /// The event `desc` names, exported by process `pid`, opened on `stream`'s device.
    pub fn get(&self, pid: u32, desc: &IpcEventDescriptor, stream: &Stream) -> Result<ImportedEvent, CudaIpcError> {
        let key = (pid, desc.handle, stream.gpu().ordinal());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.tick += 1;
        let tick = st.tick;
        if let Some((ev, t)) = st.events.get_mut(&key) {
            *t = tick;
            return Ok(ev.clone());
        }
        let ev = Arc::new(Event::open_ipc(stream.gpu(), &desc.handle)?);
        if st.events.len() >= self.max_events {
            if let Some(oldest) = st.events.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) {
                st.events.remove(&oldest);
            }
        }
        st.events.insert(key, (ev.clone(), tick));
        st.opens_total += 1;
        Ok(ev)
    }

    /// Makes `stream` wait for the peer's event (`cuStreamWaitEvent`): the copy enqueued
    /// next starts only after the producer's work recorded before it.
    pub fn wait(&self, pid: u32, desc: &IpcEventDescriptor, stream: &Stream) -> Result<(), CudaIpcError> {
        let ev = self.get(pid, desc, stream)?;
        stream.wait_event(&ev)?;
        Ok(())
    }

    /// Drops every event of process `pid`; the number dropped.
    pub fn close_peer(&self, pid: u32) -> usize {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let before = st.events.len();
        st.events.retain(|k, _| k.0 != pid);
        before - st.events.len()
    }

    /// (events cached, opens since creation).
    pub fn stats(&self) -> (usize, u64) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (st.events.len(), st.opens_total)
    }
}

impl std::fmt::Debug for ImportedEventCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, opens) = self.stats();
        f.debug_struct("ImportedEventCache").field("events", &n).field("opens_total", &opens).finish()
    }
}
