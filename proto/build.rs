//! Embeds the fuzz target's seed corpus (`../fuzz/seeds/decode_frame/`) for the codec's
//! tests (`src/wire/tests/corpus.rs`): writes `$OUT_DIR/decode_frame_corpus.rs`, a slice
//! of (file name, `include_bytes!` of the file), sorted by name. A missing folder embeds
//! nothing (and those tests fail).

use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let corpus = Path::new(&manifest_dir).join("../fuzz/seeds/decode_frame");
    println!("cargo:rerun-if-changed={}", corpus.display());
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .map(|dir| dir.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    seeds.sort();
    let mut code = String::from("&[\n");
    for path in &seeds {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let path = path.canonicalize().unwrap_or_else(|_| path.clone());
        code.push_str(&format!("    ({name:?}, include_bytes!({:?}) as &[u8]),\n", path.display().to_string()));
    }
    code.push_str("]\n");
    std::fs::write(Path::new(&out_dir).join("decode_frame_corpus.rs"), code).expect("writing the corpus list");
}
