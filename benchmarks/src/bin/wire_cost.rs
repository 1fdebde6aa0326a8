//! `wire-cost`: what the wire codec (bincode 2 behind `ferrylink_proto::wire`) costs per
//! control message, beside a copy of the same bytes measured in the same run: the least
//! any encoding of that message costs. Every sample message of the codec's own corpus is
//! encoded and decoded (with the default limits' validation) `--n-iter` times; each
//! decoded message is checked equal to the original outside the timing. See `--help`.

use clap::Parser;
use ferrylink_benchmarks::size::format_seconds;
use ferrylink_benchmarks::stats::median;
use ferrylink_benchmarks::{exit_on_error, BenchError};
use ferrylink_proto::wire::{decode_frame, encode_frame, sample_messages, Limits, WireMessage};
use std::hint::black_box;
use std::time::Instant;

/// Encode and decode cost of each control message of the wire format, per message,
/// beside a copy of its encoded bytes (the floor of any encoding).
#[derive(Debug, Parser)]
#[command(name = "wire-cost", version)]
struct Args {
    /// Messages per timed batch.
    #[arg(long, default_value_t = 20_000)]
    n_iter: u32,
    /// Timed batches per message; the figures are their medians.
    #[arg(long, default_value_t = 7)]
    batches: usize,
}

/// Per-message medians of one sample.
struct Cost {
    bytes: usize,
    encode_s: f64,
    decode_s: f64,
    copy_s: f64,
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> Result<(), BenchError> {
    if args.n_iter == 0 || args.batches == 0 {
        return Err(BenchError::Other("--n-iter and --batches must be at least 1".into()));
    }
    let limits = Limits::default();
    println!("{:<28} {:>8} {:>10} {:>10} {:>10} {:>9}", "message", "bytes", "encode", "decode", "copy", "coded/cp");
    for (name, message) in sample_messages() {
        let cost = measure(&message, &limits, &args)?;
        let ratio = (cost.encode_s + cost.decode_s) / cost.copy_s.max(1e-12);
        println!(
            "{name:<28} {:>8} {:>10} {:>10} {:>10} {ratio:>8.1}x",
            cost.bytes,
            format_seconds(cost.encode_s),
            format_seconds(cost.decode_s),
            format_seconds(cost.copy_s)
        );
    }
    Ok(())
}

fn measure(message: &WireMessage, limits: &Limits, args: &Args) -> Result<Cost, BenchError> {
    let encoded = encode_frame(message);
    match decode_frame(&encoded, limits) {
        Ok(Some((decoded, used))) if used == encoded.len() && &decoded == message => {}
        other => return Err(BenchError::Other(format!("the codec did not round-trip a sample: {other:?}"))),
    }
    let n = args.n_iter;
    let per_message = |run: &dyn Fn()| -> f64 {
        let samples: Vec<f64> = (0..args.batches)
            .map(|_| {
                let start = Instant::now();
                run();
                start.elapsed().as_secs_f64() / f64::from(n)
            })
            .collect();
        median(&samples).unwrap_or(f64::NAN)
    };
    let encode_s = per_message(&|| {
        for _ in 0..n {
            black_box(encode_frame(black_box(message)));
        }
    });
    let decode_s = per_message(&|| {
        for _ in 0..n {
            let _ = black_box(decode_frame(black_box(&encoded), limits));
        }
    });
    let copy_s = per_message(&|| {
        for _ in 0..n {
            black_box(black_box(&encoded).to_vec());
        }
    });
    Ok(Cost { bytes: encoded.len(), encode_s, decode_s, copy_s })
}
