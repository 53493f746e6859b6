//! Tests of the approvals model and its rules: canonical arguments, config,
//! ids, idempotent requests, exactly-once consumption, expiry, decisions,
//! waiting, durability across restarts, hooks, previews and metrics.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use std::path::{Path, PathBuf};

use crate::approval::{args_sha256, ConfigProblem, WebhookConfig, MAX_REASON_BYTES};

use crate::canonical::canonical as canonical_json;
use crate::clock::fmt_ms;
use crate::policy::Risk;
use sha2::{Digest, Sha256};

/// 2025-01-01T00:00:00Z in ms.
pub(crate) const T0: u64 = 1_735_689_600_000;

pub(crate) fn clock_at(ms: u64) -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(ms))
}

/// Opens a store in `dir` on a manual clock; retries briefly while a
/// previous instance's sweeper still holds the lock.
pub(crate) async fn open_in(
    dir: &Path,
    clock: &Arc<AtomicU64>,
    tweak: impl Fn(&mut ApprovalsConfig),
) -> (Arc<Approvals>, Registry) {
    let mut cfg = ApprovalsConfig {
        store_dir: dir.to_owned(),
        ..ApprovalsConfig::default()
    };
    tweak(&mut cfg);
    for _ in 0..50 {
        let mut registry = Registry::default();
        match Approvals::open_with_clock(&cfg, &mut registry, Clock::Manual(clock.clone())).await {
            Ok(a) => return (a, registry),
            Err(e) if e.to_string().contains("locked") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("open failed: {e:#}"),
        }
    }
    panic!("store stayed locked");
}

pub(crate) fn key(tool: &str, args: &Value) -> CallKey {
    CallKey {
        tenant: "acme".to_owned(),
        run_id: "run-1".to_owned(),
        subject: "alice".to_owned(),
        upstream: "incidents".to_owned(),
        tool: tool.to_owned(),
        args_sha256: args_sha256(args),
    }
}

pub(crate) fn new_approval(key: CallKey) -> NewApproval {
    NewApproval {
        key,
        agent: "sre-lead".to_owned(),
        risk: Risk::Destructive,
        arguments: json!({"deployment": "checkout", "to": "v41"}),
        token_exp: T0 / 1000 + 900,
        preview_tool: None,
        self_approval: false,
        why: None,
    }
}

pub(crate) fn approver(sub: &str) -> Approver {
    Approver {
        subject: sub.to_owned(),
        tenant: "acme".to_owned(),
        scopes: vec!["approvals".to_owned()],
    }
}

fn rollback() -> NewApproval {
    new_approval(key(
        "rollback_deployment",
        &json!({"deployment": "checkout"}),
    ))
}

fn metrics_text(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
    out
}

// --- canonical arguments -------------------------------------------------

#[test]
fn reordered_twin_arguments_hash_the_same() {
    let a: Value = serde_json::from_str(r#"{"b":1,"a":[{"d":1,"c":2}]}"#).expect("json");
    let b: Value = serde_json::from_str(r#"{ "a" : [ {"c":2, "d":1} ], "b" : 1 }"#).expect("json");
    assert_eq!(canonical_json(&a), r#"{"a":[{"c":2,"d":1}],"b":1}"#);
    assert_eq!(canonical_json(&a), canonical_json(&b));
    assert_eq!(args_sha256(&a), args_sha256(&b));
}

#[test]
fn hash_is_sha256_of_the_canonical_text() {
    let v = json!({"z": [true, null, 1.5, -3], "a": {"y": "x", "b": "é😀"}});
    let expected: [u8; 32] = Sha256::digest(canonical_json(&v).as_bytes()).into();
    assert_eq!(args_sha256(&v), expected);
}

#[test]
fn different_arguments_hash_differently() {
    let base = args_sha256(&json!({"replicas": 1}));
    assert_ne!(base, args_sha256(&json!({"replicas": 2})));
    assert_ne!(base, args_sha256(&json!({"replicas": "1"})));
    assert_ne!(base, args_sha256(&json!({"replicas": [1]})));
    // RFC 8785 prints `1.0` as `1`: the same number, the same call; a
    // different number is a different call, however large.
    assert_eq!(base, args_sha256(&json!({"replicas": 1.0})));
    assert_ne!(base, args_sha256(&json!({"replicas": 1.5})));
    assert_ne!(
        args_sha256(&json!({"id": 9_007_199_254_740_993_u64})),
        args_sha256(&json!({"id": 9_007_199_254_740_992_u64}))
    );
    // Array order is meaningful.
    assert_ne!(args_sha256(&json!([1, 2])), args_sha256(&json!([2, 1])));
}

#[test]
fn strings_carry_only_mandatory_escapes() {
    let v = json!({"k\"ey": "a\"b\\c\nd\te\u{1}f/é😀\u{7f}"});
    assert_eq!(
        canonical_json(&v),
        "{\"k\\\"ey\":\"a\\\"b\\\\c\\nd\\te\\u0001f/é😀\u{7f}\"}"
    );
}

#[test]
fn keys_sort_by_code_point() {
    let v = json!({"b": 1, "B": 2, "é": 3, "a": 4, "aa": 5, "": 6});
    assert_eq!(
        canonical_json(&v),
        r#"{"":6,"B":2,"a":4,"aa":5,"b":1,"é":3}"#
    );
}

/// Equal values, numbers compared as numbers.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn canonical_text_parses_back_to_the_same_value(v in arb_json()) {
        let text = canonical_json(&v);
        let back: Value = serde_json::from_str(&text).expect("canonical text is JSON");
        // The same value (an integral float may come back as an integer).
        prop_assert!(same_value(&back, &v), "{} vs {}", back, v);
        prop_assert_eq!(canonical_json(&back), text);
    }

    #[test]
    fn pretty_printed_text_hashes_like_compact(v in arb_json()) {
        let pretty = serde_json::to_string_pretty(&v).expect("pretty");
        let reparsed: Value = serde_json::from_str(&pretty).expect("json");
        prop_assert_eq!(args_sha256(&reparsed), args_sha256(&v));
    }
}

// --- config and ids ------------------------------------------------------

#[test]
fn config_defaults_match_the_documentation() {
    let cfg: ApprovalsConfig = toml::from_str("").expect("empty section");
    assert_eq!(cfg, ApprovalsConfig::default());
    assert_eq!(cfg.expiry_s, 600);
    assert_eq!(cfg.hold_s, 120);
    assert_eq!(cfg.progress_interval_s, 5);
    assert_eq!(cfg.store_dir, PathBuf::from("approvals"));
    assert!(!cfg.self_approval_default);
    assert!(cfg.webhook.is_none());
    let w: ApprovalsConfig =
        toml::from_str("[webhook]\nurl = \"https://hooks.example/x\"").expect("webhook");
    let w = w.webhook.expect("webhook set");
    assert_eq!((w.timeout_ms, w.max_retries, w.backoff_ms), (5000, 5, 250));
}

#[test]
fn unknown_config_keys_are_refused() {
    let err = toml::from_str::<ApprovalsConfig>("expiry = 5").expect_err("typo");
    assert!(err.to_string().contains("unknown field `expiry`"), "{err}");
    let err = toml::from_str::<ApprovalsConfig>("[webhook]\nurl = \"http://x\"\nretries = 1")
        .expect_err("typo");
    assert!(err.to_string().contains("unknown field `retries`"), "{err}");
}

#[test]
fn config_validation_names_the_field() {
    let zero = ApprovalsConfig {
        expiry_s: 0,
        ..ApprovalsConfig::default()
    };
    let err = zero.validate().expect_err("zero expiry");
    assert_eq!(
        err.to_string(),
        "invalid config: approvals.expiry_s must be at least 1"
    );
    let bad_url = ApprovalsConfig {
        webhook: Some(WebhookConfig {
            url: "ftp://hooks".to_owned(),
            timeout_ms: 1,
            max_retries: 0,
            backoff_ms: 1,
        }),
        ..ApprovalsConfig::default()
    };
    assert!(matches!(
        bad_url.validate(),
        Err(ApprovalError::InvalidConfig {
            field: "approvals.webhook.url",
            problem: ConfigProblem::NotHttpUrl
        })
    ));
    let mut rel = ApprovalsConfig::default();
    rel.resolve_paths(Path::new("/etc/fw"));
    assert_eq!(rel.store_dir, PathBuf::from("/etc/fw/approvals"));
}

#[test]
fn ids_are_unguessable_and_url_safe() {
    let mut seen = std::collections::HashSet::new();
    for _ in 0..2000 {
        let id = ApprovalId::generate().expect("os rng");
        let s = id.as_str();
        assert_eq!(s.len(), 3 + 22, "{s}");
        assert!(s.starts_with("ap_"));
        assert!(ApprovalId::parse(s).is_some());
        assert!(seen.insert(s.to_owned()), "duplicate id {s}");
    }
    assert!(ApprovalId::parse("../x").is_none());
    assert!(ApprovalId::parse(&"a".repeat(65)).is_none());
}

#[test]
fn fmt_ms_prints_utc() {
    assert_eq!(fmt_ms(T0), "2025-01-01T00:00:00Z");
    assert_eq!(fmt_ms(951_782_400_000 + 3_723_000), "2000-02-29T01:02:03Z");
    assert_eq!(fmt_ms(0), "1970-01-01T00:00:00Z");
}

// --- requests and consumption --------------------------------------------

#[tokio::test]
async fn request_is_idempotent_for_identical_calls() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let first = a.request(rollback()).await.expect("request");
    let again = a.request(rollback()).await.expect("request");
    assert_eq!(first.id, again.id);
    assert_eq!(first.status, Status::Pending);
    assert_eq!(first.expires_ms, T0 + 600_000);

    let other_args = a
        .request(new_approval(key(
            "rollback_deployment",
            &json!({"deployment": "search"}),
        )))
        .await
        .expect("request");
    assert_ne!(other_args.id, first.id);
    let mut other_run = rollback();
    other_run.key.run_id = "run-2".to_owned();
    assert_ne!(a.request(other_run).await.expect("request").id, first.id);
    assert_eq!(
        a.list("acme", Some(Status::Pending)).await.unwrap().len(),
        3
    );
}

#[tokio::test]
async fn an_approved_call_is_consumed_exactly_once_by_50_concurrent_consumers() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    assert!(
        a.consume(&p.key).await.is_none(),
        "pending is not consumable"
    );
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve");
    // Still the same approval for retries of the held call, until consumed.
    assert_eq!(a.request(rollback()).await.expect("request").id, p.id);

    let winners = AtomicUsize::new(0);
    let tries = (0..50).map(|_| async {
        if let Some(c) = a.consume(&p.key).await {
            assert_eq!(c.id, p.id);
            assert_eq!(c.status, Status::Consumed);
            winners.fetch_add(1, Ordering::SeqCst);
        }
    });
    futures_util::future::join_all(tries).await;
    assert_eq!(winners.load(Ordering::SeqCst), 1);
    let after = a
        .get("acme", p.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("kept");
    assert_eq!(after.status, Status::Consumed);
    assert_eq!(after.consumed_ms, Some(T0));
    // The next identical call needs a new approval.
    let next = a.request(rollback()).await.expect("request");
    assert_ne!(next.id, p.id);
    assert_eq!(next.status, Status::Pending);
}

#[tokio::test]
async fn a_denied_call_is_never_consumable() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    a.decide(
        "acme",
        p.id.as_str(),
        &approver("bob"),
        false,
        "not during the freeze",
    )
    .await
    .expect("deny");
    assert!(a.consume(&p.key).await.is_none());
    let d = a
        .get("acme", p.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("kept");
    assert_eq!(d.status, Status::Denied);
    let decision = d.decision.expect("recorded");
    assert_eq!(
        (
            decision.by.as_str(),
            decision.approved,
            decision.reason.as_str(),
            decision.at_ms
        ),
        ("bob", false, "not during the freeze", T0)
    );
}

#[tokio::test]
async fn pending_approvals_expire_at_their_deadline() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |c| c.expiry_s = 60).await;
    let p = a.request(rollback()).await.expect("request");
    assert_eq!(p.expires_ms, T0 + 60_000);
    clock.store(T0 + 59_999, Ordering::SeqCst);
    assert_eq!(
        a.get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("get")
            .status,
        Status::Pending
    );
    clock.store(T0 + 60_000, Ordering::SeqCst);
    // Expired on read, before any sweep.
    assert_eq!(
        a.get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("get")
            .status,
        Status::Expired
    );
    let err = a
        .decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect_err("too late");
    assert!(matches!(err, ApprovalError::Expired { expires_ms, .. } if expires_ms == T0 + 60_000));
    // A retry of the call asks anew.
    let again = a.request(rollback()).await.expect("request");
    assert_ne!(again.id, p.id);
    assert_eq!(again.expires_ms, T0 + 120_000);
}

#[tokio::test]
async fn an_approval_never_outlives_the_tool_token() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let mut short = rollback();
    short.token_exp = T0 / 1000 + 90;
    let p = a.request(short).await.expect("request");
    assert_eq!(p.expires_ms, T0 + 90_000, "token exp beats expiry_s");
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "ok")
        .await
        .expect("approve");
    // Approved but never run before the token died: void.
    clock.store(T0 + 90_000, Ordering::SeqCst);
    assert!(a.consume(&p.key).await.is_none());
    assert_eq!(
        a.get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("get")
            .status,
        Status::Expired
    );

    let mut dead = rollback();
    dead.token_exp = T0 / 1000 + 90;
    assert!(matches!(
        a.request(dead).await,
        Err(ApprovalError::TokenExpired { token_exp, .. }) if token_exp == T0 / 1000 + 90
    ));
}

#[tokio::test]
async fn a_tenant_cannot_flood_pending_approvals() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |c| c.max_pending_per_tenant = 2).await;
    for i in 0..2 {
        a.request(new_approval(key("restart", &json!({ "i": i }))))
            .await
            .expect("under the limit");
    }
    let err = a
        .request(new_approval(key("restart", &json!({"i": 3}))))
        .await
        .expect_err("over");
    assert!(matches!(
        err,
        ApprovalError::TooManyPending {
            pending: 2,
            max: 2,
            ..
        }
    ));
    // Identical retries of an existing one still work.
    a.request(new_approval(key("restart", &json!({"i": 0}))))
        .await
        .expect("existing");
    let mut other = new_approval(key("restart", &json!({"i": 3})));
    other.key.tenant = "globex".to_owned();
    a.request(other)
        .await
        .expect("another tenant has its own budget");
}

// --- decisions -------------------------------------------------------------

#[tokio::test]
async fn decisions_follow_the_rules() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    let id = p.id.as_str();

    let mut stranger = approver("eve");
    stranger.tenant = "globex".to_owned();
    assert!(matches!(
        a.decide("globex", id, &stranger, true, "").await,
        Err(ApprovalError::NotFound { .. })
    ));
    assert!(a.get("globex", id).await.ok().flatten().is_none());
    assert!(a.list("globex", None).await.unwrap().is_empty());
    // A tenant argument that disagrees with the approver's token.
    assert!(matches!(
        a.decide("acme", id, &stranger, true, "").await,
        Err(ApprovalError::NotFound { .. })
    ));

    let err = a
        .decide("acme", id, &approver("alice"), true, "")
        .await
        .expect_err("self");
    assert!(matches!(&err, ApprovalError::SelfApproval { subject } if subject == "alice"));
    assert!(
        err.to_string().contains("self-approval is not allowed"),
        "{err}"
    );

    assert!(matches!(
        a.decide("acme", id, &approver("bob"), false, "  ").await,
        Err(ApprovalError::ReasonRequired)
    ));
    assert!(matches!(
        a.decide(
            "acme",
            id,
            &approver("bob"),
            true,
            &"x".repeat(MAX_REASON_BYTES + 1)
        )
        .await,
        Err(ApprovalError::ReasonTooLong { .. })
    ));
    assert!(matches!(
        a.decide("acme", id, &approver("bob"), true, "ok\u{1b}[2J")
            .await,
        Err(ApprovalError::ReasonControlCharacter)
    ));
    assert_eq!(
        a.get("acme", id).await.ok().flatten().expect("get").status,
        Status::Pending
    );

    let ok = a
        .decide(
            "acme",
            id,
            &approver("bob"),
            true,
            "rollback is the runbook step",
        )
        .await
        .expect("approve");
    assert_eq!(ok.status, Status::Approved);
    assert!(matches!(
        a.decide("acme", id, &approver("carol"), false, "no").await,
        Err(ApprovalError::NotPending {
            status: Status::Approved,
            ..
        })
    ));
}

#[tokio::test]
async fn self_approval_is_allowed_when_the_approval_says_so() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let mut n = rollback();
    n.self_approval = true;
    let p = a.request(n).await.expect("request");
    let ok = a
        .decide("acme", p.id.as_str(), &approver("alice"), true, "")
        .await
        .expect("self approval allowed");
    assert_eq!(ok.decision.expect("decision").by, "alice");
}

#[tokio::test]
async fn one_approve_and_one_deny_racing_have_one_winner() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    for round in 0..20 {
        let p = a
            .request(new_approval(key("scale", &json!({ "round": round }))))
            .await
            .expect("request");
        let bob = approver("bob");
        let (yes, no) = tokio::join!(
            a.decide("acme", p.id.as_str(), &bob, true, "race"),
            a.decide("acme", p.id.as_str(), &bob, false, "race"),
        );
        let results = vec![(true, yes.map(|x| x.status)), (false, no.map(|x| x.status))];
        let wins: Vec<_> = results.iter().filter(|(_, r)| r.is_ok()).collect();
        assert_eq!(wins.len(), 1, "round {round}: {results:?}");
        let (approve, status) = wins[0];
        let expected = if *approve {
            Status::Approved
        } else {
            Status::Denied
        };
        assert_eq!(status.as_ref().ok(), Some(&expected));
        assert_eq!(
            a.get("acme", p.id.as_str())
                .await
                .ok()
                .flatten()
                .expect("get")
                .status,
            expected
        );
    }
}

// --- waiting ---------------------------------------------------------------

#[tokio::test]
async fn wait_resolves_when_a_person_decides() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    let waiter = {
        let (a, id) = (a.clone(), p.id.clone());
        tokio::spawn(async move { a.wait(&id, Instant::now() + Duration::from_secs(10)).await })
    };
    // Let the waiter run until it parks: nothing wakes it yet.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(!waiter.is_finished());
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve");
    let status = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("woken promptly")
        .expect("task");
    assert_eq!(status, Status::Approved);
    // Not pending any more: answers at once.
    assert_eq!(
        a.wait(&p.id, Instant::now() + Duration::from_secs(10))
            .await,
        Status::Approved
    );
}

#[tokio::test]
async fn wait_gives_up_at_until_and_reports_expiry_at_the_deadline() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    let started = Instant::now();
    assert_eq!(
        a.wait(&p.id, started + Duration::from_millis(100)).await,
        Status::Pending
    );
    assert!(started.elapsed() >= Duration::from_millis(100));

    let mut short = new_approval(key("restart", &json!({})));
    short.token_exp = T0 / 1000 + 1;
    let s = a.request(short).await.expect("request");
    let waiter = {
        let (a, id) = (a.clone(), s.id.clone());
        tokio::spawn(async move { a.wait(&id, Instant::now() + Duration::from_secs(30)).await })
    };
    // Once the waiter is parked on its deadline, time passes the token's end.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(!waiter.is_finished(), "still pending before its deadline");
    clock.store(T0 + 1000, Ordering::SeqCst);
    let status = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("resolves at the deadline, not at `until`")
        .expect("task");
    assert_eq!(status, Status::Expired);
    let unknown = ApprovalId::parse("ap_unknown").expect("shape");
    assert_eq!(a.wait(&unknown, Instant::now()).await, Status::Expired);
}

// --- durability ------------------------------------------------------------

#[tokio::test]
async fn pending_approvals_survive_a_restart_and_can_be_approved_then_consumed() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    let denied = a
        .request(new_approval(key(
            "delete_namespace",
            &json!({"ns": "prod"}),
        )))
        .await
        .expect("request");
    a.decide("acme", denied.id.as_str(), &approver("bob"), false, "never")
        .await
        .expect("deny");
    drop(a);

    let (b, _r) = open_in(dir.path(), &clock, |_| {}).await;
    let back = b
        .get("acme", p.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("pending survived");
    assert_eq!(back, p);
    let d = b
        .get("acme", denied.id.as_str())
        .await
        .ok()
        .flatten()
        .expect("decision survived");
    assert_eq!(d.status, Status::Denied);
    assert_eq!(d.decision.expect("decision").reason, "never");
    assert_eq!(
        b.request(rollback()).await.expect("request").id,
        p.id,
        "still binds its call"
    );
    b.decide(
        "acme",
        p.id.as_str(),
        &approver("bob"),
        true,
        "after restart",
    )
    .await
    .expect("approve");
    drop(b);

    let (c, _r) = open_in(dir.path(), &clock, |_| {}).await;
    assert_eq!(c.consume(&p.key).await.expect("approved survived").id, p.id);
    drop(c);

    let (d, _r) = open_in(dir.path(), &clock, |_| {}).await;
    assert!(d.consume(&p.key).await.is_none(), "consumption survived");
    assert_eq!(
        d.get("acme", p.id.as_str())
            .await
            .ok()
            .flatten()
            .expect("kept")
            .status,
        Status::Consumed
    );
}

#[tokio::test]
async fn history_is_forgotten_after_its_retention() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |c| c.history_s = 3600).await;
    let p = a.request(rollback()).await.expect("request");
    a.decide("acme", p.id.as_str(), &approver("bob"), false, "no")
        .await
        .expect("deny");
    clock.store(T0 + 3_599_000, Ordering::SeqCst);
    a.sweep().await;
    assert!(a.get("acme", p.id.as_str()).await.ok().flatten().is_some());
    clock.store(T0 + 3_600_000, Ordering::SeqCst);
    a.sweep().await;
    assert!(a.get("acme", p.id.as_str()).await.ok().flatten().is_none());
    drop(a);
    let (b, _r) = open_in(dir.path(), &clock, |c| c.history_s = 3600).await;
    assert!(
        b.get("acme", p.id.as_str()).await.ok().flatten().is_none(),
        "not resurrected by replay"
    );
}

// --- hooks, metrics, previews -----------------------------------------------

#[tokio::test]
async fn every_transition_reaches_the_hooks_with_who_and_when() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = clock_at(T0);
    let (a, _r) = open_in(dir.path(), &clock, |c| c.expiry_s = 60).await;
    type Seen = (Option<Status>, Status, u64, Option<String>);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    {
        let seen = seen.clone();
        a.on_transition(Box::new(move |t: &Transition| {
            seen.lock().expect("lock").push((
                t.from,
                t.to,
                t.at_ms,
                t.approval.decision.as_ref().map(|d| d.by.clone()),
            ));
            assert_eq!(t.approval.key.subject, "alice");
        }));
    }
    let p = a.request(rollback()).await.expect("request");
    a.request(rollback())
        .await
        .expect("idempotent: no transition");
    clock.store(T0 + 5, Ordering::SeqCst);
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve");
    clock.store(T0 + 9, Ordering::SeqCst);
    a.consume(&p.key).await.expect("consume");
    let q = a
        .request(new_approval(key("restart", &json!({}))))
        .await
        .expect("request");
    clock.store(q.expires_ms, Ordering::SeqCst);
    a.sweep().await;
    a.sweep().await;
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen,
        vec![
            (None, Status::Pending, T0, None),
            (
                Some(Status::Pending),
                Status::Approved,
                T0 + 5,
                Some("bob".to_owned())
            ),
            (
                Some(Status::Approved),
                Status::Consumed,
                T0 + 9,
                Some("bob".to_owned())
            ),
            (None, Status::Pending, T0 + 9, None),
            (Some(Status::Pending), Status::Expired, q.expires_ms, None),
        ]
    );
}

#[tokio::test]
async fn metrics_count_pending_and_outcomes() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, registry) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let p = a.request(rollback()).await.expect("request");
    let q = a
        .request(new_approval(key("restart", &json!({}))))
        .await
        .expect("request");
    let text = metrics_text(&registry);
    assert!(text.contains("approvals_pending 2"), "{text}");
    a.decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve");
    a.decide("acme", q.id.as_str(), &approver("bob"), false, "no")
        .await
        .expect("deny");
    a.consume(&p.key).await.expect("consume");
    let text = metrics_text(&registry);
    assert!(text.contains("approvals_pending 0"), "{text}");
    assert!(text.contains("approvals_created_total 2"), "{text}");
    for outcome in ["approved", "denied", "consumed"] {
        assert!(
            text.contains(&format!(
                "approvals_decisions_total{{outcome=\"{outcome}\"}} 1"
            )),
            "{outcome}: {text}"
        );
    }
}

#[tokio::test]
async fn previews_are_computed_once_and_only_while_pending() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let calls = calls.clone();
        a.set_preview(Arc::new(move |ap: &Approval, _by: &str| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let tool = ap.preview_tool.clone().unwrap_or_default();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(json!({"tool": tool, "call": n, "would_restart_pods": 12}))
            })
        }));
    }
    let mut n = rollback();
    n.preview_tool = Some("preview_remediation".to_owned());
    let p = a.request(n).await.expect("request");
    let (x, y) = tokio::join!(a.preview(&p, "bob"), a.preview(&p, "bob"));
    let x = x.expect("preview").expect("ok");
    assert_eq!(x, y.expect("preview").expect("ok"));
    assert_eq!(x["tool"], "preview_remediation");
    assert_eq!(a.preview(&p, "bob").await.expect("cached").expect("ok"), x);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let plain = a
        .request(new_approval(key("restart", &json!({}))))
        .await
        .expect("request");
    assert!(a.preview(&plain, "bob").await.is_none(), "no preview tool");
    let decided = a
        .decide("acme", p.id.as_str(), &approver("bob"), true, "")
        .await
        .expect("approve");
    assert!(
        a.preview(&decided, "bob").await.is_none(),
        "history has no preview"
    );
}

#[tokio::test]
async fn a_failed_preview_is_reported_and_retried_later() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |_| {}).await;
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let calls = calls.clone();
        a.set_preview(Arc::new(move |_: &Approval, _: &str| {
            calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Err("upstream answered 503".to_owned()) })
        }));
    }
    let mut n = rollback();
    n.preview_tool = Some("preview_remediation".to_owned());
    let p = a.request(n).await.expect("request");
    assert_eq!(
        a.preview(&p, "bob").await.expect("attempted"),
        Err("upstream answered 503".to_owned())
    );
    assert!(a.preview(&p, "bob").await.expect("cached").is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "errors are cached briefly");
}

#[tokio::test]
async fn status_and_console_urls_use_the_public_admin_url() {
    let dir = tempfile::tempdir().expect("dir");
    let (a, _r) = open_in(dir.path(), &clock_at(T0), |c| {
        c.public_url = Some("https://fw-admin.example/".to_owned());
    })
    .await;
    let p = a.request(rollback()).await.expect("request");
    assert_eq!(
        a.status_url(&p.id),
        format!("https://fw-admin.example/approvals/{}", p.id)
    );
    a.set_public_url("http://10.0.0.1:9090");
    assert_eq!(
        a.console_url(&p.id),
        format!("http://10.0.0.1:9090/console#{}", p.id)
    );
}
