//! Tool tokens for the bench: one ES256 key generated per run, and pools of
//! tokens, one distinct run per token, so the firewall pays a real first-time
//! verification for every token (ES256 costs tens of microseconds; cached
//! afterwards).
//!
//! Invariants: the private key never leaves this process (only the public
//! PEM is written for the firewall's config); every token of a pool has its
//! own `run_id` and `jti`; tokens are stored as ready `Authorization` header
//! values so sending one is a reference-count bump.

use std::time::Duration;

use http::HeaderValue;
use mcp_firewall::auth::{self, Alg, Audience, AuthConfig, MintClaims, Mode, SigningKey};

/// `iss` of bench tokens.
pub const ISSUER: &str = "https://idp.mcp-bench.local";
/// `aud` of bench tokens (the firewall's `auth.mcp_audience`).
pub const AUDIENCE: &str = "mcp-firewall-bench";
/// `kid` of the bench key.
pub const KID: &str = "bench-es256";
/// Longest token lifetime the generated config accepts (`auth.max_lifetime_s`).
pub const MAX_LIFETIME: Duration = Duration::from_secs(4 * 3600);

/// The role allowed to read every bench tool.
pub const ROLE_READER: &str = "bench-reader";
/// The role that may use every risk (writes and destructive calls wait for approval).
pub const ROLE_OPERATOR: &str = "bench-operator";
/// A reader with a step cap per run.
pub const ROLE_CAPPED: &str = "bench-capped";
/// The project every bench role and upstream belongs to.
pub const PROJECT: &str = "bench";

/// Why tokens could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Generating the key pair failed.
    #[error("generating the ES256 key: {0}")]
    KeyGen(#[source] rcgen::Error),
    /// The firewall's signing helpers refused the key or claims.
    #[error("minting a token: {0}")]
    Mint(#[source] auth::MintError),
    /// The auth config used for minting does not deserialize.
    #[error("building the minting config: {0}")]
    Config(#[source] serde_json::Error),
    /// A token is not a valid header value (cannot happen for base64url).
    #[error("token is not a valid header value")]
    Header,
}

/// The bench's identity provider: an ES256 key pair.
pub struct Issuer {
    key: SigningKey,
    public_pem: String,
    cfg: AuthConfig,
}

/// Token pools by role, as `Authorization: Bearer` values.
#[derive(Clone)]
pub struct Tokens {
    /// [`ROLE_READER`] tokens.
    pub reader: Vec<HeaderValue>,
    /// [`ROLE_OPERATOR`] tokens.
    pub operator: Vec<HeaderValue>,
    /// [`ROLE_CAPPED`] tokens.
    pub capped: Vec<HeaderValue>,
    /// [`ROLE_READER`] tokens of the scale scenario (its own distinct runs);
    /// empty unless a scale cell is planned ([`Issuer::tokens_with_scale`]).
    pub scale: Vec<HeaderValue>,
}

// === impl Issuer ===

impl Issuer {
    /// Generates a fresh P-256 key pair.
    pub fn generate() -> Result<Issuer, TokenError> {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(TokenError::KeyGen)?;
        let key = SigningKey::from_pem(Alg::ES256, pair.serialize_pem().as_bytes(), Some(KID))
            .map_err(TokenError::Mint)?;
        let cfg: AuthConfig = serde_json::from_value(serde_json::json!({
            "mcp_audience": AUDIENCE,
            "admin_audience": "mcp-firewall-bench-admin",
            "issuers": [ISSUER],
            "max_lifetime_s": MAX_LIFETIME.as_secs(),
        }))
        .map_err(TokenError::Config)?;
        Ok(Issuer {
            key,
            public_pem: pair.public_key_pem(),
            cfg,
        })
    }

    /// The public key in PEM (SPKI) form, for `[[auth.keys]] pem_file`.
    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// `n` tokens of `role`, each for a distinct run, valid for `lifetime`.
    /// Signing is spread over `threads` OS threads (ES256 signing is the
    /// slow part of starting a run), each allowed on CPUs `0..threads`: the
    /// harness's main thread may be pinned to one CPU, and threads inherit
    /// that.
    pub fn pool(
        &self,
        role: &str,
        n: usize,
        lifetime: Duration,
        threads: usize,
    ) -> Result<Vec<HeaderValue>, TokenError> {
        let threads = threads.clamp(1, 16);
        let chunk = n.div_ceil(threads).max(1);
        let ranges: Vec<(usize, usize)> = (0..n)
            .step_by(chunk)
            .map(|s| (s, (s + chunk).min(n)))
            .collect();
        let results: Vec<Result<Vec<HeaderValue>, TokenError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranges
                .iter()
                .map(|&(from, to)| {
                    scope.spawn(move || {
                        if threads > 1 {
                            crate::procs::pin_current_thread(&(0..threads).collect::<Vec<_>>());
                        }
                        (from..to)
                            .map(|i| self.one(role, i, lifetime))
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(TokenError::Header)))
                .collect()
        });
        let mut out = Vec::with_capacity(n);
        for r in results {
            out.extend(r?);
        }
        Ok(out)
    }

    fn one(&self, role: &str, i: usize, lifetime: Duration) -> Result<HeaderValue, TokenError> {
        let claims = MintClaims {
            audience: Audience::Mcp,
            issuer: None,
            sub: format!("bench-user-{}", i % 97),
            tenant_id: "bench-tenant".to_owned(),
            agent: role.to_owned(),
            run_id: format!("{role}-run-{i}-{}", uuid::Uuid::new_v4().simple()),
            mode: Mode::Caller,
            projects: vec![PROJECT.to_owned()],
            project_ceiling: None,
            scopes: Vec::new(),
            jti: None,
            run_exp: None,
        };
        let jwt = auth::mint_with(&self.key, &self.cfg, &claims, lifetime.min(MAX_LIFETIME))
            .map_err(TokenError::Mint)?;
        HeaderValue::from_str(&format!("Bearer {jwt}")).map_err(|_| TokenError::Header)
    }

    /// Pools for every role: `readers` reader tokens, and a tenth as many
    /// (at least one) for the other roles.
    pub fn tokens(&self, readers: usize, lifetime: Duration) -> Result<Tokens, TokenError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.tokens_with_scale(readers, 0, lifetime, threads)
    }

    /// [`Issuer::tokens`] plus `scale` reader tokens of their own runs for
    /// the scale scenario (0 mints none: ES256 signing costs about a quarter
    /// of a millisecond per token, so 100,000 are only minted when asked
    /// for), signed on `threads` threads.
    pub fn tokens_with_scale(
        &self,
        readers: usize,
        scale: usize,
        lifetime: Duration,
        threads: usize,
    ) -> Result<Tokens, TokenError> {
        let others = (readers / 10).max(1);
        Ok(Tokens {
            reader: self.pool(ROLE_READER, readers.max(1), lifetime, threads)?,
            operator: self.pool(ROLE_OPERATOR, others, lifetime, threads)?,
            capped: self.pool(ROLE_CAPPED, others, lifetime, threads)?,
            scale: if scale == 0 {
                Vec::new()
            } else {
                self.pool(ROLE_READER, scale, lifetime, threads)?
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn claims(h: &HeaderValue) -> serde_json::Value {
        let t = h.to_str().unwrap().strip_prefix("Bearer ").unwrap();
        let payload = t.split('.').nth(1).unwrap();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn pool_tokens_are_distinct_runs_of_the_role() {
        let issuer = Issuer::generate().unwrap();
        let pool = issuer
            .pool(ROLE_READER, 7, Duration::from_secs(600), 3)
            .unwrap();
        assert_eq!(pool.len(), 7);
        let mut runs: Vec<String> = pool
            .iter()
            .map(|h| {
                let c = claims(h);
                assert_eq!(c["agent"], ROLE_READER);
                assert_eq!(c["aud"], AUDIENCE);
                assert_eq!(c["iss"], ISSUER);
                assert_eq!(c["projects"][0], PROJECT);
                c["run_id"].as_str().unwrap().to_owned()
            })
            .collect();
        runs.sort();
        runs.dedup();
        assert_eq!(runs.len(), 7);
    }

    #[tokio::test]
    async fn the_firewall_verifier_accepts_bench_tokens_with_the_public_key() {
        let issuer = Issuer::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("k.pem");
        std::fs::write(&pem, issuer.public_pem()).unwrap();
        let cfg: AuthConfig = serde_json::from_value(serde_json::json!({
            "mcp_audience": AUDIENCE,
            "admin_audience": "x",
            "issuers": [ISSUER],
            "max_lifetime_s": MAX_LIFETIME.as_secs(),
            "keys": [{ "kid": KID, "alg": "ES256", "pem_file": pem }],
        }))
        .unwrap();
        let verifier = auth::Verifier::new(&cfg).await.unwrap();
        let tokens = issuer.tokens(3, Duration::from_secs(600)).unwrap();
        for h in tokens.reader.iter().chain(&tokens.operator) {
            let t = h.to_str().unwrap().strip_prefix("Bearer ").unwrap();
            verifier.verify(t, Audience::Mcp).await.unwrap();
        }
        assert_eq!(tokens.operator.len(), 1);
        assert_eq!(claims(&tokens.capped[0])["agent"], ROLE_CAPPED);
        assert!(tokens.scale.is_empty());
        let with_scale = issuer
            .tokens_with_scale(2, 5, Duration::from_secs(600), 2)
            .unwrap();
        assert_eq!(with_scale.scale.len(), 5);
        for h in &with_scale.scale {
            assert_eq!(claims(h)["agent"], ROLE_READER);
            let t = h.to_str().unwrap().strip_prefix("Bearer ").unwrap();
            verifier.verify(t, Audience::Mcp).await.unwrap();
        }
    }
}
