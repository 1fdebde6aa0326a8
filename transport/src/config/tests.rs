//! Tests of the configuration: parsing, the variable table against `Config::default()`,
//! README's table and `from_env`'s documentation, and applying the process-wide settings.

use super::*;
use ferrylink_memory::cuda;
use std::path::PathBuf;
use std::time::Duration;

/// Variables read by tests (never by the library): in README's table, not in `Config`.
const TEST_VARIABLES: &[&str] = &["FERRYLINK_REQUIRE_UCX"];

/// README, read when the tests are compiled.
const README: &str = include_str!("../../../README.md");

/// `from_lookup` with only `name` set to `value`.
fn with(name: &str, value: &str) -> Result<Config, ConfigError> {
    Config::from_lookup(|k| (k == name).then(|| value.to_owned()))
}

/// For each variable: a value it rejects and a valid value that is not its default.
const SAMPLES: &[(&str, &str, &str)] = &[
    ("FERRYLINK_TRANSPORT", "tcp", "native"),
    ("FERRYLINK_TIMEOUT_MS", "0", "1500"),
    ("FERRYLINK_BUSY_POLL_US", "2ms", "0"),
    ("FERRYLINK_LINGER_US", "on", "200"),
    ("FERRYLINK_DEVICE_COPIES", "sender", "receiver"),
    ("FERRYLINK_PRODUCER_ORDERING", "sync", "context"),
    ("FERRYLINK_PUSH_OFFER_MAX_BYTES", "1MB", "0"),
    ("FERRYLINK_RECV_DEVICE", "gpu1", "1"),
    ("FERRYLINK_CONTROL_RING_BYTES", "5000", "65536"),
    ("FERRYLINK_COPY_KERNEL_MAX_BYTES", "-1", "4096"),
    ("FERRYLINK_DISABLE_CUDA", "yes", "1"),
    ("FERRYLINK_UCX_LIB", "", "/opt/ucx/lib/libucp.so.0"),
    ("FERRYLINK_UCX_RMA", "on", "1"),
    ("FERRYLINK_UCX_STAGED", "yes", "1"),
];

#[test]
fn policy_parses_case_insensitively_and_rejects_others() {
    assert_eq!("AUTO".parse::<LanePolicy>().unwrap(), LanePolicy::Auto);
    assert_eq!("native".parse::<LanePolicy>().unwrap(), LanePolicy::Native);
    assert_eq!(" ucx ".parse::<LanePolicy>().unwrap(), LanePolicy::Ucx);
    let err = "tcp".parse::<LanePolicy>().unwrap_err();
    assert!(err.to_string().contains("FERRYLINK_TRANSPORT"), "{err}");
}

#[test]
fn env_values_apply_and_bad_ones_are_errors() {
    let c = Config::from_lookup(|k| match k {
        "FERRYLINK_TRANSPORT" => Some("native".into()),
        "FERRYLINK_TIMEOUT_MS" => Some("1500".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.lane_policy, LanePolicy::Native);
    assert_eq!(c.request_timeout, Duration::from_millis(1500));
    assert_eq!(with("FERRYLINK_BUSY_POLL_US", "0").unwrap().busy_poll, Duration::ZERO);
    assert_eq!(with("FERRYLINK_LINGER_US", "150").unwrap().linger_copies, Duration::from_micros(150));
    assert_eq!(Config::default().linger_copies, Duration::ZERO, "off unless asked for");
    assert_eq!(with("FERRYLINK_TRANSPORT", "").unwrap().lane_policy, LanePolicy::Auto);
    assert_eq!(with("FERRYLINK_PUSH_OFFER_MAX_BYTES", "0").unwrap().push_offer_max_bytes, 0);
    assert_eq!(with("FERRYLINK_RECV_DEVICE", " 1 ").unwrap().recv_device, Some(1));
    let c = with("FERRYLINK_PRODUCER_ORDERING", "CONTEXT").unwrap();
    assert_eq!(c.producer_ordering, ProducerOrdering::ContextSynchronize);
    let ring = |v: &str| with("FERRYLINK_CONTROL_RING_BYTES", v);
    assert_eq!(ring("0").unwrap().control_ring_bytes, 0);
    assert_eq!(ring("65536").unwrap().control_ring_bytes, 65536);
    assert!(ring("5000").is_err() && ring("2048").is_err() && ring("1MiB").is_err());
    assert_eq!(with("FERRYLINK_COPY_KERNEL_MAX_BYTES", "0").unwrap().cuda.copy_kernel_max_bytes, 0);
    assert!(with("FERRYLINK_DISABLE_CUDA", "1").unwrap().cuda.disable);
    assert!(!with("FERRYLINK_DISABLE_CUDA", "0").unwrap().cuda.disable);
    assert!(with("FERRYLINK_DISABLE_CUDA", "").is_err() && with("FERRYLINK_DISABLE_CUDA", "true").is_err());
    let c = with("FERRYLINK_UCX_LIB", "/opt/ucx/libucp.so").unwrap();
    assert_eq!(c.ucx_library, Some(PathBuf::from("/opt/ucx/libucp.so")));
    assert_eq!(c.ucx_config().library(), Some(std::path::Path::new("/opt/ucx/libucp.so")));
    assert_eq!(Config::default().ucx_config().library(), None);
    assert!(with("FERRYLINK_UCX_LIB", "  ").is_err());
    assert!(with("FERRYLINK_UCX_LIB", "/opt/\u{FFFD}/libucp.so").is_err(), "a path that was not UTF-8");
}

#[test]
fn the_table_names_each_variable_once() {
    let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), VARIABLES.len(), "a name appears twice");
    for v in VARIABLES {
        assert!(v.name.starts_with("FERRYLINK_"), "{}", v.name);
        assert!(!v.expected.is_empty() && !v.default.is_empty() && !v.meaning.is_empty(), "{}", v.name);
        assert!(variable(v.name).is_some_and(|found| found.expected == v.expected), "{}", v.name);
    }
    let sampled: Vec<&str> = SAMPLES.iter().map(|(name, _, _)| *name).collect();
    assert_eq!(sampled, VARIABLES.iter().map(|v| v.name).collect::<Vec<_>>(), "SAMPLES covers the table");
}

#[test]
fn every_variable_rejects_an_invalid_value_naming_it() {
    for &(name, invalid, _) in SAMPLES {
        let expected = variable(name).unwrap().expected;
        match with(name, invalid) {
            Err(ConfigError::Invalid { variable, value, expected: said }) => {
                assert_eq!((variable, value.as_str(), said), (name, invalid, expected));
            }
            Ok(c) => panic!("{name}={invalid:?} was accepted: {c:?}"),
            Err(other) => panic!("{name}={invalid:?}: another error than `Invalid`: {other}"),
        }
        let message = with(name, invalid).unwrap_err().to_string();
        assert!(message.contains(name) && message.contains(expected), "{message}");
    }
}

#[test]
fn every_variable_sets_what_it_shows() {
    for &(name, _, valid) in SAMPLES {
        let v = variable(name).unwrap();
        let config = with(name, valid).unwrap_or_else(|e| panic!("{name}={valid:?}: {e}"));
        assert_eq!((v.show)(&config), valid, "{name}");
        assert_ne!(valid, v.default, "{name}: the sample must differ from the default");
        let others: Vec<String> = VARIABLES.iter().filter(|o| o.name != name).map(|o| (o.show)(&config)).collect();
        let defaults: Vec<String> = VARIABLES.iter().filter(|o| o.name != name).map(|o| o.default.into()).collect();
        assert_eq!(others, defaults, "{name} changed another variable's setting");
    }
}

#[test]
fn the_table_defaults_are_config_defaults() {
    let defaults = Config::default();
    for v in VARIABLES {
        assert_eq!((v.show)(&defaults), v.default, "{}", v.name);
        if v.default != UNSET {
            let applied = with(v.name, v.default).unwrap_or_else(|e| panic!("{}: {e}", v.name));
            assert_eq!((v.show)(&applied), v.default, "{}", v.name);
        }
    }
    let read = Config::from_lookup(|_| None).unwrap();
    assert_eq!(format!("{read:?}"), format!("{defaults:?}"), "nothing set: the defaults");
}

/// The `FERRYLINK_*` rows of README's "Environment variables" table: the names in each
/// row's first cell, with the row's default cell (backticks dropped).
fn readme_rows() -> Vec<(String, String)> {
    let section = README.split("\n## Environment variables").nth(1).expect("README has the section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with('|')).skip(2) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let default = cells.get(2).map(|c| c.replace('`', "")).unwrap_or_default();
        for name in ferrylink_names(cells[0]) {
            rows.push((name, default.clone()));
        }
    }
    rows
}

/// Every `FERRYLINK_[A-Z0-9_]+` word in `text`.
fn ferrylink_names(text: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
    text.match_indices("FERRYLINK_").map(|(at, _)| text[at..].chars().take_while(|&c| word(c)).collect()).collect()
}

#[test]
fn readme_lists_exactly_the_variables_with_their_defaults() {
    let rows = readme_rows();
    let mut in_readme: Vec<&str> = rows.iter().map(|(name, _)| name.as_str()).collect();
    in_readme.sort_unstable();
    let mut expected: Vec<&str> = VARIABLES.iter().map(|v| v.name).chain(TEST_VARIABLES.iter().copied()).collect();
    expected.sort_unstable();
    assert_eq!(in_readme, expected, "README's table against the variable table and the test variables");
    for (name, default) in &rows {
        let Some(v) = variable(name) else { continue };
        if !default.is_empty() && default != "—" {
            assert_eq!(default, v.default, "README's default of {name}");
        }
    }
}

#[test]
fn from_env_documentation_names_every_variable() {
    let source = include_str!("mod.rs");
    let doc_start = source.find("    /// The defaults with the environment's").expect("from_env's doc");
    let doc_end = doc_start + source[doc_start..].find("pub fn from_env").expect("from_env");
    let doc = &source[doc_start..doc_end];
    for v in VARIABLES {
        assert!(doc.contains(&format!("`{}`", v.name)), "from_env's doc does not name {}", v.name);
    }
}

#[test]
fn a_configured_missing_ucx_library_is_an_error_naming_it() {
    let config = Config {
        lane_policy: LanePolicy::Ucx,
        ucx_library: Some(PathBuf::from("/nonexistent/config/libucp.so.0")),
        ..Config::default()
    };
    match crate::Context::new(config) {
        Err(crate::ContextError::UcxUnavailable(reason)) => {
            assert!(reason.contains("/nonexistent/config/libucp.so.0"), "{reason}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a context forced onto a missing UCX library"),
    }
}

ferrylink_testkit::peer_test! {
    /// The settings are process-wide: a peer process builds the context, so disabling
    /// CUDA there changes no other test.
    fn building_a_context_applies_the_cuda_settings(peers) {
        peers.spawn("context", &[]).wait_success(std::time::Duration::from_secs(60));
    }
    "context" => {
        let config = Config::from_lookup(|k| match k {
            "FERRYLINK_TRANSPORT" => Some("native".into()),
            "FERRYLINK_DISABLE_CUDA" => Some("1".into()),
            "FERRYLINK_COPY_KERNEL_MAX_BYTES" => Some("4096".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(cuda::copy_kernel::kernel_copy_limit(), cuda::copy_kernel::DEFAULT_KERNEL_COPY_LIMIT);
        let _context = crate::Context::new(config).unwrap();
        assert_eq!(cuda::copy_kernel::kernel_copy_limit(), 4096);
        assert_eq!(cuda::probe(), Err(cuda::CudaUnavailable::Disabled));
    },
}

/// The wire limits the core assumes by default are the configuration's defaults.
#[test]
fn default_wire_limits_match_the_default_config() {
    assert_eq!(Config::default().wire_limits(), ferrylink_proto::wire::Limits::default());
}

/// Every `with_*` method sets its own field, and only that one: a config built with all of
/// them holds each value given, where the default holds another.
#[test]
fn each_with_method_sets_its_own_field() {
    let default = Config::default();
    let cuda = CudaConfig::default().with_copy_kernel_max_bytes(12_345).with_disable(true);
    assert_eq!((cuda.copy_kernel_max_bytes, cuda.disable), (12_345, true));
    let ms = Duration::from_millis;
    let c = Config::default()
        .with_lane_policy(LanePolicy::Ucx)
        .with_request_timeout(ms(1))
        .with_busy_poll(ms(2))
        .with_linger_copies(ms(3))
        .with_connect_timeout(ms(4))
        .with_max_header_bytes(5)
        .with_max_frames(6)
        .with_max_frame_len(7)
        .with_max_message_bytes(8)
        .with_inline_threshold(9)
        .with_staging_region_bytes(10)
        .with_staging_max_bytes(11)
        .with_landing_max_bytes(12)
        .with_unexpected_max_bytes(13)
        .with_max_region_bytes(14)
        .with_device_copies(DeviceCopies::Receiver)
        .with_producer_ordering(ProducerOrdering::ContextSynchronize)
        .with_push_offer_max_bytes(15)
        .with_recv_device(Some(16))
        .with_max_mapped_device_bytes(17)
        .with_control_ring_bytes(18)
        .with_cuda(cuda.clone())
        .with_ucx_library(Some(PathBuf::from("/x/libucp.so.0")))
        .with_ucx_rma(true)
        .with_ucx_staged(true);
    assert_eq!(c.lane_policy, LanePolicy::Ucx);
    let durations = [c.request_timeout, c.busy_poll, c.linger_copies, c.connect_timeout];
    assert_eq!(durations, [ms(1), ms(2), ms(3), ms(4)]);
    let sizes = [c.max_header_bytes, c.max_frames, c.inline_threshold, c.staging_region_bytes, c.staging_max_bytes];
    assert_eq!(sizes, [5, 6, 9, 10, 11]);
    assert_eq!([c.landing_max_bytes, c.unexpected_max_bytes, c.control_ring_bytes], [12, 13, 18]);
    let limits = [c.max_frame_len, c.max_message_bytes, c.max_region_bytes, c.push_offer_max_bytes];
    assert_eq!(limits, [7, 8, 14, 15]);
    assert_eq!((c.max_mapped_device_bytes, c.recv_device), (17, Some(16)));
    assert_eq!(c.device_copies, DeviceCopies::Receiver);
    assert_eq!(c.producer_ordering, ProducerOrdering::ContextSynchronize);
    assert_eq!(c.cuda, cuda);
    assert_eq!(c.ucx_library, Some(PathBuf::from("/x/libucp.so.0")));
    assert_eq!((c.ucx_rma, c.ucx_staged), (true, true));
    // The values above differ from the defaults, so each assertion saw its setter work.
    assert_ne!(default.lane_policy, c.lane_policy);
    assert_ne!(default.device_copies, c.device_copies);
    assert_ne!(default.producer_ordering, c.producer_ordering);
    assert_ne!(default.cuda, c.cuda);
    assert!(!default.ucx_rma && !default.ucx_staged && default.recv_device.is_none());
}
