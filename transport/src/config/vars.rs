//! The table of every `FERRYLINK_*` environment variable the library reads: its name,
//! what it accepts, its default and its meaning, and how it reads into and shows from a
//! [`Config`]. [`Config::from_lookup`] reads exactly these, through this table; README's
//! "Environment variables" table lists the same names and defaults (checked by a test).

use super::policies::ProducerOrdering;
use super::values::Config;
use ferrylink_proto::policy::{DeviceCopies, LanePolicy};
use std::path::PathBuf;
use std::time::Duration;

/// One environment variable of the library.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// The variable's name (`FERRYLINK_…`).
    pub name: &'static str,
    /// What it accepts (its type), as [`ConfigError::Invalid`](super::ConfigError) names it.
    pub expected: &'static str,
    /// Its default, spelt as a value of the variable (`unset` where the default is the
    /// variable's absence).
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// Sets the variable's part of a [`Config`] from a value (trimmed); `None` when the
    /// value is not one `expected` allows.
    pub apply: fn(&mut Config, &str) -> Option<()>,
    /// The variable's part of a [`Config`], spelt as `default` is.
    pub show: fn(&Config) -> String,
}

/// The text `show` gives a setting that is the variable's absence.
pub const UNSET: &str = "unset";

/// Every variable the library reads, in the order [`Config::from_lookup`] reads them.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "FERRYLINK_TRANSPORT",
        expected: "auto, native or ucx",
        default: "auto",
        meaning: "which lane endpoints use: auto (native on the same host and user, UCX otherwise), or a forced lane",
        apply: |c, v| {
            c.lane_policy = v.parse::<LanePolicy>().ok()?;
            Some(())
        },
        show: |c| c.lane_policy.to_string(),
    },
    Variable {
        name: "FERRYLINK_TIMEOUT_MS",
        expected: "a positive number of milliseconds",
        default: "60000",
        meaning: "the longest any blocking call waits; a peer that has not acknowledged a transfer by then is dead",
        apply: |c, v| {
            c.request_timeout = Duration::from_millis(v.parse::<u64>().ok().filter(|&ms| ms > 0)?);
            Some(())
        },
        show: |c| c.request_timeout.as_millis().to_string(),
    },
    Variable {
        name: "FERRYLINK_BUSY_POLL_US",
        expected: "a number of microseconds",
        default: "2000",
        meaning: "after activity, threads poll this long before they sleep (0 turns it off)",
        apply: |c, v| {
            c.busy_poll = Duration::from_micros(v.parse().ok()?);
            Some(())
        },
        show: |c| c.busy_poll.as_micros().to_string(),
    },
    Variable {
        name: "FERRYLINK_LINGER_US",
        expected: "a number of microseconds",
        default: "0",
        meaning: "one-sided copies up to 4 KiB whose local memory names no producer stream go to a kernel that \
                  stays this long after its last copy (0: a launch each)",
        apply: |c, v| {
            c.linger_copies = Duration::from_micros(v.parse().ok()?);
            Some(())
        },
        show: |c| c.linger_copies.as_micros().to_string(),
    },
    Variable {
        name: "FERRYLINK_DEVICE_COPIES",
        expected: "receiver or connector",
        default: "connector",
        meaning: "who runs the device copies of a native connection; the connecting side's setting holds",
        apply: |c, v| {
            c.device_copies = match v.to_ascii_lowercase().as_str() {
                "receiver" => DeviceCopies::Receiver,
                "connector" => DeviceCopies::Connector,
                _ => return None,
            };
            Some(())
        },
        show: |c| {
            match c.device_copies {
                DeviceCopies::Receiver => "receiver",
                DeviceCopies::Connector => "connector",
            }
            .to_owned()
        },
    },
    Variable {
        name: "FERRYLINK_PRODUCER_ORDERING",
        expected: "event or context",
        default: "event",
        meaning: "how a device send waits for the producer's GPU work: an event on the legacy default stream, \
                  or cuCtxSynchronize in send",
        apply: |c, v| {
            c.producer_ordering = match v.to_ascii_lowercase().as_str() {
                "event" => ProducerOrdering::LegacyStreamEvent,
                "context" => ProducerOrdering::ContextSynchronize,
                _ => return None,
            };
            Some(())
        },
        show: |c| {
            match c.producer_ordering {
                ProducerOrdering::LegacyStreamEvent => "event",
                ProducerOrdering::ContextSynchronize => "context",
            }
            .to_owned()
        },
    },
    Variable {
        name: "FERRYLINK_PUSH_OFFER_MAX_BYTES",
        expected: "a number of bytes",
        default: "67108864",
        meaning: "connector copies: the listener offers buffers ahead of time for a next device message of at most \
                  this size, and a posted recv_into's own device buffers for the next message whatever its size (0 \
                  turns both kinds of offers off)",
        apply: |c, v| {
            c.push_offer_max_bytes = v.parse().ok()?;
            Some(())
        },
        show: |c| c.push_offer_max_bytes.to_string(),
    },
    Variable {
        name: "FERRYLINK_RECV_DEVICE",
        expected: "a CUDA device ordinal",
        default: UNSET,
        meaning: "the device received device frames land on (unset: the device they came from when this process \
                  sees it, else 0)",
        apply: |c, v| {
            c.recv_device = Some(v.parse().ok()?);
            Some(())
        },
        show: |c| c.recv_device.map_or_else(|| UNSET.to_owned(), |d| d.to_string()),
    },
    Variable {
        name: "FERRYLINK_CONTROL_RING_BYTES",
        expected: "0, or a power of two from 4096 to 67108864",
        default: "1048576",
        meaning: "control messages of a Unix-socket connection go through shared-memory rings of this size per \
                  direction (0 turns them off)",
        apply: |c, v| {
            let bytes = v.parse::<usize>().ok()?;
            (bytes == 0 || ferrylink_ipc::control_ring::is_valid_ring_size(bytes as u64)).then_some(())?;
            c.control_ring_bytes = bytes;
            Some(())
        },
        show: |c| c.control_ring_bytes.to_string(),
    },
    Variable {
        name: "FERRYLINK_COPY_KERNEL_MAX_BYTES",
        expected: "a number of bytes",
        default: "67108864",
        meaning: "same-device copies up to this size run as a small copy kernel, larger ones on the copy engine \
                  (0: always the copy engine); process-wide, set when a context is built",
        apply: |c, v| {
            c.cuda.copy_kernel_max_bytes = v.parse().ok()?;
            Some(())
        },
        show: |c| c.cuda.copy_kernel_max_bytes.to_string(),
    },
    Variable {
        name: "FERRYLINK_DISABLE_CUDA",
        expected: "1 (CUDA off) or 0",
        default: "0",
        meaning: "1: the process never loads the CUDA driver, as on a machine without CUDA; process-wide, applied \
                  when a context is built, if nothing used CUDA before",
        apply: |c, v| {
            c.cuda.disable = switch(v)?;
            Some(())
        },
        show: |c| shown(c.cuda.disable),
    },
    Variable {
        name: "FERRYLINK_UCX_LIB",
        expected: "a non-empty UTF-8 path or name of a libucp shared library",
        default: ucx_sys::DEFAULT_LIBRARY,
        meaning: "the UCX library the UCX lane loads",
        apply: |c, v| {
            (!v.is_empty() && !v.contains(char::REPLACEMENT_CHARACTER)).then_some(())?;
            c.ucx_library = Some(PathBuf::from(v));
            Some(())
        },
        show: |c| {
            c.ucx_library.as_ref().map_or_else(|| ucx_sys::DEFAULT_LIBRARY.to_owned(), |p| p.display().to_string())
        },
    },
    Variable {
        name: "FERRYLINK_UCX_RMA",
        expected: "1 (on) or 0",
        default: "0",
        meaning: "1: the UCX lane carries one-sided transfers (UCX's RMA); where UCX emulates RMA (TCP) a UCX peer \
                  can then read and write any memory of this process, so turn it on only among trusted peers",
        apply: |c, v| {
            c.ucx_rma = switch(v)?;
            Some(())
        },
        show: |c| shown(c.ucx_rma),
    },
    Variable {
        name: "FERRYLINK_UCX_STAGED",
        expected: "1 (on) or 0",
        default: "0",
        meaning: "1: one-sided transfers over UCX go through pinned host memory on both sides whatever the memory \
                  (device memory does anyway unless both sides' UCX is CUDA-aware); the owner's setting decides",
        apply: |c, v| {
            c.ucx_staged = switch(v)?;
            Some(())
        },
        show: |c| shown(c.ucx_staged),
    },
];

/// A switch's value: "1" on, "0" off, anything else refused.
fn switch(value: &str) -> Option<bool> {
    match value {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// A switch as its variable's value.
fn shown(on: bool) -> String {
    if on { "1" } else { "0" }.to_owned()
}

/// The variable of `name` in [`VARIABLES`].
pub fn variable(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|v| v.name == name)
}
