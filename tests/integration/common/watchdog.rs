//! What the throwaway servers of the harness share: a watchdog shell that
//! outlives nothing (it waits for EOF on stdin, whose write end lives in
//! the test process, so the kernel closes it however that process ends,
//! then kills the server and removes its directory), and a free port.

// Each test binary uses a subset of this shared harness.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The watchdog of a server whose pid is in `$0/harness.pid`: kills its
/// process group, then removes `$0`.
pub const KILL_GROUP: &str = r#"
trap '' INT HUP TERM
while read -r _; do :; done
if [ -f "$0/harness.pid" ]; then
  read -r pid < "$0/harness.pid"
  kill -9 "-$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
rm -rf "$0" 2>/dev/null || { sleep 0.5; rm -rf "$0"; }
"#;

/// Starts `script` as a watchdog over `dir` (its `$0`). Keep the child:
/// dropping its stdin is what sets it off.
pub fn spawn(script: &str, dir: &Path) -> Result<Child, String> {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C aimed at the test run must not
        // take the watchdog down before it has cleaned up.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("spawning watchdog: {e}"))
}

/// Waits until `ready` says the server `child` (whose pid is in
/// `dir/harness.pid`) serves: an error with its log if it exits first, or
/// if `timeout` passes without `waited_for` (the server is then killed).
pub async fn until_ready<F, Fut>(
    child: &mut Child,
    dir: &Path,
    waited_for: &str,
    timeout: Duration,
    poll: Duration,
    mut ready: F,
    log_tail: impl Fn() -> String,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if ready().await {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let _ = std::fs::remove_file(dir.join("harness.pid"));
            return Err(format!(
                "the server exited with {status}; log:\n{}",
                log_tail()
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(dir.join("harness.pid"));
            return Err(format!(
                "no {waited_for} within {timeout:?}; log:\n{}",
                log_tail()
            ));
        }
        tokio::time::sleep(poll).await;
    }
}

/// A free port (probed, then released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("no free port");
    l.local_addr().expect("bound socket").port()
}
