//! An application that depends on ferrylink with `default-features = false` and the
//! `cuda-13040` feature: ferrylink and cudarc are built with the CUDA 13.4 driver
//! bindings, not the default 12.8 ones. CI builds it (README, "Choosing the CUDA version").

use ferrylink::cudarc::driver::sys::CUDA_VERSION;
use ferrylink::{Frame, Message};

// The feature reached cudarc, and no other version was chosen beside it (two versions
// would define `CUDA_VERSION` twice and not build).
const _: () = assert!(CUDA_VERSION == 13040);

fn main() {
    let message = Message::new(b"header".to_vec(), vec![Frame::from(vec![1u8, 2, 3])]);
    println!(
        "ferrylink with the CUDA {}.{} driver bindings: a message of {} frame(s), {} CUDA device(s) visible",
        CUDA_VERSION / 1000,
        CUDA_VERSION % 1000 / 10,
        message.frames.len(),
        ferrylink::memory::cuda::device_count(),
    );
}
