//! Finding the tool token on a request, splitting it into its JWS parts, and
//! [`TokenError`], the one error type every refusal of a token uses.
//!
//! Invariants:
//! - a request carrying two *different* tokens is refused, whatever their
//!   validity, so nothing downstream has to guess which one was meant;
//! - every [`TokenError`] message is safe to put in a quoted
//!   `WWW-Authenticate` `error_description` (RFC 6750 §3: no `"` or `\`, only
//!   visible ASCII): values taken from the token pass through `shown`, and
//!   no message ever contains the token or a secret.

use std::borrow::Cow;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{HeaderMap, HeaderName, StatusCode};
use serde::Deserialize;

use super::{Alg, Audience};

/// Longest token accepted, in bytes. Real tool tokens are under 2 KiB; the
/// bound caps the work an attacker can make us do before the signature check.
pub(crate) const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Longest accepted string claim (and project name), in bytes.
pub(crate) const MAX_CLAIM_BYTES: usize = 256;

/// Most entries accepted in `projects` or `project_ceiling`.
pub(crate) const MAX_PROJECTS: usize = 1024;

/// Longest value from a token echoed in an error message.
const MAX_SHOWN: usize = 64;

/// Why a token is refused. Messages are precise, contain no secret and are
/// safe in a quoted header value (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Two different tokens on one request: `Authorization: Bearer` and the
    /// token header, or one of them repeated.
    #[error("the request carries two different tokens (in {first} and {second})")]
    ConflictingTokens {
        /// Where the first token was found.
        first: String,
        /// Where the second, different one was found.
        second: String,
    },
    /// A header that should carry the token is not visible ASCII.
    #[error("the {header} header is not visible ASCII")]
    UnreadableHeader {
        /// The header name.
        header: String,
    },
    /// A header names the bearer scheme but carries no token.
    #[error("the {header} header carries an empty token")]
    EmptyToken {
        /// The header name.
        header: String,
    },
    /// The token exceeds [`MAX_TOKEN_BYTES`].
    #[error("token is {len} bytes, more than the {max} accepted")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not a well-formed JWS compact serialization.
    #[error("token is malformed: {0}")]
    Malformed(Malformed),
    /// `alg: none`.
    #[error("alg none is never accepted")]
    AlgNone,
    /// An algorithm outside the supported set.
    #[error("alg {alg} is not supported (RS256, PS256, ES256, ES384, EdDSA, HS256 are)")]
    UnsupportedAlg {
        /// The header's `alg`, sanitized.
        alg: String,
    },
    /// The header has `crit`: no extension is understood, so RFC 7515 §4.1.11
    /// requires refusal.
    #[error("critical header parameters (crit) are not supported")]
    CriticalHeader,
    /// No configured or published key has this `kid`, even after a refresh.
    #[error("no key has kid {kid}")]
    UnknownKid {
        /// The header's `kid`, sanitized.
        kid: String,
    },
    /// The key named by `kid` is pinned to another algorithm.
    #[error("token alg {token_alg} does not match key {kid}, which is pinned to {key_alg}")]
    AlgMismatch {
        /// The key id, sanitized.
        kid: String,
        /// The header's algorithm.
        token_alg: Alg,
        /// The key's algorithm.
        key_alg: Alg,
    },
    /// No `kid`, and no key is pinned to the header's algorithm.
    #[error("token has no kid and no key is pinned to {alg}")]
    NoKeyForAlg {
        /// The header's algorithm.
        alg: Alg,
    },
    /// The signature does not verify with the selected key(s).
    #[error("signature does not verify")]
    BadSignature,
    /// `iss` is not a configured issuer.
    #[error("issuer {iss} is not trusted")]
    UntrustedIssuer {
        /// The `iss` claim, sanitized.
        iss: String,
    },
    /// `aud` does not contain the expected audience.
    #[error("aud does not include the {expected} audience")]
    WrongAudience {
        /// The audience checked for.
        expected: Audience,
    },
    /// `aud` contains both the MCP and the admin audience.
    #[error("aud names both the mcp and the admin audience; a token is for one of them")]
    BothAudiences,
    /// `exp` has passed (beyond the leeway).
    #[error("token expired at {exp} (now {now})")]
    Expired {
        /// The `exp` claim.
        exp: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// `nbf` is in the future (beyond the leeway).
    #[error("token is not valid before {nbf} (now {now})")]
    NotYetValid {
        /// The `nbf` claim.
        nbf: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// `iat` is in the future (beyond the leeway).
    #[error("token is issued in the future at {iat} (now {now})")]
    IssuedInFuture {
        /// The `iat` claim.
        iat: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// `exp - iat` exceeds `max_lifetime_s`.
    #[error("token lifetime {lifetime_s}s exceeds the {max_s}s maximum")]
    LifetimeTooLong {
        /// `exp - iat`.
        lifetime_s: u64,
        /// The configured maximum.
        max_s: u64,
    },
    /// A required claim is absent (or null).
    #[error("claim {claim} is missing")]
    MissingClaim {
        /// The claim name.
        claim: &'static str,
    },
    /// A claim is present but unacceptable.
    #[error("claim {claim} {problem}")]
    InvalidClaim {
        /// The claim name.
        claim: &'static str,
        /// What is wrong with it.
        problem: ClaimProblem,
    },
    /// The scope the audience requires is not granted (HTTP 403
    /// `insufficient_scope`).
    #[error("scope {scope} is required")]
    MissingScope {
        /// The required scope (from config, not the token).
        scope: String,
    },
    /// Mode `service_account` from an issuer other than
    /// `auth.service_account_issuer`.
    #[error("mode service_account is not allowed for tokens from issuer {iss}")]
    ServiceAccountNotAllowed {
        /// The `iss` claim, sanitized.
        iss: String,
    },
}

/// How a token fails to be a JWS compact serialization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Not exactly three dot-separated parts.
    #[error("not three dot-separated parts")]
    NotThreeParts,
    /// The header part is not base64url.
    #[error("header is not base64url")]
    HeaderEncoding,
    /// The header is not a JSON object with a string `alg`.
    #[error("header is not a JSON object with a string alg")]
    HeaderJson,
    /// The payload part is not base64url.
    #[error("payload is not base64url")]
    PayloadEncoding,
    /// The payload is not a JSON object (or repeats a member).
    #[error("payload is not a JSON object without repeated members")]
    PayloadJson,
    /// The signature part is empty or not base64url.
    #[error("signature is not base64url")]
    SignatureEncoding,
}

/// What is wrong with a present claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimProblem {
    /// Wrong JSON type.
    #[error("must be {expected}")]
    WrongType {
        /// The expected shape.
        expected: &'static str,
    },
    /// Empty string (or empty entry).
    #[error("must not be empty")]
    Empty,
    /// Longer than [`MAX_CLAIM_BYTES`] (or more than [`MAX_PROJECTS`] entries).
    #[error("is longer than {max}")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// Contains a control character.
    #[error("contains a control character")]
    ControlCharacter,
    /// `mode` is not `caller`, `agent` or `service_account`.
    #[error("must be caller, agent or service_account")]
    UnknownMode,
    /// `exp` is not after `iat`.
    #[error("must be later than iat")]
    NotAfterIat,
}

impl TokenError {
    /// The HTTP status the proxy should answer: 400 for a request carrying two
    /// tokens, 403 for a missing scope (MCP authorization spec §5.3), 401
    /// otherwise.
    pub fn status(&self) -> StatusCode {
        match self {
            TokenError::ConflictingTokens { .. } => StatusCode::BAD_REQUEST,
            TokenError::MissingScope { .. } => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        }
    }

    /// The RFC 6750 `error` code for `WWW-Authenticate`.
    pub fn oauth_error(&self) -> &'static str {
        match self {
            TokenError::ConflictingTokens { .. } => "invalid_request",
            TokenError::MissingScope { .. } => "insufficient_scope",
            _ => "invalid_token",
        }
    }
}

/// Finds the token in `Authorization: Bearer …` or in the configured header
/// (raw, or itself prefixed with `Bearer `).
///
/// `Authorization` with another scheme (`Basic`, ...) is not ours and is
/// ignored. Two *different* tokens anywhere (including a repeated header) are
/// [`TokenError::ConflictingTokens`] (the proxy answers 400); the same token in
/// both places is fine. Borrowed from the header map: no allocation.
pub fn extract<'h>(
    headers: &'h HeaderMap,
    header: &HeaderName,
) -> Result<Option<&'h str>, TokenError> {
    let authorization = &http::header::AUTHORIZATION;
    let mut found = None;
    for value in headers.get_all(authorization) {
        let text = value.to_str().map_err(|_| unreadable(authorization))?;
        if let Some(token) = strip_bearer(text) {
            take(
                &mut found,
                non_empty(token, authorization)?,
                authorization.as_str(),
            )?;
        }
    }
    for value in headers.get_all(header) {
        let text = value.to_str().map_err(|_| unreadable(header))?;
        let token = strip_bearer(text).unwrap_or(text);
        take(&mut found, non_empty(token, header)?, header.as_str())?;
    }
    Ok(found.map(|(token, _)| token))
}

/// Records a token found in header `from`; a different one seen before is a
/// conflict.
fn take<'h, 'n>(
    found: &mut Option<(&'h str, &'n str)>,
    token: &'h str,
    from: &'n str,
) -> Result<(), TokenError> {
    match *found {
        Some((prev, prev_from)) if prev != token => Err(TokenError::ConflictingTokens {
            first: prev_from.to_owned(),
            second: from.to_owned(),
        }),
        Some(_) => Ok(()),
        None => {
            *found = Some((token, from));
            Ok(())
        }
    }
}

fn unreadable(header: &HeaderName) -> TokenError {
    TokenError::UnreadableHeader {
        header: header.as_str().to_owned(),
    }
}

fn non_empty<'h>(token: &'h str, header: &HeaderName) -> Result<&'h str, TokenError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(TokenError::EmptyToken {
            header: header.as_str().to_owned(),
        });
    }
    Ok(token)
}

/// The credentials after a `Bearer` scheme (case-insensitive, RFC 7235 §2.1),
/// or `None` for another scheme.
fn strip_bearer(value: &str) -> Option<&str> {
    let value = value.trim_start();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    if rest.is_empty() {
        return Some(rest);
    }
    rest.starts_with(' ').then_some(rest)
}

/// A token split into its JWS compact parts (all still base64url text).
pub(crate) struct Parts<'t> {
    /// `header.payload`: the bytes the signature covers.
    pub signing_input: &'t str,
    /// The encoded header.
    pub header: &'t str,
    /// The encoded payload.
    pub payload: &'t str,
    /// The encoded signature.
    pub signature: &'t str,
}

/// Splits a token into its three parts, checking size and count only.
pub(crate) fn split(token: &str) -> Result<Parts<'_>, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLarge {
            len: token.len(),
            max: MAX_TOKEN_BYTES,
        });
    }
    let (signing_input, signature) = token
        .rsplit_once('.')
        .ok_or(TokenError::Malformed(Malformed::NotThreeParts))?;
    let (header, payload) = signing_input
        .split_once('.')
        .ok_or(TokenError::Malformed(Malformed::NotThreeParts))?;
    if payload.contains('.') {
        return Err(TokenError::Malformed(Malformed::NotThreeParts));
    }
    Ok(Parts {
        signing_input,
        header,
        payload,
        signature,
    })
}

impl Parts<'_> {
    /// Checks the signature part is non-empty base64url. Separate from
    /// [`split`] so an unsigned `alg: none` token is reported as such.
    pub(crate) fn check_signature_encoding(&self) -> Result<(), TokenError> {
        if self.signature.is_empty() || !is_base64url(self.signature) {
            return Err(TokenError::Malformed(Malformed::SignatureEncoding));
        }
        Ok(())
    }
}

fn is_base64url(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Base64url-decodes one part (no padding, as RFC 7515 requires).
pub(crate) fn decode_part(part: &str, err: Malformed) -> Result<Vec<u8>, TokenError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::Malformed(err))
}

/// The JOSE header members this verifier reads.
#[derive(Deserialize)]
pub(crate) struct RawHeader<'a> {
    #[serde(borrow)]
    pub alg: Cow<'a, str>,
    #[serde(borrow, default)]
    pub kid: Option<Cow<'a, str>>,
    #[serde(default)]
    pub crit: Option<serde::de::IgnoredAny>,
}

/// What the header says, checked: a supported `alg`, no `crit`.
pub(crate) struct Header {
    /// The algorithm.
    pub alg: Alg,
    /// The key id, if any.
    pub kid: Option<String>,
}

/// Parses and checks a decoded header.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header, TokenError> {
    let raw: RawHeader<'_> =
        serde_json::from_slice(bytes).map_err(|_| TokenError::Malformed(Malformed::HeaderJson))?;
    if raw.crit.is_some() {
        return Err(TokenError::CriticalHeader);
    }
    let alg = match Alg::from_name(&raw.alg) {
        Some(alg) => alg,
        None if raw.alg.eq_ignore_ascii_case("none") => return Err(TokenError::AlgNone),
        None => {
            return Err(TokenError::UnsupportedAlg {
                alg: shown(&raw.alg),
            })
        }
    };
    Ok(Header {
        alg,
        kid: raw.kid.map(Cow::into_owned),
    })
}

/// A value from a token made safe for an error message: visible ASCII other
/// than `"` and `\`, at most [`MAX_SHOWN`] characters (longer ones end in `...`).
pub(crate) fn shown(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_SHOWN + 3));
    for (i, c) in value.chars().enumerate() {
        if i == MAX_SHOWN {
            out.push_str("...");
            break;
        }
        out.push(if c.is_ascii_graphic() && c != '"' && c != '\\' {
            c
        } else {
            '?'
        });
    }
    if out.is_empty() {
        out.push_str("(empty)");
    }
    out
}

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;
