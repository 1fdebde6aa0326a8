//! [`output_within`]: a command's output, the command killed and the test failed if it
//! runs past a bound.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Runs `cmd` (stdin closed, stdout and stderr captured) and returns its output; kills it
/// and panics with its stderr if it runs past `bound`. Both pipes are drained meanwhile, so
/// a chatty command cannot block on a full pipe.
pub fn output_within(cmd: &mut Command, bound: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?} does not start: {e}"));
    let out = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!("{cmd:?} ran past {bound:?}: stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(pipe: Option<Box<dyn Read + Send>>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_command_gives_its_output() {
        let out = output_within(Command::new("sh").args(["-c", "echo out; echo err >&2"]), Duration::from_secs(10));
        assert!(out.status.success());
        assert_eq!((out.stdout.as_slice(), out.stderr.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
    }

    #[test]
    fn a_command_past_its_bound_is_killed_and_fails_the_test() {
        let started = Instant::now();
        let failed = std::panic::catch_unwind(|| {
            output_within(Command::new("sh").args(["-c", "echo late >&2; exec sleep 30"]), Duration::from_millis(300))
        });
        let message = *failed.expect_err("the bound fails the test").downcast::<String>().unwrap();
        assert!(message.contains("ran past") && message.contains("late"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(10), "the command was not killed");
    }
}
