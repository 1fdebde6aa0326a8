//! `decode_frame` on arbitrary bytes: it must never panic, never claim more bytes than it
//! was given, and whatever it accepts must survive an encode/decode round trip.
//!
//! Run: `cargo +nightly fuzz run decode_frame -- -max_total_time=60` (from the repository
//! root; the folder is its own workspace).
#![no_main]

use ferrylink::transport::wire::{decode_frame, encode_frame, Limits};
use ferrylink::transport::Config;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn limits() -> &'static Limits {
    static LIMITS: OnceLock<Limits> = OnceLock::new();
    LIMITS.get_or_init(|| Limits::from_config(&Config::default()))
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    if let Ok(Some((message, used))) = decode_frame(data, limits) {
        assert!(used <= data.len(), "decode_frame used {used} of {} bytes", data.len());
        let again = encode_frame(&message);
        match decode_frame(&again, limits) {
            Ok(Some((back, n))) => {
                assert_eq!(n, again.len(), "a re-encoded frame decodes whole");
                assert_eq!(back, message, "a decoded message survives a round trip");
            }
            other => panic!("a decoded message does not decode after re-encoding: {other:?}"),
        }
    }
});
