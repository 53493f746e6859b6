//! Test support: real keys of every supported algorithm (EC and Ed25519
//! generated with rcgen, RSA from committed fixtures), configs that trust
//! them, and well-formed claims to break one at a time.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde_json::{json, Value};

use super::config::{default_cache_entries, AuthConfig, KeyConfig, SecretString};
use super::verify::Clock;
use super::{Alg, SigningKey, Verifier};

pub(crate) const ISS: &str = "https://issuer.test";
pub(crate) const SA_ISS: &str = "https://sa-issuer.test";
pub(crate) const MCP_AUD: &str = "https://firewall.test/mcp";
pub(crate) const ADMIN_AUD: &str = "https://firewall.test/admin";
pub(crate) const HS_SECRET: &str = "0123456789abcdef0123456789abcdef-dev";
/// A fixed "now" for manual clocks: 2025-01-01T00:00:00Z.
pub(crate) const NOW: u64 = 1_735_689_600;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/keys")
        .join(name)
}

/// A key pair: the signing half and the public PEM.
pub(crate) struct TestKey {
    pub signing: SigningKey,
    pub private_pem: String,
    pub public_pem: String,
}

pub(crate) fn key(alg: Alg, kid: &str) -> TestKey {
    let generated = |rcgen_alg| {
        let pair = rcgen::KeyPair::generate_for(rcgen_alg).expect("rcgen key");
        (pair.serialize_pem(), pair.public_key_pem())
    };
    let (private, public) = match alg {
        Alg::ES256 => generated(&rcgen::PKCS_ECDSA_P256_SHA256),
        Alg::ES384 => generated(&rcgen::PKCS_ECDSA_P384_SHA384),
        Alg::EdDSA => generated(&rcgen::PKCS_ED25519),
        Alg::RS256 | Alg::PS256 => (
            std::fs::read_to_string(fixture("rsa2048-private.pem")).expect("fixture"),
            std::fs::read_to_string(fixture("rsa2048-public.pem")).expect("fixture"),
        ),
        Alg::HS256 => {
            return TestKey {
                signing: SigningKey::from_secret(HS_SECRET.as_bytes(), Some(kid)).expect("hs key"),
                private_pem: String::new(),
                public_pem: String::new(),
            }
        }
    };
    TestKey {
        signing: SigningKey::from_pem(alg, private.as_bytes(), Some(kid)).expect("signing key"),
        private_pem: private,
        public_pem: public,
    }
}

pub(crate) fn rsa_public_pem() -> String {
    std::fs::read_to_string(fixture("rsa2048-public.pem")).expect("fixture")
}

pub(crate) fn rsa1024_public_pem_path() -> PathBuf {
    fixture("rsa1024-public.pem")
}

/// Keys written to disk for `pem_file`; the directory lives as long as this.
pub(crate) struct KeyFiles {
    pub dir: tempfile::TempDir,
}

impl KeyFiles {
    pub(crate) fn new() -> KeyFiles {
        KeyFiles {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// A `[[auth.keys]]` entry for `key` (PEM file, or inline HS256 secret).
    pub(crate) fn entry(&self, key: &TestKey) -> KeyConfig {
        let alg = key.signing.alg();
        let kid = key.signing.kid().map(str::to_owned);
        if alg == Alg::HS256 {
            return KeyConfig {
                kid,
                alg: alg.name().into(),
                pem_file: None,
                secret_env: None,
                secret_file: None,
                secret: Some(SecretString::new(HS_SECRET)),
            };
        }
        let path =
            self.dir
                .path()
                .join(format!("{}-{}.pem", alg, kid.as_deref().unwrap_or("nokid")));
        std::fs::write(&path, &key.public_pem).expect("write pem");
        KeyConfig {
            kid,
            alg: alg.name().into(),
            pem_file: Some(path),
            secret_env: None,
            secret_file: None,
            secret: None,
        }
    }
}

pub(crate) fn config(keys: Vec<KeyConfig>) -> AuthConfig {
    AuthConfig {
        header: "X-Tool-Token".into(),
        mcp_audience: MCP_AUD.into(),
        admin_audience: ADMIN_AUD.into(),
        required_scope: "mcp:tools".into(),
        admin_scope: "approvals".into(),
        issuers: vec![ISS.into(), SA_ISS.into()],
        service_account_issuer: Some(SA_ISS.into()),
        leeway_s: 30,
        max_lifetime_s: 900,
        cache_entries: default_cache_entries(),
        keys,
        jwks: Vec::new(),
    }
}

/// Claims that pass every check for the MCP audience at `now`.
pub(crate) fn claims(now: u64) -> Value {
    json!({
        "iss": ISS,
        "aud": MCP_AUD,
        "sub": "user-1",
        "tenant_id": "tenant-1",
        "agent": "coder",
        "run_id": "run-42",
        "mode": "caller",
        "projects": ["alpha", "beta"],
        "scope": "mcp:tools other",
        "jti": "jti-1",
        "iat": now,
        "exp": now + 300,
    })
}

/// Admin-audience variant of [`claims`].
pub(crate) fn admin_claims(now: u64) -> Value {
    let mut c = claims(now);
    c["aud"] = json!(ADMIN_AUD);
    c["scope"] = json!("approvals");
    c
}

/// A verifier on a manual clock set to [`NOW`].
pub(crate) async fn verifier(cfg: &AuthConfig) -> (Verifier, Arc<AtomicU64>) {
    let clock = Arc::new(AtomicU64::new(NOW));
    let v = Verifier::with_clock(cfg, Clock::Manual(Arc::clone(&clock)))
        .await
        .expect("verifier");
    (v, clock)
}
