//! The durable approvals store: every approval in memory, every transition
//! in an append-only journal under `store_dir`.
//!
//! Layout of `store_dir` (mode 0700):
//! - `LOCK`: held with `flock` for the process lifetime, so two firewalls
//!   never write one journal;
//! - `journal.jsonl`: one line per record, `<crc32 as 8 hex digits> <JSON>\n`,
//!   the checksum over the JSON bytes. Records: `put` (a whole approval, on
//!   creation and in snapshots), `decide`, `consume`, `expire`.
//!
//! Invariants:
//! - a transition is applied in memory only after its line was written and
//!   `fdatasync`ed: nothing anyone observed (a waiter woken, a call run) can
//!   be lost by a crash;
//! - all transitions happen under one mutex that also covers the journal, so
//!   the journal's order is the order of decisions and every check-then-act
//!   (approve vs deny, concurrent consumes) is atomic;
//! - replay accepts a torn *last* line (a crash mid-append: that transition
//!   was never acknowledged) and refuses to open on damage anywhere else,
//!   since silently skipping a `consume` could let an approval run twice;
//! - open always compacts (rewrites live state and recent history to a new
//!   file, fsync, rename, fsync the directory); the sweeper compacts again
//!   when the journal holds four times more records than approvals;
//! - a write error takes back the partial line; an fsync error makes the
//!   journal refuse every later transition (fail closed) until restart.
//!
//! Costs: a read (`get`, `consume` without an approved approval) is a lock
//! and a hash lookup; a transition adds one `write(2)` and one fsync
//! (0.1–10 ms by disk), taken under the lock because transitions happen at
//! human rates, not request rates.
//!
//! The service reaches it through the `ApprovalBackend` trait: every
//! operation does its work in the call and hands back a completed future;
//! the checks it shares with PostgreSQL are in `rules`.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::backend::{Answer, ApprovalBackend, Subscription};
use super::rules;
use super::{
    Approval, ApprovalError, ApprovalId, Approver, CallKey, Decision, NewApproval, RoundRefused,
    Status, Transition,
};

/// The journal file inside `store_dir`.
pub(crate) const JOURNAL_FILE: &str = "journal.jsonl";
/// The lock file inside `store_dir`.
pub(crate) const LOCK_FILE: &str = "LOCK";
/// Below this many records the journal is never compacted at runtime.
const COMPACT_MIN_RECORDS: u64 = 1024;

/// Why the store could not open or record a transition.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("approvals store: {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: IoOp,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the store's lock.
    #[error("approvals store {path} is locked by another process (two firewalls cannot share a store_dir)")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A line before the last one is damaged.
    #[error("approvals journal {path}, line {line}: {problem}; refusing to start rather than guess which transitions happened (restore the file or move it aside)")]
    Corrupt {
        /// The journal.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: Corruption,
    },
    /// An earlier fsync failed; nothing more is written until restart.
    #[error("approvals journal {path} failed to sync earlier; transitions are refused until the firewall restarts")]
    Broken {
        /// The journal.
        path: PathBuf,
    },
    /// A record could not be serialized.
    #[error("approvals journal record could not be encoded: {0}")]
    Encode(#[source] serde_json::Error),
}

/// The file operation behind [`StoreError::Io`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Creating the directory.
    CreateDir,
    /// Opening or creating a file.
    Open,
    /// Reading the journal.
    Read,
    /// Appending to the journal.
    Append,
    /// fsync.
    Sync,
    /// Writing a compacted journal.
    Compact,
    /// Locking.
    Lock,
}

impl fmt::Display for IoOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoOp::CreateDir => "creating",
            IoOp::Open => "opening",
            IoOp::Read => "reading",
            IoOp::Append => "appending to",
            IoOp::Sync => "syncing",
            IoOp::Compact => "compacting",
            IoOp::Lock => "locking",
        })
    }
}

/// What is wrong with a journal line.
#[derive(Debug)]
pub enum Corruption {
    /// No `<8 hex digits> ` prefix.
    NoChecksum,
    /// The checksum does not match the JSON.
    Checksum {
        /// Written on the line.
        stored: u32,
        /// Computed from the JSON.
        computed: u32,
    },
    /// The JSON is not a record.
    Json(serde_json::Error),
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::NoChecksum => f.write_str("no checksum prefix"),
            Corruption::Checksum { stored, computed } => write!(
                f,
                "checksum mismatch (line says {stored:08x}, content is {computed:08x})"
            ),
            Corruption::Json(e) => write!(f, "not a journal record: {e}"),
        }
    }
}

fn io_err(op: IoOp, path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// A journal record, as written (borrowed: nothing is cloned to log).
#[derive(Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum RecordRef<'a> {
    Put {
        approval: &'a Approval,
    },
    Decide {
        id: &'a ApprovalId,
        decision: &'a Decision,
    },
    Consume {
        id: &'a ApprovalId,
        at_ms: u64,
    },
    Expire {
        id: &'a ApprovalId,
        at_ms: u64,
    },
    Withdraw {
        id: &'a ApprovalId,
        at_ms: u64,
    },
    Round {
        id: &'a ApprovalId,
        round: u32,
        at_ms: u64,
    },
}

/// A journal record, as read back.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Record {
    Put {
        approval: Box<Approval>,
    },
    Decide {
        id: ApprovalId,
        decision: Decision,
    },
    Consume {
        id: ApprovalId,
        at_ms: u64,
    },
    Expire {
        id: ApprovalId,
        #[allow(dead_code)]
        at_ms: u64,
    },
    Withdraw {
        id: ApprovalId,
        at_ms: u64,
    },
    Round {
        id: ApprovalId,
        round: u32,
        #[allow(dead_code)]
        at_ms: u64,
    },
}

struct Journal {
    file: File,
    path: PathBuf,
    dir: PathBuf,
    /// Bytes known good (fully written); a failed append truncates back here.
    bytes: u64,
    records: u64,
    broken: bool,
    buf: Vec<u8>,
}

impl Journal {
    fn encode(buf: &mut Vec<u8>, rec: &RecordRef<'_>) -> Result<(), StoreError> {
        buf.clear();
        buf.extend_from_slice(b"00000000 ");
        serde_json::to_writer(&mut *buf, rec).map_err(StoreError::Encode)?;
        let crc = crc32fast::hash(&buf[9..]);
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for i in 0..8 {
            buf[i] = HEX[((crc >> (28 - 4 * i)) & 0xf) as usize];
        }
        buf.push(b'\n');
        Ok(())
    }

    fn append(&mut self, rec: &RecordRef<'_>) -> Result<(), StoreError> {
        if self.broken {
            return Err(StoreError::Broken {
                path: self.path.clone(),
            });
        }
        Self::encode(&mut self.buf, rec)?;
        if let Err(e) = self.file.write_all(&self.buf) {
            // Take the partial line back so the next record does not follow
            // garbage (which replay would call corruption).
            if self.file.set_len(self.bytes).is_err() {
                self.broken = true;
            }
            return Err(io_err(IoOp::Append, &self.path)(e));
        }
        if let Err(e) = self.file.sync_data() {
            // After a failed fsync the kernel may have dropped the dirty
            // pages; what is on disk is unknown. Stop writing.
            self.broken = true;
            return Err(io_err(IoOp::Sync, &self.path)(e));
        }
        self.bytes += self.buf.len() as u64;
        self.records += 1;
        Ok(())
    }

    /// Rewrites the journal as one `put` per approval (atomically: temp
    /// file, fsync, rename, fsync directory) and continues appending to it.
    fn compact<'a>(
        &mut self,
        approvals: impl Iterator<Item = &'a Approval>,
    ) -> Result<(), StoreError> {
        let (file, bytes, records) = write_snapshot(&self.dir, &self.path, approvals)?;
        self.file = file;
        self.bytes = bytes;
        self.records = records;
        self.broken = false;
        Ok(())
    }
}

fn write_snapshot<'a>(
    dir: &Path,
    path: &Path,
    approvals: impl Iterator<Item = &'a Approval>,
) -> Result<(File, u64, u64), StoreError> {
    let tmp = dir.join(format!("{JOURNAL_FILE}.tmp"));
    let compact = |e| io_err(IoOp::Compact, &tmp)(e);
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(compact)?;
    let mut w = BufWriter::with_capacity(64 * 1024, file);
    let mut buf = Vec::with_capacity(1024);
    let (mut bytes, mut records) = (0u64, 0u64);
    for approval in approvals {
        Journal::encode(&mut buf, &RecordRef::Put { approval })?;
        w.write_all(&buf).map_err(compact)?;
        bytes += buf.len() as u64;
        records += 1;
    }
    let file = w.into_inner().map_err(|e| compact(e.into_error()))?;
    file.sync_all().map_err(compact)?;
    drop(file);
    fs::rename(&tmp, path).map_err(compact)?;
    // The rename is durable only once the directory is.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(IoOp::Sync, dir))?;
    let file = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(io_err(IoOp::Open, path))?;
    Ok((file, bytes, records))
}

struct Entry {
    approval: Approval,
    /// Created on the first [`Store::subscribe`]: most approvals are never
    /// waited on by more than the one held call.
    watch: Option<watch::Sender<Status>>,
}

struct Inner {
    by_id: HashMap<ApprovalId, Entry>,
    /// Live (stored pending or approved) approvals by call.
    by_key: HashMap<CallKey, ApprovalId>,
    journal: Journal,
}

/// The store. All state behind one mutex (see the module doc for why).
pub(crate) struct Store {
    inner: Mutex<Inner>,
    /// Stored-pending approvals, readable without the lock (metrics).
    pending: AtomicUsize,
    _lock: File,
}

/// What replay found, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replay {
    pub records: usize,
    pub torn_tail: bool,
    pub unknown_ids: usize,
    pub purged: usize,
}

impl Store {
    /// Opens (creating) `dir`, takes its lock, replays and compacts the
    /// journal. Terminal approvals that ended more than `history_ms` ago
    /// are dropped.
    pub(crate) fn open(dir: &Path, now_ms: u64, history_ms: u64) -> Result<Store, StoreError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(IoOp::CreateDir, dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err(IoOp::Open, &lock_path))?;
        // Released by the kernel when the process dies, even by SIGKILL.
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(StoreError::Locked { path: lock_path })
            }
            Err(e) => return Err(io_err(IoOp::Lock, &lock_path)(e.into())),
        }

        let path = dir.join(JOURNAL_FILE);
        let data = match fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err(IoOp::Read, &path)(e)),
        };
        let (mut by_id, mut replay) = replay(&data, &path)?;
        drop(data);
        by_id.retain(|_, a| {
            let keep = a
                .ended_ms()
                .is_none_or(|end| end.saturating_add(history_ms) > now_ms);
            replay.purged += usize::from(!keep);
            keep
        });
        let mut ordered: Vec<&Approval> = by_id.values().collect();
        ordered.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        let (file, bytes, records) = write_snapshot(dir, &path, ordered.into_iter())?;
        tracing::info!(
            dir = %dir.display(),
            approvals = by_id.len(),
            records = replay.records,
            torn_tail = replay.torn_tail,
            unknown_ids = replay.unknown_ids,
            purged = replay.purged,
            "approvals store opened"
        );

        let mut by_key = HashMap::new();
        let mut live: Vec<&Approval> = by_id.values().filter(|a| a.status.is_live()).collect();
        // If replay ever yields two live approvals for one call, the newest
        // binds it.
        live.sort_by_key(|a| a.created_ms);
        for a in live {
            by_key.insert(a.key.clone(), a.id.clone());
        }
        let pending = by_id
            .values()
            .filter(|a| a.status == Status::Pending)
            .count();
        let by_id = by_id
            .into_iter()
            .map(|(id, approval)| {
                (
                    id,
                    Entry {
                        approval,
                        watch: None,
                    },
                )
            })
            .collect();
        Ok(Store {
            inner: Mutex::new(Inner {
                by_id,
                by_key,
                journal: Journal {
                    file,
                    path,
                    dir: dir.to_owned(),
                    bytes,
                    records,
                    broken: false,
                    buf: Vec::with_capacity(1024),
                },
            }),
            pending: AtomicUsize::new(pending),
            _lock: lock,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave memory ahead of the
        // journal (memory changes only after a successful append), so the
        // state behind a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stored-pending approvals.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// See [`super::Approvals::request`].
    pub(crate) fn request(
        &self,
        new: NewApproval,
        now: u64,
        expiry_ms: u64,
        max_pending: usize,
        out: &mut Vec<Transition>,
    ) -> Result<Approval, ApprovalError> {
        let expires_ms = rules::deadline(&new, now, expiry_ms)?;
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(id) = inner.by_key.get(&new.key).cloned() {
            if let Some(e) = inner.by_id.get(&id) {
                if e.approval.status_at(now).is_live() {
                    return Ok(e.approval.clone());
                }
            }
            self.expire_due(inner, &id, now, out);
            inner.by_key.remove(&new.key);
        }
        // O(live approvals), only when creating one.
        let pending = inner
            .by_key
            .values()
            .filter_map(|id| inner.by_id.get(id))
            .filter(|e| e.approval.key.tenant == new.key.tenant)
            .filter(|e| e.approval.status_at(now) == Status::Pending)
            .count();
        rules::check_room(&new.key.tenant, pending, max_pending)?;
        let id = loop {
            let id = ApprovalId::generate()?;
            // 2^-128 per pair; checked anyway because the cost is one lookup.
            if !inner.by_id.contains_key(&id) {
                break id;
            }
        };
        let approval = Approval {
            id: id.clone(),
            key: new.key,
            agent: new.agent,
            risk: new.risk,
            arguments: Arc::new(new.arguments),
            token_exp: new.token_exp,
            preview_tool: new.preview_tool,
            self_approval: new.self_approval,
            why: new.why,
            created_ms: now,
            expires_ms,
            status: Status::Pending,
            decision: None,
            consumed_ms: None,
            rounds: 0,
        };
        inner.journal.append(&RecordRef::Put {
            approval: &approval,
        })?;
        inner.by_key.insert(approval.key.clone(), id.clone());
        inner.by_id.insert(
            id,
            Entry {
                approval: approval.clone(),
                watch: None,
            },
        );
        self.pending.fetch_add(1, Ordering::Relaxed);
        out.push(Transition {
            approval: approval.clone(),
            from: None,
            to: Status::Pending,
            at_ms: now,
        });
        Ok(approval)
    }

    /// See [`super::Approvals::consume`].
    pub(crate) fn consume(
        &self,
        key: &CallKey,
        now: u64,
        out: &mut Vec<Transition>,
    ) -> Option<Approval> {
        let mut g = self.lock();
        let inner = &mut *g;
        let id = inner.by_key.get(key)?.clone();
        match inner.by_id.get(&id)?.approval.status_at(now) {
            Status::Approved => {}
            Status::Expired => {
                self.expire_due(inner, &id, now, out);
                return None;
            }
            _ => return None,
        }
        if let Err(e) = inner.journal.append(&RecordRef::Consume {
            id: &id,
            at_ms: now,
        }) {
            tracing::error!(approval = %id, error = %e, "cannot journal the consumption of an approval; the call does not run");
            return None;
        }
        inner.by_key.remove(key);
        let entry = inner.by_id.get_mut(&id)?;
        entry.approval.status = Status::Consumed;
        entry.approval.consumed_ms = Some(now);
        if let Some(w) = &entry.watch {
            w.send_replace(Status::Consumed);
        }
        out.push(Transition {
            approval: entry.approval.clone(),
            from: Some(Status::Approved),
            to: Status::Consumed,
            at_ms: now,
        });
        Some(entry.approval.clone())
    }

    /// See [`super::Approvals::spend_round`].
    pub(crate) fn spend_round(
        &self,
        tenant: &str,
        id: &ApprovalId,
        round: u32,
        now: u64,
    ) -> Result<(), RoundRefused> {
        let mut g = self.lock();
        let inner = &mut *g;
        let entry = inner.by_id.get(id).ok_or(RoundRefused::Unknown)?;
        rules::check_round(&entry.approval, tenant, round)?;
        if let Err(e) = inner.journal.append(&RecordRef::Round {
            id,
            round,
            at_ms: now,
        }) {
            tracing::error!(approval = %id, error = %e, "cannot journal a round of an approved call; the round does not run");
            return Err(RoundRefused::Unavailable(e.to_string()));
        }
        if let Some(entry) = inner.by_id.get_mut(id) {
            entry.approval.rounds = round;
        }
        Ok(())
    }

    /// See [`super::Approvals::decide`], in the approver's tenant; the
    /// reason was checked by the caller.
    pub(crate) fn decide(
        &self,
        id: &str,
        by: &Approver,
        approve: bool,
        reason: &str,
        now: u64,
        out: &mut Vec<Transition>,
    ) -> Result<Approval, ApprovalError> {
        let not_found = || ApprovalError::NotFound { id: id.to_owned() };
        let mut g = self.lock();
        let inner = &mut *g;
        let entry = inner
            .by_id
            .get(id)
            .filter(|e| e.approval.key.tenant == by.tenant)
            .ok_or_else(not_found)?;
        let id = entry.approval.id.clone();
        if let Err(e) = rules::check_decidable(&entry.approval, by, now) {
            if matches!(e, ApprovalError::Expired { .. }) {
                self.expire_due(inner, &id, now, out);
            }
            return Err(e);
        }
        let decision = Decision {
            approved: approve,
            by: by.subject.clone(),
            at_ms: now,
            reason: reason.to_owned(),
        };
        inner.journal.append(&RecordRef::Decide {
            id: &id,
            decision: &decision,
        })?;
        let to = if approve {
            Status::Approved
        } else {
            Status::Denied
        };
        let entry = inner.by_id.get_mut(&id).ok_or_else(not_found)?;
        entry.approval.status = to;
        entry.approval.decision = Some(decision);
        if let Some(w) = &entry.watch {
            w.send_replace(to);
        }
        self.pending.fetch_sub(1, Ordering::Relaxed);
        if !approve && inner.by_key.get(&entry.approval.key) == Some(&id) {
            inner.by_key.remove(&entry.approval.key);
        }
        out.push(Transition {
            approval: entry.approval.clone(),
            from: Some(Status::Pending),
            to,
            at_ms: now,
        });
        Ok(entry.approval.clone())
    }

    /// See [`super::Approvals::withdraw`].
    pub(crate) fn withdraw(
        &self,
        tenant: &str,
        id: &ApprovalId,
        now: u64,
        out: &mut Vec<Transition>,
    ) -> Option<Approval> {
        let mut g = self.lock();
        let inner = &mut *g;
        let entry = inner
            .by_id
            .get(id)
            .filter(|e| e.approval.key.tenant == tenant)?;
        let from = entry.approval.status_at(now);
        if !from.is_live() {
            return None;
        }
        if let Err(e) = inner
            .journal
            .append(&RecordRef::Withdraw { id, at_ms: now })
        {
            tracing::error!(approval = %id, error = %e, "cannot journal the withdrawal of an approval");
            return None;
        }
        let entry = inner.by_id.get_mut(id)?;
        entry.approval.status = Status::Withdrawn;
        entry.approval.consumed_ms = Some(now);
        if let Some(w) = &entry.watch {
            w.send_replace(Status::Withdrawn);
        }
        if from == Status::Pending {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
        if inner.by_key.get(&entry.approval.key) == Some(id) {
            inner.by_key.remove(&entry.approval.key);
        }
        out.push(Transition {
            approval: entry.approval.clone(),
            from: Some(from),
            to: Status::Withdrawn,
            at_ms: now,
        });
        Some(entry.approval.clone())
    }

    /// Journals the expiry of `id` if it is live and past its deadline. A
    /// journal failure is logged and left for the sweeper to retry; reads
    /// report it expired either way.
    fn expire_due(&self, inner: &mut Inner, id: &ApprovalId, now: u64, out: &mut Vec<Transition>) {
        let Some(entry) = inner.by_id.get(id) else {
            return;
        };
        let from = entry.approval.status;
        if !from.is_live() || now < entry.approval.expires_ms {
            return;
        }
        let at_ms = entry.approval.expires_ms;
        if let Err(e) = inner.journal.append(&RecordRef::Expire { id, at_ms }) {
            tracing::warn!(approval = %id, error = %e, "cannot journal an expiry; it still reads as expired");
            return;
        }
        let Some(entry) = inner.by_id.get_mut(id) else {
            return;
        };
        entry.approval.status = Status::Expired;
        if let Some(w) = &entry.watch {
            w.send_replace(Status::Expired);
        }
        if from == Status::Pending {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
        if inner.by_key.get(&entry.approval.key) == Some(id) {
            inner.by_key.remove(&entry.approval.key);
        }
        out.push(Transition {
            approval: entry.approval.clone(),
            from: Some(from),
            to: Status::Expired,
            at_ms,
        });
    }

    /// A receiver that sees the status change, and the deadline; or the
    /// status if it is not pending (expired for an unknown id).
    pub(crate) fn subscribe(&self, id: &ApprovalId, now: u64) -> Subscription {
        let mut g = self.lock();
        let entry = g.by_id.get_mut(id);
        let expires_ms = rules::wait_from(entry.as_deref().map(|e| &e.approval), now)?;
        let rx = entry
            .ok_or(Status::Expired)?
            .watch
            .get_or_insert_with(|| watch::channel(Status::Pending).0)
            .subscribe();
        Ok((rx, expires_ms))
    }

    /// The status of `id` at `now`, any tenant (internal use).
    pub(crate) fn status(&self, id: &str, now: u64) -> Option<Status> {
        self.lock().by_id.get(id).map(|e| e.approval.status_at(now))
    }

    /// One approval of `tenant`, with its status as of `now`.
    pub(crate) fn get(&self, tenant: &str, id: &str, now: u64) -> Option<Approval> {
        let g = self.lock();
        rules::visible(&g.by_id.get(id)?.approval, tenant, now)
    }

    /// The tenant's approvals, newest first. O(all approvals held).
    pub(crate) fn list(&self, tenant: &str, status: Option<Status>, now: u64) -> Vec<Approval> {
        let g = self.lock();
        let mut out: Vec<Approval> = g
            .by_id
            .values()
            .filter(|e| e.approval.key.tenant == tenant)
            .filter(|e| status.is_none_or(|s| e.approval.status_at(now) == s))
            .map(|e| rules::as_of(&e.approval, now))
            .collect();
        drop(g);
        out.sort_by(|a, b| (b.created_ms, &b.id).cmp(&(a.created_ms, &a.id)));
        out
    }

    /// When the oldest approval still pending at `now` was filed.
    pub(crate) fn oldest_pending_ms(&self, now: u64) -> Option<u64> {
        let g = self.lock();
        g.by_id
            .values()
            .filter(|e| e.approval.status_at(now) == Status::Pending)
            .map(|e| e.approval.created_ms)
            .min()
    }

    /// Journals due expiries, forgets history older than `history_ms`,
    /// compacts when the journal is mostly dead records.
    pub(crate) fn sweep(&self, now: u64, history_ms: u64) -> Vec<Transition> {
        let mut out = Vec::new();
        let mut g = self.lock();
        let inner = &mut *g;
        let due: Vec<ApprovalId> = inner
            .by_key
            .values()
            .filter(|id| {
                inner
                    .by_id
                    .get(*id)
                    .is_some_and(|e| now >= e.approval.expires_ms)
            })
            .cloned()
            .collect();
        for id in &due {
            self.expire_due(inner, id, now, &mut out);
        }
        inner.by_id.retain(|_, e| {
            e.approval
                .ended_ms()
                .is_none_or(|end| end.saturating_add(history_ms) > now)
        });
        let records = inner.journal.records;
        if records > COMPACT_MIN_RECORDS && records > 4 * inner.by_id.len() as u64 {
            let mut ordered: Vec<&Approval> = inner.by_id.values().map(|e| &e.approval).collect();
            ordered.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
            match inner.journal.compact(ordered.into_iter()) {
                Ok(()) => tracing::info!(
                    before = records,
                    after = inner.journal.records,
                    "approvals journal compacted"
                ),
                Err(e) => tracing::warn!(error = %e, "approvals journal compaction failed"),
            }
        }
        out
    }

    /// Records in the journal file now.
    #[cfg(test)]
    pub(crate) fn journal_records(&self) -> u64 {
        self.lock().journal.records
    }
}

/// The journal behind the trait. Every operation does its work in the call
/// (under the lock, fsync included) and returns a future that is already
/// complete.
impl ApprovalBackend for Store {
    fn blocking(&self) -> bool {
        true
    }

    fn pending(&self) -> usize {
        Store::pending(self)
    }

    fn oldest_pending_ms(&self, now: u64) -> Option<u64> {
        Store::oldest_pending_ms(self, now)
    }

    fn request<'a>(
        &'a self,
        new: NewApproval,
        now: u64,
        expiry_ms: u64,
        max_pending: usize,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Approval> {
        done(Store::request(self, new, now, expiry_ms, max_pending, out))
    }

    fn consume<'a>(
        &'a self,
        key: &'a CallKey,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Option<Approval>> {
        done(Ok(Store::consume(self, key, now, out)))
    }

    fn spend_round<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a ApprovalId,
        round: u32,
        now: u64,
    ) -> BoxFuture<'a, Result<(), RoundRefused>> {
        done(Store::spend_round(self, tenant, id, round, now))
    }

    fn withdraw<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a ApprovalId,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Option<Approval>> {
        done(Ok(Store::withdraw(self, tenant, id, now, out)))
    }

    fn decide<'a>(
        &'a self,
        id: &'a str,
        by: &'a Approver,
        approve: bool,
        reason: &'a str,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Approval> {
        done(Store::decide(self, id, by, approve, reason, now, out))
    }

    fn subscribe<'a>(&'a self, id: &'a ApprovalId, now: u64) -> Answer<'a, Subscription> {
        done(Ok(Store::subscribe(self, id, now)))
    }

    fn status<'a>(&'a self, id: &'a str, now: u64) -> Answer<'a, Option<Status>> {
        done(Ok(Store::status(self, id, now)))
    }

    fn get<'a>(&'a self, tenant: &'a str, id: &'a str, now: u64) -> Answer<'a, Option<Approval>> {
        done(Ok(Store::get(self, tenant, id, now)))
    }

    fn list<'a>(
        &'a self,
        tenant: &'a str,
        status: Option<Status>,
        now: u64,
    ) -> Answer<'a, Vec<Approval>> {
        done(Ok(Store::list(self, tenant, status, now)))
    }

    fn sweep(&self, now: u64, history_ms: u64) -> Answer<'_, Vec<Transition>> {
        done(Ok(Store::sweep(self, now, history_ms)))
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A result already in hand, as the future the trait returns.
fn done<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

/// Applies every complete, intact line of `data`; a damaged last line is a
/// torn append and ignored, damage before it is an error.
fn replay(data: &[u8], path: &Path) -> Result<(HashMap<ApprovalId, Approval>, Replay), StoreError> {
    let mut by_id: HashMap<ApprovalId, Approval> = HashMap::new();
    let mut stats = Replay::default();
    let mut pos = 0;
    let mut line_no = 0;
    while pos < data.len() {
        line_no += 1;
        let (line, next, complete) = match memchr::memchr(b'\n', &data[pos..]) {
            Some(i) => (&data[pos..pos + i], pos + i + 1, true),
            None => (&data[pos..], data.len(), false),
        };
        let last = next >= data.len();
        let parsed = parse_line(line);
        // An append that did not finish (no newline, or bytes that never
        // made it to disk) was never acknowledged, so it never happened.
        if !complete || (last && parsed.is_err()) {
            stats.torn_tail = true;
            tracing::warn!(path = %path.display(), line = line_no, "ignoring a torn last line in the approvals journal");
            break;
        }
        let rec = parsed.map_err(|problem| StoreError::Corrupt {
            path: path.to_owned(),
            line: line_no,
            problem,
        })?;
        stats.records += 1;
        apply(&mut by_id, rec, &mut stats);
        pos = next;
    }
    Ok((by_id, stats))
}

fn parse_line(line: &[u8]) -> Result<Record, Corruption> {
    if line.len() < 9 || line[8] != b' ' {
        return Err(Corruption::NoChecksum);
    }
    let stored = std::str::from_utf8(&line[..8])
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or(Corruption::NoChecksum)?;
    let json = &line[9..];
    let computed = crc32fast::hash(json);
    if stored != computed {
        return Err(Corruption::Checksum { stored, computed });
    }
    serde_json::from_slice(json).map_err(Corruption::Json)
}

fn apply(by_id: &mut HashMap<ApprovalId, Approval>, rec: Record, stats: &mut Replay) {
    // Compaction writes every approval a later record can name, so an
    // unknown id is an approval purged as old history: nothing to change.
    fn target<'a>(
        by_id: &'a mut HashMap<ApprovalId, Approval>,
        stats: &mut Replay,
        id: &ApprovalId,
    ) -> Option<&'a mut Approval> {
        let found = by_id.get_mut(id);
        stats.unknown_ids += usize::from(found.is_none());
        found
    }
    match rec {
        Record::Put { approval } => {
            by_id.insert(approval.id.clone(), *approval);
        }
        Record::Decide { id, decision } => {
            if let Some(a) = target(by_id, stats, &id) {
                a.status = if decision.approved {
                    Status::Approved
                } else {
                    Status::Denied
                };
                a.decision = Some(decision);
            }
        }
        Record::Consume { id, at_ms } => {
            if let Some(a) = target(by_id, stats, &id) {
                a.status = Status::Consumed;
                a.consumed_ms = Some(at_ms);
            }
        }
        Record::Expire { id, .. } => {
            if let Some(a) = target(by_id, stats, &id) {
                a.status = Status::Expired;
            }
        }
        Record::Withdraw { id, at_ms } => {
            if let Some(a) = target(by_id, stats, &id) {
                a.status = Status::Withdrawn;
                a.consumed_ms = Some(at_ms);
            }
        }
        Record::Round { id, round, .. } => {
            if let Some(a) = target(by_id, stats, &id) {
                a.rounds = a.rounds.max(round);
            }
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
