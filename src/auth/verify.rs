//! [`Verifier`]: every check a tool token must pass, in one function, and the
//! cache that lets a repeated token skip the crypto.
//!
//! Order of checks (the first failure is the error returned): size, cache,
//! JWS shape, header (`alg` supported and not `none`, no `crit`), key
//! selection (`kid`, else the header's `alg`; the key's pinned algorithm must
//! equal the header's), signature, then the claims (`iss`, `aud`, times,
//! lifetime, identity claims, `mode`, scope). Claims are only parsed after the
//! signature verified, so nothing unauthenticated is ever interpreted beyond
//! the header.
//!
//! Invariants:
//! - a returned [`Claims`] passed every check at the verifier's clock, or was
//!   cached from such a pass under the same key-set generation and is not yet
//!   past `exp`;
//! - the request path waits for the network only on an unknown `kid`, and
//!   then at most [`super::UNKNOWN_KID_WAIT`].

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderName;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::task::JoinHandle;

use super::cache::{TokenCache, TokenDigest};
use super::config::{AuthConfig, ConfigError};
use super::jwks::{JwksError, KeyRing, StartError};
use super::keys::KeyError;
use super::token::{
    self, ClaimProblem, Header, Malformed, TokenError, MAX_CLAIM_BYTES, MAX_PROJECTS,
    MAX_TOKEN_BYTES,
};
use super::{Audience, Claims, Mode};

/// Why a [`Verifier`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    /// The `[auth]` values are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Key material could not be loaded.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A JWKS URL client could not be set up.
    #[error(transparent)]
    Jwks(#[from] JwksError),
    /// The build has no `jsonwebtoken` crypto provider.
    #[error("no jsonwebtoken crypto provider is available in this build")]
    NoCryptoProvider,
}

impl From<StartError> for VerifierError {
    fn from(e: StartError) -> VerifierError {
        match e {
            StartError::Key(e) => VerifierError::Key(e),
            StartError::Jwks(e) => VerifierError::Jwks(e),
        }
    }
}

/// The verifier's notion of now, in seconds since the epoch. Tests move a
/// manual clock to exercise expiry without sleeping.
#[derive(Clone)]
pub(crate) enum Clock {
    System,
    #[cfg(test)]
    Manual(Arc<std::sync::atomic::AtomicU64>),
}

impl Clock {
    fn now(&self) -> u64 {
        match self {
            // ~20 ns via the vDSO; a clock before 1970 reads as 0, which only
            // makes tokens look not yet valid.
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            #[cfg(test)]
            Clock::Manual(now) => now.load(std::sync::atomic::Ordering::SeqCst),
        }
    }
}

/// Verifies tool tokens. Cheap to clone (an `Arc`), `Send + Sync`; dropping
/// the last clone stops the JWKS refresh tasks.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

struct Inner {
    header: HeaderName,
    mcp_audience: String,
    admin_audience: String,
    required_scope: String,
    admin_scope: String,
    issuers: Vec<String>,
    service_account_issuer: Option<String>,
    leeway: u64,
    max_lifetime: u64,
    ring: Arc<KeyRing>,
    tasks: Vec<JoinHandle<()>>,
    cache: TokenCache,
    /// Claim values the cached tokens share.
    shared: super::shared::SharedClaims,
    clock: Clock,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("mcp_audience", &self.inner.mcp_audience)
            .field("admin_audience", &self.inner.admin_audience)
            .field("issuers", &self.inner.issuers)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Validates `cfg`, loads its keys, fetches every JWKS URL once (in
    /// parallel, each bounded by [`super::FETCH_TIMEOUT`]; a failed first
    /// fetch is logged and retried on schedule or on an unknown `kid`, see
    /// [`Verifier::ready`]) and starts the refresh tasks. Must run inside a
    /// Tokio runtime.
    pub async fn new(cfg: &AuthConfig) -> Result<Verifier, VerifierError> {
        Self::with_clock(cfg, Clock::System).await
    }

    pub(crate) async fn with_clock(
        cfg: &AuthConfig,
        clock: Clock,
    ) -> Result<Verifier, VerifierError> {
        cfg.validate()?;
        if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
            return Err(VerifierError::NoCryptoProvider);
        }
        let header = cfg.header_name()?;
        let (ring, tasks) = KeyRing::start(cfg).await?;
        Ok(Verifier {
            inner: Arc::new(Inner {
                header,
                mcp_audience: cfg.mcp_audience.clone(),
                admin_audience: cfg.admin_audience.clone(),
                required_scope: cfg.required_scope.clone(),
                admin_scope: cfg.admin_scope.clone(),
                issuers: cfg.issuers.clone(),
                service_account_issuer: cfg.service_account_issuer.clone(),
                leeway: cfg.leeway_s,
                max_lifetime: cfg.max_lifetime_s,
                ring,
                tasks,
                cache: TokenCache::new(cfg.cache_entries),
                shared: super::shared::SharedClaims::new(),
                clock,
            }),
        })
    }

    /// The configured token header, for [`token::extract`].
    pub fn header_name(&self) -> &HeaderName {
        &self.inner.header
    }

    /// Whether every JWKS URL has been fetched successfully at least once
    /// (for readiness probes). True when there are no URL sources.
    pub fn ready(&self) -> bool {
        self.inner.ring.ready()
    }

    /// How many keys are trusted right now.
    pub fn key_count(&self) -> usize {
        self.inner.ring.keys().len()
    }

    /// How many verified tokens are cached.
    pub fn cached_tokens(&self) -> usize {
        self.inner.cache.len()
    }

    /// Verifies `token` for `audience`. A cache hit costs one SHA-256 of the
    /// token and a map lookup; a miss runs every check (see the module doc).
    pub async fn verify(&self, token: &str, audience: Audience) -> Result<Arc<Claims>, TokenError> {
        self.verify_with(token, audience, true).await
    }

    /// [`Verifier::verify`] without reading or filling the cache (inspection).
    pub(crate) async fn verify_uncached(
        &self,
        token: &str,
        audience: Audience,
    ) -> Result<Arc<Claims>, TokenError> {
        self.verify_with(token, audience, false).await
    }

    async fn verify_with(
        &self,
        token: &str,
        audience: Audience,
        use_cache: bool,
    ) -> Result<Arc<Claims>, TokenError> {
        let inner = &*self.inner;
        // Size first: it bounds the hashing below as well as the parsing.
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLarge {
                len: token.len(),
                max: MAX_TOKEN_BYTES,
            });
        }
        let now = inner.clock.now();
        let mut generation = inner.ring.generation();
        let digest = (use_cache && inner.cache.enabled()).then(|| TokenDigest::of(token));
        if let Some(digest) = &digest {
            if let Some(claims) = inner.cache.get(digest, audience, now, generation) {
                return Ok(claims);
            }
        }

        let parts = token::split(token)?;
        let header = token::parse_header(&token::decode_part(
            parts.header,
            Malformed::HeaderEncoding,
        )?)?;
        parts.check_signature_encoding()?;
        let mut keys = inner.ring.keys();
        if let Err(TokenError::UnknownKid { .. }) =
            keys.candidates(header.kid.as_deref(), header.alg).map(drop)
        {
            if inner.ring.refresh_for_unknown_kid().await {
                generation = inner.ring.generation();
                keys = inner.ring.keys();
            }
        }
        // Valid base64url (checked above) that still fails to decode (a
        // dangling final character) is a signature that cannot verify.
        let signature = token::decode_part(parts.signature, Malformed::SignatureEncoding)
            .map_err(|_| TokenError::BadSignature)?;
        let verified = keys
            .candidates(header.kid.as_deref(), header.alg)?
            .any(|key| key.verifies(parts.signing_input.as_bytes(), &signature));
        if !verified {
            return Err(TokenError::BadSignature);
        }

        let payload = token::decode_part(parts.payload, Malformed::PayloadEncoding)?;
        let claims = Arc::new(self.check_claims(&payload, header, audience, now)?);
        if let Some(digest) = digest {
            inner
                .cache
                .insert(digest, Arc::clone(&claims), now, generation);
        }
        Ok(claims)
    }

    fn check_claims(
        &self,
        payload: &[u8],
        header: Header,
        audience: Audience,
        now: u64,
    ) -> Result<Claims, TokenError> {
        let inner = &*self.inner;
        let raw: RawClaims<'_> = serde_json::from_slice(payload)
            .map_err(|_| TokenError::Malformed(Malformed::PayloadJson))?;

        let iss = inner.trusted_issuer(raw.iss)?;
        inner.check_audience(raw.aud, audience)?;
        let times = inner.check_times(&raw, now)?;

        let sub = string(raw.sub, "sub")?;
        let tenant_id = string(raw.tenant_id, "tenant_id")?;
        let agent = string(raw.agent, "agent")?;
        let run_id = string(raw.run_id, "run_id")?;
        let jti = string(raw.jti, "jti")?;
        let mode_text = string(raw.mode, "mode")?;
        let mode = Mode::from_name(&mode_text).ok_or(TokenError::InvalidClaim {
            claim: "mode",
            problem: ClaimProblem::UnknownMode,
        })?;
        let projects = match (raw.projects, mode) {
            (Some(value), _) => string_list(value, "projects")?,
            (None, Mode::Caller) => return Err(TokenError::MissingClaim { claim: "projects" }),
            (None, _) => Vec::new(),
        };
        let project_ceiling = raw
            .project_ceiling
            .map(|v| string_list(v, "project_ceiling"))
            .transpose()?;
        let scopes = match raw.scope {
            Some(value) => scope_list(value)?,
            None => Vec::new(),
        };
        let delegation = actors(raw.act)?;

        if mode == Mode::ServiceAccount
            && inner.service_account_issuer.as_deref() != Some(iss.as_str())
        {
            return Err(TokenError::ServiceAccountNotAllowed {
                iss: token::shown(&iss),
            });
        }
        inner.check_scope(&scopes, audience)?;

        // What tokens of one agent have in common is held once.
        let shared = &inner.shared;
        Ok(Claims {
            sub: shared.text(&sub),
            tenant_id: shared.text(&tenant_id),
            agent: shared.text(&agent),
            run_id,
            mode,
            projects: shared.list(projects),
            project_ceiling: project_ceiling.map(|p| shared.list(p)),
            scopes: shared.list(scopes),
            jti,
            iss: shared.text(&iss),
            exp: times.exp,
            iat: times.iat,
            nbf: times.nbf,
            run_exp: times.run_exp,
            audience,
            kid: header.kid,
            delegation: delegation.into(),
        })
    }
}

/// A token's time claims, checked against the clock.
struct Times {
    exp: u64,
    iat: u64,
    nbf: Option<u64>,
    run_exp: Option<u64>,
}

impl Inner {
    /// `iss`, when it is one of the trusted issuers.
    fn trusted_issuer(&self, raw: Option<&RawValue>) -> Result<String, TokenError> {
        let iss = string(raw, "iss")?;
        if !self.issuers.contains(&iss) {
            return Err(TokenError::UntrustedIssuer {
                iss: token::shown(&iss),
            });
        }
        Ok(iss)
    }

    /// `aud` names the expected audience, and not both.
    fn check_audience(&self, raw: Option<&RawValue>, audience: Audience) -> Result<(), TokenError> {
        let aud = required(raw, "aud")?;
        let (has_mcp, has_admin) = audiences(aud, &self.mcp_audience, &self.admin_audience)?;
        if has_mcp && has_admin {
            return Err(TokenError::BothAudiences);
        }
        let has_expected = match audience {
            Audience::Mcp => has_mcp,
            Audience::Admin => has_admin,
        };
        if !has_expected {
            return Err(TokenError::WrongAudience { expected: audience });
        }
        Ok(())
    }

    /// `exp`, `iat`, `nbf` and `run_exp`: well-formed, valid at `now` within
    /// the leeway, and a lifetime no longer than allowed.
    fn check_times(&self, raw: &RawClaims<'_>, now: u64) -> Result<Times, TokenError> {
        let exp = number(raw.exp, "exp")?;
        let iat = number(raw.iat, "iat")?;
        let nbf = raw.nbf.map(|v| number(Some(v), "nbf")).transpose()?;
        let run_exp = match raw.run_exp {
            Some(v) => Some(number(Some(v), "run_exp")?),
            None => None,
        };
        let leeway = self.leeway;
        if now >= exp.saturating_add(leeway) {
            return Err(TokenError::Expired { exp, now });
        }
        if let Some(nbf) = nbf.filter(|nbf| *nbf > now.saturating_add(leeway)) {
            return Err(TokenError::NotYetValid { nbf, now });
        }
        if iat > now.saturating_add(leeway) {
            return Err(TokenError::IssuedInFuture { iat, now });
        }
        if exp <= iat {
            return Err(TokenError::InvalidClaim {
                claim: "exp",
                problem: ClaimProblem::NotAfterIat,
            });
        }
        if exp - iat > self.max_lifetime {
            return Err(TokenError::LifetimeTooLong {
                lifetime_s: exp - iat,
                max_s: self.max_lifetime,
            });
        }
        Ok(Times {
            exp,
            iat,
            nbf,
            run_exp,
        })
    }

    /// `scopes` hold the scope `audience` needs.
    fn check_scope(&self, scopes: &[String], audience: Audience) -> Result<(), TokenError> {
        let needed = match audience {
            Audience::Mcp => &self.required_scope,
            Audience::Admin => &self.admin_scope,
        };
        if !scopes.iter().any(|s| s == needed) {
            return Err(TokenError::MissingScope {
                scope: needed.clone(),
            });
        }
        Ok(())
    }
}

/// The claims read, each kept raw so a type error names its claim. Unknown
/// claims are ignored; a repeated claim fails the parse (no "last one wins"
/// ambiguity between us and the issuer).
#[derive(Deserialize)]
struct RawClaims<'a> {
    #[serde(borrow, default)]
    iss: Option<&'a RawValue>,
    #[serde(borrow, default)]
    sub: Option<&'a RawValue>,
    #[serde(borrow, default)]
    aud: Option<&'a RawValue>,
    #[serde(borrow, default)]
    exp: Option<&'a RawValue>,
    #[serde(borrow, default)]
    nbf: Option<&'a RawValue>,
    #[serde(borrow, default)]
    iat: Option<&'a RawValue>,
    #[serde(borrow, default)]
    jti: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tenant_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    agent: Option<&'a RawValue>,
    #[serde(borrow, default)]
    run_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    mode: Option<&'a RawValue>,
    #[serde(borrow, default)]
    projects: Option<&'a RawValue>,
    #[serde(borrow, default)]
    project_ceiling: Option<&'a RawValue>,
    #[serde(borrow, default)]
    scope: Option<&'a RawValue>,
    #[serde(borrow, default)]
    run_exp: Option<&'a RawValue>,
    #[serde(borrow, default)]
    act: Option<&'a RawValue>,
}

/// Most actors an `act` chain names.
const MAX_ACTORS: usize = 8;

/// An `act` claim (RFC 8693 §4.1): the current actor, and nested in it
/// the actors before it.
#[derive(Deserialize)]
struct RawActor<'a> {
    #[serde(borrow, default)]
    sub: Option<&'a RawValue>,
    #[serde(borrow, default)]
    act: Option<&'a RawValue>,
}

/// The delegation chain of an `act` claim: each actor's `sub`, the current
/// actor first; at most [`MAX_ACTORS`], each a valid claim string.
fn actors(value: Option<&RawValue>) -> Result<Vec<String>, TokenError> {
    let mut out = Vec::new();
    let mut next = value;
    while let Some(raw) = next {
        if out.len() == MAX_ACTORS {
            return Err(TokenError::InvalidClaim {
                claim: "act",
                problem: ClaimProblem::TooLong { max: MAX_ACTORS },
            });
        }
        let actor: RawActor<'_> = serde_json::from_str(raw.get())
            .map_err(|_| wrong_type("act", "an object with a sub"))?;
        let sub: String = actor
            .sub
            .and_then(|v| serde_json::from_str(v.get()).ok())
            .ok_or_else(|| wrong_type("act", "an object with a string sub"))?;
        text(&sub, "act")?;
        out.push(sub);
        next = actor.act;
    }
    Ok(out)
}

fn required<'a>(
    value: Option<&'a RawValue>,
    claim: &'static str,
) -> Result<&'a RawValue, TokenError> {
    value.ok_or(TokenError::MissingClaim { claim })
}

fn wrong_type(claim: &'static str, expected: &'static str) -> TokenError {
    TokenError::InvalidClaim {
        claim,
        problem: ClaimProblem::WrongType { expected },
    }
}

/// A required string claim, checked by [`text`].
fn string(value: Option<&RawValue>, claim: &'static str) -> Result<String, TokenError> {
    let raw = required(value, claim)?;
    let s: String = serde_json::from_str(raw.get()).map_err(|_| wrong_type(claim, "a string"))?;
    text(&s, claim)?;
    Ok(s)
}

/// Non-empty, at most [`MAX_CLAIM_BYTES`], no control characters: claims end
/// up in headers, logs and audit rows.
fn text(s: &str, claim: &'static str) -> Result<(), TokenError> {
    let problem = if s.is_empty() {
        ClaimProblem::Empty
    } else if s.len() > MAX_CLAIM_BYTES {
        ClaimProblem::TooLong {
            max: MAX_CLAIM_BYTES,
        }
    } else if s.chars().any(char::is_control) {
        ClaimProblem::ControlCharacter
    } else {
        return Ok(());
    };
    Err(TokenError::InvalidClaim { claim, problem })
}

/// A NumericDate (RFC 7519 §2): non-negative seconds, fractions truncated.
fn number(value: Option<&RawValue>, claim: &'static str) -> Result<u64, TokenError> {
    let raw = required(value, claim)?;
    let expected = "a non-negative number of seconds";
    let n: serde_json::Number =
        serde_json::from_str(raw.get()).map_err(|_| wrong_type(claim, expected))?;
    if let Some(n) = n.as_u64() {
        return Ok(n);
    }
    match n.as_f64() {
        // Truncation is the intent; the range check keeps the cast exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(f) if f.is_finite() && f >= 0.0 && f < u64::MAX as f64 => Ok(f as u64),
        _ => Err(wrong_type(claim, expected)),
    }
}

fn string_list(value: &RawValue, claim: &'static str) -> Result<Vec<String>, TokenError> {
    let list: Vec<String> =
        serde_json::from_str(value.get()).map_err(|_| wrong_type(claim, "an array of strings"))?;
    if list.len() > MAX_PROJECTS {
        return Err(TokenError::InvalidClaim {
            claim,
            problem: ClaimProblem::TooLong { max: MAX_PROJECTS },
        });
    }
    for entry in &list {
        text(entry, claim)?;
    }
    Ok(list)
}

fn scope_list(value: &RawValue) -> Result<Vec<String>, TokenError> {
    let s: String = serde_json::from_str(value.get())
        .map_err(|_| wrong_type("scope", "a space-separated string"))?;
    if s.len() > MAX_CLAIM_BYTES * 16 {
        return Err(TokenError::InvalidClaim {
            claim: "scope",
            problem: ClaimProblem::TooLong {
                max: MAX_CLAIM_BYTES * 16,
            },
        });
    }
    Ok(s.split_ascii_whitespace().map(str::to_owned).collect())
}

/// Whether `aud` (a string or an array of strings, RFC 7519 §4.1.3) contains
/// the MCP and/or the admin audience.
fn audiences(aud: &RawValue, mcp: &str, admin: &str) -> Result<(bool, bool), TokenError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
    }
    let aud: Aud = serde_json::from_str(aud.get())
        .map_err(|_| wrong_type("aud", "a string or an array of strings"))?;
    Ok(match aud {
        Aud::One(one) => (one == mcp, one == admin),
        Aud::Many(many) => (
            many.iter().any(|a| a == mcp),
            many.iter().any(|a| a == admin),
        ),
    })
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
