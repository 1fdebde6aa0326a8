//! The host round trip's floor: two copies of n bytes, each made by one thread and seen
//! done by another before that one makes the next.
//!
//! Between two processes the echo's copy cannot start until the process that makes it
//! has seen the first copy's end, and the first side cannot use the echo until it has
//! seen that one's end. Two threads do exactly that here, and nothing else: the client
//! thread copies its bytes into the server's buffer and raises a flag; the server thread,
//! spinning on that flag, copies the bytes into the client's buffer and raises its own;
//! the client, spinning, sees it. Both spin without sleeping (a thread that yields after
//! many spins lets a machine with fewer cores than spinning threads go on), so the time
//! is two copies plus two cache-line hand-offs between cores: what a round trip would cost
//! whose callers published their messages and spun on their peer's, with no thread
//! between them.

use crate::floor::Floor;
use std::cell::UnsafeCell;
use std::hint::{black_box, spin_loop};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spins between yields: enough that a yield is rare where both threads have a core.
const SPINS_PER_YIELD: u32 = 1 << 14;
/// Untimed round trips before the timed ones run for at least this long: threads the
/// benchmark left spinning (a transport polls for 2 ms after its last message by
/// default) have gone to sleep by then, and do not share the cores with the floor.
const WARM_UP: Duration = Duration::from_millis(5);

/// The two buffers and their flags. Each flag is a round-trip number: the client raises
/// `to_server` to k once the server's buffer holds round trip k's bytes; the server raises
/// `to_client` to k once the client's buffer holds the echo.
struct Exchange {
    to_server: AtomicU64,
    to_client: AtomicU64,
    server_buffer: UnsafeCell<Vec<u8>>,
    client_buffer: UnsafeCell<Vec<u8>>,
}

// SAFETY: the buffers are reached only through `Exchange`'s methods, which hand each
// buffer to one thread at a time by the flags' Release stores and Acquire loads (see
// `copy_to_server` and `echo_to_client`).
unsafe impl Sync for Exchange {}

impl Exchange {
    fn new(n: usize) -> Self {
        Self {
            to_server: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
            // Filled (so touched) now: page faults are not what the floor measures.
            server_buffer: UnsafeCell::new(vec![0xa5; n]),
            client_buffer: UnsafeCell::new(vec![0x3c; n]),
        }
    }

    /// The client's half of round trip `k`: its bytes into the server's buffer, the flag
    /// raised, then a spin until the echo is in its own buffer.
    fn copy_to_server(&self, k: u64, bytes: &[u8]) {
        // SAFETY: the server reads `server_buffer` only after it saw `to_server == k`
        // and is done with it once it raised `to_client` to k - 1, which this thread saw
        // (Acquire) at the end of round trip k - 1 (or no round trip ran yet).
        unsafe { (*self.server_buffer.get()).copy_from_slice(bytes) };
        self.to_server.store(k, Ordering::Release);
        let _echoed = wait_for(&self.to_client, k);
        // SAFETY: the server wrote `client_buffer` before its Release store of k, which
        // `wait_for` saw with Acquire; it touches it again only after `to_server == k + 1`.
        black_box(unsafe { &*self.client_buffer.get() });
    }

    /// The client is done: the server's wait for the next round trip ends.
    fn stop(&self) {
        self.to_server.store(STOP, Ordering::Release);
    }

    /// The server's half of round trip `k`: a spin until the client's bytes are in its
    /// buffer, then the echo into the client's buffer and the flag raised. `false` (and
    /// nothing copied) once the client stopped.
    fn echo_to_client(&self, k: u64) -> bool {
        if !wait_for(&self.to_server, k) {
            return false;
        }
        // SAFETY: the client wrote `server_buffer` before its Release store of k (seen
        // with Acquire above) and waits on `to_client` until this thread's store of k, so
        // for now only this thread touches either buffer.
        unsafe { (*self.client_buffer.get()).copy_from_slice(&*self.server_buffer.get()) };
        self.to_client.store(k, Ordering::Release);
        true
    }
}

/// What the client's flag holds once it made its last round trip.
const STOP: u64 = u64::MAX;

/// Spins until `flag` holds `k` (`true`) or [`STOP`] (`false`).
fn wait_for(flag: &AtomicU64, k: u64) -> bool {
    let mut spins = 0u32;
    loop {
        match flag.load(Ordering::Acquire) {
            seen if seen == k => return true,
            STOP => return false,
            _ => {}
        }
        spins += 1;
        if spins.is_multiple_of(SPINS_PER_YIELD) {
            std::thread::yield_now();
        } else {
            spin_loop();
        }
    }
}

/// Two copies of `n` bytes made by two threads, each seen done by the other before it
/// goes on (see the module documentation), one warm-up and `iters` timed round trips:
/// the floor of a host round trip between two processes. `None` when the second thread
/// cannot be started.
pub fn host_handoff_floor(n: usize, iters: usize) -> Option<Floor> {
    let exchange = Arc::new(Exchange::new(n));
    // The server echoes until the client's flag says 0: round numbers start at 1.
    let server = {
        let exchange = exchange.clone();
        std::thread::Builder::new()
            .name("floor-server".into())
            .spawn(move || {
                let mut k = 1;
                while exchange.echo_to_client(k) {
                    k += 1;
                }
            })
            .ok()?
    };
    let bytes = vec![0x5a; n];
    let mut k = 0u64;
    let warm_up_until = Instant::now() + WARM_UP;
    while k == 0 || Instant::now() < warm_up_until {
        k += 1;
        exchange.copy_to_server(k, black_box(&bytes));
    }
    let mut times: Vec<Duration> = Vec::with_capacity(iters);
    for _ in 0..iters {
        k += 1;
        let started = Instant::now();
        exchange.copy_to_server(k, black_box(&bytes));
        times.push(started.elapsed());
    }
    exchange.stop();
    server.join().ok()?;
    Some(Floor::from_times(&times, "copy to the other thread, echo seen done, per round trip".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_echo_carries_the_clients_bytes() {
        let exchange = Arc::new(Exchange::new(4096));
        let server = {
            let exchange = exchange.clone();
            std::thread::spawn(move || (1..=3).for_each(|k| assert!(exchange.echo_to_client(k))))
        };
        for k in 1..=3u64 {
            let bytes = vec![k as u8; 4096];
            exchange.copy_to_server(k, &bytes);
            // SAFETY: the server raised `to_client` to k and waits for k + 1 (or is done).
            assert_eq!(unsafe { &*exchange.client_buffer.get() }, &bytes);
        }
        server.join().unwrap();
    }

    #[test]
    fn the_floor_times_each_round_trip() {
        let f = host_handoff_floor(1024, 50).expect("a thread starts");
        assert_eq!(f.n_iter, 50);
        assert!(f.mean_seconds() > 0.0 && f.median_seconds > 0.0, "{f:?}");
        assert!(f.method.starts_with("copy to the other thread"), "{}", f.method);
        // Copying 64 MiB twice takes longer than copying 8 bytes twice.
        let big = host_handoff_floor(64 << 20, 3).unwrap();
        let small = host_handoff_floor(8, 3).unwrap();
        assert!(big.median_seconds > small.median_seconds, "{big:?} {small:?}");
    }
}
