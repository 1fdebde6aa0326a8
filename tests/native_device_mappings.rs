//! How many CUDA IPC mappings a receiver opens, between two processes on GPU 0. Alone in
//! its test binary: the buffers it sends and the ones its echoes land in come from this
//! process's shared device pool, and the other device tests of a binary, run in parallel
//! threads, fill that pool too, so its buffers can land in a second pool allocation
//! (slab), which the peer maps as well. Needs a GPU: ignored unless built with
//! `--features gpu-tests`.

mod common;

use common::*;
use ferrylink::transport::{Config, Context};
use ferrylink::Message;

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn one_buffer_sent_a_hundred_times_opens_one_mapping(peers) {
        require_gpu();
        let ctx = Context::new(Config::default()).unwrap();
        let p = ListeningParent::start(&peers, "echo", ctx, &[("FERRYLINK_DEVICE_COPIES", "connector".to_string())]);
        let data = pattern(1 << 20, 3);
        let mut msg = Message::new(vec![], vec![device_buffer_with(0, &data).into()]);
        for _ in 0..100 {
            msg = p.ep.send(msg).wait().unwrap();
            verify_echo(&[], std::slice::from_ref(&data), &p.ep.recv().wait().unwrap());
        }
        let (opens, _) = p.stop_reporting_mappings();
        // The peer (the connector, which copies) maps the one pool allocation that holds
        // our buffer and the buffers its echoes land in, exactly once.
        assert_eq!(opens, 1, "the receiver opened {opens} mappings for one buffer sent 100 times");
    }
    "echo" => serve_echo_reporting_mappings(),
}
