#![allow(dead_code)]

use ferrylink_memory::{Frame, Message};

pub use ferrylink_testkit::pattern;

pub fn msg(header: &[u8], sizes: &[usize], seed: u8) -> Message {
    let frames =
        sizes.iter().enumerate().map(|(i, &n)| Frame::from(pattern(n, seed.wrapping_add(i as u8).into()))).collect();
    Message::new(header.to_vec(), frames)
}

/// (header, frame contents) of a host-only message.
pub fn contents(m: &Message) -> (Vec<u8>, Vec<Vec<u8>>) {
    let frames = m.frames.iter().map(|f| f.as_host().expect("host frame").to_vec()).collect();
    (m.header.clone(), frames)
}

pub fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}
