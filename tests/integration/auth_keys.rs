//! JWKS refresh against a real key server: a hyper HTTP(S) server on loopback
//! serving a JWKS the test rotates, counts and slows down.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use mcp_firewall::auth::{
    Alg, Audience, AuthConfig, JwksSourceConfig, SigningKey, TokenError, Verifier, UNKNOWN_KID_WAIT,
};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const ISS: &str = "https://issuer.test";
const MCP_AUD: &str = "https://firewall.test/mcp";

/// What the key server answers; the test changes it between requests.
struct ServerState {
    jwks: Mutex<Value>,
    status: Mutex<StatusCode>,
    delay_ms: AtomicU64,
    hits: AtomicUsize,
    /// Connections open now (a client keeps its pooled one until dropped).
    open: AtomicUsize,
}

struct KeyServer {
    url: String,
    state: Arc<ServerState>,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
    ca_file: Option<std::path::PathBuf>,
}

impl Drop for KeyServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KeyServer {
    async fn start(jwks: Value, tls: bool) -> KeyServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        let dir = tempfile::tempdir().expect("tempdir");
        let state = Arc::new(ServerState {
            jwks: Mutex::new(jwks),
            status: Mutex::new(StatusCode::OK),
            delay_ms: AtomicU64::new(0),
            hits: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
        });
        let (acceptor, ca_file) = if tls {
            let (acceptor, ca_pem) = tls_acceptor();
            let path = dir.path().join("ca.pem");
            std::fs::write(&path, ca_pem).expect("write ca");
            (Some(acceptor), Some(path))
        } else {
            (None, None)
        };
        let served = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = Arc::clone(&served);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    state.open.fetch_add(1, Ordering::SeqCst);
                    let open = Arc::clone(&state);
                    let service = service_fn(move |_req| {
                        let state = Arc::clone(&state);
                        async move {
                            state.hits.fetch_add(1, Ordering::SeqCst);
                            let delay = state.delay_ms.load(Ordering::SeqCst);
                            if delay > 0 {
                                tokio::time::sleep(Duration::from_millis(delay)).await;
                            }
                            let body = state.jwks.lock().expect("lock").to_string();
                            let status = *state.status.lock().expect("lock");
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .header("content-type", "application/jwk-set+json")
                                    .body(Full::new(Bytes::from(body)))
                                    .expect("response"),
                            )
                        }
                    });
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(tls), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                    open.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        let scheme = if tls {
            "https://localhost"
        } else {
            "http://127.0.0.1"
        };
        KeyServer {
            url: format!("{scheme}:{}/.well-known/jwks.json", addr.port()),
            state,
            task,
            _dir: dir,
            ca_file,
        }
    }

    fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    fn publish(&self, keys: &[&SigningKey]) {
        *self.state.jwks.lock().expect("lock") = jwks(keys);
    }

    fn source(&self, min_refresh_interval_s: u64) -> JwksSourceConfig {
        JwksSourceConfig {
            inline: None,
            file: None,
            url: Some(self.url.clone()),
            refresh_s: 300,
            min_refresh_interval_s,
            ca_file: self.ca_file.clone(),
            rsa_alg: "RS256".into(),
        }
    }
}

/// A CA and a `localhost` certificate it signed, both made with rcgen.
fn tls_acceptor() -> (tokio_rustls::TlsAcceptor, String) {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("ca");
    let server_key = rcgen::KeyPair::generate().expect("server key");
    let server_params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let cert = server_params.signed_by(&server_key, &ca).expect("cert");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .expect("server config");
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca.pem())
}

fn es256(kid: &str) -> SigningKey {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    SigningKey::from_pem(Alg::ES256, pair.serialize_pem().as_bytes(), Some(kid))
        .expect("signing key")
}

fn jwks(keys: &[&SigningKey]) -> Value {
    json!({ "keys": keys.iter().map(|k| k.public_jwk().expect("jwk")).collect::<Vec<_>>() })
}

fn config(source: JwksSourceConfig) -> AuthConfig {
    AuthConfig {
        header: "X-Tool-Token".into(),
        mcp_audience: MCP_AUD.into(),
        admin_audience: "https://firewall.test/admin".into(),
        required_scope: "mcp:tools".into(),
        admin_scope: "approvals".into(),
        issuers: vec![ISS.into()],
        service_account_issuer: None,
        leeway_s: 30,
        max_lifetime_s: 900,
        cache_entries: 1024,
        keys: Vec::new(),
        jwks: vec![source],
    }
}

fn token(key: &SigningKey) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    key.sign(&json!({
        "iss": ISS, "aud": MCP_AUD, "sub": "u", "tenant_id": "t", "agent": "a", "run_id": "r",
        "mode": "agent", "scope": "mcp:tools", "jti": uuid::Uuid::new_v4().to_string(),
        "iat": now, "exp": now + 300,
    }))
    .expect("sign")
}

#[tokio::test]
async fn jwks_over_https_with_a_custom_ca_verifies() {
    rustls::crypto::ring::default_provider()
        .install_default()
        .ok();
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), true).await;
    let verifier = Verifier::new(&config(server.source(10)))
        .await
        .expect("verifier");
    assert!(verifier.ready(), "the first fetch succeeded");
    assert_eq!(verifier.key_count(), 1);
    assert!(verifier.verify(&token(&a), Audience::Mcp).await.is_ok());
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn jwks_server_with_an_untrusted_certificate_is_not_trusted() {
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), true).await;
    let mut source = server.source(10);
    source.ca_file = None; // Mozilla roots do not include the test CA.
    let verifier = Verifier::new(&config(source)).await.expect("verifier");
    assert!(!verifier.ready());
    assert_eq!(verifier.key_count(), 0);
    assert_eq!(
        server.hits(),
        0,
        "the TLS handshake failed before any request"
    );
    assert!(matches!(
        verifier.verify(&token(&a), Audience::Mcp).await,
        Err(TokenError::UnknownKid { .. })
    ));
}

#[tokio::test]
async fn rotated_key_verifies_after_one_refresh_and_the_removed_key_stops_verifying() {
    let (a, b) = (es256("a"), es256("b"));
    let server = KeyServer::start(jwks(&[&a]), true).await;
    let verifier = Verifier::new(&config(server.source(10)))
        .await
        .expect("verifier");
    let token_a = token(&a);
    assert!(verifier.verify(&token_a, Audience::Mcp).await.is_ok());
    assert_eq!(verifier.cached_tokens(), 1);

    server.publish(&[&b]);
    let claims = verifier
        .verify(&token(&b), Audience::Mcp)
        .await
        .expect("new kid verifies after a refresh");
    assert_eq!(claims.kid.as_deref(), Some("b"));
    assert_eq!(server.hits(), 2, "exactly one refresh");

    // Token A was cached, but its key is gone: the key-set change invalidated it.
    assert_eq!(
        verifier.verify(&token_a, Audience::Mcp).await,
        Err(TokenError::UnknownKid { kid: "a".into() })
    );
    assert_eq!(server.hits(), 2, "the refresh is rate-limited");
}

#[tokio::test]
async fn unknown_kid_flood_causes_at_most_one_fetch_per_interval() {
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), false).await;
    let verifier = Verifier::new(&config(server.source(1)))
        .await
        .expect("verifier");
    assert_eq!(server.hits(), 1);
    let strangers: Vec<String> = (0..50)
        .map(|i| token(&es256(&format!("stranger-{i}"))))
        .collect();

    let flood = |tokens: &[String]| {
        let verifier = verifier.clone();
        let tokens = tokens.to_vec();
        async move {
            let calls = tokens.iter().map(|t| verifier.verify(t, Audience::Mcp));
            futures_util::future::join_all(calls).await
        }
    };
    // The on-demand fetch below starts the interval no earlier than this.
    let before_fetch = Instant::now();
    let results = flood(&strangers).await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(TokenError::UnknownKid { .. }))));
    assert_eq!(
        server.hits(),
        2,
        "fifty concurrent unknown kids, one shared fetch"
    );

    let results = flood(&strangers).await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(TokenError::UnknownKid { .. }))));
    assert_eq!(server.hits(), 2, "within the interval no further fetch");

    // Unknown kids keep coming: the next fetch is the first once the
    // 1 s interval has passed, and not one before.
    crate::common::eventually("the limit to reopen", Duration::from_secs(10), || async {
        let _ = verifier.verify(&strangers[0], Audience::Mcp).await;
        server.hits() > 2
    })
    .await;
    assert!(
        before_fetch.elapsed() >= Duration::from_secs(1),
        "reopened {:?} after the fetch",
        before_fetch.elapsed()
    );
    let _ = flood(&strangers).await;
    assert_eq!(server.hits(), 3, "one more fetch in the next interval");
    assert!(
        verifier.verify(&token(&a), Audience::Mcp).await.is_ok(),
        "known keys unaffected"
    );
}

#[tokio::test]
async fn slow_key_server_does_not_hold_a_request_past_the_bound() {
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), false).await;
    let verifier = Verifier::new(&config(server.source(1)))
        .await
        .expect("verifier");
    server.state.delay_ms.store(3_000, Ordering::SeqCst);

    let started = Instant::now();
    let result = verifier.verify(&token(&es256("new")), Audience::Mcp).await;
    let waited = started.elapsed();
    assert_eq!(result, Err(TokenError::UnknownKid { kid: "new".into() }));
    assert!(
        waited >= UNKNOWN_KID_WAIT - Duration::from_millis(50),
        "it did wait for the refresh: {waited:?}"
    );
    assert!(
        waited < UNKNOWN_KID_WAIT + Duration::from_millis(400),
        "held {waited:?}"
    );

    // While that fetch is still hanging, known kids verify without waiting.
    let started = Instant::now();
    assert!(verifier.verify(&token(&a), Audience::Mcp).await.is_ok());
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "known kid took {:?}",
        started.elapsed()
    );

    // Joining the hanging fetch is bounded too.
    let started = Instant::now();
    assert!(verifier
        .verify(&token(&es256("other")), Audience::Mcp)
        .await
        .is_err());
    assert!(started.elapsed() < UNKNOWN_KID_WAIT + Duration::from_millis(400));
}

#[tokio::test]
async fn failed_fetch_keeps_the_previous_keys() {
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), false).await;
    let verifier = Verifier::new(&config(server.source(1)))
        .await
        .expect("verifier");
    *server.state.status.lock().expect("lock") = StatusCode::INTERNAL_SERVER_ERROR;
    assert!(verifier
        .verify(&token(&es256("b")), Audience::Mcp)
        .await
        .is_err());
    assert_eq!(server.hits(), 2, "the refresh was attempted");
    assert_eq!(verifier.key_count(), 1);
    assert!(verifier.verify(&token(&a), Audience::Mcp).await.is_ok());
}

#[tokio::test]
async fn key_server_down_at_start_is_retried_on_demand() {
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), false).await;
    *server.state.status.lock().expect("lock") = StatusCode::SERVICE_UNAVAILABLE;
    let verifier = Verifier::new(&config(server.source(10)))
        .await
        .expect("a down key server is not fatal");
    assert!(!verifier.ready());
    *server.state.status.lock().expect("lock") = StatusCode::OK;
    assert!(
        verifier.verify(&token(&a), Audience::Mcp).await.is_ok(),
        "the start fetch does not use up the interval"
    );
    assert!(verifier.ready());
}

#[tokio::test]
async fn scheduled_refresh_revokes_removed_keys() {
    let (a, b) = (es256("a"), es256("b"));
    let server = KeyServer::start(jwks(&[&a, &b]), false).await;
    let mut source = server.source(10);
    source.refresh_s = 1;
    let verifier = Verifier::new(&config(source)).await.expect("verifier");
    let token_a = token(&a);
    assert!(verifier.verify(&token_a, Audience::Mcp).await.is_ok());
    server.publish(&[&b]);
    // The refresh task runs on its 1 s schedule: wait for its effect.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while verifier.key_count() != 1 {
        assert!(std::time::Instant::now() < deadline, "never refreshed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(server.hits() >= 2, "refreshed on schedule");
    assert_eq!(
        verifier.verify(&token_a, Audience::Mcp).await,
        Err(TokenError::UnknownKid { kid: "a".into() })
    );
}

#[tokio::test]
async fn dropping_the_verifier_stops_the_refresh_task() {
    let a = es256("a");
    let server = KeyServer::start(jwks(&[&a]), false).await;
    let mut source = server.source(10);
    source.refresh_s = 1;
    let verifier = Verifier::new(&config(source)).await.expect("verifier");
    assert_eq!(server.state.open.load(Ordering::SeqCst), 1, "pooled");
    drop(verifier);
    // The refresh task owns the HTTP client; its pooled connection closes
    // only once the task is gone, and nothing is left that could fetch.
    crate::common::wait_until(
        "the refresh task to end with the verifier",
        Duration::from_secs(10),
        || server.state.open.load(Ordering::SeqCst) == 0,
    )
    .await;
    assert_eq!(server.hits(), 1);
}
