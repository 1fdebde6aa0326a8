//! What one side of a run needs from the options: the [`RoundTripOptions`], the object
//! type checked against the machine (and `--memory` against it), `--op` and `--blocks`
//! checked against the sizes, the transport context of that side, and the client's side
//! of a round trip of either kind ([`ClientSide`]).

use super::args::Args;
use crate::onesided::{self, BlockLayout, Op};
use crate::roundtrip::{run_client, ClientTimes, RoundTripOptions};
use crate::{BenchError, MemoryKind, ObjectType};
use ferrylink::memory::cuda;
use ferrylink::transport::{Config, Context, Endpoint};

/// The options of one run, from the command line.
pub(super) fn options(args: &Args, object_type: ObjectType, n_bytes: usize) -> RoundTripOptions {
    RoundTripOptions {
        n_bytes,
        n_iter: args.n_iter,
        n_warmup_iter: args.n_warmup_iter,
        object_type,
        memory: args.memory,
        server_dev: args.server_dev,
        client_dev: args.client_dev,
        reuse_alloc: args.reuse_alloc,
        check_every: args.check,
        corrupt_echo: args.corrupt_echo_for_test,
        op: args.op,
        blocks: args.blocks.unwrap_or(1),
        prepared: args.prepared,
        skip_transfer: args.skip_transfer_for_test,
    }
}

/// `--op` against the other options: `--blocks` only with one-sided round trips, at least
/// 1 and dividing every size of the run (`sizes`: `-n`, or each size of `--sweep`);
/// `--reuse-alloc` and the send path's test hook only with sends, the one-sided one only
/// with put and get.
pub(super) fn check_op(args: &Args, sizes: &[u64]) -> Result<(), BenchError> {
    let usage = |m: String| Err(BenchError::Usage(m));
    if args.op.one_sided().is_none() {
        if let Some(n) = args.blocks {
            return usage(format!("--blocks {n} goes with --op put or --op get: a send moves its bytes as one frame"));
        }
        if args.skip_transfer_for_test.is_some() {
            return usage("--skip-transfer-for-test goes with --op put or --op get".into());
        }
        if args.prepared {
            return usage("--prepared goes with --op put or --op get".into());
        }
        return Ok(());
    }
    let op = args.op;
    if args.reuse_alloc {
        return usage(format!(
            "--reuse-alloc is for --op send: --op {op} registers its buffers once and uses them every round trip"
        ));
    }
    if args.corrupt_echo_for_test.is_some() {
        return usage(format!("--corrupt-echo-for-test is for --op send (--op {op}: --skip-transfer-for-test)"));
    }
    let blocks = args.blocks.unwrap_or(1);
    let flag = if args.sweep.is_some() { "--sweep" } else { "-n" };
    for &n in sizes {
        let n = usize::try_from(n).map_err(|_| BenchError::Usage(format!("{flag}: {n} bytes is too large")))?;
        BlockLayout::new(n, blocks).map_err(|e| BenchError::Usage(format!("{flag}: {e}")))?;
    }
    Ok(())
}

/// The client's side of a run: the send path, or a one-sided client whose regions are
/// registered before the server is started (so that memory the transport refuses is
/// reported as such, with nothing else running).
pub(super) enum ClientSide {
    /// `--op send`.
    Send,
    /// `--op put` or `get`.
    OneSided(onesided::Client),
}

impl ClientSide {
    /// Prepares the client of `o` on `ctx`.
    pub(super) fn prepare(ctx: &Context, o: &RoundTripOptions) -> Result<ClientSide, BenchError> {
        Ok(match o.op {
            Op::Send => ClientSide::Send,
            Op::Put | Op::Get => ClientSide::OneSided(onesided::Client::prepare(ctx, o)?),
        })
    }

    /// Runs the round trips on `ep`.
    pub(super) fn run(self, ep: &Endpoint, o: &RoundTripOptions) -> Result<ClientTimes, BenchError> {
        match self {
            ClientSide::Send => run_client(ep, o),
            ClientSide::OneSided(client) => client.run(ep, o),
        }
    }
}

/// The object type asked for (or the default), checked against the machine and against
/// `--memory`.
pub(super) fn object_type(args: &Args) -> Result<ObjectType, BenchError> {
    let count = cuda::device_count();
    let ty = args.object_type.unwrap_or(if count > 0 { ObjectType::Device } else { ObjectType::Host });
    check_memory(args, ty, count)?;
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

/// `--memory` other than `pool` needs device objects, and makes its own buffers (no
/// `--reuse-alloc`).
fn check_memory(args: &Args, ty: ObjectType, count: usize) -> Result<(), BenchError> {
    let memory = args.memory;
    if memory == MemoryKind::Pool {
        return Ok(());
    }
    if ty != ObjectType::Device {
        return Err(BenchError::Usage(if count == 0 {
            format!("--memory {memory} needs device objects, and this machine has no CUDA device")
        } else {
            format!("--memory {memory} needs device objects (-o device); host runs use shared host memory")
        }));
    }
    if args.reuse_alloc {
        return Err(BenchError::Usage(format!(
            "--memory {memory} makes fresh buffers every round trip; --reuse-alloc goes with --memory pool only"
        )));
    }
    Ok(())
}

/// A context from the environment whose received device frames land on `dev` (this
/// side's device: `-d` for the server, `-e` for the client), unless
/// `FERRYLINK_RECV_DEVICE` says otherwise.
pub(super) fn side_context(o: &RoundTripOptions, dev: usize) -> Result<Context, BenchError> {
    let mut config = Config::from_env().map_err(|e| BenchError::Transport(e.to_string()))?;
    if o.object_type == ObjectType::Device && std::env::var_os("FERRYLINK_RECV_DEVICE").is_none() {
        config.recv_device = Some(dev);
    }
    Context::new(config).map_err(|e| BenchError::Transport(e.to_string()))
}
