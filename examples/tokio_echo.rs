//! Two processes exchange messages with async/await over ferrylink, on tokio.
//!
//! ```text
//! cargo run --example tokio_echo
//! ```
//!
//! ferrylink needs no async runtime: its requests are futures that its progress thread
//! wakes. This program listens, re-executes itself as the peer (`--peer PATH`), which
//! connects with `connect_async` and echoes every message back; it sends messages and
//! awaits their echoes while racing each receive against a timer in `tokio::select!`.
//! The timer often wins: the receive it drops is withdrawn, and no message is lost.

use ferrylink::transport::{Context, Endpoint, Listener};
use ferrylink::Message;
use std::error::Error;
use std::time::Duration;

const ROUNDS: usize = 1000;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let ctx = Context::from_env()?;
    if let Some(i) = args.iter().position(|a| a == "--peer") {
        return runtime.block_on(echo_everything(&ctx, &args[i + 1]));
    }
    let listener = Listener::bind_private(&ctx)?;
    let mut peer = std::process::Command::new(std::env::current_exe()?).arg("--peer").arg(listener.path()).spawn()?;
    let result = runtime.block_on(send_and_check_echoes(&listener));
    // The endpoint is gone now: the peer's next receive ends and it exits.
    peer.wait()?;
    result
}

/// The peer: echoes every message until the other side hangs up.
async fn echo_everything(ctx: &Context, path: &str) -> Result<(), Box<dyn Error>> {
    let ep = ctx.connect_async(path).await?;
    while let Ok(message) = ep.recv().await {
        ep.send(message).await?;
    }
    Ok(())
}

async fn send_and_check_echoes(listener: &Listener) -> Result<(), Box<dyn Error>> {
    let ep = listener.accept_async().await?;
    println!("connected to {} over the {} lane", ep.peer(), ep.lane());
    let mut timer_won = 0;
    for round in 0..ROUNDS {
        let header = format!("message {round}").into_bytes();
        let frame = vec![(round % 251) as u8; 64 << 10];
        // The send completes when the peer has the message; it hands it back.
        ep.send(Message::new(header.clone(), vec![frame.into()])).await?;
        let echo = receive_racing_a_timer(&ep, &mut timer_won).await?;
        assert_eq!(echo.header, header, "echoes come back in order, none lost");
    }
    println!("{ROUNDS} echoes back in order; the timer won {timer_won} races, each dropping a receive");
    // A bound of your own works the same way: the dropped receive takes nothing with it.
    match tokio::time::timeout(Duration::from_millis(20), ep.recv()).await {
        Err(_elapsed) => println!("nothing more within 20 ms, as expected"),
        Ok(unexpected) => println!("unexpected: {:?}", unexpected.map(|m| m.header)),
    }
    Ok(())
}

/// Awaits the next message while a 50 µs timer keeps interrupting (a stand-in for other
/// work a `select!` loop does): each time the timer wins, the receive is dropped.
async fn receive_racing_a_timer(ep: &Endpoint, timer_won: &mut usize) -> Result<Message, Box<dyn Error>> {
    loop {
        tokio::select! {
            received = ep.recv() => return Ok(received?),
            _ = tokio::time::sleep(Duration::from_micros(50)) => *timer_won += 1,
        }
    }
}
