//! Several replicas, one truth: three firewalls over one Redis, one
//! PostgreSQL and one upstream, behind a round-robin client that also
//! varies the form of the token (either header, any capitalisation of
//! `Bearer`, surrounding spaces), so nothing can be pinned to a replica.
//! Step and cost caps hold exactly, the tenant's rate within 10 %, an
//! approval granted on one replica releases the call held on another and
//! runs once, a denial is a denial everywhere. Then the stores die under
//! load: reads go on, writes are refused at once with `-31006`, nothing
//! hangs, and everything recovers by itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::backend::{Backend, Scope};
use crate::common::postgres::Postgres;
use crate::common::redis::Redis;
use crate::common::{self, raw, Firewall, TestConfig};
use mcp_firewall::auth::Audience;

const POLICY: &str = r#"
[[tools]]
upstream = "ledger"
match = ["read_thing"]
risk = "read"
[[tools]]
upstream = "ledger"
match = ["charge"]
risk = "read"
price = 0.25
[[tools]]
upstream = "ledger"
match = ["write_note"]
risk = "write"
[[tools]]
upstream = "ledger"
match = ["wipe"]
risk = "destructive"

[[agents]]
name = "fleet"
projects = ["sre"]
risks = ["read", "write", "destructive"]
allow = [{ upstream = "ledger" }]
[agents.gates]
write = "allow"
destructive = "approve"

[[agents]]
name = "spender"
projects = ["sre"]
risks = ["read"]
allow = [{ upstream = "ledger" }]
max_cost = 1.0
max_steps = 100
"#;

/// Executions per tool at the upstream.
type Counts = Arc<Mutex<HashMap<String, usize>>>;

async fn ledger(counts: Counts) -> raw::RawUpstream {
    raw::upstream(move |seen| {
        let counts = counts.clone();
        async move {
            let req: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
            let result = match req["method"].as_str() {
                Some("tools/list") => json!({"tools": [
                    {"name": "read_thing", "inputSchema": {"type": "object"}},
                    {"name": "charge", "inputSchema": {"type": "object"}},
                    {"name": "write_note", "inputSchema": {"type": "object"}},
                    {"name": "wipe", "inputSchema": {"type": "object"}},
                ]}),
                Some("tools/call") => {
                    let tool = req["params"]["name"].as_str().unwrap_or("").to_owned();
                    *counts.lock().unwrap().entry(tool).or_default() += 1;
                    json!({"content": [{"type": "text", "text": "ok"}]})
                }
                _ => json!({}),
            };
            raw::full(
                200,
                "application/json",
                json!({"jsonrpc": "2.0", "id": req["id"], "result": result}).to_string(),
            )
        }
    })
    .await
}

fn executed(counts: &Counts, tool: &str) -> usize {
    counts.lock().unwrap().get(tool).copied().unwrap_or(0)
}

/// Three replicas (or `n`) of one config: shared Redis key prefix,
/// database, session keys, policy.
struct Fleet {
    replicas: Vec<Firewall>,
    counts: Counts,
    _upstream: raw::RawUpstream,
    _policies: tempfile::TempDir,
}

async fn fleet(n: usize, scope: &Scope, extra: impl FnOnce(TestConfig) -> TestConfig) -> Fleet {
    let counts = Counts::default();
    let upstream = ledger(counts.clone()).await;
    let policies = common::policy_dir(&[("90-fleet.toml", POLICY)]);
    let cfg = TestConfig::new()
        .policies(policies.path())
        .upstream("ledger", &upstream.url())
        .set(
            "sessions.keys",
            toml::Value::Array(vec![toml::Value::Table(common::table([
                ("id", "k1".into()),
                ("value", "a-shared-session-key-for-every-replica".into()),
            ]))]),
        );
    let text = extra(scope.state(cfg)).text();
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(common::firewall(&text).await);
    }
    Fleet {
        replicas,
        counts,
        _upstream: upstream,
        _policies: policies,
    }
}

impl Fleet {
    /// The i-th request goes to replica i mod n, with the i-th token form.
    async fn call(&self, i: usize, token: &str, tool: &str, args: Value) -> Value {
        let fw = &self.replicas[i % self.replicas.len()];
        let (name, value) = token_form(i, token);
        let resp = common::http()
            .post(fw.mcp_url("ledger"))
            .header(name, value)
            .header("content-type", "application/json")
            .body(
                json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                       "params": {"name": tool, "arguments": args}})
                .to_string(),
            )
            .send()
            .await
            .expect("sent");
        assert_eq!(resp.status(), 200);
        resp.json().await.expect("json")
    }

    async fn list_everywhere(&self, token: &str) {
        for fw in &self.replicas {
            let a = common::post(
                &fw.mcp_url("ledger"),
                token,
                &[],
                r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#,
            )
            .await;
            assert_eq!(a.status, 200, "{}", a.text);
        }
    }

    async fn stop(self) {
        for fw in self.replicas {
            fw.stop().await;
        }
    }
}

/// Every form the firewall accepts for one token: a load balancer hashing
/// the header cannot pin a run to a replica.
fn token_form(i: usize, token: &str) -> (&'static str, String) {
    match i % 5 {
        0 => ("authorization", format!("Bearer {token}")),
        1 => ("authorization", format!("bearer {token}")),
        2 => ("authorization", format!("BEARER   {token}  ")),
        3 => ("x-tool-token", token.to_owned()),
        _ => ("x-tool-token", format!("Bearer {token}")),
    }
}

fn outcome(v: &Value) -> String {
    if v["result"]["content"][0]["text"] == "ok" {
        "ok".to_owned()
    } else if let Some(s) = v["result"]["structuredContent"]["stop_reason"].as_str() {
        s.to_owned()
    } else if let Some(c) = v["error"]["code"].as_i64() {
        c.to_string()
    } else {
        format!("? {v}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_cap_holds_exactly_across_three_replicas() {
    let scope = Backend::Shared.scope().await;
    let fleet = Arc::new(
        fleet(3, &scope, |c| {
            c.set("limits.per_run_per_s", 0)
                .set("limits.per_run_tool_per_s", 0)
                .set("limits.per_tenant_per_s", 0)
                .set("limits.default_max_steps", 8)
                // Exactness, not the store's outage: a loaded machine's slow
                // Redis must not turn reads over to per-replica budgets.
                .set("state.timeout_ms", 2000)
        })
        .await,
    );
    let token = common::sign(&common::claims("fleet", &["sre"]));
    fleet.list_everywhere(&token).await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (fleet, token) = (fleet.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            outcome(&fleet.call(i, &token, "read_thing", json!({})).await)
        }));
    }
    let mut by_outcome: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        *by_outcome.entry(t.await.unwrap()).or_default() += 1;
    }
    assert_eq!(by_outcome.get("ok"), Some(&8), "{by_outcome:?}");
    assert_eq!(by_outcome.get("step_cap"), Some(&92), "{by_outcome:?}");
    assert_eq!(executed(&fleet.counts, "read_thing"), 8);
    // The same run is capped on every replica afterwards.
    for i in 0..3 {
        let v = fleet.call(i, &token, "read_thing", json!({})).await;
        assert_eq!(outcome(&v), "step_cap");
    }
    Arc::try_unwrap(fleet).ok().unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_caps_of_run_and_tenant_day_hold_exactly_across_replicas() {
    let scope = Backend::Shared.scope().await;
    // A call costs 0.25; a run may spend 1.0 (4 calls), the tenant 2.0 a
    // day (8 calls): four runs of 20 concurrent calls each get 8 in all.
    let fleet = Arc::new(
        fleet(3, &scope, |c| {
            c.set("limits.per_run_per_s", 0)
                .set("limits.per_run_tool_per_s", 0)
                .set("limits.per_tenant_per_s", 0)
                .set("limits.tenant_daily_cost", 2.0)
                .set("state.timeout_ms", 2000)
        })
        .await,
    );
    let tokens: Vec<String> = (0..4)
        .map(|_| common::sign(&common::claims("spender", &["sre"])))
        .collect();
    fleet.list_everywhere(&tokens[0]).await;
    let mut tasks = Vec::new();
    for (r, token) in tokens.iter().enumerate() {
        for i in 0..20 {
            let (fleet, token) = (fleet.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                (
                    r,
                    outcome(&fleet.call(i, &token, "charge", json!({})).await),
                )
            }));
        }
    }
    let mut ran_per_run = [0usize; 4];
    let mut refused = 0;
    for t in tasks {
        let (r, o) = t.await.unwrap();
        match o.as_str() {
            "ok" => ran_per_run[r] += 1,
            "cost_cap" => refused += 1,
            other => panic!("unexpected outcome {other}"),
        }
    }
    assert!(
        ran_per_run.iter().all(|n| *n <= 4),
        "no run passes its cost cap: {ran_per_run:?}"
    );
    assert_eq!(ran_per_run.iter().sum::<usize>(), 8, "{ran_per_run:?}");
    assert_eq!(refused, 72);
    assert_eq!(executed(&fleet.counts, "charge"), 8);
    Arc::try_unwrap(fleet).ok().unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_rate_holds_within_ten_percent_across_replicas() {
    let scope = Backend::Shared.scope().await;
    let per_s = 40.0;
    let fleet = Arc::new(
        fleet(3, &scope, |c| {
            c.set("limits.per_run_per_s", 0)
                .set("limits.per_run_tool_per_s", 0)
                .set("limits.per_tenant_per_s", 40)
                .set("limits.default_max_steps", 100000)
        })
        .await,
    );
    let token = common::sign(&common::claims("fleet", &["sre"]));
    fleet.list_everywhere(&token).await;
    let window = Duration::from_secs(3);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..6 {
        let (fleet, token) = (fleet.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut limited, mut i) = (0usize, 0usize, w);
            while start.elapsed() < window {
                match outcome(&fleet.call(i, &token, "read_thing", json!({})).await).as_str() {
                    "ok" => ok += 1,
                    "-31003" => limited += 1,
                    other => panic!("unexpected outcome {other}"),
                }
                i += 6;
            }
            (ok, limited)
        }));
    }
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        let (o, l) = t.await.unwrap();
        ok += o;
        limited += l;
    }
    let elapsed = start.elapsed().as_secs_f64();
    // GCRA: a burst of `per_s`, then `per_s` a second.
    let expected = per_s + per_s * elapsed;
    let ratio = ok as f64 / expected;
    assert!(
        limited > ok,
        "the offered load must exceed the limit: {ok} ok, {limited} limited"
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{ok} admitted in {elapsed:.2} s across 3 replicas, expected {expected:.0} (ratio {ratio:.3})"
    );
    assert_eq!(executed(&fleet.counts, "read_thing"), ok);
    Arc::try_unwrap(fleet).ok().unwrap().stop().await;
}

fn admin_token(sub: &str) -> String {
    let mut c = common::claims("sre-lead", &["sre"]);
    c.audience = Audience::Admin;
    c.sub = sub.to_owned();
    common::sign(&c)
}

async fn admin_get(fw: &Firewall, token: &str, path: &str) -> Value {
    common::http()
        .get(format!("{}{path}", fw.admin))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn decide(fw: &Firewall, token: &str, id: &str, action: &str) -> u16 {
    common::http()
        .post(format!("{}/approvals/{id}/{action}", fw.admin))
        .bearer_auth(token)
        .json(&json!({"reason": "checked on call"}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn pending_on(fw: &Firewall, token: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = admin_get(fw, token, "/approvals?status=pending").await;
        let list = v["approvals"].as_array().cloned().unwrap_or_default();
        if !list.is_empty() || Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_granted_on_one_replica_releases_the_call_held_on_another_once() {
    let scope = Backend::Shared.scope().await;
    let fleet = Arc::new(
        fleet(3, &scope, |c| {
            scope
                .approvals_store(c)
                .set("approvals.hold_s", 20)
                .set("approvals.expiry_s", 600)
                .set("approvals.progress_interval_s", 1)
        })
        .await,
    );
    let token = common::sign(&common::claims("fleet", &["sre"]));
    fleet.list_everywhere(&token).await;
    let oncall = admin_token("oncall");

    // Held on A (replica 0): an SSE request waits for a person.
    let held = {
        let url = fleet.replicas[0].mcp_url("ledger");
        let token = token.clone();
        tokio::spawn(async move {
            common::post(
                &url,
                &token,
                &[],
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wipe","arguments":{"target":"cache-1"}}}"#,
            )
            .await
        })
    };
    // Every replica's admin API lists it (one database).
    let on_c = pending_on(&fleet.replicas[2], &oncall).await;
    assert_eq!(on_c.len(), 1, "{on_c:?}");
    let id = on_c[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        pending_on(&fleet.replicas[1], &oncall).await[0]["id"],
        id.as_str()
    );
    assert_eq!(
        executed(&fleet.counts, "wipe"),
        0,
        "nothing runs while pending"
    );

    // Approved on B: the call held on A wakes and runs, once.
    assert_eq!(
        decide(&fleet.replicas[1], &oncall, &id, "approve").await,
        200
    );
    let answer = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the held call was released")
        .unwrap();
    assert_eq!(
        answer.json()["result"]["content"][0]["text"],
        "ok",
        "{}",
        answer.text
    );
    assert_eq!(executed(&fleet.counts, "wipe"), 1);

    // The identical retry on C does not run it again: it needs a new approval.
    let retry = common::post(
        &fleet.replicas[2].mcp_url("ledger"),
        &token,
        &[("accept", "application/json")],
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"wipe","arguments":{"target":"cache-1"}}}"#,
    )
    .await;
    assert_eq!(retry.code(), -31002, "{}", retry.text);
    assert_ne!(
        retry.json()["error"]["data"]["approval_id"].as_str(),
        Some(id.as_str())
    );
    assert_eq!(executed(&fleet.counts, "wipe"), 1);
    let shown = admin_get(&fleet.replicas[0], &oncall, &format!("/approvals/{id}")).await;
    assert_eq!(shown["status"], "consumed", "{shown}");

    // Denied on B: denied on every replica, and it never runs.
    let second = retry.json()["error"]["data"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        decide(&fleet.replicas[1], &oncall, &second, "deny").await,
        200
    );
    for fw in &fleet.replicas {
        let shown = admin_get(fw, &oncall, &format!("/approvals/{second}")).await;
        assert_eq!(shown["status"], "denied", "{shown}");
        assert_eq!(decide(fw, &oncall, &second, "approve").await, 409);
    }
    assert_eq!(executed(&fleet.counts, "wipe"), 1);
    Arc::try_unwrap(fleet).ok().unwrap().stop().await;
}

/// Reads and writes against one replica while its Redis dies and comes
/// back: reads continue (open), writes are refused at once with -31006
/// (closed), nothing hangs, and the shared budgets return by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dies_under_load_reads_continue_writes_refused_then_recovery() {
    let redis = Redis::start().await;
    let scope = Backend::Shared.scope().await;
    let counts = Counts::default();
    let upstream = ledger(counts.clone()).await;
    let policies = common::policy_dir(&[("90-fleet.toml", POLICY)]);
    let cfg = TestConfig::new()
        .policies(policies.path())
        .upstream("ledger", &upstream.url())
        .set("limits.per_run_per_s", 0)
        .set("limits.per_run_tool_per_s", 0)
        .set("limits.default_max_steps", 100000);
    // This test's own Redis, and a shorter timeout.
    let text = scope
        .state(cfg)
        .set("state.redis_url", redis.url.as_str())
        .set("state.timeout_ms", 50)
        .text();
    let fw = Arc::new(common::firewall(&text).await);
    let token = common::sign(&common::claims("fleet", &["sre"]));
    common::post(
        &fw.mcp_url("ledger"),
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#,
    )
    .await;
    let call = |tool: &'static str, i: usize| one_call(fw.clone(), token.clone(), tool, i);
    assert_eq!(call("write_note", 1).await.0, "ok");

    // Load: a reader and a writer, all along; each phase waits for what
    // the load has seen, not for a time.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = |tool: &'static str| {
        let (stop, fw, token) = (stop.clone(), fw.clone(), token.clone());
        let seen = Seen::default();
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut i = 10;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let one = one_call(fw.clone(), token.clone(), tool, i).await;
                    seen.lock().unwrap().push(one);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        (task, seen)
    };
    let (readers, reads) = load("read_thing");
    let (writers, writes) = load("write_note");
    until_seen(&reads, "ok", 5, "reads before the outage").await;
    until_seen(&writes, "ok", 5, "writes before the outage").await;
    redis.stop().await;
    let reads_before = count(&reads, "ok");
    until_seen(&writes, "-31006", 3, "writes refused in the outage").await;
    until_seen(&reads, "ok", reads_before + 5, "reads in the outage").await;
    // During the outage: degraded, not unready (all replicas share the store).
    common::eventually(
        "/readyz to say degraded",
        Duration::from_secs(10),
        || async {
            let ready = common::http()
                .get(format!("{}/readyz", fw.admin))
                .send()
                .await
                .unwrap();
            assert_eq!(ready.status(), 200);
            let text = ready.text().await.unwrap();
            text.contains("degraded: budget_store_unavailable")
        },
    )
    .await;
    let (o, took) = call("write_note", 99_999).await;
    assert_eq!(o, "-31006", "a write is refused while Redis is down");
    assert!(
        took < Duration::from_millis(500),
        "refused at once: {took:?}"
    );
    let (o, _) = call("read_thing", 99_998).await;
    assert_eq!(o, "ok", "a read runs on this replica's own budgets");

    redis.resume().await;
    // Recovery is automatic: writes run again within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (o, _) = call("write_note", 100_000).await;
        if o == "ok" {
            break;
        }
        assert!(Instant::now() < deadline, "writes never recovered: {o}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The load's own writes recover too, with the reader still running.
    let (reads_now, writes_now) = (count(&reads, "ok"), count(&writes, "ok"));
    until_seen(&writes, "ok", writes_now + 3, "the load's writes after").await;
    until_seen(&reads, "ok", reads_now + 3, "the load's reads after").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    readers.await.unwrap();
    writers.await.unwrap();
    let reads = std::mem::take(&mut *reads.lock().unwrap());
    let writes = std::mem::take(&mut *writes.lock().unwrap());
    assert!(
        reads.iter().all(|(o, _)| o == "ok"),
        "every read ran: {:?}",
        reads.iter().filter(|(o, _)| o != "ok").collect::<Vec<_>>()
    );
    let slowest = reads
        .iter()
        .chain(writes.iter())
        .map(|(_, d)| *d)
        .max()
        .unwrap();
    assert!(
        slowest < Duration::from_secs(2),
        "nothing hangs: {slowest:?}"
    );
    let refused = writes.iter().filter(|(o, _)| o == "-31006").count();
    assert!(refused > 0, "writes were refused during the outage");
    assert!(
        writes.iter().all(|(o, _)| o == "ok" || o == "-31006"),
        "{:?}",
        writes
            .iter()
            .filter(|(o, _)| o != "ok" && o != "-31006")
            .collect::<Vec<_>>()
    );
    let metrics = fw.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("mcp_firewall_store_fallback_total")
                && l.contains("fallback=\"closed\"")
                && l.contains("risk=\"write\"")),
        "{metrics}"
    );
    drop(upstream);
    Arc::try_unwrap(fw).ok().unwrap().stop().await;
}

/// What a load task has seen: each call's outcome and how long it took.
type Seen = Arc<std::sync::Mutex<Vec<(String, Duration)>>>;

/// How many calls `seen` answered with `outcome`.
fn count(seen: &Seen, outcome: &str) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(o, _)| o == outcome)
        .count()
}

/// Waits until `seen` holds `n` calls answered with `outcome`.
async fn until_seen(seen: &Seen, outcome: &str, n: usize, what: &str) {
    let what = format!("{what} ({n} {outcome})");
    common::wait_until(&what, Duration::from_secs(15), || count(seen, outcome) >= n).await;
}

/// One `tools/call` of `tool`: its outcome and how long it took.
async fn one_call(fw: Arc<Firewall>, token: String, tool: &str, i: usize) -> (String, Duration) {
    let started = Instant::now();
    let a = common::post(
        &fw.mcp_url("ledger"),
        &token,
        &[],
        &json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": tool, "arguments": {}}})
        .to_string(),
    )
    .await;
    (outcome(&a.json()), started.elapsed())
}

/// The approvals database dies: a gated call is answered at once that no
/// approval can be had, reads are untouched, and approvals work again once
/// it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dies_gated_calls_refused_at_once_then_recovery() {
    let pg = Postgres::start().await;
    let db = pg.create_database("approvals");
    let counts = Counts::default();
    let upstream = ledger(counts.clone()).await;
    let policies = common::policy_dir(&[("90-fleet.toml", POLICY)]);
    let text = TestConfig::new()
        .policies(policies.path())
        .upstream("ledger", &upstream.url())
        .set("approvals.store", "postgres")
        .set("approvals.postgres_url", db.as_str())
        .set("approvals.postgres_timeout_ms", 300)
        .set("approvals.hold_s", 0)
        .set("approvals.expiry_s", 600)
        .text();
    let fw = common::firewall(&text).await;
    let token = common::sign(&common::claims("fleet", &["sre"]));
    let url = fw.mcp_url("ledger");
    common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#,
    )
    .await;
    let wipe = |i: usize| {
        json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
               "params": {"name": "wipe", "arguments": {"n": i}}})
        .to_string()
    };
    let a = common::post(&url, &token, &[], &wipe(1)).await;
    assert_eq!(
        a.code(),
        -31002,
        "approval required while the database is up"
    );
    assert!(
        a.json()["error"]["data"]["approval_id"].is_string(),
        "{}",
        a.text
    );

    pg.stop().await;
    let started = Instant::now();
    let a = common::post(&url, &token, &[], &wipe(2)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at once"
    );
    assert_eq!(a.code(), -31002, "{}", a.text);
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("none can be requested"),
        "{}",
        a.text
    );
    let r = common::post(
        &url,
        &token,
        &[],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_thing","arguments":{}}}"#,
    )
    .await;
    assert_eq!(outcome(&r.json()), "ok", "reads do not need the database");
    let oncall = admin_token("oncall");
    let listed = common::http()
        .get(format!("{}/approvals", fw.admin))
        .bearer_auth(&oncall)
        .send()
        .await
        .unwrap();
    assert_eq!(
        listed.status(),
        503,
        "the console says the store is unavailable"
    );
    // Let the breaker see enough failures, then /readyz is degraded.
    for i in 0..3 {
        common::post(&url, &token, &[], &wipe(10 + i)).await;
    }
    let text = common::http()
        .get(format!("{}/readyz", fw.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("approvals_store_unavailable"), "{text}");

    pg.resume().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a = common::post(&url, &token, &[], &wipe(4)).await;
        if a.json()["error"]["data"]["approval_id"].is_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "approvals never recovered: {}",
            a.text
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(executed(&counts, "wipe"), 0, "nothing gated ran");
    drop(upstream);
    fw.stop().await;
}

/// The shipped nginx affinity file (an optional cache-locality aid) sends
/// every form of one token to the same replica, and different tokens to
/// different replicas: a real nginx, three recording upstreams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_affinity_file_hashes_every_form_of_a_token_alike() {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nginx is installed (apt-get install nginx)");
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nginx/run-affinity.conf"),
    )
    .unwrap();
    // The file's maps, as shipped; the upstreams and listener are the test's.
    let mut maps = String::new();
    let mut inside = false;
    for line in shipped.lines() {
        if line.starts_with("map ") {
            inside = true;
        }
        if inside {
            maps.push_str(line);
            maps.push('\n');
        }
        if inside && line.starts_with('}') {
            inside = false;
        }
    }
    assert_eq!(maps.matches("map ").count(), 3, "{maps}");
    let mut backends = Vec::new();
    for n in 0..3 {
        backends.push(
            raw::upstream(move |_| async move { raw::full(200, "text/plain", format!("{n}")) })
                .await,
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let servers: String = backends
        .iter()
        .map(|b| format!("        server {};\n", b.addr))
        .collect();
    let conf = format!(
        "daemon off;\nmaster_process off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\nevents {{}}\nhttp {{\n    access_log off;\n    client_body_temp_path {dir};\n    proxy_temp_path {dir};\n{maps}\n    upstream mcp_firewall {{\n        hash $mcp_run_affinity consistent;\n{servers}    }}\n    server {{\n        listen 127.0.0.1:{port};\n        location / {{ proxy_pass http://mcp_firewall; }}\n    }}\n}}\n",
        dir = dir.path().display()
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let mut child = std::process::Command::new(nginx)
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .arg("-p")
        .arg(dir.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let backend_of = |name: &'static str, value: String| async move {
        for _ in 0..100 {
            if let Ok(r) = common::http()
                .get(format!("http://127.0.0.1:{port}/mcp"))
                .header(name, value.clone())
                .send()
                .await
            {
                return r.text().await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("nginx did not answer");
    };
    let mut seen = std::collections::HashSet::new();
    for t in 0..12 {
        let token = common::sign(&common::claims("fleet", &["sre"]));
        let mut forms = std::collections::HashSet::new();
        for i in 0..5 {
            let (name, value) = token_form(i, &token);
            forms.insert(backend_of(name, value).await);
        }
        assert_eq!(
            forms.len(),
            1,
            "token {t}: every form on one replica: {forms:?}"
        );
        seen.extend(forms);
    }
    assert!(
        seen.len() > 1,
        "different tokens spread over replicas: {seen:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A `redis-server` speaking TLS only, with a password, killed on drop.
struct TlsRedis {
    port: u16,
    child: std::process::Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn tls_redis(dir: &std::path::Path, ca: &crate::tls::Ca, password: &str) -> TlsRedis {
    let (cert, key) = ca.issue();
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.join("redis.pem"), cert).unwrap();
    std::fs::write(dir.join("redis.key"), key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(dir.join("redis.pem"))
        .arg("--tls-key-file")
        .arg(dir.join("redis.key"))
        .arg("--tls-ca-cert-file")
        .arg(dir.join("ca.pem"))
        .args(["--requirepass", password])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "TLS redis did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    TlsRedis { port, child }
}

/// Budgets in a Redis reached over TLS (verified against the configured CA)
/// with its password from a file: writes run; a wrong password or an
/// unverifiable certificate means the store cannot be asked (-31006), never
/// an unverified connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_password_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = crate::tls::Ca::new("redis test CA");
    let redis = tls_redis(dir.path(), &ca, "s3cret-pw").await;
    std::fs::write(dir.path().join("pw"), "s3cret-pw\n").unwrap();
    std::fs::write(dir.path().join("wrong"), "guess\n").unwrap();
    std::fs::write(
        dir.path().join("other-ca.pem"),
        crate::tls::Ca::new("other").pem,
    )
    .unwrap();
    let counts = Counts::default();
    let upstream = ledger(counts.clone()).await;
    let policies = common::policy_dir(&[("90-fleet.toml", POLICY)]);
    let token = common::sign(&common::claims("fleet", &["sre"]));
    for (password, ca_file, want) in [
        ("pw", "ca.pem", "ok"),
        ("wrong", "ca.pem", "-31006"),
        ("pw", "other-ca.pem", "-31006"),
    ] {
        let text = TestConfig::new()
            .policies(policies.path())
            .upstream("ledger", &upstream.url())
            .set("state.backend", "redis")
            .set(
                "state.redis_url",
                format!("rediss://127.0.0.1:{}", redis.port),
            )
            .set(
                "state.redis_password_file",
                common::toml_path(&dir.path().join(password)),
            )
            .set(
                "state.redis_ca_file",
                common::toml_path(&dir.path().join(ca_file)),
            )
            .set("state.timeout_ms", 500)
            .text();
        let fw = Arc::new(common::firewall(&text).await);
        common::post(
            &fw.mcp_url("ledger"),
            &token,
            &[],
            r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#,
        )
        .await;
        let (o, _) = one_call(fw.clone(), token.clone(), "write_note", 1).await;
        assert_eq!(o, want, "password {password}, CA {ca_file}");
        Arc::try_unwrap(fw).ok().unwrap().stop().await;
    }
    assert_eq!(executed(&counts, "write_note"), 1);
}

/// Approvals in a PostgreSQL reached with `sslmode=require`, verified
/// against the configured CA; another CA's certificate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verified_against_the_configured_ca() {
    let pg = Postgres::start().await;
    let db = pg.create_database("tlsdb");
    // The server's certificate, readable by the server only.
    let certs = tempfile::tempdir().unwrap();
    let ca = crate::tls::Ca::new("postgres test CA");
    let (cert, key) = ca.issue();
    let (crt, keyf) = (
        certs.path().join("server.crt"),
        certs.path().join("server.key"),
    );
    std::fs::write(&crt, cert).unwrap();
    std::fs::write(&keyf, key).unwrap();
    std::fs::write(certs.path().join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(
        certs.path().join("other.pem"),
        crate::tls::Ca::new("other").pem,
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keyf, std::fs::Permissions::from_mode(0o600)).unwrap();
        let root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if root {
            let uid = |flag: &str| -> u32 {
                let out = std::process::Command::new("id")
                    .args([flag, "postgres"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            for p in [certs.path(), &crt, &keyf] {
                std::os::unix::fs::chown(p, Some(uid("-u")), Some(uid("-g"))).unwrap();
            }
        }
    }
    pg.psql(
        "postgres",
        &format!("ALTER SYSTEM SET ssl_cert_file = '{}'", crt.display()),
    );
    pg.psql(
        "postgres",
        &format!("ALTER SYSTEM SET ssl_key_file = '{}'", keyf.display()),
    );
    pg.psql("postgres", "ALTER SYSTEM SET ssl = on");
    pg.psql("postgres", "SELECT pg_reload_conf()");
    // The reload is asynchronous: wait until the server says TLS is on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pg.psql("postgres", "SHOW ssl").trim() != "on" {
        assert!(Instant::now() < deadline, "postgres never turned TLS on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let counts = Counts::default();
    let upstream = ledger(counts.clone()).await;
    let policies = common::policy_dir(&[("90-fleet.toml", POLICY)]);
    let token = common::sign(&common::claims("fleet", &["sre"]));
    for (ca_file, files_an_approval) in [("ca.pem", true), ("other.pem", false)] {
        let text = TestConfig::new()
            .policies(policies.path())
            .upstream("ledger", &upstream.url())
            .set("approvals.store", "postgres")
            .set("approvals.postgres_url", format!("{db}?sslmode=require"))
            .set(
                "approvals.postgres_ca_file",
                common::toml_path(&certs.path().join(ca_file)),
            )
            .set("approvals.hold_s", 0)
            .text();
        let fw = common::firewall(&text).await;
        let url = fw.mcp_url("ledger");
        common::post(
            &url,
            &token,
            &[],
            r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#,
        )
        .await;
        let a = common::post(
            &url,
            &token,
            &[],
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wipe","arguments":{}}}"#,
        )
        .await;
        assert_eq!(a.code(), -31002, "{}", a.text);
        assert_eq!(
            a.json()["error"]["data"]["approval_id"].is_string(),
            files_an_approval,
            "CA {ca_file}: {}",
            a.text
        );
        fw.stop().await;
    }
    let ssl_used = pg.psql("tlsdb", "SELECT count(*) FROM mcp_firewall_approvals");
    assert_eq!(
        ssl_used.trim(),
        "1",
        "the approval went over TLS into the database"
    );
}
