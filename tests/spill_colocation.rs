//! The spill store co-located with the transport: a device frame that would exceed the
//! device budget evicts older entries to host memory instead of failing. Needs a GPU:
//! ignored unless built with `--features gpu-tests`, failing without a device.

mod common;

use common::*;
use ferrylink::spill::{SpillConfig, SpillStore, Tier};
use ferrylink::transport::{Config, Context, Listener};
use ferrylink::Message;
use std::sync::Arc;
use std::time::Duration;

const PATH_VAR: &str = "FERRYLINK_TEST_SOCKET";
const MIB: usize = 1 << 20;

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn an_incoming_device_frame_evicts_older_entries(peers) {
        require_gpu();
        let dir = socket_dir();
        // 64 MiB of device budget, three 16 MiB device entries already in it.
        let store = Arc::new(SpillStore::<u32>::new(SpillConfig::new(64 * MIB, 1 << 30, dir.path())).unwrap());
        for k in 0..3u32 {
            let buf = device_buffer_with(0, &pattern(16 * MIB, k as u64));
            store.insert(k, Message::new(vec![], vec![buf.into()])).map_err(|r| r.error).unwrap();
        }
        assert_eq!(store.device_bytes(0), 48 * MIB);
        let ctx = Context::with_make_room(Config::default(), store.clone()).unwrap();
        let listener = Listener::bind(&ctx, dir.path().join("p/s.sock")).unwrap();
        let mut child = peers.spawn("sender", &[(PATH_VAR, listener.path().display().to_string())]);
        let ep = listener.accept_timeout(Duration::from_secs(60)).unwrap();
        // Landing 48 MiB needs room: at least two of the older entries go to host memory.
        let got = ep.recv().wait().unwrap();
        assert_eq!(frame_bytes(&got.frames[0]), pattern(48 * MIB, 77));
        let stats = store.stats();
        println!("spill stats after landing: {stats:?}");
        assert!(store.device_bytes(0) <= 64 * MIB - 48 * MIB, "room was made: {} bytes left", store.device_bytes(0));
        assert!(stats.device_to_host >= 2, "{stats:?}");
        assert_eq!(store.tier(&0), Some(Tier::Host), "the least recently used entry was evicted first");
        // Evicted entries come back intact.
        for k in 0..3u32 {
            let m = store.take(&k).unwrap().expect("entry still in some tier");
            assert_eq!(frame_bytes(&m.frames[0]), pattern(16 * MIB, k as u64), "entry {k}");
        }
        ep.send(Message::new(b"done".to_vec(), vec![])).wait().unwrap();
        child.wait_success(Duration::from_secs(60));
    }
    peer(role) => {
        let ctx = Context::new(Config::default()).unwrap();
        let ep = ctx.connect(std::env::var(PATH_VAR).unwrap()).unwrap();
        let buf = device_buffer_with(0, &pattern(48 * MIB, 77));
        ep.send(Message::new(b"big".to_vec(), vec![buf.into()])).wait().unwrap();
        let _ = ep.recv().wait();
        return;
    },
}
