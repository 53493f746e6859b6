//! `mcp-firewall audit verify`: proves the audit trail in ClickHouse
//! complete and unaltered, or names the rows that are not.
//!
//! Three streams, each read once as `RowBinary`: the signed checkpoints
//! (`<table>_checkpoints`, and the writers' local checkpoint files), every
//! writer's chain in `seq` order (`<table>_chain`), and the audit rows in
//! whatever order ClickHouse returns them. The chain is checked link by
//! link as it streams, without its rows (a gap is a deleted entry; an entry
//! whose link is not the link of its fields, or not the next entry's
//! `prev_hash`, a rewritten one; a second entry under a used `seq` a forged
//! one; entries a writer did not go on from are outside the signed chain)
//! and against the checkpoints (a signed link the chain no longer has: the
//! chain was rewritten; a signed `seq` past its end: its tail was cut).
//! Each row is then hashed and compared with its entry: a row that does
//! not give its hash was altered; an entry without its row was deleted
//! (unless it is an intent whose verified completion replaced it when the
//! table merged: its link was checked all the same); a row without an
//! entry was never chained (forged). Where a key is configured, a writer
//! no trusted checkpoint signs, or a tail left unsigned longer than its
//! writer signs, fails too. A window is anchored at signed checkpoints
//! ([`Range`]): it is checked exactly as the whole would be.
//!
//! Invariants: nothing is written; memory is one small record per chain
//! entry in the range checked (150 to 250 bytes with the hash table's
//! slack), never a row; every finding names the row (writer, `seq`,
//! `event_id`, time).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;

use super::chain::{
    Entry, Hash, Link, Links, SignedCheckpoint, Step, CHAIN_COLUMNS, CHECKPOINT_COLUMNS,
};
use super::record::{payload_time_ms, row_len, row_version, COLUMNS};
pub use super::verify_report::{
    render, BadCheckpoint, CheckpointRef, Listed, Report, RowRef, SeqRange, WriterReport,
};

/// A streamed answer that has not given a whole record in this many bytes
/// is not `RowBinary` of the expected columns.
const MAX_PENDING: usize = 64 << 20;

/// What to verify.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Chain entries linked at or after this instant (ms); rows of this
    /// time on that are in no chain. `None`: from each chain's start.
    pub from_ms: Option<u64>,
    /// Up to this instant (ms). `None`: to each chain's end, and a signed
    /// `seq` past the end is a cut tail.
    pub to_ms: Option<u64>,
    /// One writer only.
    pub writer: Option<String>,
    /// Public keys whose checkpoint signatures count.
    pub keys: Vec<[u8; 32]>,
    /// Writers' local checkpoint files, read besides the table.
    pub checkpoint_files: Vec<PathBuf>,
    /// Every verified row as a JSON line (writer, `seq`, hashes, columns)
    /// to this file.
    pub export: Option<PathBuf>,
    /// Checkpoints are required (a signing key is configured, and the
    /// auditor did not pass `--allow-unsigned`): the writer's
    /// `checkpoint_every` (rows, seconds). A writer no trusted checkpoint
    /// signs, entries after a final checkpoint, and a tail unsigned longer
    /// than this allows are findings.
    pub require_signed: Option<(u64, u64)>,
}

/// How much later than `checkpoint_every` a live writer's checkpoint may
/// reach ClickHouse (it sends them at most every 5 s, and retries).
const SIGNING_SLACK_S: u64 = 60;

/// One chain entry, as kept while rows stream by.
struct Rec {
    writer: u32,
    seq: u64,
    prev: Hash,
    hash: Hash,
    legacy: bool,
    time_ms: u64,
    /// 0 not seen, 1 verified, 2 altered.
    state: u8,
}

/// Where the audit trail is.
pub struct Target<'a> {
    /// ClickHouse.
    pub client: &'a clickhouse::Client,
    /// Database.
    pub database: &'a str,
    /// Audit table (the chain and checkpoints are `<table>_chain`,
    /// `<table>_checkpoints`).
    pub table: &'a str,
}

/// A client for verifying the ClickHouse `cfg` names: the firewall's
/// (TLS, password), answers uncompressed (verify reads far more than it
/// saves on compression).
pub fn client_for(cfg: &super::ClickHouseConfig) -> anyhow::Result<clickhouse::Client> {
    Ok(super::build_client(cfg)?.with_compression(clickhouse::Compression::None))
}

/// Verifies the trail at `target` as `opts` says.
pub async fn verify(target: &Target<'_>, opts: &Options) -> anyhow::Result<Report> {
    let started = Instant::now();
    if let Some(w) = &opts.writer {
        anyhow::ensure!(super::is_writer_id(w), "--writer {w:?} is not a writer id");
    }
    let mut report = Report::default();
    let signed = checkpoints(target, opts, &mut report).await?;
    let ranges = ranges(opts, &signed);
    let linked_from = linked_from(target, opts).await?;
    let mut state = Chains::new(opts, signed, ranges.clone(), linked_from);
    if let Some(path) = &opts.export {
        let f = std::fs::File::create(path)
            .with_context(|| format!("creating the export file {}", path.display()))?;
        state.export = Some(std::io::BufWriter::new(f));
    }
    stream(
        target.client,
        &chain_sql_of(target.database, target.table, opts, &ranges),
        |data| {
            let (entry, len) = Entry::decode(data)?;
            state.entry(entry);
            Some(len)
        },
    )
    .await
    .context("reading the chain")?;
    state.finish_chains();
    report.entries_read = state.entries;
    if let Some(sql) = completions_sql(target.database, target.table, opts, &ranges) {
        stream(target.client, &sql, |data| {
            let id: [u8; 16] = data.get(..16)?.try_into().ok()?;
            state.completed_later.insert(key_of(id));
            Some(16)
        })
        .await
        .context("reading the completions of the window's intents")?;
    }
    let mut rows_read = 0u64;
    stream(
        target.client,
        &rows_sql_of(target.database, target.table, opts, &ranges),
        |data| {
            let len = row_len(data)?;
            rows_read += 1;
            state.row(&data[..len]);
            Some(len)
        },
    )
    .await
    .context("reading the audit rows")?;
    report.rows_read = rows_read;
    if let Some(mut f) = state.export.take() {
        use std::io::Write as _;
        f.flush().context("writing the export file")?;
    }
    if let Some(e) = state.export_error.take() {
        return Err(e).context("writing the export file");
    }
    state.finish_rows(&mut report);
    report.holds = report.forged.is_empty()
        && report.before_chain == 0
        && report.unsigned_checkpoints.is_empty()
        && report.writers.iter().all(|w| w.holds);
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Valid checkpoints per writer: `seq` → (hash, time, final). Invalid ones
/// are findings.
type Signed = HashMap<String, BTreeMap<u64, (Hash, u64, bool)>>;

async fn checkpoints(
    target: &Target<'_>,
    opts: &Options,
    report: &mut Report,
) -> anyhow::Result<Signed> {
    let mut all = Vec::new();
    let sql = checkpoints_sql(target.database, target.table, opts.writer.as_deref());
    stream(target.client, &sql, |data| {
        let (cp, len) = SignedCheckpoint::decode(data)?;
        all.push(cp);
        Some(len)
    })
    .await
    .context("reading the checkpoints")?;
    for path in &opts.checkpoint_files {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the checkpoint file {}", path.display()))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let cp = SignedCheckpoint::from_line(line)
                .with_context(|| format!("{} line {}: not a checkpoint", path.display(), n + 1))?;
            if opts
                .writer
                .as_ref()
                .is_none_or(|w| *w == cp.checkpoint.writer_id)
            {
                all.push(cp);
            }
        }
    }
    if !all.is_empty() && opts.keys.is_empty() {
        anyhow::bail!(
            "{} checkpoints to check and no public key: pass --public-key (what `mcp-firewall audit pubkey` printed) or a config with audit.signing_key_file",
            all.len()
        );
    }
    let mut signed: Signed = HashMap::new();
    for cp in all {
        let c = &cp.checkpoint;
        let Some(last) = cp.verify_kind(&opts.keys) else {
            report.unsigned_checkpoints.push(BadCheckpoint {
                seq: c.seq,
                why: format!(
                    "writer {}: the signature is not one of the given keys' (claims {})",
                    c.writer_id, cp.public_key
                ),
            });
            continue;
        };
        let per = signed.entry(c.writer_id.clone()).or_default();
        match per.get(&c.seq) {
            Some((hash, _, _)) if *hash != c.row_hash => {
                report.unsigned_checkpoints.push(BadCheckpoint {
                    seq: c.seq,
                    why: format!(
                        "writer {}: two valid checkpoints sign different hashes for one seq (is the key compromised?)",
                        c.writer_id
                    ),
                });
            }
            Some((_, time, was_final)) => {
                // The same head signed again: final if either says so (a
                // clean stop re-signs its last checkpoint as final).
                let entry = (c.row_hash, (*time).max(c.time_ms), *was_final || last);
                per.insert(c.seq, entry);
            }
            None => {
                per.insert(c.seq, (c.row_hash, c.time_ms, last));
            }
        }
    }
    Ok(signed)
}

fn checkpoints_sql(database: &str, table: &str, writer: Option<&str>) -> String {
    let mut sql = format!(
        "SELECT {} FROM {database}.{table}_checkpoints",
        CHECKPOINT_COLUMNS.join(", ")
    );
    if let Some(w) = writer {
        sql.push_str(&format!(" WHERE writer_id = '{w}'"));
    }
    sql
}

fn linked_from_sql(database: &str, table: &str, writer: Option<&str>) -> String {
    let mut sql = format!(
        "SELECT writer_id, min(seq) FROM {database}.{table}_chain WHERE link != {}",
        super::clickhouse::EMPTY_LINK_SQL
    );
    if let Some(w) = writer {
        sql.push_str(&format!(" AND writer_id = '{w}'"));
    }
    sql.push_str(" GROUP BY writer_id");
    sql
}

/// The part of a writer's chain a window checks: after the last signed
/// checkpoint at or before `--from` (whose link anchors it), up to the
/// first at or after `--to`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Range {
    /// The anchoring checkpoint: `seq` and link (none: from the start).
    after: Option<(u64, Hash)>,
    /// The closing checkpoint's `seq` (none: to the chain's end).
    upto: Option<u64>,
}

impl Range {
    fn contains(&self, seq: u64) -> bool {
        self.after.is_none_or(|(a, _)| seq > a) && self.upto.is_none_or(|u| seq <= u)
    }

    fn sql(&self, writer: &str) -> String {
        let mut c = format!("(writer_id = '{writer}'");
        if let Some((a, _)) = self.after {
            c.push_str(&format!(" AND seq > {a}"));
        }
        if let Some(u) = self.upto {
            c.push_str(&format!(" AND seq <= {u}"));
        }
        c.push(')');
        c
    }
}

/// The range of each writer with valid checkpoints, in a window (a full
/// verify reads every writer whole).
fn ranges(opts: &Options, signed: &Signed) -> BTreeMap<String, Range> {
    if opts.from_ms.is_none() && opts.to_ms.is_none() {
        return BTreeMap::new();
    }
    signed
        .iter()
        .map(|(w, cps)| {
            let after = opts.from_ms.and_then(|from| {
                cps.iter()
                    .filter(|(_, (_, t, _))| *t <= from)
                    .map(|(seq, (h, _, _))| (*seq, *h))
                    .next_back()
            });
            let upto = opts.to_ms.and_then(|to| {
                cps.iter()
                    .find(|(_, (_, t, _))| *t >= to)
                    .map(|(seq, _)| *seq)
            });
            (w.clone(), Range { after, upto })
        })
        .collect()
}

/// Where each writer's links begin: its first entry with a link.
async fn linked_from(target: &Target<'_>, opts: &Options) -> anyhow::Result<HashMap<String, u64>> {
    let sql = linked_from_sql(target.database, target.table, opts.writer.as_deref());
    let mut out = HashMap::new();
    stream(target.client, &sql, |data| {
        let (len, at) = super::record::leb128(data, 0)?;
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        let writer = String::from_utf8(data.get(at..end)?.to_vec()).ok()?;
        let seq = u64::from_le_bytes(data.get(end..end + 8)?.try_into().ok()?);
        out.insert(writer, seq);
        Some(end + 8)
    })
    .await
    .context("reading where each chain's links begin")?;
    Ok(out)
}

/// The conditions on chain entries: the writer; in a window, each anchored
/// writer's range, and the window's time for writers no checkpoint
/// anchors.
fn chain_filter(opts: &Options, ranges: &BTreeMap<String, Range>) -> Vec<String> {
    let mut conds = Vec::new();
    if let Some(w) = &opts.writer {
        conds.push(format!("writer_id = '{w}'"));
    }
    if opts.from_ms.is_none() && opts.to_ms.is_none() {
        return conds;
    }
    let mut unanchored = vec![format!(
        "chained >= toDateTime({}) AND chained <= toDateTime({})",
        opts.from_ms.unwrap_or(0) / 1000,
        opts.to_ms.map_or(u64::from(u32::MAX), |t| t / 1000)
    )];
    if !ranges.is_empty() {
        let names: Vec<String> = ranges.keys().map(|w| format!("'{w}'")).collect();
        unanchored.push(format!("writer_id NOT IN ({})", names.join(", ")));
    }
    let mut any: Vec<String> = ranges.iter().map(|(w, r)| r.sql(w)).collect();
    any.push(format!("({})", unanchored.join(" AND ")));
    conds.push(format!("({})", any.join(" OR ")));
    conds
}

fn chain_sql_of(
    database: &str,
    table: &str,
    opts: &Options,
    ranges: &BTreeMap<String, Range>,
) -> String {
    let conds = chain_filter(opts, ranges);
    format!(
        "SELECT {} FROM {database}.{table}_chain{} ORDER BY writer_id, seq",
        CHAIN_COLUMNS.join(", "),
        where_clause(&conds)
    )
}

fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    }
}

/// The rows to check: all of them; or the rows of the chain entries
/// checked and, in a window, every row of its time that no entry of any
/// chain names (whatever its `row_version`).
fn rows_sql_of(
    database: &str,
    table: &str,
    opts: &Options,
    ranges: &BTreeMap<String, Range>,
) -> String {
    let t = format!("{database}.{table}");
    let conds = chain_filter(opts, ranges);
    let mut sql = format!("SELECT {} FROM {t}", COLUMNS.join(", "));
    if conds.is_empty() {
        return sql;
    }
    sql.push_str(&format!(
        " WHERE (event_id, row_version) IN (SELECT event_id, row_version FROM {t}_chain{})",
        where_clause(&conds)
    ));
    if opts.from_ms.is_some() || opts.to_ms.is_some() {
        let from = opts.from_ms.unwrap_or(0) / 1000;
        let to = opts.to_ms.map_or(u64::from(u32::MAX), |t| t / 1000);
        sql.push_str(&format!(
            " OR (time >= toDateTime({from}) AND time <= toDateTime({to}) \
             AND (event_id, row_version) NOT IN (SELECT event_id, row_version FROM {t}_chain))"
        ));
    }
    sql
}

/// In a window: the calls whose intent is in it and whose completion is
/// chained outside it (at its end, an intent's completion may come after
/// the closing checkpoint; its own window verifies it).
fn completions_sql(
    database: &str,
    table: &str,
    opts: &Options,
    ranges: &BTreeMap<String, Range>,
) -> Option<String> {
    if opts.from_ms.is_none() && opts.to_ms.is_none() {
        return None;
    }
    let conds = chain_filter(opts, ranges);
    Some(format!(
        "SELECT event_id FROM {database}.{table}_chain WHERE row_version = 1 AND event_id IN \
         (SELECT event_id FROM {database}.{table}_chain{} AND row_version = 0)",
        where_clause(&conds)
    ))
}

/// Streams `sql`'s `RowBinary` answer through `each`, which takes the
/// record the bytes start with and says its length (`None`: not whole yet).
async fn stream(
    client: &clickhouse::Client,
    sql: &str,
    mut each: impl FnMut(&[u8]) -> Option<usize>,
) -> anyhow::Result<()> {
    let mut cursor = client.query_raw(sql).fetch_bytes("RowBinary")?;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut at = 0usize;
    while let Some(chunk) = cursor.next().await? {
        if at > 0 && at >= buf.len() / 2 {
            buf.drain(..at);
            at = 0;
        }
        buf.extend_from_slice(&chunk);
        while let Some(len) =
            buf.get(at..)
                .and_then(|rest| if rest.is_empty() { None } else { each(rest) })
        {
            at += len.max(1);
        }
        anyhow::ensure!(
            buf.len() - at <= MAX_PENDING,
            "ClickHouse's answer is not RowBinary of the expected columns (is the schema this release's?)"
        );
    }
    anyhow::ensure!(
        at == buf.len(),
        "ClickHouse's answer ends inside a record ({} bytes left): not RowBinary of the expected columns",
        buf.len() - at
    );
    Ok(())
}

/// The chains as they stream by, then the rows.
struct Chains {
    windowed: bool,
    signed: Signed,
    ranges: BTreeMap<String, Range>,
    linked_from: HashMap<String, u64>,
    writers: Vec<WriterReport>,
    ids: HashMap<String, u32>,
    links: Links,
    /// The current writer's range, where its links begin, whether its
    /// chain is read to its end.
    range: Range,
    first_linked: u64,
    open_end: bool,
    /// The current writer's checkpoints not yet met, and the last met
    /// (`seq`, time, final).
    pending: BTreeMap<u64, (Hash, u64, bool)>,
    last_met: Option<(u64, u64, bool)>,
    /// Links of the checkpoints met: where a writer may resume.
    met_links: HashMap<Hash, u64>,
    /// When the first entry after the last met checkpoint was chained.
    tail_since_s: Option<u32>,
    require_signed: Option<(u64, u64)>,
    recs: HashMap<(u128, u8), Rec>,
    /// In a window: calls whose intent is in it and whose completion is
    /// chained after it (the merge may have folded the intent into it).
    completed_later: std::collections::HashSet<u128>,
    /// Rows no entry in range names: `(event_id, row_version, time_ms)`.
    unchained: Vec<(u128, u8, u64)>,
    export: Option<std::io::BufWriter<std::fs::File>>,
    export_error: Option<std::io::Error>,
    entries: u64,
    chain_start_ms: u64,
}

fn row_ref(seq: Option<u64>, event_id: u128, row_version: u8, time_ms: u64) -> RowRef {
    RowRef {
        seq,
        event_id: uuid_text(event_id),
        row_version,
        time: crate::clock::fmt_ms(time_ms),
        time_ms,
    }
}

/// The text of an `event_id` kept as [`key_of`] read it.
fn uuid_text(key: u128) -> String {
    super::record::uuid_of(&key.to_le_bytes()).map_or_else(String::new, |u| u.to_string())
}

fn key_of(event_id: [u8; 16]) -> u128 {
    u128::from_le_bytes(event_id)
}

impl Chains {
    fn new(
        opts: &Options,
        signed: Signed,
        ranges: BTreeMap<String, Range>,
        linked_from: HashMap<String, u64>,
    ) -> Chains {
        Chains {
            windowed: opts.from_ms.is_some() || opts.to_ms.is_some(),
            signed,
            ranges,
            linked_from,
            writers: Vec::new(),
            ids: HashMap::new(),
            links: Links::from_genesis(),
            range: Range::default(),
            first_linked: u64::MAX,
            open_end: true,
            pending: BTreeMap::new(),
            last_met: None,
            met_links: HashMap::new(),
            tail_since_s: None,
            require_signed: opts.require_signed,
            recs: HashMap::new(),
            completed_later: std::collections::HashSet::new(),
            unchained: Vec::new(),
            export: None,
            export_error: None,
            entries: 0,
            chain_start_ms: u64::MAX,
        }
    }

    fn current(&mut self) -> Option<&mut WriterReport> {
        self.writers.last_mut()
    }

    /// A writer's chain begins: its range, anchor and checkpoints.
    fn begin_writer(&mut self, writer_id: &str, first_seq: u64) {
        self.finish_writer();
        let idx = u32::try_from(self.writers.len()).unwrap_or(u32::MAX);
        self.ids.insert(writer_id.to_owned(), idx);
        let anchored = self.ranges.get(writer_id).copied();
        self.range = anchored.unwrap_or_default();
        let range = self.range;
        self.pending = self
            .signed
            .remove(writer_id)
            .unwrap_or_default()
            .into_iter()
            .filter(|(seq, _)| range.contains(*seq))
            .collect();
        self.open_end = range.upto.is_none();
        self.first_linked = self.linked_from.get(writer_id).copied().unwrap_or(u64::MAX);
        self.last_met = None;
        self.met_links.clear();
        self.tail_since_s = None;
        self.links = match (range.after, anchored.is_some() || !self.windowed) {
            // Anchored at a signed checkpoint: the next entry must follow
            // its link.
            (Some((seq, link)), _) => {
                self.met_links.insert(link, seq);
                Links::after(seq, link)
            }
            (None, true) => Links::from_genesis(),
            // A window of a writer no checkpoint anchors: taken as found.
            (None, false) => Links::anchored(),
        };
        self.writers.push(WriterReport {
            writer_id: writer_id.to_owned(),
            first_seq,
            ..WriterReport::default()
        });
    }

    /// The next chain entry (sorted by writer, then `seq`).
    fn entry(&mut self, e: Entry) {
        self.entries += 1;
        if self
            .writers
            .last()
            .is_none_or(|w| w.writer_id != e.writer_id)
        {
            self.begin_writer(&e.writer_id, e.link.seq);
        }
        let writer = u32::try_from(self.writers.len() - 1).unwrap_or(u32::MAX);
        let step = self.links.push(&e.link);
        let seq = e.link.seq;
        let key = (key_of(e.event_id), e.row_version);
        // Its own hashes: a link that is not the link of its fields, or an
        // entry of the older kind where the chain links, was rewritten.
        let own = if e.link.legacy {
            seq < self.first_linked
        } else {
            seq >= self.first_linked && e.link.holds(&e.writer_id, self.first_linked)
        };
        let resumed = match step {
            Step::Broken => self
                .met_links
                .get(&e.link.prev_hash)
                .copied()
                .filter(|cp| *cp + 1 < seq),
            _ => None,
        };
        let Some(w) = self.writers.last_mut() else {
            return;
        };
        match step {
            Step::Duplicate => {
                w.duplicates += 1;
                return;
            }
            Step::Conflict => {
                w.conflicts.push(seq);
                return;
            }
            Step::Gap { from, to } => w.gaps.push(SeqRange { from, to }),
            Step::Broken => match resumed {
                Some(cp) => w.outside.push(SeqRange {
                    from: cp + 1,
                    to: seq - 1,
                }),
                None => w.broken_links.push(seq),
            },
            Step::Linked => {}
        }
        if !own && !matches!(step, Step::Broken) {
            w.broken_links.push(seq);
        }
        w.last_seq = seq;
        self.tail_since_s.get_or_insert(e.chained_s);
        // The checkpoints at or before this entry.
        while let Some((&cseq, &(hash, time, last))) = self.pending.first_key_value() {
            if cseq > seq {
                break;
            }
            self.pending.pop_first();
            if cseq < seq {
                // Its entry was deleted: the gap says so.
                continue;
            }
            if hash == e.link.link {
                w.checkpoints += 1;
                self.last_met = Some((cseq, time, last));
                self.met_links.insert(hash, cseq);
                self.tail_since_s = None;
            } else {
                w.bad_checkpoints.push(BadCheckpoint {
                    seq: cseq,
                    why: "the chain's link at this seq is not the signed one: the chain was rewritten".into(),
                });
            }
        }
        self.chain_start_ms = self.chain_start_ms.min(e.time_ms);
        let rec = Rec {
            writer,
            seq,
            prev: e.link.prev_hash,
            hash: e.link.row_hash,
            legacy: e.link.legacy,
            time_ms: e.time_ms,
            state: 0,
        };
        if let Some(old) = self.recs.insert(key, rec) {
            // One row chained under two numbers: only a forged entry does that.
            if let Some(w) = self.current() {
                w.conflicts.push(old.seq.max(seq));
            }
        }
    }

    /// The current writer's chain ended.
    fn finish_writer(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let last_met = self.last_met.take();
        let tail_since = self.tail_since_s.take();
        let open_end = self.open_end;
        let required = self.require_signed;
        let Some(w) = self.current() else {
            return;
        };
        // Signed entries past the end of what is left: a cut tail (of the
        // chain, or of a window: the closing checkpoint's entry is gone).
        if let Some((&signed_end, _)) = pending.last_key_value() {
            w.truncated = Some(SeqRange {
                from: w.last_seq + 1,
                to: signed_end,
            });
        }
        match last_met {
            Some((seq, time, last)) => {
                w.unsigned_tail = w.last_seq - seq;
                w.last_checkpoint_final = last;
                w.last_checkpoint = Some(CheckpointRef {
                    seq,
                    time: crate::clock::fmt_ms(time),
                });
            }
            None => w.unsigned_tail = w.last_seq + 1 - w.first_seq,
        }
        // Where a key is configured, the chain must be signed: a writer
        // nobody signed is invented, and a tail unsigned for longer than
        // the writer signs, or past its final checkpoint, was not written
        // by it (or its signatures were deleted).
        let (Some((every_rows, every_s)), true) = (required, open_end) else {
            return;
        };
        if w.truncated.is_some() || w.unsigned_tail == 0 {
            return;
        }
        let age_s = tail_since.map_or(0, |t| {
            (crate::clock::now_ms() / 1000).saturating_sub(u64::from(t))
        });
        let (from, to) = (w.last_seq + 1 - w.unsigned_tail, w.last_seq);
        w.unsigned = match last_met {
            None => Some(format!(
                "seq {from}..{to}: no checkpoint signed by a trusted key covers this writer (an invented writer, or its checkpoints were deleted)"
            )),
            Some((seq, _, true)) => Some(format!(
                "seq {from}..{to}: after the final checkpoint of a clean stop (seq {seq}) and signed by none since"
            )),
            Some(_) if w.unsigned_tail > every_rows => Some(format!(
                "seq {from}..{to}: {} entries unsigned, more than checkpoint_every allows ({every_rows} rows)",
                w.unsigned_tail
            )),
            Some(_) if age_s > every_s + SIGNING_SLACK_S => Some(format!(
                "seq {from}..{to}: unsigned for {age_s} s, longer than checkpoint_every allows ({every_s} s)"
            )),
            Some(_) => None,
        };
    }

    fn finish_chains(&mut self) {
        self.finish_writer();
        // Writers with checkpoints in range whose every entry there is gone.
        let mut gone: Vec<_> = self.signed.drain().collect();
        gone.sort_by(|a, b| a.0.cmp(&b.0));
        for (writer_id, cps) in gone {
            let range = self.ranges.get(&writer_id).copied().unwrap_or_default();
            if let Some(&last) = cps.keys().rfind(|s| range.contains(**s)) {
                let mut w = WriterReport {
                    writer_id,
                    truncated: Some(SeqRange {
                        from: range.after.map_or(1, |(a, _)| a + 1),
                        to: last,
                    }),
                    ..WriterReport::default()
                };
                w.judge();
                self.writers.push(w);
            }
        }
    }

    /// An audit row.
    fn row(&mut self, row: &[u8]) {
        let Some(id) = row.get(..16).and_then(|b| <[u8; 16]>::try_from(b).ok()) else {
            return;
        };
        let key = key_of(id);
        let version = row_version(row).unwrap_or(u8::MAX);
        let time_ms = payload_time_ms(row).unwrap_or(0);
        let Some(rec) = self.recs.get_mut(&(key, version)) else {
            // In a window only rows no chain names at all are read besides
            // the entries' own: each is forged, whatever its version.
            self.unchained.push((key, version, time_ms));
            return;
        };
        let Some(w) = self.writers.get(rec.writer as usize) else {
            return;
        };
        let link = Link {
            seq: rec.seq,
            prev_hash: rec.prev,
            row_hash: rec.hash,
            link: rec.hash,
            legacy: rec.legacy,
        };
        let ok = link.covers(&w.writer_id, row);
        let first = rec.state == 0;
        rec.state = match (rec.state, ok) {
            (_, false) => 2,
            (2, true) => 2,
            (_, true) => 1,
        };
        if ok && first {
            if let Some(out) = &mut self.export {
                let line = serde_json::json!({
                    "writer_id": w.writer_id,
                    "seq": rec.seq,
                    "prev_hash": hex::encode(rec.prev),
                    "row_hash": hex::encode(rec.hash),
                    "row": super::record::decode_row(row),
                });
                use std::io::Write as _;
                if let Err(e) = writeln!(out, "{line}") {
                    self.export_error.get_or_insert(e);
                }
            }
        }
    }

    /// Rows done: entries without rows, rows without entries.
    fn finish_rows(mut self, report: &mut Report) {
        // (writer, seq, event_id, version, time) of altered and missing rows.
        let mut altered = Vec::new();
        let mut missing = Vec::new();
        for ((key, version), rec) in &self.recs {
            let Some(w) = self.writers.get_mut(rec.writer as usize) else {
                continue;
            };
            let found = (rec.writer, rec.seq, *key, *version, rec.time_ms);
            match rec.state {
                1 => w.verified += 1,
                2 => altered.push(found),
                _ => {
                    // Its completion verified here, or chained after the
                    // window (its own window verifies it).
                    let completed = *version == 0
                        && match self.recs.get(&(*key, 1)) {
                            Some(c) => c.state == 1,
                            None => self.completed_later.contains(key),
                        };
                    if completed {
                        w.superseded += 1;
                    } else {
                        missing.push(found);
                    }
                }
            }
        }
        altered.sort_unstable_by_key(|f| (f.0, f.1));
        missing.sort_unstable_by_key(|f| (f.0, f.1));
        for (list, found) in [(0, altered), (1, missing)] {
            for (writer, seq, key, version, time_ms) in found {
                if let Some(w) = self.writers.get_mut(writer as usize) {
                    let r = row_ref(Some(seq), key, version, time_ms);
                    if list == 0 {
                        w.altered.push(r);
                    } else {
                        w.missing.push(r);
                    }
                }
            }
        }
        for (key, version, time_ms) in std::mem::take(&mut self.unchained) {
            if !self.windowed && time_ms < self.chain_start_ms {
                report.before_chain += 1;
            } else {
                report.forged.push(row_ref(None, key, version, time_ms));
            }
        }
        for w in &mut self.writers {
            w.judge();
        }
        report.writers = self.writers;
    }
}

/// Every statement `verify` runs, for a full verify and for a window with
/// writer `writer` anchored at `seq` 1..=2 (a fixture runs them on a current
/// ClickHouse).
pub fn queries(database: &str, table: &str, writer: &str) -> Vec<(&'static str, String)> {
    let full = Options::default();
    let window = Options {
        from_ms: Some(1),
        to_ms: Some(u64::from(u32::MAX) * 1000),
        ..Options::default()
    };
    let mut ranges = BTreeMap::new();
    ranges.insert(
        writer.to_owned(),
        Range {
            after: Some((1, [0; 32])),
            upto: Some(2),
        },
    );
    vec![
        (
            "verify: checkpoints",
            checkpoints_sql(database, table, None),
        ),
        (
            "verify: where links begin",
            linked_from_sql(database, table, None),
        ),
        (
            "verify: the chain",
            chain_sql_of(database, table, &full, &BTreeMap::new()),
        ),
        (
            "verify: the rows",
            rows_sql_of(database, table, &full, &BTreeMap::new()),
        ),
        (
            "verify: a window's chain",
            chain_sql_of(database, table, &window, &ranges),
        ),
        (
            "verify: a window's rows",
            rows_sql_of(database, table, &window, &ranges),
        ),
        (
            "verify: a window's completions",
            completions_sql(database, table, &window, &ranges).unwrap_or_default(),
        ),
    ]
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
