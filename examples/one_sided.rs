//! One-sided transfers: a process registers a "cache" of blocks, ships its key, and a peer
//! writes blocks straight into it with one batched `put`, then reads one back with `get`.
//!
//! ```text
//! cargo run --release --example one_sided              # host memory
//! cargo run --release --example one_sided -- --device  # GPU 0 memory (needs CUDA)
//! ```
//!
//! The program registers 256 blocks of 64 KiB, re-executes itself as the peer
//! (`--peer PATH`), sends the peer the key, and waits for the peer's notification; the
//! peer imports the key, writes 100 blocks into every other slot in one `put_batch`
//! (notifying the owner), prepares that put once and posts it ten times more (the spans
//! checked and, on the native lane, listed once), reads one block back with `get`, and
//! checks it.

use ferrylink::ipc::shared_host_buffer;
use ferrylink::memory::cuda::{self, DevicePool};
use ferrylink::transport::onesided::{Access, Registration, RemoteKey, Span};
use ferrylink::transport::{Context, Listener};
use ferrylink::{Frame, Message};
use std::process::Command;
use std::time::{Duration, Instant};

const BLOCK: u64 = 64 << 10;
const SLOTS: u64 = 256;
const WRITTEN: u64 = 100;

/// `len` bytes of host or device memory holding `fill`.
fn memory(len: u64, fill: u8, device: bool) -> Result<Frame, Box<dyn std::error::Error>> {
    if device {
        cuda::probe()?;
        let buffer = DevicePool::shared(0)?.alloc(len as usize)?;
        buffer.fill(fill)?;
        Ok(buffer.into())
    } else {
        let mut buffer = shared_host_buffer(len as usize)?;
        buffer.as_mut_slice().fill(fill);
        Ok(buffer.into())
    }
}

fn bytes_of(r: &Registration) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    Ok(match r.frame() {
        Frame::Host(h) => h.as_slice().to_vec(),
        Frame::Device(d) => d.to_vec()?,
    })
}

/// The peer: imports the owner's key, writes blocks 0..100 into slots 0, 2, 4, … with one
/// batched put, reads slot 2 back.
fn peer(path: &str, device: bool) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::from_env()?;
    let ep = ctx.connect(path)?;
    let key = RemoteKey::from_bytes(&ep.recv().wait()?.header)?;
    let cache = ep.import(&key).wait()?;
    let blocks = ctx.register(memory(WRITTEN * BLOCK, 7, device)?, Access::ReadWrite)?;
    let spans: Vec<Span> =
        (0..WRITTEN).map(|i| Span { local_offset: i * BLOCK, remote_offset: 2 * i * BLOCK, len: BLOCK }).collect();
    let start = Instant::now();
    ep.put_batch(&blocks, &cache, &spans, Some(b"blocks written".to_vec())).wait()?;
    println!("peer: {WRITTEN} blocks of {BLOCK} bytes put in one request in {:?}", start.elapsed());
    let prepared = ep.prepare_put_batch(&blocks, &cache, &spans)?;
    let start = Instant::now();
    for _ in 0..10 {
        ep.post(&prepared, None).wait()?;
    }
    println!("peer: the same put, prepared once, posted 10 times in {:?}", start.elapsed());
    let one = ctx.register(memory(BLOCK, 0, device)?, Access::ReadWrite)?;
    ep.get(&one, &cache, Span { local_offset: 0, remote_offset: 2 * BLOCK, len: BLOCK }, None).wait()?;
    assert!(bytes_of(&one)?.iter().all(|&b| b == 7), "the block read back differs");
    println!("peer: read slot 2 back, it holds what was put");
    ep.recv().wait()?; // the owner says goodbye
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let device = args.iter().any(|a| a == "--device");
    if let Some(i) = args.iter().position(|a| a == "--peer") {
        return peer(&args[i + 1], device);
    }
    let ctx = Context::from_env()?;
    let cache = ctx.register(memory(SLOTS * BLOCK, 0, device)?, Access::ReadWrite)?;
    let listener = Listener::bind_private(&ctx)?;
    let mut child = Command::new(std::env::current_exe()?);
    child.arg("--peer").arg(listener.path());
    if device {
        child.arg("--device");
    }
    let mut child = child.spawn()?;
    let ep = listener.accept_timeout(Duration::from_secs(30))?;
    println!("owner: connected over the {} lane; sending the key", ep.lane());
    ep.send(Message::new(cache.key().to_bytes().to_vec(), vec![])).wait()?;
    let note = ep.recv_notification().wait()?;
    println!("owner: notified \"{}\"", String::from_utf8_lossy(&note.data));
    let bytes = bytes_of(&cache)?;
    for slot in 0..SLOTS {
        let block = &bytes[(slot * BLOCK) as usize..((slot + 1) * BLOCK) as usize];
        let expected = if slot % 2 == 0 && slot / 2 < WRITTEN { 7 } else { 0 };
        assert!(block.iter().all(|&b| b == expected), "slot {slot} holds the wrong bytes");
    }
    println!("owner: slots 0, 2, …, 198 hold the peer's blocks, the others are untouched");
    ep.send(Message::new(b"bye".to_vec(), vec![])).wait()?;
    child.wait()?;
    Ok(())
}
