//! `require_gpu` fails closed: a GPU test that runs without a device fails, never passes.
//! The peer runs with `FERRYLINK_DISABLE_CUDA=1`, so there is no device for it on any
//! machine.

use ferrylink_testkit::{peer_test, require_gpu};
use std::time::Duration;

peer_test! {
    /// A test that needs a GPU, run where there is none, fails and says why.
    fn a_gpu_test_without_a_device_fails(peers) {
        let mut peer = peers.spawn("gpu-test", &[("FERRYLINK_DISABLE_CUDA", "1".to_owned())]);
        let out = peer.wait_end(Duration::from_secs(30));
        assert!(!out.status.success(), "the GPU test passed without a device:\n{}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains("no CUDA device (FERRYLINK_DISABLE_CUDA is set)"),
            "stdout:\n{}\nstderr:\n{}",
            out.stdout,
            out.stderr
        );
        assert!(!out.stdout.contains("reached the device"), "{}", out.stdout);
    }
    "gpu-test" => {
        require_gpu();
        println!("reached the device");
    },
}
