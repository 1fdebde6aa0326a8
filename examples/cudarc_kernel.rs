//! cudarc and ferrylink together: one process sends a cudarc `CudaSlice<f32>` (no copy,
//! no synchronize: the send waits for the slice's stream on the GPU), the other launches
//! a cudarc kernel directly on the received memory and sends it back.
//!
//! ```text
//! cargo run --release --example cudarc_kernel     # needs a CUDA device
//! ```
//!
//! The parent installs an exportable stream-ordered pool as the device's current pool
//! (`install_exportable_pool`): from then on cudarc's own allocations travel between
//! processes as pool pointers instead of being bounced through ferrylink's pool. It
//! re-executes itself as the peer (`--peer PATH`), which doubles every value.

use ferrylink::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use ferrylink::cudarc::nvrtc::Ptx;
use ferrylink::memory::cuda;
use ferrylink::transport::{Context, Listener};
use ferrylink::{Frame, Message};
use std::process::Command;
use std::time::Duration;

const N: usize = 1 << 20;

/// `x[i] *= factor` for `i < n`.
const SCALE_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry scale(.param .u64 x, .param .u32 n, .param .f32 factor)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [x];
    ld.param.u32 %r1, [n];
    ld.param.f32 %f1, [factor];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r2, %r2, %r3, %r4;
    setp.ge.u32 %p, %r2, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd2, %rd2, %rd3;
    ld.global.f32 %f2, [%rd2];
    mul.f32 %f2, %f2, %f1;
    st.global.f32 [%rd2], %f2;
DONE:
    ret;
}
"#;

/// The peer: doubles every value of each message's first frame, on the GPU, and sends
/// the message back.
fn peer(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::from_env()?;
    let ep = ctx.connect(path)?;
    let gpu = CudaContext::new(0)?;
    let stream = gpu.default_stream();
    let scale = gpu.load_module(Ptx::from_src(SCALE_PTX))?.load_function("scale")?;
    while let Ok(mut message) = ep.recv().wait() {
        let Some(Frame::Device(buf)) = message.frames.first_mut() else { break };
        let n = (buf.len() / 4) as u32;
        let factor = 2.0f32;
        let mut launch = stream.launch_builder(&scale);
        launch.arg(&mut *buf).arg(&n).arg(&factor);
        // SAFETY: the kernel reads and writes `n` floats of the received buffer, which
        // holds `4 n` bytes and lives until the send below completed.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n))? };
        // The kernel ran on `stream`: the send waits for it there.
        let produced = std::mem::replace(&mut message.frames[0], Frame::from(Vec::new()));
        if let Frame::Device(buf) = produced {
            message.frames[0] = Frame::Device(buf.produced_on(&stream));
        }
        ep.send(message).wait()?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--peer") {
        return peer(&args[i + 1]);
    }
    cuda::probe()?;
    cuda::install_exportable_pool(0)?;
    let ctx = Context::from_env()?;
    let listener = Listener::bind_private(&ctx)?;
    let mut child = Command::new(std::env::current_exe()?).arg("--peer").arg(listener.path()).spawn()?;
    let ep = listener.accept_timeout(Duration::from_secs(30))?;

    let stream = cuda::cudarc_stream(0)?;
    let values: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let slice = stream.clone_htod(&values)?;
    let sent = ep.send(Message::new(b"double these".to_vec(), vec![cuda::from_cuda_slice(slice)?.into()])).wait()?;
    let back = ep.recv().wait()?;
    let Some(Frame::Device(doubled)) = back.frames.into_iter().next() else {
        return Err("no device frame came back".into());
    };
    let mut bytes = vec![0u8; doubled.len()];
    doubled.copy_to_host(&mut bytes)?;
    let wrong = bytes
        .chunks_exact(4)
        .enumerate()
        .filter(|(i, b)| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) != 2.0 * *i as f32);
    let wrong = wrong.count();
    // The slice we sent comes back out of the sent message, as cudarc's own type.
    let Some(Frame::Device(original)) = sent.frames.into_iter().next() else {
        return Err("the sent frame is gone".into());
    };
    let original = original.into_cuda_slice::<f32>().map_err(|b| format!("not our slice: {b:?}"))?;
    let untouched = stream.clone_dtoh(&original)? == values;
    println!(
        "{N} floats sent as a cudarc CudaSlice<f32>, doubled by a cudarc kernel in the peer: {} wrong; \
         the original slice is {}; bounced bytes: {}",
        wrong,
        if untouched { "untouched" } else { "CHANGED" },
        ep.stats().bounced_bytes
    );
    drop(ep);
    child.wait()?;
    if wrong > 0 || !untouched {
        return Err("the round trip went wrong".into());
    }
    Ok(())
}
