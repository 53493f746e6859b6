//! What `audit verify` reports: per writer, the rows verified and every
//! finding (deleted, altered, forged, gaps, broken links, checkpoints that do
//! not hold), each naming its row; and the report rendered for people.
//! [`super::verify`] fills it in.

use serde::Serialize;

/// At most this many findings of one kind are listed (all are counted).
const LIST_MAX: usize = 1000;

/// Findings of one kind: how many, and the first [`LIST_MAX`].
#[derive(Debug, Clone, Serialize)]
pub struct Listed<T> {
    /// How many.
    pub count: u64,
    /// The first of them.
    pub first: Vec<T>,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Listed {
            count: 0,
            first: Vec::new(),
        }
    }
}

impl<T> Listed<T> {
    /// Counts `item`, and lists it while fewer than [`LIST_MAX`] are.
    pub(crate) fn push(&mut self, item: T) {
        self.count += 1;
        if self.first.len() < LIST_MAX {
            self.first.push(item);
        }
    }

    /// None found.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// A row a finding is about.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RowRef {
    /// Its place in its writer's chain (none for a row in no chain).
    pub seq: Option<u64>,
    /// Its `event_id`.
    pub event_id: String,
    /// Its `row_version` (0: the intent of a forwarded call, 1: final).
    pub row_version: u8,
    /// Its `time_ms`, RFC 3339.
    pub time: String,
    /// Its `time_ms`.
    pub time_ms: u64,
}

/// Inclusive `seq` range.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct SeqRange {
    /// First.
    pub from: u64,
    /// Last.
    pub to: u64,
}

/// A checkpoint that does not hold.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BadCheckpoint {
    /// The `seq` it names.
    pub seq: u64,
    /// Why it does not hold.
    pub why: String,
}

/// The last checkpoint a writer's chain matched.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckpointRef {
    /// Its `seq`.
    pub seq: u64,
    /// When it was signed, RFC 3339.
    pub time: String,
}

/// What verifying one writer found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WriterReport {
    /// The writer (a replica).
    pub writer_id: String,
    /// Nothing wrong.
    pub holds: bool,
    /// First and last `seq` of its chain in the range.
    pub first_seq: u64,
    /// Last `seq`.
    pub last_seq: u64,
    /// Rows whose content, link and place hold.
    pub verified: u64,
    /// Intents merged into their verified completion (the table keeps one
    /// row per call): not missing.
    pub superseded: u64,
    /// Identical second copies of entries (at-least-once delivery).
    pub duplicates: u64,
    /// Chain entries missing (deleted): `seq` ranges.
    pub gaps: Listed<SeqRange>,
    /// Entries whose row is gone (deleted rows).
    pub missing: Listed<RowRef>,
    /// Rows that no longer give their entry's hash (altered).
    pub altered: Listed<RowRef>,
    /// Entries whose `prev_hash` is not the hash of the entry before.
    pub broken_links: Listed<u64>,
    /// Second entries under a used `seq` that differ from the first.
    pub conflicts: Listed<u64>,
    /// Entries left out of the signed chain: the writer went on from its
    /// last checkpoint after them (it resumed without its chain head and
    /// could not prove them its own).
    pub outside: Listed<SeqRange>,
    /// Valid checkpoints the chain matched.
    pub checkpoints: u64,
    /// The last of them.
    pub last_checkpoint: Option<CheckpointRef>,
    /// Checkpoints that do not hold (bad signature, or a hash the chain
    /// does not have).
    pub bad_checkpoints: Listed<BadCheckpoint>,
    /// Signed rows past the chain's end (its tail was cut).
    pub truncated: Option<SeqRange>,
    /// Rows after the last checkpoint: unsigned so far (a cut there is not
    /// provable until the next checkpoint).
    pub unsigned_tail: u64,
    /// Whether its last checkpoint was a clean stop's final one.
    pub last_checkpoint_final: bool,
    /// Entries no trusted checkpoint signs where one is required: why.
    pub unsigned: Option<String>,
}

impl WriterReport {
    /// Sets `holds`: nothing wrong was found.
    pub(crate) fn judge(&mut self) {
        self.holds = self.gaps.is_empty()
            && self.missing.is_empty()
            && self.altered.is_empty()
            && self.broken_links.is_empty()
            && self.conflicts.is_empty()
            && self.outside.is_empty()
            && self.bad_checkpoints.is_empty()
            && self.truncated.is_none()
            && self.unsigned.is_none();
    }
}

/// What `audit verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Everything checked holds.
    pub holds: bool,
    /// Per writer.
    pub writers: Vec<WriterReport>,
    /// Rows in no chain, of the chains' time (inserted behind the firewall).
    pub forged: Listed<RowRef>,
    /// Checkpoints whose signature no given key made.
    pub unsigned_checkpoints: Listed<BadCheckpoint>,
    /// Rows older than every chain (written before chaining began, or
    /// inserted with an old time): not provable, so the trail does not
    /// hold; verify from when chaining began (`--from`).
    pub before_chain: u64,
    /// Audit rows read.
    pub rows_read: u64,
    /// Chain entries read.
    pub entries_read: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// The report for people.
pub fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for w in &r.writers {
        render_writer(&mut o, w);
    }
    for x in &r.forged.first {
        let _ = writeln!(
            o,
            "FORGED    event {} row_version {} at {}: in no writer's chain",
            x.event_id, x.row_version, x.time
        );
    }
    if r.forged.count > r.forged.first.len() as u64 {
        let _ = writeln!(o, "… {} forged rows in all", r.forged.count);
    }
    for b in &r.unsigned_checkpoints.first {
        let _ = writeln!(o, "BAD SIGNATURE checkpoint seq {}: {}", b.seq, b.why);
    }
    render_totals(&mut o, r);
    o
}

/// One writer's lines: its summary, its checkpoints, then each finding.
fn render_writer(o: &mut String, w: &WriterReport) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "writer {}: {}  seq {}..{}: {} rows verified, {} intents superseded by their completion, {} duplicate entries",
        w.writer_id,
        if w.holds { "holds" } else { "DOES NOT HOLD" },
        w.first_seq,
        w.last_seq,
        w.verified,
        w.superseded,
        w.duplicates
    );
    match &w.last_checkpoint {
        Some(c) => {
            let _ = writeln!(
                o,
                "  {} signed checkpoints, the last at seq {} ({}); {} rows after it unsigned so far",
                w.checkpoints, c.seq, c.time, w.unsigned_tail
            );
        }
        None => {
            let _ = writeln!(
                o,
                "  no signed checkpoint: {} rows unsigned so far",
                w.unsigned_tail
            );
        }
    }
    render_rows(o, "DELETED", &w.missing);
    render_rows(o, "ALTERED", &w.altered);
    render_chain_findings(o, w);
}

/// The rows of one kind of finding (`what`), and how many in all when not
/// all are listed.
fn render_rows(o: &mut String, what: &str, l: &Listed<RowRef>) {
    use std::fmt::Write as _;
    for x in &l.first {
        let _ = writeln!(
            o,
            "  {what:<9} seq {} event {} row_version {} at {}",
            x.seq.unwrap_or(0),
            x.event_id,
            x.row_version,
            x.time
        );
    }
    if l.count > l.first.len() as u64 {
        let _ = writeln!(o, "  … {} {what} rows in all", l.count);
    }
}

/// A writer's findings about its chain and checkpoints: gaps, broken
/// links, entries outside the signed chain, conflicts, bad checkpoints, a
/// cut tail, a missing signature.
fn render_chain_findings(o: &mut String, w: &WriterReport) {
    use std::fmt::Write as _;
    for g in &w.gaps.first {
        let _ = writeln!(
            o,
            "  GAP       seq {}..{}: chain entries deleted",
            g.from, g.to
        );
    }
    for s in &w.broken_links.first {
        let _ = writeln!(
            o,
            "  BROKEN    seq {s}: prev_hash is not the hash of the entry before"
        );
    }
    for r in &w.outside.first {
        let _ = writeln!(
            o,
            "  OUTSIDE   seq {}..{}: not in the signed chain (the writer went on from its checkpoint at seq {})",
            r.from,
            r.to,
            r.from - 1
        );
    }
    for s in &w.conflicts.first {
        let _ = writeln!(
            o,
            "  CONFLICT  seq {s}: a second, different entry under this number"
        );
    }
    for b in &w.bad_checkpoints.first {
        let _ = writeln!(o, "  CHECKPOINT seq {}: {}", b.seq, b.why);
    }
    if let Some(t) = &w.truncated {
        let _ = writeln!(
            o,
            "  TRUNCATED seq {}..{}: signed by a checkpoint, gone from the chain",
            t.from, t.to
        );
    }
    if let Some(why) = &w.unsigned {
        let _ = writeln!(o, "  UNSIGNED  {why}");
    }
}

/// The last lines: rows older than every chain, what was read how fast,
/// and the verdict.
fn render_totals(o: &mut String, r: &Report) {
    use std::fmt::Write as _;
    if r.before_chain > 0 {
        let _ = writeln!(
            o,
            "{} rows are older than every chain (written before chaining began, or inserted with an old time): not provable; verify from when chaining began (--from)",
            r.before_chain
        );
    }
    let rate = if r.seconds > 0.0 {
        r.rows_read as f64 / r.seconds
    } else {
        0.0
    };
    let _ = writeln!(
        o,
        "{} rows and {} chain entries read in {:.1} s ({:.0} rows/s)",
        r.rows_read, r.entries_read, r.seconds, rate
    );
    let _ = writeln!(
        o,
        "{}",
        if r.holds {
            "verdict: the audit trail holds"
        } else {
            "verdict: the audit trail DOES NOT HOLD"
        }
    );
}
