//! `Registration`: memory registered with UCX (`ucp_mem_map`) so peers can put into it
//! and get from it, with its packed rkey for them.

use std::fmt;
use std::ptr;

use ucx_sys::Status;

use super::buffer::{MemoryType, RecvBuf};
use super::context::UcxContext;
use super::error::{check, non_null, Rejected, UcxError};
use super::region_key::{check_packed_rkey, RegionKey, MAX_PACKED_RKEY_LEN};

/// Memory registered with a context (`ucp_mem_map`) for peers' puts and gets, owning the
/// buffer that holds it.
///
/// The registration takes its buffer by value, as requests do: while it lives, peers
/// holding its [`RegionKey`] may write and read the bytes at any time (a NIC's DMA, or,
/// where UCX emulates RMA over active messages as on TCP, this process's worker during
/// `progress`), so safe code gets no reference to them. Take the buffer back with
/// [`into_buf`](Self::into_buf), or look at it through the `unsafe`
/// [`buf`](Self::buf) / [`buf_mut`](Self::buf_mut) once the peers are known to be done
/// (they flushed and said so, e.g. with a notification).
///
/// Dropping it unmaps the memory (`ucp_mem_unmap`), then drops the buffer. From then on
/// hardware transports refuse peers' accesses, but **UCX's emulated RMA does not check
/// registrations at all**: the target writes wherever the initiator's message says. So
/// the protocol must make sure every peer holding the key is done (flushed, and told to
/// stop) before the registration and its memory go away, and a peer that ignores that
/// can write into freed memory. ferrylink's own initiators keep every operation inside
/// the range the key describes ([`UcxEndpoint::put`](super::UcxEndpoint::put)).
///
/// `Send` and `Sync` when the buffer is: mapping, packing and unmapping take the context's
/// lock (contexts are created with shared workers).
pub struct Registration<B: RecvBuf> {
    context: UcxContext,
    /// Live memory handle, unmapped once, in Drop (or `into_buf`).
    memh: ucx_sys::ucp_mem_h,
    address: u64,
    length: usize,
    memory_type: MemoryType,
    /// Present until `into_buf`.
    buf: Option<B>,
}

// SAFETY: the memory handle belongs to the context, not to a worker; ucp_mem_unmap and
// ucp_rkey_pack take the context's lock (contexts use mt_workers_shared), so they may run
// on any thread. The buffer moves with the registration, hence the bound.
unsafe impl<B: RecvBuf + Send> Send for Registration<B> {}
// SAFETY: `&self` methods only read plain fields or call ucp_rkey_pack (context lock);
// the buffer is reached through `&self` only by the unsafe `buf`, hence the bound.
unsafe impl<B: RecvBuf + Sync> Sync for Registration<B> {}

impl UcxContext {
    /// Registers `buf` (`ucp_mem_map` of its whole range, host or CUDA memory) so peers
    /// can put into and get from it once they have its
    /// [`region_key`](Registration::region_key).
    ///
    /// [`Rejected`] (buffer given back): the context has no RMA ([`UcxError::RmaDisabled`]),
    /// the buffer is CUDA memory and this UCX is not CUDA-aware, it is empty, or UCX
    /// refused (or answered the query of the new handle with a range that does not cover
    /// the buffer).
    pub fn register<B: RecvBuf>(&self, mut buf: B) -> Result<Registration<B>, Rejected<B>> {
        let memory_type = buf.memory_type();
        let error = if !self.supports_rma() {
            Some(UcxError::RmaDisabled)
        } else if memory_type == MemoryType::Cuda && !self.supports_cuda_memory() {
            Some(UcxError::CudaUnsupported)
        } else if buf.is_empty() {
            Some(UcxError::EmptyRegistration)
        } else {
            None
        };
        if let Some(error) = error {
            return Err(Rejected { error, buf });
        }
        let address = buf.as_mut_ptr();
        let length = buf.len();
        match map_and_query(self, address, length, memory_type) {
            Ok(memh) => Ok(Registration {
                context: self.clone(),
                memh,
                address: address as u64,
                length,
                memory_type,
                buf: Some(buf),
            }),
            Err(error) => Err(Rejected { error, buf }),
        }
    }
}

/// `ucp_mem_map` of `length` bytes at `address`, then `ucp_mem_query` to check that the
/// handle covers them; unmapped again on any failure after the map.
fn map_and_query(
    context: &UcxContext,
    address: *mut std::ffi::c_void,
    length: usize,
    memory_type: MemoryType,
) -> Result<ucx_sys::ucp_mem_h, UcxError> {
    let ucx = context.inner.ucx;
    // SAFETY: ucp_mem_map_params_t is plain data; all-zero is valid and only the fields
    // named in field_mask are read.
    let mut params: ucx_sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
    params.field_mask = (ucx_sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
        | ucx_sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
        | ucx_sys::UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) as u64;
    params.address = address;
    params.length = length;
    params.memory_type = memory_type.raw();
    let mut memh = ptr::null_mut();
    // SAFETY: live context; params describe `length` bytes at `address` of the given
    // memory type, which the caller's buffer owns (RecvBuf's contract) for as long as the
    // handle lives; memh is a writable out-pointer. No ALLOCATE flag: UCX registers the
    // range, it allocates nothing.
    let status = Status(unsafe { ucx.ucp_mem_map(context.inner.handle, &params, &mut memh) });
    check("ucp_mem_map", status)?;
    let memh = non_null("ucp_mem_map", memh)?;
    let unmap = |error: UcxError| {
        // SAFETY: the handle mapped above, unmapped exactly once (it is not returned).
        let status = Status(unsafe { ucx.ucp_mem_unmap(context.inner.handle, memh) });
        if !status.is_ok() {
            tracing::warn!(%status, "ucp_mem_unmap of a refused registration failed");
        }
        Err(error)
    };
    // SAFETY: ucp_mem_attr_t is plain data; all-zero is valid.
    let mut attr: ucx_sys::ucp_mem_attr_t = unsafe { std::mem::zeroed() };
    attr.field_mask = (ucx_sys::UCP_MEM_ATTR_FIELD_ADDRESS | ucx_sys::UCP_MEM_ATTR_FIELD_LENGTH) as u64;
    // SAFETY: memh is the live handle just mapped; attr is writable.
    let status = Status(unsafe { ucx.ucp_mem_query(memh, &mut attr) });
    if let Err(e) = check("ucp_mem_query", status) {
        return unmap(e);
    }
    if let Err(what) = covers(attr.address as u64, attr.length, address as u64, length) {
        return unmap(UcxError::NoResult { call: "ucp_mem_query", what });
    }
    Ok(memh)
}

/// Whether the mapped range `mapped`+`mapped_len` (as `ucp_mem_query` reports it) covers
/// the requested `start`+`len`; UCX may map more (aligned), never less.
fn covers(mapped: u64, mapped_len: usize, start: u64, len: usize) -> Result<(), String> {
    let mapped_end = mapped.checked_add(mapped_len as u64);
    let end = start.checked_add(len as u64);
    match (mapped_end, end) {
        (Some(mapped_end), Some(end)) if mapped <= start && end <= mapped_end => Ok(()),
        _ => Err(format!("a mapping of {mapped_len} bytes at {mapped:#x} for {len} bytes at {start:#x}")),
    }
}

impl<B: RecvBuf> Registration<B> {
    /// Address of the first registered byte (a device address for CUDA memory).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Registered bytes: the whole buffer.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether no bytes are registered (never: empty buffers are refused).
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Where the registered bytes live.
    pub fn memory_type(&self) -> MemoryType {
        self.memory_type
    }

    /// What a peer needs to reach this memory: the range and UCX's packed rkey
    /// (`ucp_rkey_pack`, copied out and its buffer released). Ship it; the peer
    /// unpacks it for its endpoint to this process
    /// ([`UcxEndpoint::unpack_rkey`](super::UcxEndpoint::unpack_rkey)). Keys may be
    /// packed any number of times; all stay valid while the registration lives.
    pub fn region_key(&self) -> Result<RegionKey, UcxError> {
        let ucx = self.context.inner.ucx;
        let mut buffer = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: the context and memory handle are live (the handle is unmapped only in
        // Drop); both out-pointers are writable.
        let status = Status(unsafe { ucx.ucp_rkey_pack(self.context.inner.handle, self.memh, &mut buffer, &mut size) });
        check("ucp_rkey_pack", status)?;
        let what = if buffer.is_null() {
            Some(format!("a null buffer ({size} bytes)"))
        } else if size == 0 || size > MAX_PACKED_RKEY_LEN {
            Some(format!("a packed rkey of {size} bytes"))
        } else {
            None
        };
        let rkey = match what {
            Some(what) => Err(UcxError::NoResult { call: "ucp_rkey_pack", what }),
            // SAFETY: UCX returned `size` readable bytes at the non-null `buffer` (checked
            // to be 1..=MAX_PACKED_RKEY_LEN), valid until released below.
            None => Ok(unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), size) }.to_vec()),
        };
        if !buffer.is_null() {
            // SAFETY: the buffer ucp_rkey_pack returned, released exactly once (also when
            // its size was refused).
            unsafe { ucx.ucp_rkey_buffer_release(buffer) };
        }
        let rkey = rkey?;
        // The bytes must pass the checks a peer applies: a UCX whose format moved shows
        // here, not as peers refusing every key.
        if let Err(fault) = check_packed_rkey(&rkey) {
            return Err(UcxError::NoResult {
                call: "ucp_rkey_pack",
                what: format!("a packed rkey peers refuse: {fault}"),
            });
        }
        Ok(RegionKey { address: self.address, length: self.length as u64, rkey })
    }

    /// Unmaps the memory and gives the buffer back (see the type's docs for peers still
    /// holding the key).
    pub fn into_buf(mut self) -> B {
        self.unmap();
        self.buf.take().expect("buffer present until into_buf")
    }

    /// The registered buffer.
    ///
    /// # Safety
    /// No peer may write the registered bytes while the reference lives: every peer that
    /// holds the key has completed and flushed its puts and starts no new ones (the
    /// protocol knows, e.g. from a notification sent after the flush).
    pub unsafe fn buf(&self) -> &B {
        self.buf.as_ref().expect("buffer present until into_buf")
    }

    /// The registered buffer, to change.
    ///
    /// # Safety
    /// No peer may read or write the registered bytes while the reference lives (as for
    /// [`buf`](Self::buf), for gets too).
    pub unsafe fn buf_mut(&mut self) -> &mut B {
        self.buf.as_mut().expect("buffer present until into_buf")
    }

    /// The raw memory handle, for calls this layer does not wrap. Valid while `self`
    /// lives.
    pub fn as_raw(&self) -> ucx_sys::ucp_mem_h {
        self.memh
    }

    /// `ucp_mem_unmap`, once.
    fn unmap(&mut self) {
        if self.memh.is_null() {
            return;
        }
        // SAFETY: the handle mapped in `register`, unmapped exactly once (nulled right
        // after); the context is live (we hold a clone).
        let status = Status(unsafe { self.context.inner.ucx.ucp_mem_unmap(self.context.inner.handle, self.memh) });
        self.memh = ptr::null_mut();
        if !status.is_ok() {
            tracing::warn!(%status, "ucp_mem_unmap failed");
        }
    }
}

impl<B: RecvBuf> Drop for Registration<B> {
    fn drop(&mut self) {
        // Unmapped before the buffer drops with the fields.
        self.unmap();
    }
}

impl<B: RecvBuf> fmt::Debug for Registration<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("address", &format_args!("{:#x}", self.address))
            .field("length", &self.length)
            .field("memory_type", &self.memory_type)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ucp_mem_query` may report an aligned superset of the requested range, never less.
    #[test]
    fn the_mapping_must_cover_the_buffer() {
        assert!(covers(0x1000, 0x100, 0x1000, 0x100).is_ok());
        assert!(covers(0x0, 0x3000, 0x1010, 0x100).is_ok());
        assert!(covers(0x1001, 0x100, 0x1000, 0x100).is_err(), "starts after the buffer");
        assert!(covers(0x1000, 0xff, 0x1000, 0x100).is_err(), "ends before the buffer ends");
        assert!(covers(u64::MAX, 2, u64::MAX, 1).is_err(), "a mapping past the address space");
    }
}
