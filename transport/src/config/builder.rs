//! The `with_*` methods of [`Config`] and [`CudaConfig`]: each returns the config with one
//! setting changed, so a config is built from [`Config::default`] (or
//! [`Config::from_env`]) without naming every field, and fields can be added without
//! breaking callers (both types are `#[non_exhaustive]`: no struct literal outside this
//! crate).
//!
//! ```
//! use ferrylink_transport::{Config, LanePolicy};
//! use std::time::Duration;
//!
//! let config = Config::default().with_lane_policy(LanePolicy::Native).with_request_timeout(Duration::from_secs(5));
//! assert_eq!(config.request_timeout, Duration::from_secs(5));
//! ```
//!
//! ```compile_fail
//! // Outside this crate a config cannot be written as a struct literal.
//! let config = ferrylink_transport::Config { ucx_rma: true, ..Default::default() };
//! ```

use super::policies::ProducerOrdering;
use super::values::{Config, CudaConfig};
use ferrylink_proto::policy::{DeviceCopies, LanePolicy};
use std::path::PathBuf;
use std::time::Duration;

/// `impl $config { with_field(self, value) -> Self }` for each `field: type => with_field`.
macro_rules! with_methods {
    ($config:ident { $($field:ident: $ty:ty => $with:ident;)* }) => {
        impl $config {
            $(
                #[doc = concat!("This config with [`", stringify!($config), "::", stringify!($field), "`] set to `value`.")]
                #[must_use]
                pub fn $with(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

with_methods!(Config {
    lane_policy: LanePolicy => with_lane_policy;
    request_timeout: Duration => with_request_timeout;
    busy_poll: Duration => with_busy_poll;
    linger_copies: Duration => with_linger_copies;
    connect_timeout: Duration => with_connect_timeout;
    max_header_bytes: usize => with_max_header_bytes;
    max_frames: usize => with_max_frames;
    max_frame_len: u64 => with_max_frame_len;
    max_message_bytes: u64 => with_max_message_bytes;
    inline_threshold: usize => with_inline_threshold;
    staging_region_bytes: usize => with_staging_region_bytes;
    staging_max_bytes: usize => with_staging_max_bytes;
    landing_max_bytes: usize => with_landing_max_bytes;
    unexpected_max_bytes: usize => with_unexpected_max_bytes;
    max_region_bytes: u64 => with_max_region_bytes;
    device_copies: DeviceCopies => with_device_copies;
    producer_ordering: ProducerOrdering => with_producer_ordering;
    push_offer_max_bytes: u64 => with_push_offer_max_bytes;
    recv_device: Option<usize> => with_recv_device;
    max_mapped_device_bytes: u64 => with_max_mapped_device_bytes;
    control_ring_bytes: usize => with_control_ring_bytes;
    cuda: CudaConfig => with_cuda;
    ucx_library: Option<PathBuf> => with_ucx_library;
    ucx_rma: bool => with_ucx_rma;
    ucx_staged: bool => with_ucx_staged;
});

with_methods!(CudaConfig {
    copy_kernel_max_bytes: usize => with_copy_kernel_max_bytes;
    disable: bool => with_disable;
});
