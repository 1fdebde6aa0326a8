//! `decode_frame` on arbitrary bytes: it must never panic and must keep its invariant
//! (`ferrylink_proto::wire::check_decode_invariant`: never claim more bytes than it
//! was given, decode a frame the same whatever follows it, and whatever it accepts must
//! survive an encode/decode round trip). The codec's tests check the same invariant over
//! the seed corpus (`fuzz/seeds/decode_frame/`) and over generated inputs.
//!
//! Run: `cargo +nightly fuzz run decode_frame fuzz/corpus/decode_frame fuzz/seeds/decode_frame
//! -- -max_total_time=60` (from the repository root; the folder is its own workspace).
//! New inputs go to the first folder (ignored by git); `seeds/decode_frame/` is the
//! committed seed corpus (copy a find worth keeping there). CI builds the target on
//! stable and runs it over the seeds once (`.ci/run`).
#![no_main]

use ferrylink_proto::wire::{check_decode_invariant, Limits};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn limits() -> &'static Limits {
    static LIMITS: OnceLock<Limits> = OnceLock::new();
    LIMITS.get_or_init(Limits::default)
}

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = check_decode_invariant(data, limits()) {
        panic!("decode_frame broke its invariant: {violation}");
    }
});
