//! `local-send-recv`: ucx-py's round-trip benchmark on ferrylink (the binary
//! `src/bin/local_send_recv.rs` parses [`Args`] and calls [`run`]).
//!
//! - `args`: the command line;
//! - `address`: `-s` / `-p` for runs in two processes started separately;
//! - `setup`: options, object type and transport context of one side;
//! - `server`: serving one client, and the server process a local run starts;
//! - `runs`: one run, the device pairs, and what they print;
//! - `raw_ucx`: the raw UCX reference of a send run on the UCX lane, measured by the
//!   client and the server after the round trips;
//! - `sweep`: `--sweep`, its summary and its plot.
//!
//! `--op put|get` runs one-sided round trips ([`crate::onesided`]) through the same runs,
//! sweeps and pairs: `setup` prepares the client of either kind, `server` serves either.

mod address;
mod args;
mod raw_ucx;
mod runs;
mod server;
mod setup;
mod sweep;

pub use args::Args;

use crate::size::parse_sweep;
use crate::{timeline, BenchError, ObjectType};
use address::{server_address, Address};
use runs::{finish_run, pairs, print_single, raw_ucx_reference, run_once};
use server::{serve_on, serve_standalone, unique_socket_path};
use setup::{check_op, object_type, options, side_context, ClientSide};
use std::path::Path;
use sweep::sweep;

/// Runs what `args` asks for: the server process of a local run (`--serve-on`), a
/// standalone server or client, a sweep, every device pair, or one run (with its
/// timeline).
pub fn run(args: Args) -> Result<(), BenchError> {
    let n_bytes = usize::try_from(args.n_bytes).map_err(|_| BenchError::Usage("--n-bytes too large".into()))?;
    if let Some(path) = &args.serve_on {
        let o = options(&args, args.object_type.unwrap_or(ObjectType::Host), n_bytes);
        serve_on(path, &o)?;
        if let Some(file) = &args.timeline_file {
            timeline::write_marks(file, &timeline::take_marks())?;
        }
        return Ok(());
    }
    if args.n_iter == 0 {
        return Err(BenchError::Usage("--n-iter must be at least 1".into()));
    }
    let address = server_address(&args)?;
    let object_type = object_type(&args)?;
    let sizes = match &args.sweep {
        Some(range) => parse_sweep(range)?,
        None => vec![args.n_bytes],
    };
    check_op(&args, &sizes)?;
    let o = options(&args, object_type, n_bytes);
    if args.server_only {
        return serve_standalone(address.unwrap_or_else(|| Address::Unix(unique_socket_path(0))), &o);
    }
    if args.pairs.is_some() {
        return pairs(&args, &o);
    }
    let ctx = side_context(&o, o.client_dev)?;
    if args.client_only {
        let address = address.expect("clap requires --server-address with --client-only");
        let client = ClientSide::prepare(&ctx, &o)?;
        let ep = match &address {
            Address::Unix(path) => ctx.connect(path),
            Address::Tcp(host, port) => ctx.connect_tcp((host.as_str(), *port)),
        }
        .map_err(|e| BenchError::Transport(format!("connecting to {address}: {e}")))?;
        let times = client.run(&ep, &o)?;
        let raw_ucx = raw_ucx_reference(&ctx, &ep, &o);
        let (info, m) = finish_run(&o, ep.lane(), &times, raw_ucx);
        return print_single(&args, &info, &m);
    }
    if args.sweep.is_some() {
        return sweep(&args, &ctx, &o, &sizes);
    }
    let timeline_file = args.timeline.then(|| unique_socket_path(0).with_extension("timeline"));
    let (info, m) = run_once(&ctx, &o, 0, timeline_file.as_deref())?;
    print_single(&args, &info, &m)?;
    if let Some(file) = timeline_file {
        print_timeline(&file, o.n_warmup_iter)?;
    }
    Ok(())
}

/// `--timeline`: merges the server's records with the client's and prints the summary.
fn print_timeline(server_file: &Path, n_warmup_iter: usize) -> Result<(), BenchError> {
    let server = timeline::read_marks(server_file);
    let _ = std::fs::remove_file(server_file);
    let mut marks = server.map_err(|e| BenchError::Other(format!("reading the server's timeline: {e}")))?;
    marks.extend(timeline::take_marks());
    let (steps, windows) = timeline::summarize(&marks, timeline::ROUND_TRIP_STARTS, n_warmup_iter);
    println!("\n{}", timeline::format_steps(&steps, windows).trim_end());
    // The tail: the slowest 1 % of the round trips (each from its start to the next's).
    if let Some((steps, n, from)) =
        timeline::summarize_slowest(&marks, timeline::ROUND_TRIP_STARTS, n_warmup_iter, 0.99)
    {
        let title = format!("median µs over the slowest {n} round trips (from {from:.2} µs to the next start)");
        println!("\n{}", timeline::format_steps_titled(&steps, n, &title).trim_end());
    }
    Ok(())
}
