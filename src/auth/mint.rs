//! Developer helpers behind `mcp-firewall token mint` and `token inspect`:
//! signing tool tokens with a dev HS256 key from the config (or a PEM private
//! key, for tests and local IdP stand-ins), and explaining, per audience, why
//! a token would be refused.
//!
//! Invariants:
//! - minting never produces a token the configured verifier would refuse for
//!   its lifetime or issuer: the lifetime is capped by `max_lifetime_s` and
//!   the issuer must be configured;
//! - inspection decodes without trusting: it shows the header and claims as
//!   sent, and the verdicts come from the real [`Verifier`] (uncached, so
//!   inspecting does not warm or disturb the cache).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::jwk::EllipticCurve;
use jsonwebtoken::{EncodingKey, Header};
use serde::Serialize;

use super::config::{Alg, AuthConfig};
use super::keys::{self, KeyError};
use super::token::{self, Malformed, TokenError};
use super::{Audience, Claims, Mode, Verifier};

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// The config has no HS256 key to mint with.
    #[error("auth.keys: no HS256 key configured to mint development tokens with")]
    NoDevKey,
    /// The dev key's secret could not be read.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A PEM that is not a private key for the algorithm.
    #[error("not a {alg} private key in PEM (PKCS#8) form")]
    BadPrivateKey {
        /// The requested algorithm.
        alg: Alg,
    },
    /// Lifetime zero or above `max_lifetime_s`.
    #[error("lifetime {requested_s}s is outside 1..={max_s}s (auth.max_lifetime_s)")]
    Lifetime {
        /// Requested seconds.
        requested_s: u64,
        /// The configured maximum.
        max_s: u64,
    },
    /// The issuer is not one of `auth.issuers`.
    #[error("issuer {iss:?} is not in auth.issuers; the verifier would refuse the token")]
    UntrustedIssuer {
        /// The requested issuer.
        iss: String,
    },
    /// Signing failed inside `jsonwebtoken`.
    #[error("signing failed: {0}")]
    Sign(#[source] jsonwebtoken::errors::Error),
    /// A public JWK was asked of a symmetric key.
    #[error("an HS256 key has no public JWK")]
    NoPublicJwk,
}

/// A key to sign tokens with, pinned to one algorithm.
pub struct SigningKey {
    alg: Alg,
    kid: Option<String>,
    key: EncodingKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("alg", &self.alg)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A PKCS#8 PEM private key (`RSA PRIVATE KEY` also works for RSA).
    pub fn from_pem(alg: Alg, pem: &[u8], kid: Option<&str>) -> Result<SigningKey, MintError> {
        let key = match alg {
            Alg::RS256 | Alg::PS256 => EncodingKey::from_rsa_pem(pem),
            Alg::ES256 | Alg::ES384 => EncodingKey::from_ec_pem(pem),
            Alg::EdDSA => EncodingKey::from_ed_pem(pem),
            Alg::HS256 => return Err(MintError::BadPrivateKey { alg }),
        }
        .map_err(|_| MintError::BadPrivateKey { alg })?;
        Ok(SigningKey {
            alg,
            kid: kid.map(str::to_owned),
            key,
        })
    }

    /// An HS256 secret.
    pub fn from_secret(secret: &[u8], kid: Option<&str>) -> Result<SigningKey, MintError> {
        let key = EncodingKey::from_secret(secret).map_err(MintError::Sign)?;
        Ok(SigningKey {
            alg: Alg::HS256,
            kid: kid.map(str::to_owned),
            key,
        })
    }

    /// The first HS256 key of `cfg.keys`, the development minting key.
    pub fn from_config(cfg: &AuthConfig) -> Result<SigningKey, MintError> {
        let (index, entry) = cfg
            .keys
            .iter()
            .enumerate()
            .find(|(i, k)| k.parsed_alg(*i) == Ok(Alg::HS256))
            .ok_or(MintError::NoDevKey)?;
        let secret = keys::load_secret(entry, index)?;
        SigningKey::from_secret(&secret, entry.kid.as_deref())
    }

    /// The algorithm.
    pub fn alg(&self) -> Alg {
        self.alg
    }

    /// The key id put in the header.
    pub fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// Signs arbitrary claims (no checks): header `{alg, typ: JWT, kid}`.
    pub fn sign<T: Serialize>(&self, claims: &T) -> Result<String, MintError> {
        let mut header = Header::new(self.alg.jwt());
        header.kid.clone_from(&self.kid);
        jsonwebtoken::encode(&header, claims, &self.key).map_err(MintError::Sign)
    }

    /// The public half as a JWK (with `kid`, `alg` and `use: sig`), to publish
    /// in a JWKS.
    pub fn public_jwk(&self) -> Result<serde_json::Value, MintError> {
        if self.alg == Alg::HS256 {
            return Err(MintError::NoPublicJwk);
        }
        let mut value = if self.alg == Alg::EdDSA {
            // jsonwebtoken's `Jwk::from_encoding_key` only takes 48-byte
            // PKCS#8 v1 Ed25519 keys; ring and rcgen write v2 (with the public
            // key), which its own key utilities parse fine.
            let provider = CryptoProvider::try_get_default()
                .ok_or(MintError::BadPrivateKey { alg: self.alg })?;
            let x = (provider.key_utils.ed_pub_components_from_private_key)(
                self.key.as_bytes(),
                &EllipticCurve::Ed25519,
            )
            .map_err(MintError::Sign)?;
            serde_json::json!({ "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "x": URL_SAFE_NO_PAD.encode(x) })
        } else {
            let jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&self.key, self.alg.jwt())
                .map_err(MintError::Sign)?;
            serde_json::to_value(&jwk).map_err(|e| MintError::Sign(e.into()))?
        };
        if let Some(object) = value.as_object_mut() {
            if let Some(kid) = &self.kid {
                object.insert("kid".into(), kid.clone().into());
            }
            object.insert("use".into(), "sig".into());
        }
        Ok(value)
    }
}

/// What a minted token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintClaims {
    /// The audience it is for (its `aud` is taken from the config).
    pub audience: Audience,
    /// Issuer; default the first of `auth.issuers`.
    pub issuer: Option<String>,
    /// Principal.
    pub sub: String,
    /// Tenant.
    pub tenant_id: String,
    /// Agent.
    pub agent: String,
    /// Run.
    pub run_id: String,
    /// Mode.
    pub mode: Mode,
    /// Projects.
    pub projects: Vec<String>,
    /// Optional project ceiling.
    pub project_ceiling: Option<Vec<String>>,
    /// Scopes; empty means the audience's required scope.
    pub scopes: Vec<String>,
    /// Token id; default a random UUID.
    pub jti: Option<String>,
    /// When the run ends (`run_exp`, seconds since the epoch), if it should
    /// end before the firewall's run lifetime.
    pub run_exp: Option<u64>,
}

#[derive(Serialize)]
struct Wire<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'a str,
    tenant_id: &'a str,
    agent: &'a str,
    run_id: &'a str,
    mode: Mode,
    projects: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    project_ceiling: Option<&'a [String]>,
    scope: String,
    jti: String,
    iat: u64,
    exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_exp: Option<u64>,
}

/// Mints a development token signed with the first HS256 key of `cfg`.
pub fn mint(
    cfg: &AuthConfig,
    claims: &MintClaims,
    lifetime: Duration,
) -> Result<String, MintError> {
    mint_with(&SigningKey::from_config(cfg)?, cfg, claims, lifetime)
}

/// Mints a token signed with `key` (e.g. a PEM private key in tests), with
/// `iat` now and `exp` after `lifetime`.
pub fn mint_with(
    key: &SigningKey,
    cfg: &AuthConfig,
    claims: &MintClaims,
    lifetime: Duration,
) -> Result<String, MintError> {
    let requested_s = lifetime.as_secs();
    if requested_s == 0 || requested_s > cfg.max_lifetime_s {
        return Err(MintError::Lifetime {
            requested_s,
            max_s: cfg.max_lifetime_s,
        });
    }
    let iss = match &claims.issuer {
        Some(iss) if cfg.issuers.contains(iss) => iss.as_str(),
        Some(iss) => return Err(MintError::UntrustedIssuer { iss: iss.clone() }),
        None => cfg
            .issuers
            .first()
            .map(String::as_str)
            .ok_or(MintError::UntrustedIssuer { iss: String::new() })?,
    };
    let (aud, default_scope) = match claims.audience {
        Audience::Mcp => (&cfg.mcp_audience, &cfg.required_scope),
        Audience::Admin => (&cfg.admin_audience, &cfg.admin_scope),
    };
    let scope = if claims.scopes.is_empty() {
        default_scope.clone()
    } else {
        claims.scopes.join(" ")
    };
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    key.sign(&Wire {
        iss,
        aud,
        sub: &claims.sub,
        tenant_id: &claims.tenant_id,
        agent: &claims.agent,
        run_id: &claims.run_id,
        mode: claims.mode,
        projects: &claims.projects,
        project_ceiling: claims.project_ceiling.as_deref(),
        scope,
        jti: claims
            .jti
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        iat,
        exp: iat + requested_s,
        run_exp: claims.run_exp,
    })
}

/// A token taken apart for a human.
#[derive(Debug)]
pub struct Inspection {
    /// The decoded header, if it is JSON.
    pub header: Option<serde_json::Value>,
    /// The decoded claims, if they are JSON (unverified!).
    pub claims: Option<serde_json::Value>,
    /// The verdict for the MCP audience.
    pub mcp: Result<Arc<Claims>, TokenError>,
    /// The verdict for the admin audience.
    pub admin: Result<Arc<Claims>, TokenError>,
}

/// Decodes `token` without trusting it and asks `verifier` (bypassing its
/// cache) whether it would be accepted for each audience, and if not, why.
pub async fn inspect(verifier: &Verifier, token: &str) -> Inspection {
    let decode = |part: Option<&str>, err: Malformed| {
        part.and_then(|p| token::decode_part(p, err).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
    };
    let mut parts = token.split('.');
    let header = decode(parts.next(), Malformed::HeaderEncoding);
    let claims = decode(parts.next(), Malformed::PayloadEncoding);
    let mcp = verifier.verify_uncached(token, Audience::Mcp).await;
    let admin = verifier.verify_uncached(token, Audience::Admin).await;
    Inspection {
        header,
        claims,
        mcp,
        admin,
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let json = |v: &Option<serde_json::Value>| {
            v.as_ref()
                .and_then(|v| serde_json::to_string_pretty(v).ok())
                .unwrap_or_else(|| "(not decodable)".to_owned())
        };
        writeln!(f, "header: {}", json(&self.header))?;
        writeln!(f, "claims (unverified): {}", json(&self.claims))?;
        for (name, verdict) in [("mcp", &self.mcp), ("admin", &self.admin)] {
            match verdict {
                Ok(c) if c.delegation.is_empty() => writeln!(
                    f,
                    "{name}: valid (sub {}, run {}, expires {})",
                    c.sub, c.run_id, c.exp
                )?,
                Ok(c) => writeln!(
                    f,
                    "{name}: valid (sub {}, acted for by {}, run {}, expires {})",
                    c.sub,
                    c.delegation.join(" <- "),
                    c.run_id,
                    c.exp
                )?,
                Err(e) => writeln!(f, "{name}: refused: {e}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "mint_tests.rs"]
mod tests;
