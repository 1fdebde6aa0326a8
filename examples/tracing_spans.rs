//! Prints ferrylink's tracing events with the spans they happened in: the context, the
//! connection (peer pid and uid, lane) and the transfer (request id, bytes, direction).
//!
//! ```text
//! cargo run --example tracing_spans                               # ferrylink's debug events
//! RUST_LOG=ferrylink_proto=trace,ferrylink_transport=debug cargo run --example tracing_spans
//! ```
//!
//! Two contexts of this process connect over the native lane; one sends the other a
//! message and puts bytes into a region the other registered. Each span is printed again
//! when it closes, with how long it was open (a transfer's span closes when its request
//! completes).

use ferrylink::ipc::shared_host_buffer;
use ferrylink::transport::{Access, Config, Context, LanePolicy, Listener, Span};
use ferrylink::{Frame, Message};
use std::time::Duration;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("ferrylink_transport=debug,ferrylink_proto=debug"));
    tracing_subscriber::fmt().with_env_filter(filter).with_span_events(FmtSpan::CLOSE).init();

    let config = Config::default().with_lane_policy(LanePolicy::Native);
    let receiver_ctx = Context::new(config.clone())?;
    let listener = Listener::bind_private(&receiver_ctx)?;
    let sender_ctx = Context::new(config)?;
    let sender = sender_ctx.connect(listener.path())?;
    let receiver = listener.accept_timeout(Duration::from_secs(5))?;

    let pending = receiver.recv();
    sender.send(Message::new(b"hello".to_vec(), vec![Frame::from(vec![1u8; 4096])])).wait()?;
    let message = pending.wait()?;
    println!("received {} bytes", message.payload_len());

    let region = receiver_ctx.register(shared_host_buffer(1 << 20)?, Access::ReadWrite)?;
    let source = sender_ctx.register(shared_host_buffer(1 << 20)?, Access::Read)?;
    let remote = sender.import(&region.key()).wait()?;
    sender.put(&source, &remote, Span::at(0, 1 << 20), None).wait()?;
    println!("put {} bytes", 1 << 20);
    Ok(())
}
