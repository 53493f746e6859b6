//! Injected disk faults for the spool (feature `fault-injection`, on in the
//! test builds only): a full disk and a stalled disk, per spool directory,
//! so tests reproduce what a filled or frozen filesystem does to the writer,
//! the cursor and start-up without needing one. Production builds contain
//! none of this.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// What the spool's disk does, for one spool directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// Writes and file creations fail with `ENOSPC`.
    pub no_space: bool,
    /// Each write waits this long first (a frozen or slow disk).
    pub stall: Option<Duration>,
}

fn plans() -> &'static Mutex<HashMap<PathBuf, Plan>> {
    static PLANS: OnceLock<Mutex<HashMap<PathBuf, Plan>>> = OnceLock::new();
    PLANS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Makes the spool in `dir` see `plan` from now on.
pub fn inject(dir: &Path, plan: Plan) {
    if let Ok(mut p) = plans().lock() {
        p.insert(dir.to_owned(), plan);
    }
}

/// The disk of the spool in `dir` works again.
pub fn clear(dir: &Path) {
    if let Ok(mut p) = plans().lock() {
        p.remove(dir);
    }
}

fn plan(dir: &Path) -> Plan {
    plans()
        .lock()
        .ok()
        .and_then(|p| p.get(dir).copied())
        .unwrap_or_default()
}

/// Before a write to a file of the spool in `dir`: stalls as planned, then
/// fails as planned.
pub(crate) fn before_write(dir: &Path) -> io::Result<()> {
    let p = plan(dir);
    if let Some(d) = p.stall {
        std::thread::sleep(d);
    }
    if p.no_space {
        return Err(io::Error::from_raw_os_error(28));
    }
    Ok(())
}
