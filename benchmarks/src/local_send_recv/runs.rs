//! Runs and what they print: one run (a server process, the client's round trips, on the
//! UCX lane the raw UCX reference, the ceiling and the floor), its table or JSON record,
//! and the `--pairs` matrix (`--sweep` is in `sweep.rs`).

use super::args::Args;
use super::raw_ucx;
use super::server::ServerProcess;
use super::setup::{side_context, ClientSide};
use crate::ceiling::{self, Ceiling, Floor};
use crate::raw_ucx::RawUcx;
use crate::report::{format_efficiency, roundtrip_table, Iterations, Measurement, RunInfo};
use crate::roundtrip::{ClientTimes, RoundTripOptions};
use crate::size::{format_bytes, format_rate};
use crate::stats::Summary;
use crate::{progress, BenchError, ObjectType};
use ferrylink::memory::cuda;
use ferrylink::transport::{Context, Endpoint, LaneKind};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// One run: the client's side prepared (one-sided: its memory registered), a server
/// process, the client's round trips, on the UCX lane the raw UCX reference, then the
/// ceiling and the floor.
pub(super) fn run_once(
    ctx: &Context,
    o: &RoundTripOptions,
    run: usize,
    timeline_file: Option<&Path>,
) -> Result<(RunInfo, Measurement), BenchError> {
    let client = ClientSide::prepare(ctx, o)?;
    let mut server = ServerProcess::spawn(o, run, timeline_file)?;
    let ep: Endpoint = match ctx.connect(&server.path) {
        Ok(ep) => ep,
        Err(e) => {
            let se = server.fail("could not be reached");
            return Err(BenchError::Transport(format!("connecting to the server: {e}; {se}")));
        }
    };
    let lane = ep.lane();
    let result = client.run(&ep, o);
    let raw_ucx = match &result {
        Ok(_) => raw_ucx_reference(ctx, &ep, o),
        Err(_) => None,
    };
    drop(ep);
    let times = match result {
        Ok(times) => {
            server.finish()?;
            times
        }
        Err(e) => {
            // The server's own error usually says more; wait briefly for it.
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(server.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let se = server.fail("stopped");
            return Err(BenchError::Transport(format!("{e}\n{se}").replacen("transport: ", "", 1)));
        }
    };
    Ok(finish_run(o, lane, &times, raw_ucx))
}

/// The raw UCX reference of a send run on the UCX lane, measured with the server on `ep`
/// after the round trips; `None` on other runs, and, with a warning saying why, where it
/// could not be measured (device memory through a UCX that is not CUDA-aware).
pub(super) fn raw_ucx_reference(ctx: &Context, ep: &Endpoint, o: &RoundTripOptions) -> Option<RawUcx> {
    if !raw_ucx::applies(o, ep.lane()) {
        return None;
    }
    raw_ucx::measure(ctx, ep, o).inspect_err(|why| eprintln!("warning: the raw UCX reference was left out: {why}")).ok()
}

/// The report of a run, with its raw UCX reference (measured with the server), and its
/// ceiling and its floor measured now.
pub(super) fn finish_run(
    o: &RoundTripOptions,
    lane: LaneKind,
    times: &ClientTimes,
    raw_ucx: Option<RawUcx>,
) -> (RunInfo, Measurement) {
    let ceiling: Option<Ceiling> = match o.object_type {
        ObjectType::Host => Some(ceiling::host_memcpy_roundtrip(o.n_bytes, o.n_iter)),
        ObjectType::Device => match ceiling::device_copy_roundtrip(o.client_dev, o.server_dev, o.n_bytes, o.n_iter) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("warning: measuring the device ceiling failed: {e}");
                None
            }
        },
    };
    let floor: Option<Floor> = match o.object_type {
        ObjectType::Host => {
            let floor = ceiling::host_handoff_floor(o.n_bytes, o.n_iter);
            if floor.is_none() {
                eprintln!("warning: measuring the host floor failed: its second thread did not start");
            }
            floor
        }
        ObjectType::Device => match ceiling::device_copy_floor(o.client_dev, o.server_dev, o.n_bytes, o.n_iter) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("warning: measuring the device floor failed: {e}");
                None
            }
        },
    };
    let devices = o.object_type == ObjectType::Device;
    let one_sided = o.op.one_sided().is_some();
    let info = RunInfo {
        benchmark: "local-send-recv".into(),
        lane: Some(lane.to_string()),
        ucx_tls: (lane == LaneKind::Ucx)
            .then(|| std::env::var("UCX_TLS").unwrap_or_else(|_| "(unset: UCX default)".into())),
        object_type: o.object_type,
        n_bytes: o.n_bytes as u64,
        n_iter: o.n_iter,
        n_warmup_iter: o.n_warmup_iter,
        // One-sided round trips use their registered buffers every time.
        reuse_alloc: o.reuse_alloc || one_sided,
        memory: devices.then_some(o.memory),
        server_dev: devices.then_some(o.server_dev),
        client_dev: devices.then_some(o.client_dev),
        op: Some(o.op),
        blocks: one_sided.then_some(o.blocks),
        prepared: one_sided.then_some(o.prepared),
    };
    let m = Measurement {
        case: "roundtrip".into(),
        title: "round trip".into(),
        summary: Summary::new(2.0 * o.n_bytes as f64, &times.timed),
        ceiling,
        floor,
        raw_ucx,
        first_round_trip: Some(times.first.as_secs_f64()),
    };
    (info, m)
}

pub(super) fn print_single(args: &Args, info: &RunInfo, m: &Measurement) -> Result<(), BenchError> {
    let iterations = if args.no_detailed_report { Iterations::Omitted } else { Iterations::Listed };
    let text =
        if args.json { info.record(m).to_json_line() + "\n" } else { roundtrip_table(info, m, iterations).render() };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|_| out.flush())?;
    Ok(())
}

pub(super) fn efficiency(m: &Measurement) -> String {
    format_efficiency(m.efficiency())
}

pub(super) fn pairs(args: &Args, base: &RoundTripOptions) -> Result<(), BenchError> {
    let count = cuda::device_count();
    let bar = progress::bar((count * count) as u64, "pairs");
    let mut cells: Vec<Vec<String>> = Vec::with_capacity(count);
    for s in 0..count {
        let mut row = Vec::with_capacity(count);
        for c in 0..count {
            bar.set_message(format!("server {s}, client {c}"));
            let o = RoundTripOptions { server_dev: s, client_dev: c, ..base.clone() };
            // The client's frames land on its own device of this pair.
            let pair_ctx = side_context(&o, c).inspect_err(|_| bar.abandon())?;
            let (info, m) = run_once(&pair_ctx, &o, s * count + c, None).inspect_err(|_| bar.abandon())?;
            if args.json {
                println!("{}", info.record(&m).to_json_line());
            }
            row.push(format!("{} ({})", format_rate(m.summary.bandwidth_avg()), efficiency(&m)));
            bar.inc(1);
        }
        cells.push(row);
    }
    bar.finish_and_clear();
    if !args.json {
        let width = cells.iter().flatten().map(String::len).max().unwrap_or(0).max(8);
        println!(
            "Round-trip average bandwidth (efficiency against the raw copy), n_bytes {}, rows: server device, \
             columns: client device",
            format_bytes(base.n_bytes as f64)
        );
        print!("{:>8}", "");
        for c in 0..count {
            print!(" | {:>width$}", format!("client {c}"));
        }
        println!();
        for (s, row) in cells.iter().enumerate() {
            print!("{:>8}", format!("server {s}"));
            for cell in row {
                print!(" | {cell:>width$}");
            }
            println!();
        }
    }
    Ok(())
}
