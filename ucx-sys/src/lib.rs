//! `ucx-sys`: raw UCX (ucp) FFI, loaded at run time (being written).
