//! The upstream credential's one place, as a property: whatever shape a
//! request takes (a call, a list, a ping, a notification, a 2025-03-26
//! batch mixing them, a session's `initialize`, GET stream and DELETE; in
//! both eras), every request the upstream receives carries the token
//! exchanged for *that* run (its `run_id`, the upstream's audience), or
//! the firewall's own for its own listing; and when the provider refuses,
//! the upstream receives nothing at all. A path that skipped the record
//! stage's credential (or sent a message the stage answered) fails it.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::common::idp::{self, Idp};
use crate::common::{self, raw, Firewall, TestConfig};
use crate::credentials::{exchange_section, exchanging, provider, secret_file};

/// One request of a case.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Call {
        stateless: bool,
    },
    List {
        stateless: bool,
    },
    /// (2025-11-25: `ping` is not a 2026-07-28 method.)
    Ping,
    Notification,
    Batch,
    Session,
}

#[derive(Debug, Clone)]
struct Case {
    shapes: Vec<Shape>,
    refused: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        any::<bool>().prop_map(|stateless| Shape::Call { stateless }),
        any::<bool>().prop_map(|stateless| Shape::List { stateless }),
        Just(Shape::Ping),
        Just(Shape::Notification),
        Just(Shape::Batch),
        Just(Shape::Session),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(shape(), 1..4),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(shapes, refused)| Case { shapes, refused })
}

const V2025: &str = "2025-11-25";

fn call_params() -> Value {
    json!({"name": "get_incident", "arguments": {"incident_id": "INC-1"}})
}

/// Sends one shape as the holder of `token`.
async fn send(fw: &Firewall, token: &str, shape: Shape) {
    let url = fw.mcp_url("incidents");
    let old = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}).to_string()
    };
    let modern = |method: &str, name: &str, params: Value| {
        crate::answer_path::modern(method, name, 3, params)
    };
    let post_modern = |(headers, body): (Vec<(String, String)>, String)| {
        let url = url.clone();
        async move {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .filter(|(k, v)| k != "mcp-name" || !v.is_empty())
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            common::post(&url, token, &h, &body).await;
        }
    };
    let v2025 = [("mcp-protocol-version", V2025)];
    match shape {
        Shape::Call { stateless: true } => {
            post_modern(modern("tools/call", "get_incident", call_params())).await
        }
        Shape::Call { stateless: false } => {
            common::post(&url, token, &v2025, &old("tools/call", call_params())).await;
        }
        Shape::List { stateless: true } => post_modern(modern("tools/list", "", json!({}))).await,
        Shape::List { stateless: false } => {
            common::post(&url, token, &v2025, &old("tools/list", json!({}))).await;
        }
        Shape::Ping => {
            common::post(&url, token, &v2025, &old("ping", json!({}))).await;
        }
        Shape::Notification => {
            let n = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
            common::post(&url, token, &v2025, n).await;
        }
        Shape::Batch => {
            let batch = json!([
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call_params()},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 4, "method": "ping"},
            ]);
            common::post(
                &url,
                token,
                &[("mcp-protocol-version", "2025-03-26")],
                &batch.to_string(),
            )
            .await;
        }
        Shape::Session => {
            let init = old(
                "initialize",
                json!({"protocolVersion": V2025, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
            );
            let a = common::post(&url, token, &[], &init).await;
            let Some(sid) = a.headers.get("mcp-session-id") else {
                return;
            };
            let sid = sid.to_str().unwrap().to_owned();
            let stream = [
                ("mcp-session-id", sid.as_str()),
                ("accept", "text/event-stream"),
            ];
            common::send(reqwest::Method::GET, &url, Some(token), &stream, None).await;
            common::send(
                reqwest::Method::DELETE,
                &url,
                Some(token),
                &[("mcp-session-id", sid.as_str())],
                None,
            )
            .await;
        }
    }
}

/// What the upstream must have received with each request: the run's
/// exchanged token, or the firewall's own on its own listing.
fn check(seen: &[raw::Seen], jwks: &Value, run: &str, what: &str) {
    for s in seen {
        let bearer = s
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_else(|| {
                panic!(
                    "{what}: a {} {} arrived without a bearer",
                    s.method,
                    s.rpc_method()
                )
            });
        let c = idp::verify(bearer, jwks, "tickets");
        if c["sub"] == "mcp-firewall" {
            assert!(c.get("run_id").is_none(), "{what}: {c}");
            assert_eq!(
                s.rpc_method(),
                "tools/list",
                "{what}: only the firewall's own listing goes with its own token"
            );
        } else {
            assert_eq!(
                c["run_id"],
                run,
                "{what}: a {} {} went with another run's token",
                s.method,
                s.rpc_method()
            );
            assert_eq!(c["act"]["sub"], "mcp-firewall", "{what}: {c}");
        }
    }
}

struct World {
    idp: Idp,
    up: raw::RawUpstream,
    fw: Firewall,
    jwks: Value,
    _secret: tempfile::TempDir,
}

static WORLD: tokio::sync::OnceCell<World> = tokio::sync::OnceCell::const_new();

async fn world() -> World {
    let idp = provider(300).await;
    let up = raw::mcp().await;
    let secret = tempfile::tempdir().unwrap();
    let secret_file = secret_file(secret.path());
    let mut section = exchange_section(&idp.token_endpoint, &secret_file);
    if let toml::Value::Table(t) = &mut section {
        // The provider's answers come at once; a refused case is quick.
        t.insert("timeout_ms".into(), 1000.into());
    }
    let cfg = exchanging(TestConfig::new(), "incidents", &up.url(), section);
    let fw = common::firewall(&cfg.text()).await;
    let jwks = idp.public_jwks().await;
    World {
        idp,
        up,
        fw,
        jwks,
        _secret: secret,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every shape, each in a run of its own: what arrives carries that
    /// run's token; with the provider refusing, nothing arrives.
    #[test]
    fn every_request_reaches_the_upstream_with_its_runs_token_or_not_at_all(c in case()) {
        common::PROPERTY_RT.block_on(async {
            let w = WORLD.get_or_init(world).await;
            let claims = common::claims("sre-lead", &["sre"]);
            let token = common::sign(&claims);
            w.idp
                .set_mode(if c.refused { "refuse" } else { "ok" })
                .await;
            let before = w.up.hits();
            for s in &c.shapes {
                send(&w.fw, &token, *s).await;
            }
            w.idp.set_mode("ok").await;
            // A relayed stream may still be closing.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let seen = w.up.seen()[before..].to_vec();
            let what = format!("{c:?}");
            if c.refused {
                assert!(
                    seen.is_empty(),
                    "{what}: the provider refused, yet the upstream received {:?}",
                    seen.iter().map(|s| format!("{} {}", s.method, s.rpc_method())).collect::<Vec<_>>()
                );
            } else {
                assert!(!seen.is_empty(), "{what}: nothing arrived");
                check(&seen, &w.jwks, &claims.run_id, &what);
            }
        });
    }
}
