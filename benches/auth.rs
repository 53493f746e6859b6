//! Tool-token verification cost: a full ES256 verification (what the first
//! request of a run pays) against a verified-token cache hit (every later
//! request), plus the other algorithms' full cost for comparison.
//!
//! The futures are polled once with `now_or_never`: neither path awaits
//! anything when the key is known, so no runtime overhead is measured.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use futures_util::FutureExt;
use mcp_firewall::auth::{
    Alg, Audience, AuthConfig, JwksSourceConfig, KeyConfig, SecretString, SigningKey, Verifier,
};
use serde_json::json;

const ISS: &str = "https://issuer.bench";
const MCP_AUD: &str = "https://firewall.bench/mcp";
const HS_SECRET: &str = "bench-secret-bench-secret-bench-secret";

fn key(alg: Alg) -> SigningKey {
    let pem = match alg {
        Alg::ES256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .expect("key")
            .serialize_pem(),
        Alg::ES384 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)
            .expect("key")
            .serialize_pem(),
        Alg::EdDSA => rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .expect("key")
            .serialize_pem(),
        Alg::RS256 | Alg::PS256 => std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/keys/rsa2048-private.pem"
        ))
        .expect("fixture"),
        Alg::HS256 => {
            return SigningKey::from_secret(HS_SECRET.as_bytes(), Some("HS256")).expect("key")
        }
    };
    SigningKey::from_pem(alg, pem.as_bytes(), Some(alg.name())).expect("signing key")
}

fn config(keys: &[&SigningKey], cache_entries: usize) -> AuthConfig {
    let jwks = json!({ "keys": keys.iter().filter(|k| k.alg() != Alg::HS256).map(|k| k.public_jwk().expect("jwk")).collect::<Vec<_>>() });
    let hs = KeyConfig {
        kid: Some("HS256".into()),
        alg: "HS256".into(),
        pem_file: None,
        secret_env: None,
        secret_file: None,
        secret: Some(SecretString::new(HS_SECRET)),
    };
    AuthConfig {
        header: "X-Tool-Token".into(),
        mcp_audience: MCP_AUD.into(),
        admin_audience: "https://firewall.bench/admin".into(),
        required_scope: "mcp:tools".into(),
        admin_scope: "approvals".into(),
        issuers: vec![ISS.into()],
        service_account_issuer: None,
        leeway_s: 30,
        max_lifetime_s: 900,
        cache_entries,
        keys: vec![hs],
        jwks: vec![JwksSourceConfig {
            inline: Some(jwks.to_string()),
            file: None,
            url: None,
            refresh_s: 300,
            min_refresh_interval_s: 10,
            ca_file: None,
            rsa_alg: "RS256".into(),
        }],
    }
}

fn token(key: &SigningKey) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    key.sign(&json!({
        "iss": ISS, "aud": MCP_AUD, "sub": "user-1", "tenant_id": "tenant-1", "agent": "coder",
        "run_id": "run-42", "mode": "caller", "projects": ["alpha", "beta"], "scope": "mcp:tools",
        "jti": "b1c7e0f2-1d2e-4c53-9a0e-6f1f0c0b2a11", "iat": now, "exp": now + 900,
    }))
    .expect("sign")
}

fn verification(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let keys: Vec<SigningKey> = Alg::ALL.iter().map(|alg| key(*alg)).collect();
    let refs: Vec<&SigningKey> = keys.iter().collect();
    let uncached = runtime
        .block_on(Verifier::new(&config(&refs, 0)))
        .expect("verifier");
    let cached = runtime
        .block_on(Verifier::new(&config(&refs, 1024)))
        .expect("verifier");

    let mut group = c.benchmark_group("auth");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for key in &keys {
        let t = token(key);
        group.bench_function(format!("{}_first_time", key.alg()), |b| {
            b.iter(|| {
                uncached
                    .verify(&t, Audience::Mcp)
                    .now_or_never()
                    .expect("ready")
                    .expect("valid")
            })
        });
    }
    let es256 = token(&keys[Alg::ES256 as usize]);
    cached
        .verify(&es256, Audience::Mcp)
        .now_or_never()
        .expect("ready")
        .expect("valid");
    group.bench_function("ES256_cached", |b| {
        b.iter(|| {
            cached
                .verify(&es256, Audience::Mcp)
                .now_or_never()
                .expect("ready")
                .expect("valid")
        })
    });
    group.finish();
}

criterion_group!(benches, verification);
criterion_main!(benches);
