//! What the one-sided tests share: registered memory (shared host memory, device memory
//! of each kind) and keys shipped in a message header.

use ferrylink::ipc::shared_host_buffer;
use ferrylink::memory::cuda::{self, DevicePool, Gpu, VmmAllocation};
use ferrylink::transport::onesided::{Access, Registration, RemoteKey};
use ferrylink::transport::{Context, Endpoint};
use ferrylink::{DeviceBuffer, Message};
use ferrylink_testkit::pattern;

/// `len` bytes of shared memory holding `pattern(len, seed)`, registered with `access`.
pub fn registered(ctx: &Context, len: usize, seed: u64, access: Access) -> Registration {
    let mut buf = shared_host_buffer(len).unwrap();
    buf.as_mut_slice().copy_from_slice(&pattern(len, seed));
    ctx.register(buf, access).unwrap()
}

/// A host registration's bytes.
pub fn bytes(r: &Registration) -> &[u8] {
    r.frame().as_host().unwrap().as_slice()
}

/// Sends a registration's key in a message header.
pub fn send_key(ep: &Endpoint, r: &Registration) {
    ep.send(Message::new(r.key().to_bytes().to_vec(), vec![])).wait().unwrap();
}

/// Receives a key sent by `send_key`.
pub fn recv_key(ep: &Endpoint) -> RemoteKey {
    RemoteKey::from_bytes(&ep.recv().wait().unwrap().header).unwrap()
}

/// Device memory of `len` bytes of kind `kind` (0 pool, 1 one VMM chunk, 2 three VMM
/// chunks, 3 exportable stream-ordered pool) on GPU 0, holding `pattern(len, seed)`.
pub fn device_memory(kind: usize, len: usize, seed: u64) -> DeviceBuffer {
    let gpu = Gpu::get(0).unwrap();
    let buf = match kind {
        0 => DevicePool::shared(0).unwrap().alloc(len).unwrap(),
        1 | 2 => {
            let g = VmmAllocation::granularity(&gpu).unwrap();
            let chunks = if kind == 1 { 1 } else { 3 };
            let chunk = len.div_ceil(chunks).next_multiple_of(g);
            let range = VmmAllocation::with_chunks(&gpu, &vec![chunk; chunks]).unwrap();
            range.buffer(0, len).unwrap()
        }
        _ => {
            cuda::install_exportable_pool(0).unwrap();
            let stream = cuda::cudarc_stream(0).unwrap();
            cuda::from_cuda_slice(stream.alloc_zeros::<u8>(len).unwrap()).unwrap()
        }
    };
    buf.copy_from_host(&pattern(len, seed)).unwrap();
    buf
}
