//! Events, interprocess events and a pool of interprocess events.
//!
//! Ordering between processes: the producer records a pooled interprocess event
//! (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`) on its stream after its work on a
//! buffer and sends [`Event::ipc_handle`]; the consumer opens it ([`Event::open_ipc`]) and
//! makes its copy stream wait on it. A pooled event must stay out of the pool until the
//! consumer's wait was enqueued (the transport holds the [`PooledEvent`] until the ack):
//! re-recording it earlier would make the consumer wait for the wrong work.

use super::context::Gpu;
use super::error::{check, check_query, CudaError, CudaResult};
use super::stream::Stream;
use cudarc::driver::sys;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

/// A CUDA event on one device; destroyed on drop.
pub struct Event {
    gpu: Gpu,
    raw: sys::CUevent,
    ipc_handle: Option<[u8; 64]>,
    imported: bool,
}

// SAFETY: a CUevent is a driver handle usable from any thread once its context is bound;
// every method binds the context first.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

const FLAG_DISABLE_TIMING: u32 = 2; // CU_EVENT_DISABLE_TIMING
const FLAG_INTERPROCESS: u32 = 4; // CU_EVENT_INTERPROCESS

impl Event {
    /// A plain event without timing (`CU_EVENT_DISABLE_TIMING`).
    pub fn new(gpu: &Gpu) -> CudaResult<Event> {
        Self::create(gpu, FLAG_DISABLE_TIMING)
    }

    /// An interprocess event (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`) with its
    /// IPC handle fetched once.
    pub fn interprocess(gpu: &Gpu) -> CudaResult<Event> {
        let mut ev = Self::create(gpu, FLAG_INTERPROCESS | FLAG_DISABLE_TIMING)?;
        let mut handle = sys::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: `ev.raw` is a live interprocess event; the context is bound by create.
        check("cuIpcGetEventHandle", unsafe { sys::cuIpcGetEventHandle(&mut handle, ev.raw) })?;
        ev.ipc_handle = Some(handle.reserved.map(|b| b as u8));
        Ok(ev)
    }

    fn create(gpu: &Gpu, flags: u32) -> CudaResult<Event> {
        gpu.bind_to_current_thread()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the context is bound; cuEventCreate writes one handle.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut raw, flags) })?;
        if raw.is_null() {
            return Err(CudaError::invalid("cuEventCreate", "the driver returned a null event"));
        }
        Ok(Event { gpu: gpu.clone(), raw, ipc_handle: None, imported: false })
    }

    /// Opens another process' interprocess event in `gpu`'s context
    /// (`cuIpcOpenEventHandle`). The handle is untrusted; the driver validates it.
    pub fn open_ipc(gpu: &Gpu, handle: &[u8; 64]) -> CudaResult<Event> {
        gpu.bind_to_current_thread()?;
        let h = sys::CUipcEventHandle { reserved: handle.map(|b| b as _) };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the context is bound; the driver validates the handle bytes and writes
        // one event handle.
        check("cuIpcOpenEventHandle", unsafe { sys::cuIpcOpenEventHandle(&mut raw, h) })?;
        if raw.is_null() {
            return Err(CudaError::invalid("cuIpcOpenEventHandle", "the driver returned a null event"));
        }
        Ok(Event { gpu: gpu.clone(), raw, ipc_handle: Some(*handle), imported: true })
    }

    /// Records the event on `stream` (after all work enqueued there so far).
    pub fn record(&self, stream: &Stream) -> CudaResult<()> {
        if stream.gpu() != &self.gpu {
            return Err(CudaError::invalid("cuEventRecord", "event and stream are on different devices"));
        }
        if self.imported {
            return Err(CudaError::invalid("cuEventRecord", "an imported IPC event can only be waited on"));
        }
        self.gpu.bind_to_current_thread()?;
        // SAFETY: both handles are live and belong to the bound context.
        check("cuEventRecord", unsafe { sys::cuEventRecord(self.raw, stream.raw()) })
    }

    /// Records the event on the device's legacy default stream (`stream 0`), which
    /// orders it after all work submitted so far to the default stream and to every
    /// blocking stream of the context: a producer that used either needs no stream of
    /// its own to be known to the transport.
    pub fn record_on_legacy_default_stream(&self) -> CudaResult<()> {
        if self.imported {
            return Err(CudaError::invalid("cuEventRecord", "an imported IPC event can only be waited on"));
        }
        self.gpu.bind_to_current_thread()?;
        // SAFETY: a live event of the bound context; the null stream is the legacy default
        // stream of that context.
        check("cuEventRecord", unsafe { sys::cuEventRecord(self.raw, std::ptr::null_mut()) })
    }

    /// Records the event on a stream the user named as a buffer's producer
    /// ([`crate::ProducerStream`]), which may be non-blocking.
    pub fn record_on_producer(&self, producer: &crate::ProducerStream) -> CudaResult<()> {
        if self.imported {
            return Err(CudaError::invalid("cuEventRecord", "an imported IPC event can only be waited on"));
        }
        self.gpu.bind_to_current_thread()?;
        // SAFETY: a live event of the bound context; the producer stream belongs to this
        // device's primary context and is alive while the buffer naming it is (contract of
        // `DeviceBuffer::produced_on_raw`; cudarc streams are kept alive by the buffer).
        check("cuEventRecord", unsafe { sys::cuEventRecord(self.raw, producer.raw()) })
    }

    /// Makes later work on a user's stream ([`crate::ProducerStream`], possibly
    /// non-blocking or of another device) wait for this event's last record
    /// (`cuStreamWaitEvent`); the host does not wait. A null (legacy default) stream is
    /// that of this event's device.
    pub fn make_stream_wait(&self, stream: &crate::ProducerStream) -> CudaResult<()> {
        self.gpu.bind_to_current_thread()?;
        // SAFETY: a live event; the stream belongs to a primary context and is alive while
        // the `ProducerStream` is (contract of `ProducerStream::from_raw`; cudarc streams are
        // kept alive by the value). The driver accepts an event of another context.
        check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream.raw(), self.raw, 0) })
    }

    /// Blocks until the work before the last record completed.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.gpu.bind_to_current_thread()?;
        // SAFETY: `raw` is a live event.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(self.raw) })
    }

    /// Whether the work before the last record completed (non-blocking).
    pub fn query(&self) -> CudaResult<bool> {
        self.gpu.bind_to_current_thread()?;
        // SAFETY: `raw` is a live event.
        check_query("cuEventQuery", unsafe { sys::cuEventQuery(self.raw) })
    }

    /// The IPC handle of an interprocess event (created or opened), `None` otherwise.
    pub fn ipc_handle(&self) -> Option<&[u8; 64]> {
        self.ipc_handle.as_ref()
    }

    /// Whether this event was opened from another process' handle.
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The raw handle (valid while `self` lives).
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }
}

impl Stream {
    /// Makes later work on this stream wait for `event`'s last record.
    pub fn wait_event(&self, event: &Event) -> CudaResult<()> {
        // SAFETY: `event.raw()` is a live event while `event` is borrowed.
        unsafe { self.wait_raw_event(event.raw()) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind_to_current_thread() {
            tracing::warn!(error = %e, "event leaked: cannot bind its context");
            return;
        }
        // SAFETY: `raw` is an event we created or opened and nobody else destroys.
        if let Err(e) = check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(self.raw) }) {
            tracing::warn!(error = %e, "cuEventDestroy failed");
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.gpu.ordinal())
            .field("interprocess", &self.ipc_handle.is_some())
            .field("imported", &self.imported)
            .finish()
    }
}

/// A pool of interprocess events on one device (one per endpoint on the sending side).
#[derive(Clone)]
pub struct EventPool {
    inner: Arc<EventPoolInner>,
}

struct EventPoolInner {
    gpu: Gpu,
    free: Mutex<Vec<Event>>,
    max_idle: usize,
    interprocess: bool,
}

impl EventPool {
    /// A pool of interprocess events on `gpu`, keeping at most `max_idle` idle events.
    pub fn new(gpu: &Gpu, max_idle: usize) -> EventPool {
        Self::build(gpu, max_idle, true)
    }

    /// A pool of plain events (`CU_EVENT_DISABLE_TIMING`) for ordering within this
    /// process, keeping at most `max_idle` idle events.
    pub fn local(gpu: &Gpu, max_idle: usize) -> EventPool {
        Self::build(gpu, max_idle, false)
    }

    fn build(gpu: &Gpu, max_idle: usize, interprocess: bool) -> EventPool {
        let free = Mutex::new(Vec::new());
        EventPool { inner: Arc::new(EventPoolInner { gpu: gpu.clone(), free, max_idle, interprocess }) }
    }

    /// An event (interprocess unless the pool is [`EventPool::local`]), from the pool or
    /// new. It returns to the pool when the
    /// [`PooledEvent`] drops: hold it until the consumer's wait was enqueued.
    pub fn acquire(&self) -> CudaResult<PooledEvent> {
        let reused = self.inner.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let event = match reused {
            Some(ev) => ev,
            None if self.inner.interprocess => Event::interprocess(&self.inner.gpu)?,
            None => Event::new(&self.inner.gpu)?,
        };
        Ok(PooledEvent { event: Some(event), pool: self.inner.clone() })
    }

    /// Number of idle events in the pool.
    pub fn idle(&self) -> usize {
        self.inner.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.inner.gpu
    }
}

impl fmt::Debug for EventPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventPool").field("device", &self.inner.gpu.ordinal()).field("idle", &self.idle()).finish()
    }
}

/// An interprocess event borrowed from an [`EventPool`].
pub struct PooledEvent {
    event: Option<Event>,
    pool: Arc<EventPoolInner>,
}

impl PooledEvent {
    /// The IPC handle to send to the consumer.
    pub fn handle(&self) -> [u8; 64] {
        self.event.as_ref().and_then(|e| e.ipc_handle().copied()).unwrap_or([0; 64])
    }
}

impl Deref for PooledEvent {
    type Target = Event;
    fn deref(&self) -> &Event {
        // Always Some until Drop.
        self.event.as_ref().expect("PooledEvent used after drop")
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(ev) = self.event.take() {
            let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < self.pool.max_idle {
                free.push(ev);
            }
        }
    }
}

impl fmt::Debug for PooledEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledEvent").field("event", &self.event).finish()
    }
}
