//! `local-send-recv`: ucx-py's round-trip benchmark on ferrylink. See `--help`.

use clap::{Parser, ValueEnum};
use ferrylink::memory::cuda;
use ferrylink::transport::{Config, Context, Endpoint, Lane, Listener};
use ferrylink_benchmarks::ceiling::{self, Ceiling};
use ferrylink_benchmarks::record::GB;
use ferrylink_benchmarks::report::{roundtrip_table, Measurement, RunInfo};
use ferrylink_benchmarks::roundtrip::{run_client, serve, RoundTripOptions};
use ferrylink_benchmarks::size::{format_bytes, format_rate, format_seconds, parse_size, parse_sweep};
use ferrylink_benchmarks::stats::Summary;
use ferrylink_benchmarks::{exit_on_error, plot, progress, timeline, BenchError, ObjectType};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the server process may take to start listening, and to accept.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server process may take to exit after the last round trip.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pairs {
    /// Every (server device, client device) pair.
    All,
}

/// Round-trip benchmark (ucx-py's local-send-recv): the client sends n bytes to a server
/// process, which sends them back. Bandwidth = 2·n/t per round trip (as ucx-py reports
/// it), printed with the lane that ran, the hardware ceiling measured in the same run and
/// the efficiency against it.
#[derive(Debug, Clone, Parser)]
#[command(name = "local-send-recv", version, after_help = AFTER_HELP)]
struct Args {
    /// Message size: 1000000, 100MB (10^6), 10MiB (2^20), 1GB, 1GiB. The default of 100 MB
    /// finishes in a few seconds on host memory on a small machine; ucx-py users comparing
    /// figures usually pass -n 1GB and -n 1MB.
    #[arg(short = 'n', long, default_value = "100MB", value_parser = parse_size)]
    n_bytes: u64,
    /// Timed round trips.
    #[arg(long, default_value_t = 10)]
    n_iter: usize,
    /// Untimed round trips before them.
    #[arg(long, default_value_t = 1)]
    n_warmup_iter: usize,
    /// Memory to send: device when a CUDA device is present, host otherwise.
    #[arg(short = 'o', long, value_enum)]
    object_type: Option<ObjectType>,
    /// The server's CUDA device.
    #[arg(short = 'd', long, default_value_t = 0)]
    server_dev: usize,
    /// The client's CUDA device.
    #[arg(short = 'e', long, default_value_t = 0)]
    client_dev: usize,
    /// Receive into one preallocated buffer on both sides instead of fresh memory each time.
    #[arg(long)]
    reuse_alloc: bool,
    /// Only run the server (for a client started separately with --client-only).
    #[arg(long, conflicts_with_all = ["client_only", "sweep", "pairs"])]
    server_only: bool,
    /// Only run the client, connecting to --server-address (and --port).
    #[arg(long, requires = "server_address", conflicts_with_all = ["sweep", "pairs"])]
    client_only: bool,
    /// With --server-only / --client-only: a Unix socket path (`unix:/path`, or any path
    /// with a `/`) on this machine, or the server's host name / IP address (with -p: the
    /// UCX lane across machines).
    #[arg(short = 's', long)]
    server_address: Option<String>,
    /// TCP port of the server (with -s HOST, or alone with --server-only: listen on all
    /// interfaces). Control messages go over TCP, data over UCX.
    #[arg(short = 'p', long)]
    port: Option<u16>,
    /// Print one JSON object per line per run instead of the table.
    #[arg(long)]
    json: bool,
    /// Run every size from MIN to MAX, doubling (e.g. 1MB:1GB); prints a summary and draws
    /// bandwidth against size to --plot.
    #[arg(long, value_name = "MIN:MAX", conflicts_with = "pairs")]
    sweep: Option<String>,
    /// Where --sweep draws its SVG plot.
    #[arg(long, value_name = "PATH", default_value = "local-send-recv-sweep.svg")]
    plot: PathBuf,
    /// Run every device pair and print a matrix (device objects only).
    #[arg(long, value_enum)]
    pairs: Option<Pairs>,
    /// After the table, print where a round trip's time goes: the median time of each
    /// step in the client's and the server's threads (the transport's trace events),
    /// from the start of the round trip. Recording adds about 0.5 µs per step.
    #[arg(long, conflicts_with_all = ["json", "sweep", "pairs", "server_only", "client_only"])]
    timeline: bool,
    /// Internal: serve one client on this Unix socket (how the client starts its server).
    #[arg(long, hide = true, value_name = "PATH")]
    serve_on: Option<PathBuf>,
    /// Internal: the server records its timeline into this file.
    #[arg(long, hide = true, value_name = "PATH", requires = "serve_on")]
    timeline_file: Option<PathBuf>,
}

const AFTER_HELP: &str = "\
Environment: FERRYLINK_TRANSPORT=auto|native|ucx picks the lane (both processes inherit it);
FERRYLINK_TIMEOUT_MS bounds every transfer; RUST_LOG=debug shows the transport's logs.

Ceiling: host runs time memcpy of n bytes between two pre-touched buffers, there and back
(a round trip needs at least one copy each way), as 2·n/t; device runs time raw
cuMemcpyDtoD (same device) or cuMemcpyPeer (two devices) both ways. Efficiency = average
bandwidth / ceiling. Exit codes: 0 ok, 2 bad options or unsupported here, 1 failure.";

fn main() {
    let args = Args::parse();
    let timeline = match (&args.timeline_file, args.timeline) {
        (Some(_), _) => Some("server"),
        (None, true) => Some("client"),
        (None, false) => None,
    };
    ferrylink_benchmarks::init_tracing_with_timeline(timeline);
    exit_on_error(run(args));
}

fn run(args: Args) -> Result<(), BenchError> {
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
        let ep = match &address {
            Address::Unix(path) => ctx.connect(path),
            Address::Tcp(host, port) => ctx.connect_tcp((host.as_str(), *port)),
        }
        .map_err(|e| BenchError::Transport(format!("connecting to {address}: {e}")))?;
        let times = run_client(&ep, &o)?;
        let (info, m) = finish_run(&o, ep.lane(), &times);
        return print_single(&args, &info, &m);
    }
    if let Some(range) = &args.sweep {
        return sweep(&args, &ctx, &o, &parse_sweep(range)?);
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
    Ok(())
}

fn options(args: &Args, object_type: ObjectType, n_bytes: usize) -> RoundTripOptions {
    RoundTripOptions {
        n_bytes,
        n_iter: args.n_iter,
        n_warmup_iter: args.n_warmup_iter,
        object_type,
        server_dev: args.server_dev,
        client_dev: args.client_dev,
        reuse_alloc: args.reuse_alloc,
    }
}

/// Where a standalone server listens / a standalone client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Address {
    /// A Unix socket on this machine (native lane).
    Unix(PathBuf),
    /// A TCP address (another machine: the UCX lane).
    Tcp(String, u16),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(h, p) => write!(f, "tcp {h}:{p}"),
        }
    }
}

/// `-s/--server-address` and `-p/--port`: a Unix socket path (`unix:/path`, or anything
/// with a `/`), or a host name / IP address with a port.
fn server_address(args: &Args) -> Result<Option<Address>, BenchError> {
    let standalone = args.server_only || args.client_only;
    if !standalone && (args.server_address.is_some() || args.port.is_some()) {
        return Err(BenchError::Usage(
            "-s/--server-address and -p/--port are for runs in two processes started separately: \
             use --server-only on one side and --client-only on the other"
                .into(),
        ));
    }
    match (args.server_address.as_deref(), args.port) {
        (None, None) => Ok(None),
        (Some(a), None) if a.starts_with("unix:") => Ok(Some(Address::Unix(PathBuf::from(&a["unix:".len()..])))),
        (Some(a), None) if a.contains('/') => Ok(Some(Address::Unix(PathBuf::from(a)))),
        (Some(a), None) => {
            Err(BenchError::Usage(format!("-s/--server-address {a} is a network address: give -p/--port too")))
        }
        (None, Some(port)) if args.server_only => Ok(Some(Address::Tcp("0.0.0.0".into(), port))),
        (None, Some(_)) => Err(BenchError::Usage("--client-only -p/--port needs -s/--server-address HOST".into())),
        (Some(a), Some(port)) if !a.contains('/') => Ok(Some(Address::Tcp(a.to_owned(), port))),
        (Some(a), Some(_)) => Err(BenchError::Usage(format!("-p/--port does not go with the Unix socket {a}"))),
    }
}

/// The object type asked for (or the default), checked against the machine.
fn object_type(args: &Args) -> Result<ObjectType, BenchError> {
    let count = cuda::device_count();
    let ty = args.object_type.unwrap_or(if count > 0 { ObjectType::Device } else { ObjectType::Host });
    if args.pairs.is_some() && ty != ObjectType::Device {
        return Err(BenchError::Usage(if count == 0 {
            "--pairs needs device objects, and this machine has no CUDA device".into()
        } else {
            "--pairs needs device objects (-o device)".into()
        }));
    }
    if ty == ObjectType::Device {
        if let Err(e) = cuda::probe() {
            return Err(BenchError::Unsupported(format!("-o device needs a CUDA device: {e}")));
        }
        for (flag, dev) in [("-d/--server-dev", args.server_dev), ("-e/--client-dev", args.client_dev)] {
            if dev >= count {
                return Err(BenchError::Usage(format!(
                    "{flag} {dev} is out of range: this machine has {count} CUDA device(s) (0..{})",
                    count - 1
                )));
            }
        }
    }
    Ok(ty)
}

/// A context from the environment whose received device frames land on `dev` (this
/// side's device: `-d` for the server, `-e` for the client), unless
/// `FERRYLINK_RECV_DEVICE` says otherwise.
fn side_context(o: &RoundTripOptions, dev: usize) -> Result<Context, BenchError> {
    let mut config = Config::from_env().map_err(|e| BenchError::Transport(e.to_string()))?;
    if o.object_type == ObjectType::Device && std::env::var_os("FERRYLINK_RECV_DEVICE").is_none() {
        config.recv_device = Some(dev);
    }
    Context::new(config).map_err(|e| BenchError::Transport(e.to_string()))
}

/// The server process of a local run: serves one client on `path`, printing `ready` on
/// stdout once it listens.
fn serve_on(path: &Path, o: &RoundTripOptions) -> Result<(), BenchError> {
    let ctx = side_context(o, o.server_dev)?;
    let listener = Listener::bind(&ctx, path)
        .map_err(|e| BenchError::Transport(format!("listening on {}: {e}", path.display())))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|_| out.flush())?;
    let ep = listener.accept_timeout(STARTUP_TIMEOUT).map_err(|e| BenchError::Transport(format!("accept: {e}")))?;
    serve(&ep, o)
}

/// `--server-only`: serves one client at `address` (a Unix socket, or TCP for the UCX lane).
fn serve_standalone(address: Address, o: &RoundTripOptions) -> Result<(), BenchError> {
    let ctx = side_context(o, o.server_dev)?;
    let listener = match &address {
        Address::Unix(path) => Listener::bind(&ctx, path),
        Address::Tcp(host, port) => Listener::bind_tcp(&ctx, (host.as_str(), *port)),
    }
    .map_err(|e| BenchError::Transport(format!("listening on {address}: {e}")))?;
    let client_address = match (&address, listener.tcp_addr()) {
        (Address::Tcp(..), Some(a)) => format!("-s <this host> -p {}", a.port()),
        _ => format!("-s {address}"),
    };
    eprintln!(
        "listening on {address}; run the client with: local-send-recv --client-only {client_address} -o {} -n {} \
         --n-iter {} --n-warmup-iter {}{}",
        o.object_type,
        o.n_bytes,
        o.n_iter,
        o.n_warmup_iter,
        if o.reuse_alloc { " --reuse-alloc" } else { "" }
    );
    let ep = listener
        .accept_timeout(Duration::from_secs(3600))
        .map_err(|e| BenchError::Transport(format!("accept: {e}")))?;
    eprintln!("client connected ({} lane)", ep.lane());
    serve(&ep, o)
}

fn unique_socket_path(run: usize) -> PathBuf {
    ferrylink::transport::private_runtime_dir().join(format!("local-send-recv-{}-{run}.sock", std::process::id()))
}

/// The server process of one run (this binary, re-executed with `--serve-on`).
struct ServerProcess {
    child: Child,
    path: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Starts it and waits until it listens.
    fn spawn(o: &RoundTripOptions, run: usize, timeline_file: Option<&Path>) -> Result<Self, BenchError> {
        let path = unique_socket_path(run);
        let exe = std::env::current_exe().map_err(|e| BenchError::Server(format!("finding this binary: {e}")))?;
        let mut argv: Vec<OsString> = vec!["--serve-on".into(), path.clone().into()];
        for (flag, value) in [
            ("--n-bytes", o.n_bytes.to_string()),
            ("--n-iter", o.n_iter.to_string()),
            ("--n-warmup-iter", o.n_warmup_iter.to_string()),
            ("--object-type", o.object_type.to_string()),
            ("--server-dev", o.server_dev.to_string()),
            ("--client-dev", o.client_dev.to_string()),
        ] {
            argv.push(flag.into());
            argv.push(value.into());
        }
        if o.reuse_alloc {
            argv.push("--reuse-alloc".into());
        }
        if let Some(file) = timeline_file {
            argv.push("--timeline-file".into());
            argv.push(file.into());
        }
        // With RUST_LOG set the server's log goes to the terminal beside the client's
        // (for tracing a run); otherwise it is kept for the error message.
        let server_stderr = if std::env::var_os("RUST_LOG").is_some() { Stdio::inherit() } else { Stdio::piped() };
        let mut child = Command::new(&exe)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(server_stderr)
            .spawn()
            .map_err(|e| BenchError::Server(format!("starting {}: {e}", exe.display())))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let sink = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = err.read(&mut buf) {
                    sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut server = ServerProcess { child, path, stderr };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.trim() == "ready" => return Ok(server),
                Ok(_) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    return Err(server.fail(&format!("did not start listening within {STARTUP_TIMEOUT:?}")))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(server.fail("exited before it was ready"))
                }
            }
        }
    }

    /// Stops the process (if still running) and describes `what` with its stderr.
    fn fail(&mut self, what: &str) -> BenchError {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => s.to_string(),
            _ => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                "killed".into()
            }
        };
        std::thread::sleep(Duration::from_millis(50)); // let the stderr reader catch up
        let err = self.stderr.lock().unwrap_or_else(|p| p.into_inner()).trim().to_owned();
        let err = if err.is_empty() { String::new() } else { format!("; its stderr:\n{err}") };
        BenchError::Server(format!("the server process {what} ({status}){err}"))
    }

    /// Waits for a clean exit.
    fn finish(mut self) -> Result<(), BenchError> {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(_)) => return Err(self.fail("failed")),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return Err(self.fail(&format!("did not exit within {EXIT_TIMEOUT:?}"))),
                Err(e) => return Err(BenchError::Server(format!("waiting for the server process: {e}"))),
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One run: a server process, the client's round trips, then the ceiling.
fn run_once(
    ctx: &Context,
    o: &RoundTripOptions,
    run: usize,
    timeline_file: Option<&Path>,
) -> Result<(RunInfo, Measurement), BenchError> {
    let mut server = ServerProcess::spawn(o, run, timeline_file)?;
    let ep: Endpoint = match ctx.connect(&server.path) {
        Ok(ep) => ep,
        Err(e) => {
            let se = server.fail("could not be reached");
            return Err(BenchError::Transport(format!("connecting to the server: {e}; {se}")));
        }
    };
    let lane = ep.lane();
    let result = run_client(&ep, o);
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
    Ok(finish_run(o, lane, &times))
}

/// The report of a run, with its ceiling measured now.
fn finish_run(o: &RoundTripOptions, lane: Lane, times: &[Duration]) -> (RunInfo, Measurement) {
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
    let devices = o.object_type == ObjectType::Device;
    let info = RunInfo {
        benchmark: "local-send-recv".into(),
        lane: Some(lane.to_string()),
        ucx_tls: (lane == Lane::Ucx)
            .then(|| std::env::var("UCX_TLS").unwrap_or_else(|_| "(unset: UCX default)".into())),
        object_type: o.object_type,
        n_bytes: o.n_bytes as u64,
        n_iter: o.n_iter,
        n_warmup_iter: o.n_warmup_iter,
        reuse_alloc: o.reuse_alloc,
        server_dev: devices.then_some(o.server_dev),
        client_dev: devices.then_some(o.client_dev),
    };
    let m = Measurement {
        case: "roundtrip".into(),
        title: "round trip".into(),
        summary: Summary::new(2.0 * o.n_bytes as f64, times),
        ceiling,
    };
    (info, m)
}

fn print_single(args: &Args, info: &RunInfo, m: &Measurement) -> Result<(), BenchError> {
    let text = if args.json { info.record(m).to_json_line() + "\n" } else { roundtrip_table(info, m).render() };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|_| out.flush())?;
    Ok(())
}

fn efficiency(m: &Measurement) -> String {
    m.efficiency().map_or_else(|| "n/a".into(), |e| format!("{:.1} %", e * 100.0))
}

fn sweep(args: &Args, ctx: &Context, base: &RoundTripOptions, sizes: &[u64]) -> Result<(), BenchError> {
    let bar = progress::bar(sizes.len() as u64, "sweep");
    let mut runs = Vec::with_capacity(sizes.len());
    for (i, &n) in sizes.iter().enumerate() {
        bar.set_message(format_bytes(n as f64));
        let n_bytes = usize::try_from(n).map_err(|_| BenchError::Usage(format!("{n} bytes is too large")))?;
        let o = RoundTripOptions { n_bytes, ..base.clone() };
        let (info, m) = run_once(ctx, &o, i, None).inspect_err(|_| bar.abandon())?;
        if args.json {
            println!("{}", info.record(&m).to_json_line());
        }
        runs.push((info, m));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let lane = runs.first().and_then(|(i, _)| i.lane.clone()).unwrap_or_default();
    if !args.json {
        let (first, _) = &runs[0];
        println!(
            "Sweep: local-send-recv, lane {lane}, object {}, reuse alloc {}, n_iter {}, device(s) {}",
            first.object_type,
            first.reuse_alloc,
            first.n_iter,
            first.devices()
        );
        println!(
            "{:>12} | {:>12} | {:>12} | {:>14} | {:>12} | {:>10}",
            "n_bytes", "average", "median", "latency median", "ceiling", "efficiency"
        );
        for (info, m) in &runs {
            println!(
                "{:>12} | {:>12} | {:>12} | {:>14} | {:>12} | {:>10}",
                format_bytes(info.n_bytes as f64),
                format_rate(m.summary.bandwidth_avg()),
                format_rate(m.summary.bandwidth_median()),
                format_seconds(m.summary.latency_median()),
                m.ceiling.as_ref().map_or_else(|| "n/a".into(), |c| format_rate(c.bytes_per_sec)),
                efficiency(m)
            );
        }
    }
    let series = vec![
        plot::Series {
            name: format!("ferrylink round trip, {lane} lane (average)"),
            points: runs.iter().map(|(i, m)| (i.n_bytes, m.summary.bandwidth_avg() / GB)).collect(),
        },
        plot::Series {
            name: "ceiling (raw copy, same run)".into(),
            points: runs
                .iter()
                .filter_map(|(i, m)| m.ceiling.as_ref().map(|c| (i.n_bytes, c.bytes_per_sec / GB)))
                .collect(),
        },
    ];
    let title = format!("local-send-recv: round-trip bandwidth (2·n/t), {lane} lane, {}", base.object_type);
    plot::draw_sweep(&args.plot, &title, &series).map_err(BenchError::Other)?;
    eprintln!("plot written to {}", args.plot.display());
    Ok(())
}

fn pairs(args: &Args, base: &RoundTripOptions) -> Result<(), BenchError> {
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
