//! `local-send-recv`: ucx-py's round-trip benchmark on ferrylink. See `--help`.
//!
//! The logic lives in [`ferrylink_benchmarks::local_send_recv`].

use clap::Parser;
use ferrylink_benchmarks::exit_on_error;
use ferrylink_benchmarks::local_send_recv::{run, Args};

fn main() {
    ferrylink_benchmarks::ucx_logs_to_stderr();
    let args = Args::parse();
    ferrylink_benchmarks::init_tracing_with_timeline(args.timeline_process());
    exit_on_error(run(args));
}
