//! Who the load test's agents are: run tokens given on the command line or
//! in a file (one per line, each a run), or minted from a key the operator
//! holds (an HS256 secret, or an ES256 / RS256 private key PEM) with claims
//! from a TOML template.
//!
//! Invariants: every minted token is its own run (`run_id`, `jti`); the key
//! never leaves this process; tokens are handed out round robin, so with
//! `calls_per_run` a user moves on to the next run after that many calls,
//! as an agent does when a task ends.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mcp_firewall::auth::{self, Alg, Audience, AuthConfig, MintClaims, Mode, SigningKey};
use serde::Deserialize;

/// Why no tokens could be had.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A file could not be read.
    #[error("{path}: {error}")]
    File {
        /// The file.
        path: String,
        /// What failed.
        error: String,
    },
    /// The claims template is not valid.
    #[error("claims template: {0}")]
    Claims(String),
    /// The key or claims were refused by the signer.
    #[error("minting: {0}")]
    Mint(#[from] auth::MintError),
    /// Nothing to send with.
    #[error("{0}")]
    Invalid(String),
}

/// The claims template (`--claims FILE`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsTemplate {
    /// `iss`.
    pub issuer: String,
    /// `aud` (the firewall's `auth.mcp_audience`).
    pub audience: String,
    /// `tenant_id`.
    pub tenant: String,
    /// `agent` (a role of the firewall's policy).
    pub agent: String,
    /// `sub` (`{n}` is replaced by the run's number).
    #[serde(default = "default_sub")]
    pub sub: String,
    /// `projects`.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Token lifetime in seconds.
    #[serde(default = "default_lifetime")]
    pub lifetime_s: u64,
    /// `scope` (default: the firewall's default `mcp:tools`).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// `run_id` prefix (a number and a random suffix follow).
    #[serde(default = "default_run_prefix")]
    pub run_prefix: String,
}

fn default_sub() -> String {
    "load-agent-{n}".to_owned()
}

fn default_lifetime() -> u64 {
    3600
}

fn default_run_prefix() -> String {
    "load-run".to_owned()
}

/// The key to mint with.
#[derive(Debug, Clone)]
pub enum MintKey {
    /// An HS256 shared secret.
    Secret(Vec<u8>),
    /// An ES256 or RS256 private key, PEM.
    Pem(Alg, Vec<u8>),
}

/// The tokens of a load test, handed out round robin.
#[derive(Debug)]
pub struct Identities {
    tokens: Vec<String>,
    next: AtomicUsize,
    /// Whether they were minted here (the report says so).
    pub minted: bool,
}

impl Identities {
    /// Tokens given as they are.
    pub fn given(tokens: Vec<String>) -> Result<Identities, IdentityError> {
        let tokens: Vec<String> = tokens
            .into_iter()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty() && !t.starts_with('#'))
            .collect();
        if tokens.is_empty() {
            return Err(IdentityError::Invalid(
                "no token: give --token, --token-file, or --mint-key with --claims".into(),
            ));
        }
        Ok(Identities {
            tokens,
            next: AtomicUsize::new(0),
            minted: false,
        })
    }

    /// No token at all (an upstream without authentication).
    pub fn anonymous() -> Identities {
        Identities {
            tokens: vec![String::new()],
            next: AtomicUsize::new(0),
            minted: false,
        }
    }

    /// One token per line of `path` (blank lines and `#` comments skipped).
    pub fn from_file(path: &Path) -> Result<Vec<String>, IdentityError> {
        let text = std::fs::read_to_string(path).map_err(|e| IdentityError::File {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        Ok(text.lines().map(str::to_owned).collect())
    }

    /// `runs` tokens minted with `key` from `template`.
    pub fn mint(
        key: &MintKey,
        kid: Option<&str>,
        template: &ClaimsTemplate,
        runs: usize,
    ) -> Result<Identities, IdentityError> {
        if runs == 0 {
            return Err(IdentityError::Invalid("--runs must be at least 1".into()));
        }
        let signing = match key {
            MintKey::Secret(s) => SigningKey::from_secret(s, kid)?,
            MintKey::Pem(alg, pem) => SigningKey::from_pem(*alg, pem, kid)?,
        };
        let cfg: AuthConfig = serde_json::from_value(serde_json::json!({
            "mcp_audience": template.audience,
            "admin_audience": format!("{}-admin", template.audience),
            "issuers": [template.issuer],
            "max_lifetime_s": template.lifetime_s.max(1),
        }))
        .map_err(|e| IdentityError::Claims(e.to_string()))?;
        let salt = uuid::Uuid::new_v4().simple().to_string();
        let salt = &salt[..8];
        let mut tokens = Vec::with_capacity(runs);
        for n in 0..runs {
            let claims = MintClaims {
                audience: Audience::Mcp,
                issuer: Some(template.issuer.clone()),
                sub: template.sub.replace("{n}", &n.to_string()),
                tenant_id: template.tenant.clone(),
                agent: template.agent.clone(),
                run_id: format!("{}-{n}-{salt}", template.run_prefix),
                mode: Mode::Caller,
                projects: template.projects.clone(),
                project_ceiling: None,
                scopes: template.scopes.clone(),
                jti: Some(format!("load-{salt}-{n}")),
                run_exp: None,
            };
            tokens.push(auth::mint_with(
                &signing,
                &cfg,
                &claims,
                Duration::from_secs(template.lifetime_s.max(1)),
            )?);
        }
        Ok(Identities {
            tokens,
            next: AtomicUsize::new(0),
            minted: true,
        })
    }

    /// Reads a claims template.
    pub fn template(path: &Path) -> Result<ClaimsTemplate, IdentityError> {
        let text = std::fs::read_to_string(path).map_err(|e| IdentityError::File {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| IdentityError::Claims(e.to_string()))
    }

    /// The next token (round robin over every run).
    pub fn take(&self) -> &str {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.tokens[i % self.tokens.len()]
    }

    /// How many distinct tokens (runs).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are none (never: construction refuses it).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Parses `--mint-alg`.
pub fn parse_alg(s: &str) -> Result<Alg, IdentityError> {
    match s.to_ascii_uppercase().as_str() {
        "ES256" => Ok(Alg::ES256),
        "RS256" => Ok(Alg::RS256),
        other => Err(IdentityError::Invalid(format!(
            "--mint-alg {other}: ES256 or RS256 for a PEM key (HS256 takes --mint-secret-file)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> ClaimsTemplate {
        toml::from_str(
            "issuer = \"https://idp.test\"\naudience = \"mcp-firewall\"\ntenant = \"acme\"\nagent = \"reader\"\nprojects = [\"sre\"]\n",
        )
        .unwrap()
    }

    fn claims(token: &str) -> serde_json::Value {
        use base64::Engine as _;
        let part = token.split('.').nth(1).unwrap();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn minted_tokens_are_one_run_each_with_the_template_claims() {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = MintKey::Pem(Alg::ES256, pair.serialize_pem().into_bytes());
        let ids = Identities::mint(&key, Some("k1"), &template(), 3).unwrap();
        assert_eq!(ids.len(), 3);
        let a = claims(ids.take());
        let b = claims(ids.take());
        assert_ne!(a["run_id"], b["run_id"]);
        assert_ne!(a["jti"], b["jti"]);
        assert_eq!(a["tenant_id"], "acme");
        assert_eq!(a["agent"], "reader");
        assert_eq!(a["aud"], "mcp-firewall");
        assert_eq!(a["sub"], "load-agent-0");
        let third = ids.take().to_owned();
        assert_ne!(third, ids.tokens[0]);
        assert_eq!(ids.take(), ids.tokens[0], "round robin wraps");
        let hs = Identities::mint(
            &MintKey::Secret(b"a-long-enough-secret-for-hs256-tokens!".to_vec()),
            None,
            &template(),
            1,
        )
        .unwrap();
        assert_eq!(hs.len(), 1);
        assert!(Identities::mint(&key, None, &template(), 0).is_err());
        assert!(parse_alg("HS256").is_err());
        assert!(Identities::given(vec!["  ".into(), "# comment".into()]).is_err());
        assert_eq!(
            Identities::given(vec![" t1 ".into(), "t2".into()])
                .unwrap()
                .take(),
            "t1"
        );
    }
}
