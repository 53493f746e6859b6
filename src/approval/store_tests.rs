//! Tests of the journal: its line format, replay of torn and damaged files,
//! the directory lock, compaction and file modes.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::json;

use super::super::service::tests::{approver, clock_at, key, new_approval, open_in, T0};
use super::*;

fn journal(dir: &Path) -> String {
    fs::read_to_string(dir.join(JOURNAL_FILE)).expect("journal")
}

fn append_raw(dir: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.join(JOURNAL_FILE))
        .expect("open journal");
    f.write_all(bytes).expect("append");
}

fn store(dir: &Path) -> Result<Store, StoreError> {
    Store::open(dir, T0, 86_400_000)
}

/// [`store`], waiting out a dropped subsystem's sweeper that may still hold
/// the lock for the length of one sweep.
async fn store_after_drop(dir: &Path) -> Result<Store, StoreError> {
    for _ in 0..50 {
        match store(dir) {
            Err(StoreError::Locked { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => return other,
        }
    }
    store(dir)
}

#[tokio::test]
async fn each_transition_is_one_checksummed_json_line() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let p = a
        .request(new_approval(key("rollback_deployment", &json!({"d": 1}))))
        .await
        .expect("request");
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "ok")
        .await
        .expect("approve");
    a.consume(&p.key).await.expect("consume");
    let text = journal(dir.path());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (line, op) in lines.iter().zip(["put", "decide", "consume"]) {
        let (crc, json) = line.split_once(' ').expect("crc prefix");
        assert_eq!(crc.len(), 8);
        assert_eq!(
            u32::from_str_radix(crc, 16).expect("hex"),
            crc32fast::hash(json.as_bytes())
        );
        let v: serde_json::Value = serde_json::from_str(json).expect("json");
        assert_eq!(v["op"], op, "{line}");
    }
    assert!(text.ends_with('\n'));
    assert_eq!(a.file_store().journal_records(), 3);
}

#[tokio::test]
async fn a_torn_last_line_is_ignored_and_cut_at_open() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let p = a
        .request(new_approval(key("rollback_deployment", &json!({}))))
        .await
        .expect("request");
    drop(a);
    // A crash in the middle of appending the approval's decision.
    let mut torn = Vec::new();
    Journal::encode(
        &mut torn,
        &RecordRef::Decide {
            id: &p.id,
            decision: &Decision {
                approved: true,
                by: "bob".to_owned(),
                at_ms: T0,
                reason: String::new(),
            },
        },
    )
    .expect("encode");
    append_raw(dir.path(), &torn[..torn.len() / 2]);

    let (b, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let back = b
        .get("acme", p.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("kept");
    assert_eq!(
        back.status,
        Status::Pending,
        "the torn decision never happened"
    );
    assert!(!journal(dir.path()).contains("decide"), "cut by compaction");
    drop(b);

    // A whole last line whose bytes did not all reach the disk.
    let mut bad = torn.clone();
    let at = bad.len() - 5;
    bad[at] ^= 0x20;
    append_raw(dir.path(), &bad);
    let (c, _r) = open_in(dir.path(), &clock, |_| {}).await;
    assert_eq!(
        c.get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("kept")
            .status,
        Status::Pending
    );
    // And the store keeps working after recovery.
    c.decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve after recovery");
}

#[tokio::test]
async fn damage_before_the_last_line_refuses_to_open() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let p = a
        .request(new_approval(key("rollback_deployment", &json!({}))))
        .await
        .expect("request");
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve");
    a.consume(&p.key).await.expect("consume");
    drop(a);
    // Flip one byte inside the `decide` line (line 2 of 3).
    let mut text = journal(dir.path()).into_bytes();
    let second = text.iter().position(|&b| b == b'\n').expect("line 1") + 20;
    text[second] ^= 0x01;
    fs::write(dir.path().join(JOURNAL_FILE), &text).expect("write");
    let err = match store_after_drop(dir.path()).await {
        Err(e) => e,
        Ok(_) => panic!("opened a damaged journal"),
    };
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                line: 2,
                problem: Corruption::Checksum { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn a_line_without_checksum_is_damage() {
    let dir = tempfile::tempdir().expect("dir");
    fs::write(
        dir.path().join(JOURNAL_FILE),
        b"{\"op\":\"expire\",\"id\":\"ap_x\",\"at_ms\":1}\n0000000 x\n",
    )
    .expect("write");
    assert!(matches!(
        store(dir.path()),
        Err(StoreError::Corrupt {
            line: 1,
            problem: Corruption::NoChecksum,
            ..
        })
    ));
}

#[test]
fn two_stores_cannot_share_a_directory() {
    let dir = tempfile::tempdir().expect("dir");
    let first = store(dir.path()).expect("first");
    assert!(matches!(store(dir.path()), Err(StoreError::Locked { .. })));
    drop(first);
    store(dir.path()).expect("lock released with the store");
}

#[test]
fn directory_and_files_are_private() {
    let parent = tempfile::tempdir().expect("dir");
    let dir = parent.path().join("approvals");
    let _s = store(&dir).expect("open");
    let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(JOURNAL_FILE)), 0o600);
    assert_eq!(mode(&dir.join(LOCK_FILE)), 0o600);
}

#[test]
fn sweep_compacts_a_journal_of_mostly_dead_records() {
    let dir = tempfile::tempdir().expect("dir");
    let s = store(dir.path()).expect("open");
    let mut out = Vec::new();
    let bob = approver("bob");
    // Each approval: put + decide + consume; then history expires them.
    for i in 0..400 {
        let p = s
            .request(
                new_approval(key("restart", &json!({ "i": i }))),
                T0,
                600_000,
                10_000,
                &mut out,
            )
            .expect("request");
        s.decide(p.id.as_str(), &bob, true, "", T0, &mut out)
            .expect("approve");
        s.consume(&p.key, T0, &mut out).expect("consume");
    }
    let live = s
        .request(
            new_approval(key("restart", &json!("live"))),
            T0,
            600_000,
            10_000,
            &mut out,
        )
        .expect("request");
    assert_eq!(s.journal_records(), 1201);
    s.sweep(T0 + 1000, 500);
    assert_eq!(
        s.journal_records(),
        1,
        "only the live approval is rewritten"
    );
    assert_eq!(journal(dir.path()).lines().count(), 1);
    // Appends continue on the compacted file.
    s.decide(live.id.as_str(), &bob, true, "", T0 + 1000, &mut out)
        .expect("approve");
    drop(s);
    let s = store(dir.path()).expect("reopen");
    assert_eq!(
        s.status(live.id.as_str(), T0 + 1000),
        Some(Status::Approved)
    );
}
