//! `two-host`: runs a command on a first host and others on a second, each a network
//! namespace of this machine joined by a veth pair, and removes both when the first
//! command ends (see `ferrylink_testkit::two_host::across`). Needs root.

use ferrylink_testkit::two_host::across::{run, Across, USAGE};

fn main() {
    match Across::parse(std::env::args_os().skip(1)) {
        Ok(across) => std::process::exit(run(&across)),
        Err(e) => {
            eprintln!("two-host: {e}");
            eprintln!(
                "usage: two-host [--keep DIR]... [--second 'SHELL LINE']... [--timeout SECS] [--grace SECS] -- COMMAND [ARG]..."
            );
            std::process::exit(USAGE);
        }
    }
}
