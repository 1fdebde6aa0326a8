//! The fuzz target's committed seed corpus, `fuzz/seeds/decode_frame/`: one frame per
//! sample message (so every message kind), and whatever inputs a fuzzing run found and
//! someone copied there. `build.rs` embeds the files at compile time (test binaries copied to another
//! machine cannot read the source tree), and every seed must keep the fuzz target's
//! invariant here, on every `cargo test`.
//!
//! After changing the samples or the encoding: `FERRYLINK_WRITE_FUZZ_CORPUS=1 cargo test
//! -p ferrylink-proto --lib wire::tests::corpus` writes the samples' seeds, and the
//! next build embeds them.

use super::super::*;
use super::limits;

/// The corpus files: (file name, contents).
const SEEDS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/decode_frame_corpus.rs"));
/// Set to write the samples' seeds into the corpus folder of this source tree.
const WRITE_VAR: &str = "FERRYLINK_WRITE_FUZZ_CORPUS";

#[test]
fn every_seed_keeps_the_invariant() {
    assert!(SEEDS.len() >= sample_messages().len(), "{} seeds embedded", SEEDS.len());
    for (name, bytes) in SEEDS {
        if let Err(e) = check_decode_invariant(bytes, &limits()) {
            panic!("seed {name}: {e}");
        }
    }
}

#[test]
fn the_corpus_holds_the_frame_of_every_sample() {
    if std::env::var_os(WRITE_VAR).is_some_and(|v| v == "1") {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/decode_frame");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, m) in sample_messages() {
            std::fs::write(dir.join(name), encode_frame(&m)).unwrap();
        }
        println!("wrote {} seeds into {}: rebuild to embed them", sample_messages().len(), dir.display());
        return;
    }
    for (name, m) in sample_messages() {
        let Some((_, seed)) = SEEDS.iter().find(|(seed, _)| *seed == name) else {
            panic!("no seed {name} in fuzz/seeds/decode_frame ({WRITE_VAR}=1 writes it)");
        };
        assert_eq!(*seed, encode_frame(&m).as_slice(), "seed {name} is stale ({WRITE_VAR}=1 rewrites it)");
        let outcome = check_decode_invariant(seed, &limits()).unwrap();
        assert!(matches!(outcome, DecodeOutcome::Accepted { message, .. } if message == m), "seed {name}");
    }
}
