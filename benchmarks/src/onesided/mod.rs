//! One-sided round trips of `local-send-recv` (`--op put` and `--op get`), beside the
//! two-sided one of [`crate::roundtrip`] (`--op send`).
//!
//! At setup each side registers its memory ([`buffers::RegisteredBuffer`]: shared host
//! memory, or device memory of the `--memory` kind, allocated once) and ships the key of
//! the region the peer is to use in a two-sided message; each imports the other's key
//! ([`protocol`]). The client holds two regions of `n` bytes, its source and its landing
//! region; the server one, `n` bytes (`2·n` with `--blocks` above 1, [`layout`]).
//!
//! - **put**: the client puts its source into the server's region with a notification;
//!   the server, on it, puts its region back into the client's landing region with a
//!   notification; the client's round trip ends when that notification arrives.
//! - **get**: the client gets the server's region into its landing region with a
//!   notification (delivered to the server after the read); the server, on it, gets the
//!   client's source into its region with a notification; the client's round trip ends
//!   on it.
//!
//! Either way a round trip moves `n` bytes each way (bandwidth 2·n/t, as for sends), each
//! direction one request of `blocks` spans ([`layout::BlockLayout`]).
//!
//! **Checks** (the first and the last round trip, every one with `--check`; outside the
//! timing), in [`client`]: before a checked round trip the client stamps its source with
//! the round trip's number at the start of every block and fills its landing region with
//! the complement of what the round trip must land there; after it, it compares. A put
//! brings back the server's region, which holds the client's bytes only if the client's
//! put landed (the server's region starts as the complement of the source pattern, and
//! later holds an earlier stamp); the landing region holds them only if the server's put
//! landed. A get lands what the server's region held (the complement at first, then the
//! source as the server last read it), and the client then gets the server's region once
//! more, untimed and without a notification, to check that the server's get read its
//! source. The server checks at the end that no byte of its gaps was written. A transfer
//! that moved nothing fails the run; the hidden test-only `--skip-transfer-for-test
//! client:R|server:R` makes one side skip its transfer of round trip `R` (a two-sided
//! message stands in for its notification) so that the tests see it.

mod buffers;
mod client;
mod layout;
mod protocol;
mod server;

pub use client::Client;
pub use layout::BlockLayout;
pub use server::serve;

/// `--op`: what a round trip does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum Op {
    /// Two-sided: the client sends, the server receives and sends the message back.
    #[default]
    Send,
    /// One-sided: the client puts into the server's region, the server puts it back.
    Put,
    /// One-sided: the client gets the server's region, the server gets the client's.
    Get,
}

impl Op {
    /// The name `--op` takes and records carry.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Put => "put",
            Op::Get => "get",
        }
    }

    /// The one-sided operation, `None` for [`Op::Send`].
    pub fn one_sided(self) -> Option<OneSided> {
        match self {
            Op::Send => None,
            Op::Put => Some(OneSided::Put),
            Op::Get => Some(OneSided::Get),
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A one-sided operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OneSided {
    /// `put` / `put_batch`.
    Put,
    /// `get` / `get_batch`.
    Get,
}

impl std::fmt::Display for OneSided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OneSided::Put => "put",
            OneSided::Get => "get",
        })
    }
}

/// A side of a round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The side that starts each round trip.
    Client,
    /// The side that answers.
    Server,
}

/// Test only (`--skip-transfer-for-test SIDE:ROUND_TRIP`): `side` skips its transfer of
/// round trip `round_trip` (counted from 0, warm-up round trips first) and sends a
/// two-sided message in place of its notification, as if the transfer had moved nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SkipTransfer {
    /// Who skips.
    pub side: Side,
    /// Which round trip.
    pub round_trip: usize,
}

impl SkipTransfer {
    /// Parses `client:R` or `server:R`.
    pub fn parse(input: &str) -> Result<SkipTransfer, String> {
        let bad = || format!("{input:?} is not SIDE:ROUND_TRIP (client:3, server:0)");
        let (side, round_trip) = input.split_once(':').ok_or_else(bad)?;
        let side = match side {
            "client" => Side::Client,
            "server" => Side::Server,
            _ => return Err(bad()),
        };
        Ok(SkipTransfer { side, round_trip: round_trip.parse().map_err(|_| bad())? })
    }

    /// Whether `side` skips its transfer of round trip `round_trip`.
    pub fn skips(skip: Option<SkipTransfer>, side: Side, round_trip: usize) -> bool {
        skip.is_some_and(|s| s.side == side && s.round_trip == round_trip)
    }
}

impl std::fmt::Display for SkipTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = match self.side {
            Side::Client => "client",
            Side::Server => "server",
        };
        write!(f, "{side}:{}", self.round_trip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_are_the_flag_values() {
        use clap::ValueEnum;
        for op in Op::value_variants() {
            assert_eq!(op.to_possible_value().unwrap().get_name(), op.name());
            assert_eq!(op.one_sided().map(|o| o.to_string()), (*op != Op::Send).then(|| op.name().to_owned()));
        }
        assert_eq!(Op::default(), Op::Send);
    }

    #[test]
    fn skip_hooks_parse_and_print_back() {
        for text in ["client:0", "server:17"] {
            assert_eq!(SkipTransfer::parse(text).unwrap().to_string(), text);
        }
        for bad in ["client", "both:1", "server:-1", "client:x", ""] {
            assert!(SkipTransfer::parse(bad).is_err(), "{bad}");
        }
        let s = Some(SkipTransfer { side: Side::Server, round_trip: 2 });
        assert!(SkipTransfer::skips(s, Side::Server, 2));
        assert!(!SkipTransfer::skips(s, Side::Client, 2) && !SkipTransfer::skips(s, Side::Server, 1));
        assert!(!SkipTransfer::skips(None, Side::Server, 2));
    }
}
