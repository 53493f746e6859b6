//! The provable audit trail against a real ClickHouse: a load of calls
//! through the firewall is chained and signed, `mcp-firewall audit verify`
//! proves it, and each way of tampering with it behind the firewall's back
//! (a deleted row, an altered argument, a forged row, a cut tail, a
//! rewritten chain) makes `verify` fail naming the row. Duplicate delivery,
//! table merges, a `kill -9` mid-load and a lost chain head still verify;
//! two writers are verified independently.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mcp_firewall::audit::chain::Signer;
use serde_json::{json, Value};

use crate::audit_e2e::{free_port, serve, wait_listening};
use crate::common::clickhouse::ClickHouse;
use crate::common::{self, TestConfig};

const TABLES: [&str; 3] = [
    "audit_events",
    "audit_events_chain",
    "audit_events_checkpoints",
];

/// What every test here starts from: the shared ClickHouse, a database of
/// its own, a directory, a checkpoint key, an upstream answering `{}`.
struct Setup {
    ch: &'static ClickHouse,
    db: String,
    dir: tempfile::TempDir,
    key: PathBuf,
    public: String,
    upstream: crate::common::raw::RawUpstream,
}

async fn setup() -> Setup {
    let ch = ClickHouse::shared().await;
    let db = ch.create_database();
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = key(dir.path());
    let upstream = crate::common::raw::upstream(|seen| async move {
        crate::common::raw::result_for(&seen, json!({}))
    })
    .await;
    Setup {
        ch,
        db,
        dir,
        key,
        public,
        upstream,
    }
}

/// A signing key file (0600) and its public key text.
fn key(dir: &Path) -> (PathBuf, String) {
    let path = dir.join("audit.key");
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(["audit", "keygen", "--out", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let signer = Signer::from_pem(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (path, signer.public_key_text())
}

fn config(
    spool: &Path,
    ch: &ClickHouse,
    db: &str,
    url: &str,
    writer: &str,
    key: &Path,
) -> TestConfig {
    TestConfig::new()
        .audit(writer, &ch.http_url, db, spool)
        .set("audit.writer_id", writer)
        .set("audit.signing_key_file", key.to_str().unwrap())
        .set("audit.checkpoint_every.rows", 40)
        .set("audit.checkpoint_every.seconds", 1)
        .upstream("incidents", url)
}

/// `mcp-firewall audit verify --config CFG --json ARGS…`: exit status and
/// report.
fn verify(cfg: &Path, args: &[&str]) -> (bool, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args([
            "audit",
            "--config",
            cfg.to_str().unwrap(),
            "--json",
            "verify",
        ])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "verify printed no report ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), report)
}

/// The same, as people read it.
fn verify_text(cfg: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(["audit", "--config", cfg.to_str().unwrap(), "verify"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `n` calls through the firewall at `url`: pings (forwarded: an intent
/// and a completion each) and calls of a tool no role has (refused by the
/// firewall: one final row each).
async fn load(url: &str, n: u64) {
    let token = common::token();
    let http = common::http();
    for i in 0..n {
        let body = if i % 4 == 3 {
            format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"not_a_tool","arguments":{{"n":{i}}}}}}}"#
            )
        } else {
            format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#)
        };
        let resp = http
            .post(url)
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
}

/// Copies the trail into a new database, to tamper with it there.
fn copy(ch: &ClickHouse, db: &str) -> String {
    let to = ch.create_database();
    for t in TABLES {
        ch.query(&format!("CREATE TABLE {to}.{t} AS {db}.{t}"));
        ch.query(&format!("INSERT INTO {to}.{t} SELECT * FROM {db}.{t}"));
    }
    to
}

/// Runs a mutation and waits until ClickHouse has applied it.
fn mutate(ch: &ClickHouse, db: &str, sql: &str) {
    ch.query(sql);
    let deadline = Instant::now() + Duration::from_secs(30);
    while ch.query_u64(&format!(
        "SELECT count() FROM system.mutations WHERE database = '{db}' AND is_done = 0"
    )) > 0
    {
        assert!(Instant::now() < deadline, "mutation not applied: {sql}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A config file pointing at `db` (the firewall's, with the database swapped).
fn config_for(dir: &Path, text: &str, db: &str, name: &str) -> PathBuf {
    let mut doc: toml::Table = toml::from_str(text).unwrap();
    doc["audit"]["clickhouse"]
        .as_table_mut()
        .unwrap()
        .insert("database".into(), toml::Value::String(db.into()));
    let path = dir.join(name);
    std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
    path
}

/// Distinct rows of `db` (an intent and its completion are two).
/// Every row of `db` is chained once: no row without its entry, no row
/// chained twice, and no entry whose event is missing from the table.
/// (Counting the table's rows against the entries would race ClickHouse:
/// a merge folds an intent into its completion at any time.)
fn assert_every_row_chained_once(ch: &ClickHouse, db: &str, entries: u64) {
    let distinct = ch.query_u64(&format!(
        "SELECT count() FROM (SELECT DISTINCT event_id, row_version FROM {db}.audit_events_chain)"
    ));
    assert_eq!(distinct, entries, "a row chained twice");
    let unchained = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events WHERE (event_id, row_version) NOT IN \
         (SELECT event_id, row_version FROM {db}.audit_events_chain)"
    ));
    assert_eq!(unchained, 0, "rows without their chain entry");
    let missing = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events_chain WHERE event_id NOT IN \
         (SELECT event_id FROM {db}.audit_events)"
    ));
    assert_eq!(missing, 0, "entries whose event is not in the table");
}

/// Entries in the chain of `db`.
fn entries(ch: &ClickHouse, db: &str) -> u64 {
    ch.query_u64(&format!("SELECT count() FROM {db}.audit_events_chain"))
}

fn writer<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["writers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["writer_id"] == id)
        .unwrap_or_else(|| panic!("no writer {id} in {report:#}"))
}

/// `(event_id, seq)` of the `k`-th call the firewall refused itself (one
/// row, no intent).
fn refusal(ch: &ClickHouse, db: &str, k: u64) -> (String, u64) {
    let line = ch.query(&format!(
        "SELECT toString(event_id), seq FROM {db}.audit_events_chain WHERE event_id IN \
         (SELECT event_id FROM {db}.audit_events WHERE tool = 'not_a_tool') ORDER BY seq LIMIT 1 OFFSET {k}"
    ));
    let (id, seq) = line.trim().split_once('\t').unwrap();
    (id.to_owned(), seq.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_load_verifies_and_every_tampering_is_named() {
    let Setup {
        ch,
        db,
        dir,
        key,
        public,
        upstream,
    } = setup().await;
    let spool = dir.path().join("spool");
    let text = config(&spool, ch, &db, &upstream.url(), "fw-a", &key).text();
    let fw = common::firewall(&text).await;
    load(&fw.mcp_url("incidents"), 200).await;
    // The refused calls never reached the upstream; the pings did, once each.
    let seen = upstream.seen();
    let has =
        |r: &crate::common::raw::Seen, what: &[u8]| r.body.windows(what.len()).any(|w| w == what);
    assert!(!seen.iter().any(|r| has(r, b"not_a_tool")));
    assert_eq!(seen.iter().filter(|r| has(r, b"\"ping\"")).count(), 150);
    // A clean stop drains the spool and signs the tail.
    fw.stop().await;
    let cfg = config_for(dir.path(), &text, &db, "fw.toml");
    let chained = entries(ch, &db);
    // 150 pings (intent and completion), 50 refusals, the firewall's own
    // tools/list: every row is chained once.
    assert!(chained >= 350, "{chained}");
    assert_every_row_chained_once(ch, &db, chained);

    let (ok, report) = verify(&cfg, &[]);
    assert!(ok, "{report:#}");
    let w = writer(&report, "fw-a");
    assert_eq!(w["verified"], chained);
    assert_eq!(
        (w["first_seq"].as_u64(), w["last_seq"].as_u64()),
        (Some(1), Some(chained))
    );
    assert!(w["checkpoints"].as_u64().unwrap() >= 2, "{w:#}");
    assert_eq!(w["unsigned_tail"], 0, "the stop signed the tail: {w:#}");
    assert_eq!(report["forged"]["count"], 0);
    // The local checkpoint file holds the same checkpoints.
    let local = std::fs::read_to_string(spool.join("checkpoints.jsonl")).unwrap();
    assert!(local.lines().count() as u64 >= w["checkpoints"].as_u64().unwrap());
    // People get a verdict; the public key can be given instead of the config's key.
    let (ok, text_report) = verify_text(&cfg, &["--public-key", &public]);
    assert!(
        ok && text_report.contains("verdict: the audit trail holds"),
        "{text_report}"
    );

    // Merging collapses each intent into its completion: not a deletion.
    ch.query(&format!("OPTIMIZE TABLE {db}.audit_events FINAL"));
    let (ok, report) = verify(&cfg, &[]);
    assert!(ok, "{report:#}");
    let w = writer(&report, "fw-a");
    let intents = ch.query_u64(&format!(
        "SELECT count() FROM {db}.audit_events_chain WHERE row_version = 0"
    ));
    assert!(intents >= 150);
    assert_eq!(w["superseded"], intents, "{w:#}");
    assert_eq!(w["verified"].as_u64().unwrap() + intents, chained);

    // A deleted row: named by its seq and event id.
    let copy1 = copy(ch, &db);
    let (gone, gone_seq) = refusal(ch, &db, 7);
    mutate(
        ch,
        &copy1,
        &format!("ALTER TABLE {copy1}.audit_events DELETE WHERE event_id = toUUID('{gone}')"),
    );
    let (ok, report) = verify(&config_for(dir.path(), &text, &copy1, "c1.toml"), &[]);
    assert!(!ok);
    let missing = &writer(&report, "fw-a")["missing"];
    assert_eq!(missing["count"], 1, "{report:#}");
    assert_eq!(missing["first"][0]["event_id"], gone.as_str());
    assert_eq!(missing["first"][0]["seq"], gone_seq);

    // One altered argument.
    let copy2 = copy(ch, &db);
    let (refused, _) = refusal(ch, &db, 5);
    let refused = refused.as_str();
    mutate(ch, &copy2, &format!(
        "ALTER TABLE {copy2}.audit_events UPDATE arguments = '{{\"n\":99999}}' WHERE event_id = toUUID('{refused}')"
    ));
    let (ok, report) = verify(&config_for(dir.path(), &text, &copy2, "c2.toml"), &[]);
    assert!(!ok);
    let altered = &writer(&report, "fw-a")["altered"];
    assert_eq!(altered["count"], 1, "{report:#}");
    assert_eq!(altered["first"][0]["event_id"], refused);
    let (_, people) = verify_text(&config_for(dir.path(), &text, &copy2, "c2.toml"), &[]);
    assert!(
        people.contains("ALTERED") && people.contains(refused),
        "{people}"
    );

    // A row that never happened.
    let copy3 = copy(ch, &db);
    let forged = "01890000-0000-7000-8000-00000000f0f0";
    let now_ms = mcp_firewall::internals::now_ms();
    ch.query(&format!(
        "INSERT INTO {copy3}.audit_events (event_id, time, time_ms, tenant, method, tool, decision, row_version) \
         VALUES (toUUID('{forged}'), toDateTime({}), {now_ms}, 'acme', 'tools/call', 'delete_everything', 'allow', 1)",
        now_ms / 1000
    ));
    let (ok, report) = verify(&config_for(dir.path(), &text, &copy3, "c3.toml"), &[]);
    assert!(!ok);
    assert_eq!(report["forged"]["count"], 1, "{report:#}");
    assert_eq!(report["forged"]["first"][0]["event_id"], forged);
    assert!(writer(&report, "fw-a")["holds"].as_bool().unwrap());

    // The tail cut before the last checkpoint, rows and chain entries
    // alike, and the checkpoints in ClickHouse deleted too: the local
    // checkpoint file still proves the cut.
    let copy4 = copy(ch, &db);
    let cut_from = chained - 30;
    mutate(
        ch,
        &copy4,
        &format!("ALTER TABLE {copy4}.audit_events_chain DELETE WHERE seq >= {cut_from}"),
    );
    let ids = ch.query(&format!(
        "SELECT toString(event_id) FROM {db}.audit_events_chain WHERE seq >= {cut_from}"
    ));
    let list: Vec<String> = ids.lines().map(|l| format!("toUUID('{l}')")).collect();
    mutate(
        ch,
        &copy4,
        &format!(
            "ALTER TABLE {copy4}.audit_events DELETE WHERE event_id IN ({})",
            list.join(", ")
        ),
    );
    let cfg4 = config_for(dir.path(), &text, &copy4, "c4.toml");
    let (ok, report) = verify(&cfg4, &[]);
    assert!(!ok);
    let w = writer(&report, "fw-a");
    assert_eq!(w["truncated"]["from"], cut_from, "{w:#}");
    assert_eq!(w["truncated"]["to"], chained);
    let (_, people) = verify_text(&cfg4, &[]);
    assert!(
        people.contains(&format!("TRUNCATED seq {cut_from}..{chained}")),
        "{people}"
    );
    mutate(
        ch,
        &copy4,
        &format!("ALTER TABLE {copy4}.audit_events_checkpoints DELETE WHERE 1 = 1"),
    );
    let local_file = spool.join("checkpoints.jsonl");
    let (ok, report) = verify(&cfg4, &["--checkpoints", local_file.to_str().unwrap()]);
    assert!(!ok);
    let w = writer(&report, "fw-a");
    assert_eq!(w["truncated"]["from"], cut_from, "{w:#}");
    assert_eq!(w["truncated"]["to"], chained);
    // `--config` reads the config's checkpoint file by default: the cut is
    // proven without naming it.
    let (ok, report) = verify(&cfg4, &[]);
    assert!(!ok, "{report:#}");
    assert_eq!(writer(&report, "fw-a")["truncated"]["from"], cut_from);
    // An auditor without that file (an empty one given) and no checkpoint
    // left in ClickHouse: nothing signs the chain, which a configured key
    // makes a failure too.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let (ok, report) = verify(&cfg4, &["--checkpoints", empty.to_str().unwrap()]);
    assert!(!ok, "{report:#}");
    assert!(writer(&report, "fw-a")["unsigned"]
        .as_str()
        .is_some_and(|w| w.contains("no checkpoint")));

    // A rewritten chain: an entry whose content hash was changed no longer
    // gives its own link (and a re-linked one breaks the next).
    let copy5 = copy(ch, &db);
    let (rewritten, seq) = refusal(ch, &db, 3);
    mutate(
        ch,
        &copy5,
        &format!(
            "ALTER TABLE {copy5}.audit_events_chain UPDATE row_hash = prev_hash WHERE seq = {seq}"
        ),
    );
    let (ok, report) = verify(&config_for(dir.path(), &text, &copy5, "c5.toml"), &[]);
    assert!(!ok);
    let w = writer(&report, "fw-a");
    assert_eq!(w["broken_links"]["first"][0], seq, "{w:#}");
    assert_eq!(w["altered"]["first"][0]["event_id"], rewritten.as_str());

    // A checkpoint signed by another key does not count.
    let (ok, report) = verify(
        &cfg,
        &[
            "--public-key",
            &Signer::from_pem(&Signer::generate_pem().unwrap())
                .unwrap()
                .public_key_text(),
        ],
    );
    assert!(!ok);
    assert!(report["unsigned_checkpoints"]["count"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_a_kill_9_and_a_lost_chain_head_still_verify() {
    let Setup {
        ch,
        db,
        dir,
        key,
        upstream,
        ..
    } = setup().await;
    let spool = dir.path().join("spool");
    let port = free_port();
    let admin = free_port();
    let text = config(&spool, ch, &db, &upstream.url(), "fw-k", &key)
        .set("server.listen", format!("127.0.0.1:{port}"))
        .set("admin.listen", format!("127.0.0.1:{admin}"))
        .text();
    let cfg = dir.path().join("fw.toml");
    std::fs::write(&cfg, &text).unwrap();
    let start = || serve(&cfg);
    let url = format!("http://127.0.0.1:{port}/mcp/incidents");
    let mut child = start();
    wait_listening(port).await;
    // Killed in the middle of a load.
    let loader = tokio::spawn({
        let url = url.clone();
        async move {
            let token = common::token();
            let http = common::http();
            for i in 0..100_000u64 {
                let sent = http
                    .post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#))
                    .send()
                    .await;
                if sent.is_err() {
                    return i;
                }
            }
            100_000
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while ch
        .try_query(&format!("SELECT count() FROM {db}.audit_events_chain"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0)
        < 300
    {
        assert!(Instant::now() < deadline, "nothing was shipped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let sent = loader.await.unwrap();
    assert!(sent > 150, "the load ran ({sent})");
    // Restarted on the same spool: it replays what was not acknowledged,
    // linked exactly as before.
    // A clean stop (SIGTERM drains and signs the tail).
    let serve_a_little = || async {
        let mut child = start();
        wait_listening(port).await;
        load(&url, 20).await;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(child.wait().unwrap().success());
    };
    serve_a_little().await;
    let (ok, report) = verify(&cfg, &[]);
    assert!(ok, "{report:#}");
    let w = writer(&report, "fw-k");
    assert_eq!(w["unsigned_tail"], 0, "{w:#}");

    // The chain head file lost (as after a torn write): the next start asks
    // ClickHouse where the chain continues.
    std::fs::remove_file(spool.join("chain")).unwrap();
    serve_a_little().await;

    // Every row and entry delivered twice more.
    for t in ["audit_events", "audit_events_chain"] {
        ch.query(&format!("INSERT INTO {db}.{t} SELECT * FROM {db}.{t}"));
    }
    let (ok, report) = verify(&cfg, &[]);
    assert!(ok, "{report:#}");
    let w = writer(&report, "fw-k");
    assert!(
        w["duplicates"].as_u64().unwrap() >= w["last_seq"].as_u64().unwrap(),
        "{w:#}"
    );
    // Merges may have folded intents into their completions meanwhile.
    assert_eq!(
        w["verified"].as_u64().unwrap() + w["superseded"].as_u64().unwrap(),
        w["last_seq"].as_u64().unwrap(),
        "{w:#}"
    );
    assert_eq!(w["unsigned_tail"], 0, "{w:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_are_verified_independently() {
    let Setup {
        ch,
        db,
        dir,
        key,
        upstream,
        ..
    } = setup().await;
    let text_a = config(
        &dir.path().join("a"),
        ch,
        &db,
        &upstream.url(),
        "fw-1",
        &key,
    )
    .text();
    let text_b = config(
        &dir.path().join("b"),
        ch,
        &db,
        &upstream.url(),
        "fw-2",
        &key,
    )
    .text();
    let a = common::firewall(&text_a).await;
    let b = common::firewall(&text_b).await;
    let (ua, ub) = (a.mcp_url("incidents"), b.mcp_url("incidents"));
    tokio::join!(load(&ua, 40), load(&ub, 60));
    // The chain's progress is a metric.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = a.metrics().await;
        let seq = text
            .lines()
            .find_map(|l| l.strip_prefix("mcp_firewall_audit_chain_seq "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        assert!(
            text.contains("mcp_firewall_audit_checkpoints_total"),
            "{text}"
        );
        if seq >= 70 {
            break;
        }
        assert!(Instant::now() < deadline, "chain seq {seq}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.stop().await;
    b.stop().await;
    let cfg = config_for(dir.path(), &text_a, &db, "fw.toml");
    let (ok, report) = verify(&cfg, &[]);
    assert!(ok, "{report:#}");
    let of = |w: &str| {
        ch.query_u64(&format!(
            "SELECT count() FROM {db}.audit_events_chain WHERE writer_id = '{w}'"
        ))
    };
    let (one, two) = (of("fw-1"), of("fw-2"));
    assert!(one >= 70 && two >= 105, "{one} {two}");
    assert_every_row_chained_once(ch, &db, one + two);
    assert_eq!(writer(&report, "fw-1")["verified"], one);
    assert_eq!(writer(&report, "fw-2")["verified"], two);
    // One writer's row deleted: that writer fails, the other holds.
    let line = ch.query(&format!(
        "SELECT toString(event_id) FROM {db}.audit_events_chain WHERE writer_id = 'fw-2' AND row_version = 0 ORDER BY seq LIMIT 1 OFFSET 3"
    ));
    mutate(
        ch,
        &db,
        &format!(
            "ALTER TABLE {db}.audit_events DELETE WHERE event_id = toUUID('{}')",
            line.trim()
        ),
    );
    let (ok, report) = verify(&cfg, &[]);
    assert!(!ok);
    assert!(writer(&report, "fw-1")["holds"].as_bool().unwrap());
    assert!(!writer(&report, "fw-2")["holds"].as_bool().unwrap());
    let (ok, report) = verify(&cfg, &["--writer", "fw-1"]);
    assert!(ok, "{report:#}");
    assert_eq!(report["writers"].as_array().unwrap().len(), 1);
    // A day's window: today's chain of both writers.
    let today = mcp_firewall::internals::fmt_ms(mcp_firewall::internals::now_ms());
    let day = &today[..10];
    let (ok, report) = verify(&cfg, &["--from", day, "--to", day, "--writer", "fw-2"]);
    assert!(!ok);
    // A ping's intent and completion, both gone.
    let missing = &writer(&report, "fw-2")["missing"];
    assert_eq!(missing["count"], 2, "{report:#}");
    assert_eq!(
        missing["first"][0]["event_id"],
        missing["first"][1]["event_id"]
    );
}

/// Chains `row` under `writer` after `(seq, hash)` as an attacker with
/// write access (and no key) would, and inserts the row and its entry.
async fn plant(ch: &ClickHouse, db: &str, writer: &str, after: (u64, [u8; 32]), row: Vec<u8>) {
    use mcp_firewall::audit::chain::{encode_entry, Chain, CHAIN_COLUMNS};
    // A chain linked from its start (this release's).
    let mut chain = Chain::resume(writer, after.0, after.1, 1);
    let link = chain.link(&row);
    let mut entry = Vec::new();
    let now = u32::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    encode_entry(writer, &link, &row, 1, now, &mut entry);
    ch.insert_rowbinary(db, "audit_events_chain", CHAIN_COLUMNS, entry)
        .await;
    ch.insert_rowbinary(db, "audit_events", mcp_firewall::audit::COLUMNS, row)
        .await;
}

/// A copy of a refused call's row under a new `event_id`.
async fn forged_row(ch: &ClickHouse, db: &str) -> Vec<u8> {
    let mut row = ch
        .fetch_rowbinary(&format!(
            "SELECT {} FROM {db}.audit_events WHERE tool = 'not_a_tool' LIMIT 1",
            mcp_firewall::audit::COLUMNS.join(", ")
        ))
        .await;
    assert!(row.len() > 16);
    row[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    row
}

/// Where a signing key is configured, checkpoints are required: a trail
/// whose checkpoints are all gone, a writer no key signs, and a row
/// appended after a clean stop's final checkpoint do not hold (each passed
/// before, exit 0); `--allow-unsigned` reports them without failing. The
/// config's checkpoint file is read by default and must exist, and its
/// relative key and checkpoint paths resolve against the config's
/// directory, from any working directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_required_where_a_key_is_configured() {
    let Setup {
        ch,
        db,
        dir,
        key,
        upstream,
        ..
    } = setup().await;
    std::fs::rename(&key, dir.path().join("relative.key")).unwrap();
    let text = config(
        Path::new("spool"),
        ch,
        &db,
        &upstream.url(),
        "fw-r",
        Path::new("relative.key"),
    )
    .set("audit.checkpoint_file", "signed.jsonl")
    .text();
    let fw = common::firewall_in(&text, dir.path()).await;
    load(&fw.mcp_url("incidents"), 60).await;
    fw.stop().await;
    let file = dir.path().join("signed.jsonl");
    assert!(file.is_file(), "the checkpoint file is beside the config");
    let cfg = dir.path().join("fw.toml");
    std::fs::write(&cfg, &text).unwrap();
    let verify_from_root = |cfg: &Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
            .current_dir("/")
            .args([
                "audit",
                "--config",
                cfg.to_str().unwrap(),
                "--json",
                "verify",
            ])
            .args(args)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.success(),
            report,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, report, err) = verify_from_root(&cfg, &[]);
    assert!(ok, "{report:#} {err}");
    let w = writer(&report, "fw-r");
    assert_eq!(w["last_checkpoint_final"], true, "{w:#}");
    assert_eq!(w["unsigned_tail"], 0, "{w:#}");

    // Every checkpoint deleted from ClickHouse, and the auditor without the
    // writer's file (an empty one given): nothing signs the trail.
    let c1 = copy(ch, &db);
    mutate(
        ch,
        &c1,
        &format!("ALTER TABLE {c1}.audit_events_checkpoints DELETE WHERE 1"),
    );
    let cfg1 = config_for(dir.path(), &text, &c1, "c1.toml");
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let (ok, report, _) = verify_from_root(&cfg1, &["--checkpoints", empty.to_str().unwrap()]);
    assert!(!ok, "{report:#}");
    let why = writer(&report, "fw-r")["unsigned"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        why.contains("no checkpoint signed by a trusted key"),
        "{report:#}"
    );
    let (ok, _, _) = verify_from_root(
        &cfg1,
        &["--checkpoints", empty.to_str().unwrap(), "--allow-unsigned"],
    );
    assert!(ok, "--allow-unsigned reports, does not fail");
    // With the config's own file (read by default), the same trail holds.
    let (ok, report, err) = verify_from_root(&cfg1, &[]);
    assert!(ok, "{report:#} {err}");
    // A configured checkpoint file that is missing is an error.
    let moved = dir.path().join("elsewhere.jsonl");
    std::fs::rename(&file, &moved).unwrap();
    let (ok, _, err) = verify_from_root(&cfg1, &[]);
    assert!(
        !ok && err.contains("signed.jsonl") && err.contains("missing"),
        "{err}"
    );
    std::fs::rename(&moved, &file).unwrap();

    // An invented writer: a row chained under a new writer id from seq 1,
    // hashes valid, no checkpoint.
    let c2 = copy(ch, &db);
    let row = forged_row(ch, &db).await;
    plant(ch, &c2, "fw-invented", (0, [0; 32]), row).await;
    let cfg2 = config_for(dir.path(), &text, &c2, "c2.toml");
    let (ok, report, _) = verify_from_root(&cfg2, &[]);
    assert!(!ok, "{report:#}");
    assert_eq!(writer(&report, "fw-r")["holds"], true, "{report:#}");
    let invented = writer(&report, "fw-invented");
    assert_eq!(invented["holds"], false);
    assert!(
        invented["unsigned"]
            .as_str()
            .unwrap()
            .contains("no checkpoint"),
        "{invented:#}"
    );

    // A row appended after the writer's final checkpoint (a clean stop),
    // chained to its head with valid hashes.
    let c3 = copy(ch, &db);
    let head = ch.query(&format!(
        "SELECT seq, hex(link) FROM {c3}.audit_events_chain WHERE writer_id = 'fw-r' ORDER BY seq DESC LIMIT 1"
    ));
    let (seq, hash) = head.trim().split_once('\t').unwrap();
    let hash: [u8; 32] = hex::decode(hash).unwrap().try_into().unwrap();
    let row = forged_row(ch, &db).await;
    plant(ch, &c3, "fw-r", (seq.parse().unwrap(), hash), row).await;
    let cfg3 = config_for(dir.path(), &text, &c3, "c3.toml");
    let (ok, report, _) = verify_from_root(&cfg3, &[]);
    assert!(!ok, "{report:#}");
    let w = writer(&report, "fw-r");
    assert_eq!(w["unsigned_tail"], 1, "{w:#}");
    assert!(
        w["unsigned"]
            .as_str()
            .unwrap()
            .contains("after the final checkpoint"),
        "{w:#}"
    );
}

/// A writer's chain entries in `db`, in `seq` order.
async fn chain_of(
    ch: &ClickHouse,
    db: &str,
    writer: &str,
) -> Vec<mcp_firewall::audit::chain::Entry> {
    use mcp_firewall::audit::chain::{Entry, CHAIN_COLUMNS};
    let bytes = ch
        .fetch_rowbinary(&format!(
            "SELECT {} FROM {db}.audit_events_chain WHERE writer_id = '{writer}' ORDER BY seq",
            CHAIN_COLUMNS.join(", ")
        ))
        .await;
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((e, n)) = bytes.get(at..).and_then(Entry::decode) {
        out.push(e);
        at += n;
    }
    assert_eq!(at, bytes.len());
    out
}

/// The row of `(event_id, row_version)` in `db`, as `RowBinary`.
async fn row_bytes(ch: &ClickHouse, db: &str, event_id: &str, version: u8) -> Vec<u8> {
    ch.fetch_rowbinary(
        &format!(
            "SELECT {} FROM {db}.audit_events WHERE event_id = toUUID('{event_id}') AND row_version = {version} LIMIT 1",
            mcp_firewall::audit::COLUMNS.join(", ")
        ),
    )
    .await
}

fn uuid_text(e: &mcp_firewall::audit::chain::Entry) -> String {
    // ClickHouse keeps a UUID as two little-endian halves.
    let mut b = e.event_id;
    b[..8].reverse();
    b[8..].reverse();
    uuid::Uuid::from_bytes(b).to_string()
}

/// Replaces a writer's entries from `seq` on with `entries`.
async fn replace_entries(
    ch: &ClickHouse,
    db: &str,
    writer: &str,
    from: u64,
    entries: &[mcp_firewall::audit::chain::Entry],
) {
    use mcp_firewall::audit::chain::{encode_entry, CHAIN_COLUMNS};
    mutate(
        ch,
        db,
        &format!("ALTER TABLE {db}.audit_events_chain DELETE WHERE writer_id = '{writer}' AND seq >= {from}"),
    );
    let mut body = Vec::new();
    for e in entries {
        let mut row = e.event_id.to_vec();
        row.extend_from_slice(&[0; 4]);
        row.extend_from_slice(&e.time_ms.to_le_bytes());
        encode_entry(writer, &e.link, &row, e.row_version, e.chained_s, &mut body);
    }
    ch.insert_rowbinary(db, "audit_events_chain", CHAIN_COLUMNS, body)
        .await;
}

/// The attacks of someone with write access to ClickHouse and no key, on
/// a trail whose intents a merge folded into their completions: an
/// altered completion re-hashed with the next entry's `prev_hash`
/// rewritten (and, harder, with every link after it rewritten); and in a
/// window (`--from/--to`): a forged `row_version = 2` copy of a real call,
/// its first entries deleted, its tail cut. Each passed before (exit 0);
/// each is named now and exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_database_administrator_without_the_key_can_do_is_named() {
    use mcp_firewall::audit::chain::{content_hash, link_hash};
    let Setup {
        ch,
        db,
        dir,
        key,
        upstream,
        ..
    } = setup().await;
    let spool = dir.path().join("spool");
    let text = config(&spool, ch, &db, &upstream.url(), "fw-d", &key).text();
    let fw = common::firewall(&text).await;
    // In rounds more than checkpoint_every's second apart: checkpoints
    // between them, whatever the batches.
    for _ in 0..5 {
        load(&fw.mcp_url("incidents"), 40).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    fw.stop().await;
    ch.query(&format!("OPTIMIZE TABLE {db}.audit_events FINAL"));
    let cfg = config_for(dir.path(), &text, &db, "fw.toml");
    let (ok, report) = verify(&cfg, &[]);
    assert!(ok, "{report:#}");
    let chain = chain_of(ch, &db, "fw-d").await;
    // A completion whose intent the merge folded into it.
    let intents: std::collections::HashSet<[u8; 16]> = chain
        .iter()
        .filter(|e| e.row_version == 0)
        .map(|e| e.event_id)
        .collect();
    let k = chain
        .iter()
        .position(|e| e.row_version == 1 && intents.contains(&e.event_id) && e.link.seq > 20)
        .unwrap();
    let target = uuid_text(&chain[k]);

    // 1. Altered, re-hashed, and the next entry's prev_hash rewritten.
    let c1 = copy(ch, &db);
    mutate(ch, &c1, &format!(
        "ALTER TABLE {c1}.audit_events UPDATE arguments = '{{\"n\":424242}}' WHERE event_id = toUUID('{target}')"
    ));
    let altered = row_bytes(ch, &c1, &target, 1).await;
    let mut two = chain[k..].to_vec();
    two[0].link.row_hash = content_hash(&altered);
    two[0].link.link = link_hash(
        "fw-d",
        two[0].link.seq,
        1,
        &two[0].link.prev_hash,
        &two[0].link.row_hash,
    );
    two[1].link.prev_hash = two[0].link.link;
    replace_entries(ch, &c1, "fw-d", chain[k].link.seq, &two).await;
    let (ok, report) = verify(&config_for(dir.path(), &text, &c1, "c1.toml"), &[]);
    assert!(!ok, "{report:#}");
    let w = writer(&report, "fw-d");
    assert_eq!(
        w["broken_links"]["first"][0],
        chain[k].link.seq + 1,
        "{w:#}"
    );

    // The same, every link after it rewritten to match: the next signed
    // checkpoint no longer matches.
    let c2 = copy(ch, &db);
    mutate(ch, &c2, &format!(
        "ALTER TABLE {c2}.audit_events UPDATE arguments = '{{\"n\":424242}}' WHERE event_id = toUUID('{target}')"
    ));
    let mut all = chain[k..].to_vec();
    let mut prev = chain[k - 1].link.link;
    for e in &mut all {
        let row = row_bytes(ch, &c2, &uuid_text(e), e.row_version).await;
        if !row.is_empty() {
            e.link.row_hash = content_hash(&row);
        }
        e.link.prev_hash = prev;
        e.link.link = link_hash("fw-d", e.link.seq, 1, &prev, &e.link.row_hash);
        prev = e.link.link;
    }
    replace_entries(ch, &c2, "fw-d", chain[k].link.seq, &all).await;
    let (ok, report) = verify(&config_for(dir.path(), &text, &c2, "c2.toml"), &[]);
    assert!(!ok, "{report:#}");
    let w = writer(&report, "fw-d");
    assert!(
        w["bad_checkpoints"]["count"].as_u64().unwrap() >= 1,
        "{w:#}"
    );
    assert_eq!(w["broken_links"]["count"], 0, "{w:#}");

    // Windows: anchored at signed checkpoints.
    let cps: Vec<(u64, u64)> = ch
        .query(&format!(
            "SELECT seq, time_ms FROM {db}.audit_events_checkpoints WHERE writer_id = 'fw-d' ORDER BY seq"
        ))
        .lines()
        .map(|l| {
            let (s, t) = l.split_once('\t').unwrap();
            (s.parse().unwrap(), t.parse().unwrap())
        })
        .collect();
    let mut cps = cps;
    // A clean stop signs its last checkpoint again, as final.
    cps.dedup_by_key(|c| c.0);
    assert!(cps.len() >= 4, "{cps:?}");
    let (a, b) = (cps[1], cps[cps.len() - 2]);
    let window = [
        "--from".to_owned(),
        (a.1 + 1).to_string(),
        "--to".to_owned(),
        b.1.to_string(),
    ];
    let window: Vec<&str> = window.iter().map(String::as_str).collect();
    let (ok, report) = verify(&cfg, &window);
    assert!(ok, "the untouched window holds: {report:#}");

    // 4. A forged row_version = 2 copy of a real call in the window.
    let c3 = copy(ch, &db);
    let inside = chain
        .iter()
        .find(|e| e.link.seq > a.0 + 2 && e.link.seq < b.0 && e.row_version == 1)
        .unwrap();
    let cols: Vec<String> = mcp_firewall::audit::COLUMNS
        .iter()
        .map(|c| {
            if *c == "row_version" {
                "toUInt8(2)".to_owned()
            } else {
                (*c).to_owned()
            }
        })
        .collect();
    ch.query(&format!(
        "INSERT INTO {c3}.audit_events ({}) SELECT {} FROM {c3}.audit_events WHERE event_id = toUUID('{}') AND row_version = 1 LIMIT 1",
        mcp_firewall::audit::COLUMNS.join(", "),
        cols.join(", "),
        uuid_text(inside)
    ));
    let (ok, report) = verify(&config_for(dir.path(), &text, &c3, "c3.toml"), &window);
    assert!(!ok, "{report:#}");
    assert_eq!(report["forged"]["count"], 1, "{report:#}");
    assert_eq!(report["forged"]["first"][0]["row_version"], 2);

    // 5. The window's first entries (and rows) deleted.
    let c4 = copy(ch, &db);
    let first: Vec<String> = chain
        .iter()
        .filter(|e| e.link.seq == a.0 + 1 || e.link.seq == a.0 + 2)
        .map(uuid_text)
        .collect();
    mutate(
        ch,
        &c4,
        &format!(
        "ALTER TABLE {c4}.audit_events_chain DELETE WHERE writer_id = 'fw-d' AND seq IN ({}, {})",
        a.0 + 1,
        a.0 + 2
    ),
    );
    mutate(
        ch,
        &c4,
        &format!(
            "ALTER TABLE {c4}.audit_events DELETE WHERE event_id IN (toUUID('{}'), toUUID('{}'))",
            first[0], first[1]
        ),
    );
    let (ok, report) = verify(&config_for(dir.path(), &text, &c4, "c4.toml"), &window);
    assert!(!ok, "{report:#}");
    let w = writer(&report, "fw-d");
    assert_eq!(w["gaps"]["first"][0]["from"], a.0 + 1, "{w:#}");

    // 6. The window's tail cut up to the checkpoint that closes it.
    let c5 = copy(ch, &db);
    mutate(ch, &c5, &format!(
        "ALTER TABLE {c5}.audit_events_chain DELETE WHERE writer_id = 'fw-d' AND seq > {} AND seq <= {}",
        b.0 - 3,
        b.0
    ));
    let (ok, report) = verify(&config_for(dir.path(), &text, &c5, "c5.toml"), &window);
    assert!(!ok, "{report:#}");
    let w = writer(&report, "fw-d");
    assert_eq!(w["truncated"]["to"], b.0, "{w:#}");
}

/// A writer that lost its chain head resumes only from what it can prove
/// (its last checkpoint): an entry planted after its last one is never
/// continued from nor signed; the writer counts it and verify names it
/// (it passed before: the writer went on after the forged entry and its
/// next checkpoint signed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_without_its_head_goes_on_only_from_what_it_signed() {
    let Setup {
        ch,
        db,
        dir,
        key,
        upstream,
        ..
    } = setup().await;
    let spool = dir.path().join("spool");
    let text = config(&spool, ch, &db, &upstream.url(), "fw-h", &key).text();
    let fw = common::firewall(&text).await;
    load(&fw.mcp_url("incidents"), 40).await;
    fw.stop().await;
    let chain = chain_of(ch, &db, "fw-h").await;
    let last = chain.last().unwrap().link;
    let row = forged_row(ch, &db).await;
    plant(ch, &db, "fw-h", (last.seq, last.link), row).await;
    let planted = last.seq + 1;
    std::fs::remove_file(spool.join("chain")).unwrap();
    let fw = common::firewall(&text).await;
    load(&fw.mcp_url("incidents"), 20).await;
    // The shipper learns where to go on when it ships its first batch.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut m = fw.metrics().await;
    while !m.contains("mcp_firewall_audit_chain_unproven_entries 1") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        m = fw.metrics().await;
    }
    assert!(
        m.contains("mcp_firewall_audit_chain_unproven_entries 1"),
        "{}",
        m.lines()
            .filter(|l| l.contains("chain"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    fw.stop().await;
    let cfg = config_for(dir.path(), &text, &db, "fw.toml");
    let (ok, report) = verify(&cfg, &[]);
    assert!(!ok, "{report:#}");
    let w = writer(&report, "fw-h");
    assert_eq!(w["outside"]["first"][0]["from"], planted, "{w:#}");
    assert_eq!(w["outside"]["first"][0]["to"], planted, "{w:#}");
    assert_eq!(w["broken_links"]["count"], 0, "{w:#}");
    assert_eq!(w["last_checkpoint_final"], true, "{w:#}");
    let (_, people) = verify_text(&cfg, &[]);
    assert!(
        people.contains(&format!("OUTSIDE   seq {planted}..{planted}")),
        "{people}"
    );
}
