//! The uids a root firewall runs stdio servers as (`[stdio] uid_range`):
//! one per running server, never shared, so process limits, signals,
//! `/proc` and file ownership are per server. A uid is leased when a
//! server starts and free again once nothing of that server runs; one that
//! any process of the host runs as (another firewall's server, a user) is
//! skipped.

use std::collections::BTreeSet;

use parking_lot::Mutex;

/// Leased uids, and where the next search starts.
struct Pool {
    leased: BTreeSet<u32>,
    next: u32,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    leased: BTreeSet::new(),
    next: 0,
});

/// One leased uid, free again when dropped.
#[derive(Debug)]
pub(crate) struct Lease(u32);

impl Lease {
    /// The uid (and gid).
    pub(crate) fn uid(&self) -> u32 {
        self.0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        POOL.lock().leased.remove(&self.0);
    }
}

/// A uid of `[first, last]` that no other server and no process of the
/// host runs as.
pub(crate) fn lease(range: [u32; 2]) -> Result<Lease, String> {
    let [first, last] = range;
    let busy = host_uids();
    let mut pool = POOL.lock();
    let span = u64::from(last - first) + 1;
    let start = if (first..=last).contains(&pool.next) {
        pool.next
    } else {
        first
    };
    for i in 0..span {
        let offset = (u64::from(start - first) + i) % span;
        let Ok(offset) = u32::try_from(offset) else {
            continue;
        };
        let uid = first + offset;
        if pool.leased.contains(&uid) || busy.contains(&uid) {
            continue;
        }
        pool.leased.insert(uid);
        pool.next = if uid == last { first } else { uid + 1 };
        return Ok(Lease(uid));
    }
    Err(format!(
        "every uid of [stdio] uid_range = [{first}, {last}] runs a server; widen the range"
    ))
}

/// The real uids of every process of the host.
fn host_uids() -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_is_never_leased_twice_and_comes_back_when_dropped() {
        let range = [3_900_000_000, 3_900_000_002];
        let a = lease(range).unwrap();
        let b = lease(range).unwrap();
        let c = lease(range).unwrap();
        let mut all = vec![a.uid(), b.uid(), c.uid()];
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 3);
        let full = lease(range).unwrap_err();
        assert!(full.contains("widen the range"), "{full}");
        let freed = b.uid();
        drop(b);
        assert_eq!(lease(range).unwrap().uid(), freed);
        // A uid a process of the host runs as is skipped.
        let me = nix::unistd::getuid().as_raw();
        assert!(lease([me, me]).is_err());
    }
}
