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

/// A free port (probed, then released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("no free port");
    l.local_addr().expect("bound socket").port()
}
