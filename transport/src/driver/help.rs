//! A caller's turn: what a user thread spinning on a request of a native-lane endpoint
//! does with the engine while it holds the engine's lock (`cell.rs`, decision 0044).
//!
//! It runs the queued commands a caller may run (its own send or receive among them, so
//! the message is published without a hand-off to the progress thread), reads its
//! connection's control ring and gives that connection its turn (so the peer's reply
//! completes its request on its own thread). Whatever touches the UCX worker, a socket
//! being accepted or every connection at once is left to the progress thread, in order:
//! from the first command left, every later one waits for the progress thread too.

use super::conn::ConnDriver;
use super::Engine;
use crate::command::Command;
use ferrylink_memory::cuda::CurrentContextGuard;
use std::time::Instant;

impl Engine {
    /// One caller's turn for endpoint `ep` (`now`: the time of the caller's turn).
    /// Whether a command was left to the progress thread.
    pub(super) fn help(&mut self, ep: usize, now: Instant) -> bool {
        // Device work binds the context it needs on this thread; the caller gets its own
        // back afterwards. A process whose transport never used CUDA does not load it.
        let _caller_context = self.device.cuda_in_use().then(CurrentContextGuard::save).and_then(Result::ok);
        let left = self.run_callers_commands();
        if let Some(conn) = self.conns.get_mut(&ep).filter(|c| c.caller_may_turn()) {
            conn.in_span(|c| {
                c.poll_ring(&self.lanes);
                c.turn(&self.lanes, now);
            });
        }
        left
    }

    /// Runs the queued commands a caller may run, up to the first it may not, which is
    /// left (with every later one) to the progress thread. Whether commands are left.
    fn run_callers_commands(&mut self) -> bool {
        if !self.deferred.is_empty() {
            return true;
        }
        while let Ok(cmd) = self.commands.try_recv() {
            if !self.caller_may_run(&cmd) {
                self.deferred.push_back(cmd);
                return true;
            }
            // Only `Shutdown` ends the engine, and a caller never runs it.
            let _runs = self.run_command(cmd);
        }
        false
    }

    /// Whether a caller's turn may run `cmd`: the requests of a connection off the UCX
    /// lane (or of one that is gone, which fail at once) and timers; not `Shutdown`,
    /// connects, listeners, statistics (which accept queued connections) or revocations
    /// (which reach every connection).
    fn caller_may_run(&self, cmd: &Command) -> bool {
        let ep = match cmd {
            Command::Send { ep, .. }
            | Command::Recv { ep, .. }
            | Command::Cancel { ep, .. }
            | Command::Withdraw { ep, .. }
            | Command::Undelivered { ep, .. }
            | Command::Expire { ep, .. }
            | Command::Close { ep }
            | Command::Import { ep, .. }
            | Command::Transfer { ep, .. }
            | Command::RecvNotification { ep, .. }
            | Command::Unimport { ep, .. }
            | Command::Unprepare { ep, .. }
            | Command::ReturnNotification { ep, .. } => *ep,
            Command::WakeAt { .. } => return true,
            Command::Shutdown
            | Command::Adopt { .. }
            | Command::Listen { .. }
            | Command::Unlisten { .. }
            | Command::Stats { .. }
            | Command::Revoke { .. } => return false,
        };
        self.conns.get(&ep).is_none_or(ConnDriver::caller_may_turn)
    }
}
