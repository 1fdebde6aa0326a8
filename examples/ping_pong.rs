//! Two processes exchange a message back and forth over ferrylink.
//!
//! ```text
//! cargo run --release --example ping_pong            # host memory
//! cargo run --release --example ping_pong -- --device   # GPU 0 memory (needs CUDA)
//! ```
//!
//! The program starts a listener, re-executes itself as the peer (`--peer PATH`), sends a
//! 64 MiB message, gets it back, checks it and prints how long each round trip took.

use ferrylink::memory::cuda::{self, DevicePool};
use ferrylink::transport::{Context, Listener};
use ferrylink::{Frame, Message};
use std::process::Command;
use std::time::{Duration, Instant};

const LEN: usize = 64 << 20;
const ROUNDS: usize = 5;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let ctx = Context::from_env()?;
    if let Some(i) = args.iter().position(|a| a == "--peer") {
        // The peer: echo every message until the other side hangs up.
        let ep = ctx.connect(&args[i + 1])?;
        while let Ok(message) = ep.recv().wait() {
            ep.send(message).wait()?;
        }
        return Ok(());
    }

    let on_device = args.iter().any(|a| a == "--device");
    let listener = Listener::bind_private(&ctx)?;
    let mut peer = Command::new(std::env::current_exe()?).arg("--peer").arg(listener.path()).spawn()?;
    let ep = listener.accept_timeout(Duration::from_secs(30))?;
    println!("connected to {} over the {} lane", ep.peer(), ep.lane());

    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let frame: Frame = if on_device {
        cuda::probe()?;
        let buffer = DevicePool::shared(0)?.alloc(LEN)?;
        buffer.copy_from_host(&pattern)?;
        buffer.into()
    } else {
        pattern.clone().into()
    };
    let mut message = Message::new(b"ping".to_vec(), vec![frame]);
    for round in 0..ROUNDS {
        let start = Instant::now();
        message = ep.send(message).wait()?;
        let back = ep.recv().wait()?;
        let elapsed = start.elapsed();
        let gbps = 2.0 * LEN as f64 / elapsed.as_secs_f64() / 1e9;
        println!("round {round}: {LEN} bytes there and back in {elapsed:?} ({gbps:.2} GB/s)");
        let mut check = vec![0u8; LEN];
        match &back.frames[0] {
            Frame::Host(h) => check.copy_from_slice(h.as_slice()),
            Frame::Device(d) => d.copy_to_host(&mut check)?,
        }
        assert!(check == pattern, "the echoed bytes differ");
    }
    drop(ep);
    peer.wait()?;
    Ok(())
}
