//! The verifier's invariant, by property: on random chains (calls refused
//! by the firewall, one row; calls forwarded, an intent and a completion,
//! interleaved), signed every few entries and at a clean stop, with the
//! audit table merged or not, an untouched trail holds; every way of
//! tampering with it (an entry or row deleted, a row altered and re-hashed
//! with every link after it rewritten, entries reordered, an entry or row
//! inserted, the tail cut, every checkpoint dropped, a forged entry planted
//! before the writer resumes without its head) makes it fail.

use super::*;
use crate::audit::chain::{encode_entry, Chain, Link, Signer, GENESIS};
use crate::audit::record::{encode_row, AuditRow};
use proptest::prelude::*;

const WRITER: &str = "fw-prop";

/// One writer's trail as ClickHouse would hold it.
#[derive(Clone)]
struct Trail {
    /// Entries, in `seq` order.
    entries: Vec<Entry>,
    /// Rows, keyed by (event_id, row_version) (a merge removes intents).
    rows: Vec<((u128, u8), Vec<u8>)>,
    /// Signed checkpoints.
    checkpoints: Vec<SignedCheckpoint>,
}

fn signer() -> &'static Signer {
    static KEY: std::sync::OnceLock<Signer> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        Signer::from_pem(&Signer::generate_pem().unwrap_or_default()).unwrap_or_else(|_| {
            panic!("a test key");
        })
    })
}

/// A row's key as the verifier reads it (its stored `event_id`, version).
fn key(row: &[u8]) -> (u128, u8) {
    let id: [u8; 16] = row[..16].try_into().unwrap_or([0; 16]);
    (key_of(id), row_version(row).unwrap_or(u8::MAX))
}

/// A keyed row.
fn keyed(id: u128, version: u8, n: u64) -> ((u128, u8), Vec<u8>) {
    let row = row_of(id, version, n);
    (key(&row), row)
}

fn row_of(id: u128, version: u8, n: u64) -> Vec<u8> {
    let mut r = AuditRow::new();
    r.event_id = uuid::Uuid::from_u128(id);
    r.time_ms = 1_796_000_000_000 + n;
    r.row_version = version;
    r.tool = format!("tool-{n}");
    let mut out = Vec::new();
    encode_row(
        &r,
        format!("{{\"n\":{n}}}").as_bytes(),
        b"{}",
        "test",
        &mut out,
    );
    out
}

fn entry_of(link: Link, row: &[u8], version: u8) -> Entry {
    let mut bytes = Vec::new();
    encode_entry(WRITER, &link, row, version, 1_000, &mut bytes);
    Entry::decode(&bytes)
        .map(|(e, _)| e)
        .unwrap_or_else(|| panic!("an entry"))
}

/// Links `rows` (in order) from `chain`, signing every `every` entries.
fn link_rows(t: &mut Trail, chain: &mut Chain, rows: Vec<((u128, u8), Vec<u8>)>, every: usize) {
    for (key, row) in rows {
        let link = chain.link(&row);
        t.entries.push(entry_of(link, &row, key.1));
        t.rows.push((key, row));
        if t.entries.len() % every == 0 {
            let (seq, hash) = chain.head();
            t.checkpoints.push(SignedCheckpoint::sign(
                signer(),
                WRITER,
                seq,
                hash,
                1_796_000_000_000 + seq,
            ));
        }
    }
}

/// A trail of `calls` (true: forwarded), signed every `every` entries and
/// finally at a clean stop.
fn trail(calls: &[bool], every: usize) -> (Trail, Chain) {
    let mut rows = Vec::new();
    let mut open: Vec<u128> = Vec::new();
    for (i, forwarded) in calls.iter().enumerate() {
        let id = 1000 + i as u128;
        let n = i as u64;
        if *forwarded {
            rows.push(keyed(id, 0, n));
            open.push(id);
        } else {
            rows.push(keyed(id, 1, n));
        }
        // Completions arrive later, interleaved.
        if i % 2 == 1 {
            if let Some(done) = open.pop() {
                rows.push(keyed(done, 1, n + 10_000));
            }
        }
    }
    for done in open {
        rows.push(keyed(done, 1, 20_000));
    }
    let mut t = Trail {
        entries: Vec::new(),
        rows: Vec::new(),
        checkpoints: Vec::new(),
    };
    let mut chain = Chain::new(WRITER);
    link_rows(&mut t, &mut chain, rows, every);
    stop(&mut t, &chain);
    (t, chain)
}

/// A clean stop's final checkpoint.
fn stop(t: &mut Trail, chain: &Chain) {
    let (seq, hash) = chain.head();
    t.checkpoints.push(SignedCheckpoint::sign_as(
        signer(),
        WRITER,
        seq,
        hash,
        1_796_000_000_000 + seq,
        true,
    ));
}

/// Folds every intent whose completion is there into it (a merge).
fn merge(t: &mut Trail) {
    let done: std::collections::HashSet<u128> = t
        .rows
        .iter()
        .filter(|((_, v), _)| *v == 1)
        .map(|((id, _), _)| *id)
        .collect();
    t.rows
        .retain(|((id, v), _)| !(*v == 0 && done.contains(id)));
}

/// What the verifier says of `t` (a full verify, checkpoints required).
fn verdict(t: &Trail) -> Report {
    let key: [u8; 32] = signer().public_key().try_into().unwrap_or([0; 32]);
    let opts = Options {
        keys: vec![key],
        require_signed: Some((4, 10)),
        ..Options::default()
    };
    let mut report = Report::default();
    let mut signed: Signed = HashMap::new();
    for cp in &t.checkpoints {
        match cp.verify_kind(&opts.keys) {
            Some(last) => {
                let c = &cp.checkpoint;
                let per = signed.entry(c.writer_id.clone()).or_default();
                let was = per.get(&c.seq).is_some_and(|x| x.2);
                per.insert(c.seq, (c.row_hash, c.time_ms, last || was));
            }
            None => report.unsigned_checkpoints.push(BadCheckpoint {
                seq: cp.checkpoint.seq,
                why: "bad signature".into(),
            }),
        }
    }
    let first_linked = t
        .entries
        .iter()
        .filter(|e| !e.link.legacy)
        .map(|e| e.link.seq)
        .min();
    let linked: HashMap<String, u64> = first_linked
        .map(|s| (WRITER.to_owned(), s))
        .into_iter()
        .collect();
    let mut state = Chains::new(&opts, signed, BTreeMap::new(), linked);
    let mut entries = t.entries.clone();
    entries.sort_by_key(|e| e.link.seq);
    for e in entries {
        state.entry(e);
    }
    state.finish_chains();
    for (_, row) in &t.rows {
        state.row(row);
    }
    state.finish_rows(&mut report);
    report.holds = report.forged.is_empty()
        && report.before_chain == 0
        && report.unsigned_checkpoints.is_empty()
        && report.writers.iter().all(|w| w.holds);
    report
}

/// The ways of tampering.
#[derive(Debug, Clone, Copy)]
enum Tamper {
    DeleteEntry(usize),
    DeleteRow(usize),
    AlterAndRelink(usize),
    AlterTwoValues(usize),
    Reorder(usize),
    InsertEntryAfterEnd,
    InsertRowInNoChain,
    InsertConflicting(usize),
    Truncate(usize),
    DropCheckpoints,
    LoseTheHead,
}

fn tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        (0usize..1000).prop_map(Tamper::DeleteEntry),
        (0usize..1000).prop_map(Tamper::DeleteRow),
        (0usize..1000).prop_map(Tamper::AlterAndRelink),
        (0usize..1000).prop_map(Tamper::AlterTwoValues),
        (0usize..1000).prop_map(Tamper::Reorder),
        Just(Tamper::InsertEntryAfterEnd),
        Just(Tamper::InsertRowInNoChain),
        (0usize..1000).prop_map(Tamper::InsertConflicting),
        (1usize..1000).prop_map(Tamper::Truncate),
        Just(Tamper::DropCheckpoints),
        Just(Tamper::LoseTheHead),
    ]
}

/// Rewrites every entry from index `from` on with the attacker's own
/// (valid) links, as one without the key can.
fn relink(t: &mut Trail, from: usize) {
    let (seq, prev) = match from {
        0 => (0, GENESIS),
        i => (t.entries[i - 1].link.seq, t.entries[i - 1].link.link),
    };
    let mut chain = Chain::resume(WRITER, seq, prev, 1);
    for i in from..t.entries.len() {
        let key = (key_of(t.entries[i].event_id), t.entries[i].row_version);
        // A merged intent: its row is gone, its old content hash kept.
        let row = row_for(t, key);
        let mut link = chain.link(&row);
        if row.is_empty() {
            link.row_hash = t.entries[i].link.row_hash;
            link.link = crate::audit::chain::link_hash(
                WRITER,
                link.seq,
                1,
                &link.prev_hash,
                &link.row_hash,
            );
            chain = Chain::resume(WRITER, link.seq, link.link, 1);
        }
        t.entries[i].link = link;
    }
}

/// The row of `key` (empty when it is gone).
fn row_for(t: &Trail, key: (u128, u8)) -> Vec<u8> {
    t.rows
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, r)| r.clone())
        .unwrap_or_default()
}

/// Alters row `i`'s arguments (a byte of its hashed part).
fn alter_row(row: &mut [u8]) {
    if let Some(b) = row.iter_mut().rev().find(|b| **b == b'}') {
        *b = b']';
    }
}

fn apply(t: &mut Trail, chain: &mut Chain, how: Tamper) {
    let n = t.entries.len();
    match how {
        Tamper::DeleteEntry(i) => {
            let e = t.entries.remove(i % n);
            let key = (key_of(e.event_id), e.row_version);
            t.rows.retain(|(k, _)| *k != key);
        }
        Tamper::DeleteRow(i) => {
            // A completion's row (deleting an intent whose completion is
            // there is what a merge does).
            let completions: Vec<usize> =
                (0..t.rows.len()).filter(|j| t.rows[*j].0 .1 == 1).collect();
            let j = completions[i % completions.len()];
            t.rows.remove(j);
        }
        Tamper::AlterAndRelink(i) | Tamper::AlterTwoValues(i) => {
            // A completion (after a merge its intent's row is gone).
            let at: Vec<usize> = (0..n).filter(|j| t.entries[*j].row_version == 1).collect();
            let k = at[i % at.len()];
            let key = (key_of(t.entries[k].event_id), 1);
            if let Some((_, row)) = t.rows.iter_mut().find(|(kk, _)| *kk == key) {
                alter_row(row);
            }
            if matches!(how, Tamper::AlterAndRelink(_)) {
                relink(t, k);
            } else {
                // That entry re-hashed, and the next one's prev_hash.
                let row = row_for(t, key);
                let e = &mut t.entries[k].link;
                e.row_hash = crate::audit::chain::content_hash(&row);
                e.link =
                    crate::audit::chain::link_hash(WRITER, e.seq, 1, &e.prev_hash, &e.row_hash);
                let new = e.link;
                if k + 1 < n {
                    t.entries[k + 1].link.prev_hash = new;
                }
            }
        }
        Tamper::Reorder(i) => {
            let a = i % (n - 1);
            let (x, y) = (t.entries[a].link.seq, t.entries[a + 1].link.seq);
            t.entries[a].link.seq = y;
            t.entries[a + 1].link.seq = x;
        }
        Tamper::InsertEntryAfterEnd => {
            link_rows(t, chain, vec![keyed(9_999_999, 1, 99)], usize::MAX);
        }
        Tamper::InsertRowInNoChain => {
            t.rows.push(keyed(8_888_888, 1, 88));
        }
        Tamper::InsertConflicting(i) => {
            let e = &t.entries[i % n];
            let seq = e.link.seq;
            let mut c = Chain::resume(WRITER, seq - 1, e.link.prev_hash, 1);
            let (k, row) = keyed(7_777_777, 1, 77);
            let link = c.link(&row);
            t.entries.push(entry_of(link, &row, 1));
            t.rows.push((k, row));
        }
        Tamper::Truncate(j) => {
            let keep = n - 1 - (j % (n - 1)).min(n - 2);
            for e in t.entries.split_off(keep) {
                let key = (key_of(e.event_id), e.row_version);
                t.rows.retain(|(k, _)| *k != key);
            }
        }
        Tamper::DropCheckpoints => t.checkpoints.clear(),
        Tamper::LoseTheHead => {
            // A forged entry after the writer's last; the writer, its head
            // lost, goes on from its last checkpoint (past the forged
            // entry's seq) and stops cleanly again.
            let (cp_seq, cp_link) = chain.head();
            link_rows(t, chain, vec![keyed(6_666_666, 1, 66)], usize::MAX);
            let (last, _) = chain.head();
            let mut resumed = Chain::resume(WRITER, last, cp_link, 1);
            assert!(cp_seq < last);
            let more: Vec<_> = (0..3u128).map(|k| keyed(5_555_000 + k, 1, 55)).collect();
            link_rows(t, &mut resumed, more, usize::MAX);
            stop(t, &resumed);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn an_untouched_trail_holds_and_every_tampering_fails(
        calls in proptest::collection::vec(any::<bool>(), 4..24),
        every in 2usize..6,
        merged in any::<bool>(),
        how in tamper(),
    ) {
        let (mut t, mut chain) = trail(&calls, every);
        if merged {
            merge(&mut t);
        }
        let clean = verdict(&t);
        prop_assert!(clean.holds, "untouched (merged: {merged}): {}", render(&clean));
        apply(&mut t, &mut chain, how);
        let after = verdict(&t);
        prop_assert!(!after.holds, "{how:?} (merged: {merged}) still holds: {}", render(&after));
    }
}

/// A chain a release before links wrote (legacy entries, checkpoints over
/// their hashes), upgraded mid-way: it verifies as written; passing its
/// linked entries off as legacy ones (to loosen what a merged intent's
/// entry proves) does not.
#[test]
fn a_chain_of_an_earlier_release_verifies_and_cannot_be_passed_off_as_one() {
    let calls = [true, false, true, true, false, false, true, false];
    let (fresh, _) = trail(&calls, 3);
    let rows = fresh.rows.clone();
    let mut t = Trail {
        entries: Vec::new(),
        rows: Vec::new(),
        checkpoints: Vec::new(),
    };
    // The earlier release: legacy entries for the first half.
    let half = rows.len() / 2;
    let (mut seq, mut prev) = (0u64, GENESIS);
    for (key, row) in rows[..half].iter().cloned() {
        seq += 1;
        let hash = crate::audit::chain::row_hash(WRITER, seq, &prev, &row);
        let link = Link {
            seq,
            prev_hash: prev,
            row_hash: hash,
            link: hash,
            legacy: true,
        };
        t.entries.push(entry_of(link, &row, key.1));
        t.rows.push((key, row));
        prev = hash;
        if seq % 3 == 0 {
            t.checkpoints.push(SignedCheckpoint::sign(
                signer(),
                WRITER,
                seq,
                hash,
                1_796_000_000_000 + seq,
            ));
        }
    }
    // This release goes on after the legacy head.
    let mut chain = Chain::resume(WRITER, seq, prev, seq + 1);
    link_rows(&mut t, &mut chain, rows[half..].to_vec(), 3);
    stop(&mut t, &chain);
    let ok = verdict(&t);
    assert!(ok.holds, "{}", render(&ok));
    let mut merged = t.clone();
    merge(&mut merged);
    assert!(verdict(&merged).holds);
    // A linked entry passed off as legacy (its link taken as its hash).
    let mut downgraded = t.clone();
    if let Some(e) = downgraded.entries.iter_mut().find(|e| !e.link.legacy) {
        e.link.legacy = true;
        e.link.row_hash = e.link.link;
    }
    let bad = verdict(&downgraded);
    assert!(!bad.holds, "{}", render(&bad));
}
