//! The RFC 8693 client: a run's verified tool token exchanged at the
//! identity provider's token endpoint for a token of one upstream's
//! audience, the firewall authenticating as its own client
//! (`client_secret_basic` or `private_key_jwt`); and the firewall's own
//! token (client credentials) for the calls it makes itself.
//!
//! The provider's answer is read strictly: HTTP 200, `application/json`,
//! at most [`MAX_ANSWER_BYTES`], one JSON object whose `access_token` is a
//! non-empty header-safe string, `token_type` `Bearer`, `issued_token_type`
//! an access token or a JWT (exchanges), and `expires_in` a positive whole
//! number of seconds when given. Anything else is an error naming what was
//! wrong, and no token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::cache::{Cache, Kept, RunKey};
use super::{credential_id, Credential};
use crate::auth::Claims;
use crate::config::{ClientAuth, TokenExchange};
use crate::telemetry::Metrics;

/// Largest answer read from a token endpoint.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A token is not sent in its last tenth of life, nor in its last
/// [`MIN_MARGIN`] (a clock apart, a request in flight).
const MIN_MARGIN: Duration = Duration::from_secs(5);

/// The longest a token without `expires_in` is kept: not at all (used for
/// the request it was asked for).
const UNKNOWN_LIFETIME: Duration = Duration::ZERO;

const GRANT_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const TYPE_JWT: &str = "urn:ietf:params:oauth:token-type:jwt";
const TYPE_ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// Why no credential could be had (`-31007`).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CredentialError {
    /// The provider refused (its OAuth `error` code and HTTP status).
    #[error("the identity provider refused the exchange ({status}: {error})")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its `error` code, or what the body was.
        error: String,
    },
    /// The provider could not be asked (connect, timeout, 5xx).
    #[error("the identity provider could not be reached: {0}")]
    Unavailable(String),
    /// Its answer could not be read as a token.
    #[error("the identity provider's answer is not a usable token: {0}")]
    Invalid(String),
    /// The run's own token is past its end.
    #[error("the run's token has expired")]
    RunEnded,
    /// The run's token is not at hand to exchange (never the firewall's
    /// own token in its place).
    #[error("the run's token is not at hand")]
    NoRunToken,
    /// The store of users' tokens cannot be used (down, or sealed under
    /// another key).
    #[error("the credential store cannot be used: {0}")]
    Store(String),
    /// The run's user has no token for this upstream (`oauth_user`): they
    /// connect their account at `url` first.
    /// (Its text leaves the link out: the link is for the user alone, not
    /// for logs and the audit trail.)
    #[error("the user has not connected their {upstream} account (consent link {id} given)")]
    ConsentRequired {
        /// The upstream.
        upstream: String,
        /// The consent page, with its link ticket.
        url: String,
        /// The elicitation's id (the link's nonce).
        id: String,
        /// The run's client said (at `initialize`) that it takes URL-mode
        /// elicitation.
        url_client: bool,
    },
}

impl CredentialError {
    /// The metric's outcome.
    pub(super) fn outcome(&self) -> &'static str {
        match self {
            CredentialError::Refused { .. }
            | CredentialError::RunEnded
            | CredentialError::NoRunToken => "refused",
            CredentialError::ConsentRequired { .. } => "consent_required",
            CredentialError::Unavailable(_) | CredentialError::Store(_) => "unavailable",
            CredentialError::Invalid(_) => "invalid",
        }
    }
}

/// The run whose token is exchanged.
#[derive(Clone, Copy)]
pub(crate) struct RunSubject<'a> {
    /// The tool token as the client sent it (verified).
    pub token: &'a str,
    /// What was verified of it.
    pub claims: &'a Claims,
}

pub(super) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One upstream's exchanges and their tokens.
pub(crate) struct Credentials {
    upstream: String,
    config: Arc<TokenExchange>,
    client: HttpClient,
    cache: Cache,
    own: tokio::sync::Mutex<Option<Kept>>,
    metrics: Arc<Metrics>,
    /// The last exchange failed (and none succeeded since): `/readyz`
    /// reports the firewall degraded.
    failing: std::sync::atomic::AtomicBool,
}

/// What a token endpoint answers with a token.
#[derive(Deserialize)]
pub(super) struct Issued {
    pub access_token: String,
    token_type: String,
    #[serde(default)]
    issued_token_type: Option<String>,
    #[serde(default)]
    pub expires_in: Option<u64>,
    /// Authorization code and refresh grants.
    #[serde(default)]
    pub refresh_token: Option<String>,
    /// What was granted, when it differs from what was asked.
    #[serde(default)]
    pub scope: Option<String>,
}

/// What it answers without one (RFC 6749 §5.2).
#[derive(Deserialize)]
struct Refusal {
    error: String,
}

impl Credentials {
    /// The exchanges of `upstream`, configured by `config`.
    ///
    /// # Errors
    /// A `ca_file` that holds no certificate, or TLS that cannot be set up.
    pub(crate) fn new(
        upstream: &str,
        config: Arc<TokenExchange>,
        metrics: Arc<Metrics>,
    ) -> Result<Credentials, String> {
        // Plain http only reaches loopback endpoints: the configuration
        // refuses it elsewhere.
        let client = token_client(config.ca_file.as_deref())?;
        Ok(Credentials {
            upstream: upstream.to_owned(),
            config,
            client,
            cache: Cache::default(),
            own: tokio::sync::Mutex::new(None),
            metrics,
            failing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The token this run reaches the upstream with: the one kept for it,
    /// or a new exchange of its tool token.
    ///
    /// # Errors
    /// The exchange failed, or the run's token is past its end.
    pub(crate) async fn for_run(&self, run: RunSubject<'_>) -> Result<Credential, CredentialError> {
        let c = run.claims;
        let ends = run_end(c).ok_or(CredentialError::RunEnded)?;
        let key = RunKey::of([&c.iss, &c.tenant_id, &c.sub, &c.agent, &c.run_id]);
        let slot = self.cache.slot(&key);
        let mut kept = slot.lock().await;
        let now = Instant::now();
        if let Some(k) = kept.as_ref().filter(|k| k.until > now) {
            self.metrics.credential_cache_hit(&self.upstream);
            return Ok(k.credential.clone());
        }
        let mut form = vec![
            ("grant_type", GRANT_EXCHANGE),
            ("subject_token", run.token),
            ("subject_token_type", TYPE_JWT),
            ("requested_token_type", TYPE_ACCESS_TOKEN),
        ];
        self.push_target(&mut form);
        let answer = self.ask(&form, true).await;
        self.note("run", &answer);
        let (credential, lifetime) = answer?;
        let until = now + lifetime.min(ends.saturating_duration_since(now));
        *kept = Some(Kept {
            credential: credential.clone(),
            until,
        });
        Ok(credential)
    }

    /// The firewall's own token for this upstream (client credentials):
    /// for the calls it makes itself, on behalf of no run.
    ///
    /// # Errors
    /// The provider refused or could not be asked.
    pub(crate) async fn own(&self) -> Result<Credential, CredentialError> {
        let mut kept = self.own.lock().await;
        let now = Instant::now();
        if let Some(k) = kept.as_ref().filter(|k| k.until > now) {
            return Ok(k.credential.clone());
        }
        let mut form = vec![("grant_type", "client_credentials")];
        self.push_target(&mut form);
        let answer = self.ask(&form, false).await;
        self.note("own", &answer);
        let (credential, lifetime) = answer?;
        *kept = Some(Kept {
            credential: credential.clone(),
            until: now + lifetime,
        });
        Ok(credential)
    }

    /// Whether the last exchange failed (none succeeded since).
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts an exchange and remembers whether it failed.
    fn note<T>(&self, purpose: &'static str, answer: &Result<T, CredentialError>) {
        let outcome = answer
            .as_ref()
            .map_or_else(CredentialError::outcome, |_| "ok");
        self.metrics
            .credential_exchange(&self.upstream, purpose, outcome);
        self.failing
            .store(answer.is_err(), std::sync::atomic::Ordering::Relaxed);
    }

    fn push_target<'a>(&'a self, form: &mut Vec<(&'static str, &'a str)>) {
        if let Some(a) = &self.config.audience {
            form.push(("audience", a));
        }
        if let Some(r) = &self.config.resource {
            form.push(("resource", r));
        }
        if let Some(s) = &self.config.scope {
            form.push(("scope", s));
        }
    }

    /// One request to the token endpoint, its answer read strictly: the
    /// credential and how long it may be kept.
    async fn ask(
        &self,
        form: &[(&str, &str)],
        exchange: bool,
    ) -> Result<(Credential, Duration), CredentialError> {
        let cfg = &self.config;
        let (status, json, body) = post_token(
            &self.client,
            &cfg.token_endpoint,
            &cfg.client_id,
            Some(&cfg.client_auth),
            form,
            cfg.timeout,
        )
        .await?;
        read_answer(status, json, &body, exchange)
    }
}

/// A client for token endpoints: `ca_file`'s certificates trusted beside
/// the system's, plain http only where the configuration allowed it
/// (loopback).
///
/// # Errors
/// A `ca_file` that cannot be read or holds no certificate.
pub(super) fn token_client(ca_file: Option<&std::path::Path>) -> Result<HttpClient, String> {
    let pem = match ca_file {
        Some(path) => {
            Some(std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?)
        }
        None => None,
    };
    let builder =
        crate::http_util::https_builder(pem.as_deref()).map_err(|e| match (e, ca_file) {
            (crate::http_util::TlsSetupError::NoCertificate, Some(path)) => {
                format!("{}: no certificate in it", path.display())
            }
            (e, _) => e.to_string(),
        })?;
    let connector = builder.https_or_http().enable_http1().build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// One form POST to a token endpoint, the client authenticated by
/// `auth` (`client_secret_basic` or `private_key_jwt`; none: a public
/// client, named by `client_id` in the form), within `timeout`: its
/// status, whether it is JSON, and its body (at most
/// [`MAX_ANSWER_BYTES`]).
pub(super) async fn post_token(
    client: &HttpClient,
    endpoint: &http::Uri,
    client_id: &str,
    auth: Option<&ClientAuth>,
    form: &[(&str, &str)],
    timeout: Duration,
) -> Result<(StatusCode, bool, Bytes), CredentialError> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(endpoint.clone())
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json");
    let mut pairs: Vec<(&str, &str)> = form.to_vec();
    let signed;
    match auth {
        Some(ClientAuth::Secret(secret)) => {
            let secret = secret.header_value().to_str().map_err(|_| {
                CredentialError::Invalid("the client secret is not text".to_owned())
            })?;
            request = request.header(header::AUTHORIZATION, basic(client_id, secret)?);
        }
        Some(ClientAuth::PrivateKey { key, alg, .. }) => {
            signed = assertion(client_id, &endpoint.to_string(), key, *alg)?;
            pairs.push(("client_id", client_id));
            pairs.push(("client_assertion_type", ASSERTION_TYPE));
            pairs.push(("client_assertion", &signed));
        }
        None => pairs.push(("client_id", client_id)),
    }
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| CredentialError::Invalid(e.to_string()))?;
    let work = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| CredentialError::Unavailable(e.to_string()))?;
        let status = response.status();
        let json = crate::http_util::mime_is(
            crate::http_util::content_type(response.headers()),
            "application/json",
        );
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<LengthLimitError>().is_some() {
                    CredentialError::Invalid(format!("answer over {MAX_ANSWER_BYTES} bytes"))
                } else {
                    CredentialError::Unavailable(format!("answer cut short: {e}"))
                }
            })?
            .to_bytes();
        Ok::<_, CredentialError>((status, json, body))
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        CredentialError::Unavailable(format!("no answer within {} ms", timeout.as_millis()))
    })?
}

/// When the run ends: its token's expiry, or `run_exp` when sooner;
/// `None` when that is past.
fn run_end(c: &Claims) -> Option<Instant> {
    let end_s = c.run_exp.map_or(c.exp, |r| r.min(c.exp));
    let now_s = crate::clock::now_ms() / 1000;
    let left = end_s.checked_sub(now_s).filter(|l| *l > 0)?;
    Some(Instant::now() + Duration::from_secs(left))
}

/// A token endpoint's answer, read strictly: the credential and how long
/// it may be kept.
fn read_answer(
    status: StatusCode,
    json: bool,
    body: &[u8],
    exchange: bool,
) -> Result<(Credential, Duration), CredentialError> {
    let issued = read_issued(status, json, body, exchange)?;
    let lifetime = keep_for(issued.expires_in);
    Ok((bearer("exchange", &issued.access_token)?, lifetime))
}

/// How long a token that lives `expires_in` seconds may be sent: its
/// life less a tenth (at least [`MIN_MARGIN`]); not at all when unsaid.
pub(super) fn keep_for(expires_in: Option<u64>) -> Duration {
    match expires_in {
        Some(s) => {
            let life = Duration::from_secs(s);
            life.saturating_sub((life / 10).max(MIN_MARGIN))
        }
        None => UNKNOWN_LIFETIME,
    }
}

/// The credential that sends `token` as a bearer (`auth` on record).
pub(super) fn bearer(auth: &'static str, token: &str) -> Result<Credential, CredentialError> {
    let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| CredentialError::Invalid("access_token is not header-safe".to_owned()))?;
    header.set_sensitive(true);
    Ok(Credential {
        header: Some(header),
        auth,
        id: Arc::from(credential_id(auth, token.as_bytes())),
    })
}

/// A token endpoint's answer, read strictly (RFC 6749 §5.1 and §5.2,
/// RFC 8693 §2.2 for exchanges): the token issued.
pub(super) fn read_issued(
    status: StatusCode,
    json: bool,
    body: &[u8],
    exchange: bool,
) -> Result<Issued, CredentialError> {
    if status.is_server_error() {
        return Err(CredentialError::Unavailable(format!(
            "HTTP {}",
            status.as_u16()
        )));
    }
    if status != StatusCode::OK {
        let error = if json {
            serde_json::from_slice::<Refusal>(body)
                .ok()
                .map(|r| r.error)
                .filter(|e| {
                    !e.is_empty() && e.len() <= 64 && e.bytes().all(|b| b.is_ascii_graphic())
                })
        } else {
            None
        }
        .unwrap_or_else(|| "no OAuth error code".to_owned());
        return Err(CredentialError::Refused {
            status: status.as_u16(),
            error,
        });
    }
    if !json {
        return Err(CredentialError::Invalid("not application/json".to_owned()));
    }
    let issued: Issued = crate::http_util::read_json(body).map_err(CredentialError::Invalid)?;
    if issued.access_token.is_empty() {
        return Err(CredentialError::Invalid("empty access_token".to_owned()));
    }
    if !issued.token_type.eq_ignore_ascii_case("bearer") {
        return Err(CredentialError::Invalid(format!(
            "token_type {:?}: only Bearer tokens are sent",
            issued.token_type
        )));
    }
    if exchange {
        match issued.issued_token_type.as_deref() {
            Some(TYPE_ACCESS_TOKEN | TYPE_JWT) => {}
            Some(other) => {
                return Err(CredentialError::Invalid(format!(
                    "issued_token_type {other:?} is not an access token"
                )))
            }
            None => {
                return Err(CredentialError::Invalid(
                    "no issued_token_type (RFC 8693 requires it)".to_owned(),
                ))
            }
        }
    }
    if issued.expires_in == Some(0) {
        return Err(CredentialError::Invalid("expires_in 0".to_owned()));
    }
    if issued
        .refresh_token
        .as_deref()
        .is_some_and(|r| r.is_empty() || !r.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(CredentialError::Invalid(
            "refresh_token is empty or not printable ASCII".to_owned(),
        ));
    }
    Ok(issued)
}

/// What the token endpoint's reader makes of an answer (HTTP `status`,
/// whether it said JSON, its `body`; `exchange`: an RFC 8693 answer): the
/// header the token would be sent in and its `expires_in`, or why it is
/// refused. For the fuzz target that holds the reader to its rules.
///
/// # Errors
/// Why the answer is no usable token.
pub fn read_token_answer(
    status: u16,
    json: bool,
    body: &[u8],
    exchange: bool,
) -> Result<(HeaderValue, Option<u64>), String> {
    let status = StatusCode::from_u16(status).map_err(|e| e.to_string())?;
    let issued = read_issued(status, json, body, exchange).map_err(|e| e.to_string())?;
    let c = bearer("exchange", &issued.access_token).map_err(|e| e.to_string())?;
    let header = c.header.ok_or_else(|| "no header".to_owned())?;
    Ok((header, issued.expires_in))
}

/// `client_secret_basic` (RFC 6749 §2.3.1: each part form-encoded first).
/// Every byte but the unreserved ones is percent-encoded (a space too, as
/// `%20` rather than `+`: servers that decode these parts as a URL rather
/// than a form read both the same).
fn basic(client_id: &str, secret: &str) -> Result<HeaderValue, CredentialError> {
    use base64::Engine as _;
    let enc = |s: &str| {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    };
    let pair = format!("{}:{}", enc(client_id), enc(secret));
    let mut v = HeaderValue::from_str(&format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    ))
    .map_err(|_| CredentialError::Invalid("client credentials are not header-safe".to_owned()))?;
    v.set_sensitive(true);
    Ok(v)
}

/// A `private_key_jwt` client assertion (RFC 7523): the client as issuer
/// and subject, the token endpoint as audience, a minute's life, a fresh
/// `jti`.
fn assertion(
    client_id: &str,
    token_endpoint: &str,
    key: &jsonwebtoken::EncodingKey,
    alg: jsonwebtoken::Algorithm,
) -> Result<String, CredentialError> {
    let now = crate::clock::now_ms() / 1000;
    let claims = serde_json::json!({
        "iss": client_id,
        "sub": client_id,
        "aud": token_endpoint,
        "iat": now,
        "exp": now + 60,
        "jti": uuid::Uuid::new_v4().to_string(),
    });
    jsonwebtoken::encode(&jsonwebtoken::Header::new(alg), &claims, key)
        .map_err(|e| CredentialError::Invalid(format!("cannot sign the client assertion: {e}")))
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
