//! What the two sides of the raw UCX reference tell each other over the ferrylink
//! endpoint ([`Note`]): first whether each can take part (and its worker's address), last
//! how its round trips ended.

const MAGIC: [u8; 4] = *b"FLRU";

/// One side's message, a header-only ferrylink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Note {
    /// This side's worker is ready, at this address.
    Ready(Vec<u8>),
    /// This side cannot take part, and why.
    Unable(String),
    /// This side's round trips all completed: its buffers and worker may go once the
    /// peer says the same.
    Done,
    /// This side stopped its round trips, and why.
    Failed(String),
}

impl Note {
    /// The magic, a kind byte (1 ready, 2 unable, 3 done, 4 failed), then the address or
    /// the reason.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let (kind, rest): (u8, &[u8]) = match self {
            Note::Ready(address) => (1, address),
            Note::Unable(why) => (2, why.as_bytes()),
            Note::Done => (3, &[]),
            Note::Failed(why) => (4, why.as_bytes()),
        };
        let mut out = Vec::with_capacity(MAGIC.len() + 1 + rest.len());
        out.extend_from_slice(&MAGIC);
        out.push(kind);
        out.extend_from_slice(rest);
        out
    }

    /// Parses [`Note::to_bytes`]; anything else is an error saying what came.
    pub(super) fn from_bytes(bytes: &[u8]) -> Result<Note, String> {
        let Some(rest) = bytes.strip_prefix(&MAGIC) else {
            return Err(format!("not a raw UCX message of this benchmark ({} bytes)", bytes.len()));
        };
        let (kind, rest) = rest.split_first().ok_or("a raw UCX message without its kind")?;
        let text = || String::from_utf8_lossy(rest).into_owned();
        match kind {
            1 if !rest.is_empty() => Ok(Note::Ready(rest.to_vec())),
            1 => Err("a raw UCX message with an empty worker address".into()),
            2 => Ok(Note::Unable(text())),
            3 if rest.is_empty() => Ok(Note::Done),
            4 => Ok(Note::Failed(text())),
            k => Err(format!("a raw UCX message of unknown kind {k} ({} bytes)", rest.len())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_through_bytes() {
        for note in [
            Note::Ready(vec![1, 2, 3]),
            Note::Unable("not CUDA-aware".into()),
            Note::Done,
            Note::Failed("timed out".into()),
            Note::Failed(String::new()),
        ] {
            assert_eq!(Note::from_bytes(&note.to_bytes()), Ok(note.clone()), "{note:?}");
        }
    }

    #[test]
    fn other_bytes_are_refused() {
        for bytes in [&b""[..], b"FLRU", b"FLRX\x01a", b"FLRU\x01", b"FLRU\x03x", b"FLRU\x09"] {
            assert!(Note::from_bytes(bytes).is_err(), "{bytes:?}");
        }
    }
}
