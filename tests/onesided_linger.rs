//! One-sided device transfers through the lingering copy kernel (`FERRYLINK_LINGER_US`,
//! docs/decisions/0030-lingering-kernel-opt-in.md): the connecting side, which runs every copy of the native lane,
//! has it on; small puts and gets of every alignment, run by either side, land exactly,
//! notifications come after their data, small device messages it lands arrive whole, and
//! the copier's context counts the copies the kernel took. Needs a GPU: ignored unless built with `--features gpu-tests`.

mod common;

use common::onesided::{device_memory, recv_key, send_key};
use common::*;
use ferrylink::transport::onesided::{Access, Span};
use ferrylink::transport::{Config, Context};
use ferrylink::Message;
use std::time::Duration;

const REGION: usize = 64 << 10;
/// (offset in the source, offset in the region, length): aligned, unaligned, one byte,
/// one block's worth.
const SHAPES: [(u64, u64, u64); 6] =
    [(0, 0, 8), (16, 4096, 4096), (3, 9000, 1), (5, 100, 1000), (64, 20000, 17), (0, 61440, 4096)];

/// The length of small device message `k`: 1 byte to 4 KiB.
fn message_len(k: u8) -> usize {
    [1, 8, 100, 4096][usize::from(k) % 4]
}

/// The connector: imports the parent's region, puts every shape into it and reads each
/// back with a get, notifying the parent after each put; then reports its stats.
fn run_lingering_copier() {
    let (ctx, ep) = connect_from_env();
    let remote = ep.import(&recv_key(&ep)).wait().unwrap();
    for round in 0..20u64 {
        for (i, &(from, to, len)) in SHAPES.iter().enumerate() {
            let seed = round * 100 + i as u64;
            let source = ctx.register(device_memory(0, REGION, seed), Access::Read).unwrap();
            let span = Span { local_offset: from, remote_offset: to, len };
            ep.put(&source, &remote, span, Some(seed.to_le_bytes().to_vec())).wait().unwrap();
            let landing = ctx.register(device_memory(0, REGION, seed + 7), Access::Write).unwrap();
            ep.get(&landing, &remote, Span { local_offset: from, remote_offset: to, len }, None).wait().unwrap();
            let (sent, got) = (
                source.frame().as_device().unwrap().to_vec().unwrap(),
                landing.frame().as_device().unwrap().to_vec().unwrap(),
            );
            let (a, b) = (from as usize, (from + len) as usize);
            assert!(sent[a..b] == got[a..b], "round {round} shape {i}: the get differs from the put");
            assert!(got[..a] == pattern(REGION, seed + 7)[..a], "round {round} shape {i}: written before the span");
        }
    }
    // The parent's puts into a region of this side (this side copies them too).
    let mine = ctx.register(device_memory(0, REGION, 99), Access::ReadWrite).unwrap();
    send_key(&ep, &mine);
    for _ in 0..20 {
        let note = ep.recv_notification().wait().unwrap();
        let at = u64::from_le_bytes(note.data[..8].try_into().unwrap()) as usize;
        let bytes = mine.frame().as_device().unwrap().to_vec().unwrap();
        assert!(bytes[at..at + 64].iter().all(|&b| b == note.data[8]), "a notification came before its data");
    }
    // Small device messages from the parent: this side lands them (one copy each, by
    // the kernel that signals its own end, not the lingering one) while it stays.
    for k in 0..20u8 {
        let message = ep.recv().wait().unwrap();
        let bytes = message.frames[0].as_device().unwrap().to_vec().unwrap();
        assert_eq!(bytes.len(), message_len(k), "message {k}");
        assert!(bytes.iter().all(|&b| b == k + 1), "message {k} landed wrong");
    }
    let stats = ctx.stats().unwrap();
    let report = format!("{} {}", stats.lingering_copies, stats.lingering_kernel_launches);
    ep.send(Message::new(report.into_bytes(), vec![])).wait().unwrap();
    ep.recv().wait().unwrap(); // bye
}

peer_test! {
    #[cfg_attr(not(feature = "gpu-tests"), ignore = "needs a CUDA device: run with --features gpu-tests")]
    fn small_device_transfers_go_through_the_lingering_kernel_exactly(peers) {
        require_gpu();
        let ctx = Context::new(Config::default().with_lane_policy("native".parse().unwrap())).unwrap();
        let env = [("FERRYLINK_TRANSPORT", "native".to_string()), ("FERRYLINK_LINGER_US", "300".to_string())];
        let mut p = ListeningParent::start(&peers, "copier", ctx, &env);
        let region = p.ctx.register(device_memory(0, REGION, 1), Access::ReadWrite).unwrap();
        send_key(&p.ep, &region);
        for round in 0..20u64 {
            for (i, &(_, to, len)) in SHAPES.iter().enumerate() {
                let seed = round * 100 + i as u64;
                let note = p.ep.recv_notification().wait().unwrap();
                assert_eq!(note.data, seed.to_le_bytes(), "notifications in order");
                let bytes = region.frame().as_device().unwrap().to_vec().unwrap();
                let (from, at) = (SHAPES[i].0 as usize, to as usize);
                assert!(bytes[at..at + len as usize] == pattern(REGION, seed)[from..from + len as usize], "round {round} shape {i}: the put's data is not there");
            }
        }
        // Puts run by the copier for this side, each checked by the peer on its notification.
        let theirs = p.ep.import(&recv_key(&p.ep)).wait().unwrap();
        for k in 0..20u8 {
            let source = p.ctx.register(ferrylink::memory::cuda::DevicePool::shared(0).unwrap().alloc(64).unwrap(), Access::Read).unwrap();
            source.frame().as_device().unwrap().fill(k + 1).unwrap();
            let at = u64::from(k) * 128 + 3;
            let mut note = at.to_le_bytes().to_vec();
            note.push(k + 1);
            p.ep.put(&source, &theirs, Span { local_offset: 0, remote_offset: at, len: 64 }, Some(note)).wait().unwrap();
        }
        for k in 0..20u8 {
            let buffer = ferrylink::memory::cuda::DevicePool::shared(0).unwrap().alloc(message_len(k)).unwrap();
            buffer.fill(k + 1).unwrap();
            p.ep.send(Message::new(vec![k], vec![buffer.into()])).wait().unwrap();
        }
        let report = String::from_utf8(p.ep.recv().wait().unwrap().header).unwrap();
        let counts: Vec<u64> = report.split(' ').map(|n| n.parse().unwrap()).collect();
        println!("lingering copies {}, kernel launches {}", counts[0], counts[1]);
        // The landings of the device messages are not the kernel's (architecture 3.29).
        assert_eq!(counts[0], 20 * 2 * SHAPES.len() as u64 + 20, "every one-sided copy went through the lingering kernel");
        assert!(counts[1] >= 1 && counts[1] < counts[0], "the kernel stayed between copies ({} launches)", counts[1]);
        assert_eq!(p.ctx.stats().unwrap().lingering_copies, 0, "this side copies nothing");
        p.ep.send(Message::new(b"bye".to_vec(), vec![])).wait().unwrap();
        p.peer.wait_success(Duration::from_secs(60));
    }
    "copier" => run_lingering_copier(),
}
