//! The server side: serving one client (in the re-executed server process, or standalone
//! with `--server-only`), and the client's handle on the server process it starts
//! ([`ServerProcess`]).

use super::address::Address;
use super::raw_ucx;
use super::setup::side_context;
use crate::onesided::{self, Op};
use crate::roundtrip::{serve, RoundTripOptions};
use crate::BenchError;
use ferrylink::transport::{Context, Endpoint, Listener};
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

/// The server process of a local run: serves one client on `path`, printing `ready` on
/// stdout once it listens.
pub(super) fn serve_on(path: &Path, o: &RoundTripOptions) -> Result<(), BenchError> {
    let ctx = side_context(o, o.server_dev)?;
    let listener = Listener::bind(&ctx, path)
        .map_err(|e| BenchError::Transport(format!("listening on {}: {e}", path.display())))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|_| out.flush())?;
    let ep = listener.accept_timeout(STARTUP_TIMEOUT).map_err(|e| BenchError::Transport(format!("accept: {e}")))?;
    serve_client(&ctx, &ep, o)
}

/// Serves the round trips of `o` on `ep`: echoes (`--op send`), then on the UCX lane the
/// raw UCX reference's (a failure of which is the reference's alone: said on stderr); or
/// one-sided answers.
fn serve_client(ctx: &Context, ep: &Endpoint, o: &RoundTripOptions) -> Result<(), BenchError> {
    match o.op {
        Op::Send => {
            serve(ep, o)?;
            if raw_ucx::applies(o, ep.lane()) {
                if let Err(why) = raw_ucx::serve(ctx, ep, o) {
                    eprintln!("warning: the raw UCX reference was left out: {why}");
                }
            }
            Ok(())
        }
        Op::Put | Op::Get => onesided::serve(ctx, ep, o),
    }
}

/// `--server-only`: serves one client at `address` (a Unix socket, or TCP for the UCX lane).
pub(super) fn serve_standalone(address: Address, o: &RoundTripOptions) -> Result<(), BenchError> {
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
    let op = match o.op {
        Op::Send => String::new(),
        op => format!(" --op {op} --blocks {}{}", o.blocks, if o.prepared { " --prepared" } else { "" }),
    };
    eprintln!(
        "listening on {address}; run the client with: local-send-recv --client-only {client_address} -o {} -n {} \
         --n-iter {} --n-warmup-iter {} --memory {}{}{op}",
        o.object_type,
        o.n_bytes,
        o.n_iter,
        o.n_warmup_iter,
        o.memory,
        if o.reuse_alloc { " --reuse-alloc" } else { "" }
    );
    let ep = listener
        .accept_timeout(Duration::from_secs(3600))
        .map_err(|e| BenchError::Transport(format!("accept: {e}")))?;
    eprintln!("client connected ({} lane)", ep.lane());
    serve_client(&ctx, &ep, o)
}

pub(super) fn unique_socket_path(run: usize) -> PathBuf {
    ferrylink::transport::private_runtime_dir().join(format!("local-send-recv-{}-{run}.sock", std::process::id()))
}

/// The server process of one run (this binary, re-executed with `--serve-on`).
pub(super) struct ServerProcess {
    pub(super) child: Child,
    pub(super) path: PathBuf,
    pub(super) stderr: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Starts it and waits until it listens.
    pub(super) fn spawn(o: &RoundTripOptions, run: usize, timeline_file: Option<&Path>) -> Result<Self, BenchError> {
        let path = unique_socket_path(run);
        let exe = std::env::current_exe().map_err(|e| BenchError::Server(format!("finding this binary: {e}")))?;
        let mut argv: Vec<OsString> = vec!["--serve-on".into(), path.clone().into()];
        for (flag, value) in [
            ("--n-bytes", o.n_bytes.to_string()),
            ("--n-iter", o.n_iter.to_string()),
            ("--n-warmup-iter", o.n_warmup_iter.to_string()),
            ("--object-type", o.object_type.to_string()),
            ("--memory", o.memory.to_string()),
            ("--server-dev", o.server_dev.to_string()),
            ("--client-dev", o.client_dev.to_string()),
        ] {
            argv.push(flag.into());
            argv.push(value.into());
        }
        if o.reuse_alloc {
            argv.push("--reuse-alloc".into());
        }
        if let Some(round_trip) = o.corrupt_echo {
            argv.push("--corrupt-echo-for-test".into());
            argv.push(round_trip.to_string().into());
        }
        if o.op != Op::Send {
            argv.extend(["--op".into(), o.op.to_string().into(), "--blocks".into(), o.blocks.to_string().into()]);
            if o.prepared {
                argv.push("--prepared".into());
            }
        }
        if let Some(skip) = o.skip_transfer {
            argv.push("--skip-transfer-for-test".into());
            argv.push(skip.to_string().into());
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
    pub(super) fn fail(&mut self, what: &str) -> BenchError {
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
    pub(super) fn finish(mut self) -> Result<(), BenchError> {
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
