//! Each user's own upstream account (`auth = "oauth_user"`): the token a
//! user gave the firewall by consenting at the upstream's authorization
//! server (authorization code with PKCE, RFC 7636; the `resource` of RFC
//! 8707), kept sealed per (issuer, tenant, subject, upstream) in the
//! [`super::store`], refreshed before it expires, and sent only on runs of
//! that same subject: whatever the agent, project or run, another
//! principal's run never reads it (the owner is the verified token's).
//!
//! A run whose user has no token gets a consent link instead
//! ([`CredentialError::ConsentRequired`]): the admin listener's
//! `/connect/<upstream>?ticket=…`, the ticket sealed under the credentials
//! key (whom it is for, which upstream, until when, a nonce), usable once.
//! The authorization server's endpoints are configured, read from its
//! RFC 8414 metadata, or found through the upstream's RFC 9728
//! protected-resource metadata; a server that does not say it supports
//! PKCE with S256 is not used.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use serde::{Deserialize, Serialize};

use super::exchange::{bearer, post_token, read_issued, token_client, HttpClient, Issued};
use super::store::{Change, Filter, Owner, Record, Store, StoreError};
use super::vault::Vault;
use super::{Credential, CredentialError};
use crate::auth::Claims;
use crate::config::{AuthorizationServer, ClientAuth, Endpoints, OauthUser};
use crate::telemetry::Metrics;

/// A token is refreshed when this close to its expiry (or a tenth of its
/// life, if longer).
const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// Largest metadata document read.
const MAX_METADATA_BYTES: usize = 64 * 1024;

/// What every user credential shares: the key, the store, where links
/// point.
pub(crate) struct Keeper {
    pub(crate) vault: Vault,
    pub(crate) store: Store,
    public_url: String,
    link_ttl: Duration,
}

impl Keeper {
    /// The keeper `cfg` describes (its store opened).
    ///
    /// # Errors
    /// The store cannot be opened.
    pub(crate) async fn open(cfg: &crate::config::CredentialsConfig) -> Result<Keeper, String> {
        Ok(Keeper {
            vault: Vault::new(&cfg.key).map_err(|e| e.to_string())?,
            store: Store::open(&cfg.store).await.map_err(|e| e.to_string())?,
            public_url: cfg.public_url.clone(),
            link_ttl: cfg.link_ttl,
        })
    }
}

/// The tokens a record seals.
#[derive(Serialize, Deserialize)]
struct Tokens {
    access_token: String,
    #[serde(default)]
    refresh_token: Option<String>,
}

/// A consent link's ticket: whom it is for, until when, its nonce.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ticket {
    /// Whom the token will belong to.
    #[serde(flatten)]
    pub owner: Owner,
    /// Until when the link may be used (ms).
    pub exp_ms: u64,
    /// Its nonce (the elicitation id; single use).
    pub nonce: String,
}

/// A consent in flight: the ticket, and the PKCE verifier.
#[derive(Serialize, Deserialize)]
struct Pending {
    ticket: Ticket,
    verifier: String,
}

/// Why a consent step failed (shown on the page; never a token).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The link is altered, another upstream's, or expired.
    #[error("this link is not valid: {0}. Ask your agent again for a new one")]
    BadTicket(&'static str),
    /// The link was already used.
    #[error("this link was already used. Ask your agent again for a new one")]
    Used,
    /// The callback's state is unknown, used, or expired.
    #[error(
        "this consent is unknown, finished or expired. Start again from the link your agent gave"
    )]
    UnknownState,
    /// The authorization server said no.
    #[error("the authorization server did not grant access: {0}")]
    Denied(String),
    /// The token could not be had or kept.
    #[error("{0}")]
    Failed(String),
}

/// One upstream's users' tokens.
pub(crate) struct UserCredentials {
    upstream: String,
    upstream_url: String,
    config: Arc<OauthUser>,
    auth: Option<ClientAuth>,
    keeper: Arc<Keeper>,
    client: HttpClient,
    endpoints: tokio::sync::Mutex<Option<Endpoints>>,
    metrics: Arc<Metrics>,
    failing: AtomicBool,
}

impl UserCredentials {
    /// Upstream `upstream` (at `upstream_url`)'s users' tokens.
    ///
    /// # Errors
    /// Its `ca_file` cannot be used.
    pub(crate) fn new(
        upstream: &str,
        upstream_url: &str,
        config: Arc<OauthUser>,
        keeper: Arc<Keeper>,
        metrics: Arc<Metrics>,
    ) -> Result<UserCredentials, String> {
        let client = token_client(config.ca_file.as_deref())?;
        let endpoints = match &config.server {
            AuthorizationServer::Endpoints(e) => Some(e.clone()),
            _ => None,
        };
        Ok(UserCredentials {
            upstream: upstream.to_owned(),
            upstream_url: upstream_url.to_owned(),
            auth: config.client_secret.clone().map(ClientAuth::Secret),
            config,
            keeper,
            client,
            endpoints: tokio::sync::Mutex::new(endpoints),
            metrics,
            failing: AtomicBool::new(false),
        })
    }

    /// The users' tokens of `up`, when it takes users' own accounts.
    ///
    /// # Errors
    /// Its `ca_file` cannot be used.
    pub(crate) fn for_upstream(
        up: &crate::config::Upstream,
        keeper: &Arc<Keeper>,
        metrics: Arc<Metrics>,
    ) -> Result<Option<UserCredentials>, String> {
        match &up.auth {
            crate::config::UpstreamAuth::User(u) => UserCredentials::new(
                &up.name,
                &up.url.to_string(),
                u.clone(),
                keeper.clone(),
                metrics,
            )
            .map(Some),
            _ => Ok(None),
        }
    }

    /// The upstream's name.
    pub(crate) fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The store (listing, revoking).
    pub(crate) fn keeper(&self) -> &Keeper {
        &self.keeper
    }

    /// Whether the last use of the store or the server failed.
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    fn owner(&self, c: &Claims) -> Owner {
        Owner {
            issuer: c.iss.to_string(),
            tenant: c.tenant_id.to_string(),
            subject: c.sub.to_string(),
            upstream: self.upstream.clone(),
        }
    }

    /// The token this run's user reaches the upstream with: theirs, kept
    /// from their consent (refreshed when near its expiry); none kept: a
    /// consent link.
    ///
    /// # Errors
    /// No token kept (`ConsentRequired`), the store or the server cannot
    /// be asked, or the refresh was refused.
    pub(crate) async fn for_user(&self, claims: &Claims) -> Result<Credential, CredentialError> {
        let owner = self.owner(claims);
        let answer = self.kept(&owner).await;
        match &answer {
            Ok(_) => self.failing.store(false, Ordering::Relaxed),
            Err(
                CredentialError::Unavailable(_)
                | CredentialError::Invalid(_)
                | CredentialError::Store(_),
            ) => {
                self.failing.store(true, Ordering::Relaxed);
            }
            Err(_) => {}
        }
        match answer {
            Ok(Some(c)) => Ok(c),
            Ok(None) => {
                self.metrics
                    .credential_exchange(&self.upstream, "consent", "consent_required");
                Err(self.consent_required(owner)?)
            }
            Err(e) => Err(e),
        }
    }

    /// The kept token, refreshed if due; `None`: none usable.
    async fn kept(&self, owner: &Owner) -> Result<Option<Credential>, CredentialError> {
        let rec = self.keeper.store.get(owner).await.map_err(store_down)?;
        let Some(rec) = rec else {
            return Ok(None);
        };
        if !due(&rec) {
            return self.open(&rec).map(Some);
        }
        // Refreshed under the owner's lock: another replica may have done
        // it meanwhile.
        self.keeper
            .store
            .update(owner, |now| {
                Box::pin(async move {
                    match now {
                        None => Ok((Change::Keep, None)),
                        Some(r) if !due(&r) => Ok((Change::Keep, Some(self.open(&r)?))),
                        Some(r) if !r.refreshable => {
                            self.metrics
                                .credential_exchange(&self.upstream, "refresh", "expired");
                            Ok((Change::Delete, None))
                        }
                        Some(r) => self.refresh(r).await,
                    }
                })
            })
            .await
    }

    /// A refresh of `r` (under its lock): the new record, or its removal
    /// when the server refuses the refresh token.
    async fn refresh(&self, r: Record) -> Result<(Change, Option<Credential>), CredentialError> {
        let tokens = self.tokens(&r)?;
        let Some(refresh_token) = tokens.refresh_token.as_deref() else {
            return Ok((Change::Delete, None));
        };
        let endpoints = self.endpoints().await?;
        let mut form = vec![
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("resource", self.config.resource.as_str()),
        ];
        if !r.scope.is_empty() {
            form.push(("scope", r.scope.as_str()));
        }
        let answer = self.redeem(&endpoints.token, &form).await;
        let outcome = answer.as_ref().map_or_else(|e| e.outcome(), |_| "ok");
        self.metrics
            .credential_exchange(&self.upstream, "refresh", outcome);
        match answer {
            Ok(issued) => {
                // A server that does not rotate keeps the old refresh token.
                let keep_refresh = issued.refresh_token.clone().or(tokens.refresh_token);
                let rec = self.record(
                    r.owner.clone(),
                    &issued,
                    keep_refresh,
                    r.created_ms,
                    &r.scope,
                )?;
                let c = self.open(&rec)?;
                tracing::info!(upstream = %self.upstream, tenant = %r.owner.tenant, subject = %r.owner.subject, "user credential refreshed");
                Ok((Change::Put(rec), Some(c)))
            }
            // Only a refused grant ends the token (RFC 6749 §5.2): a
            // refused client (a wrong secret) is the firewall's to fix and
            // must not drop every user's token.
            Err(CredentialError::Refused { error, .. }) if error == "invalid_grant" => {
                tracing::warn!(upstream = %self.upstream, tenant = %r.owner.tenant, subject = %r.owner.subject, %error, "refresh refused; the user is asked to connect again");
                Ok((Change::Delete, None))
            }
            Err(e) => Err(e),
        }
    }

    fn tokens(&self, r: &Record) -> Result<Tokens, CredentialError> {
        let plain = self
            .keeper
            .vault
            .open(&r.owner.parts(), &r.sealed)
            .map_err(|e| CredentialError::Store(format!("the kept token {e}")))?;
        serde_json::from_slice(&plain)
            .map_err(|_| CredentialError::Store("the kept token is unreadable".to_owned()))
    }

    fn open(&self, r: &Record) -> Result<Credential, CredentialError> {
        let t = self.tokens(r)?;
        bearer("user", &t.access_token)
    }

    /// A record of `issued` for `owner`, sealed.
    fn record(
        &self,
        owner: Owner,
        issued: &Issued,
        refresh_token: Option<String>,
        created_ms: u64,
        asked_scope: &str,
    ) -> Result<Record, CredentialError> {
        let now = crate::clock::now_ms();
        let tokens = Tokens {
            access_token: issued.access_token.clone(),
            refresh_token,
        };
        let plain =
            serde_json::to_vec(&tokens).map_err(|e| CredentialError::Invalid(e.to_string()))?;
        let sealed = self
            .keeper
            .vault
            .seal(&owner.parts(), &plain)
            .map_err(|e| CredentialError::Invalid(e.to_string()))?;
        Ok(Record {
            owner,
            sealed,
            credential_id: super::credential_id("user", issued.access_token.as_bytes()),
            scope: issued
                .scope
                .clone()
                .unwrap_or_else(|| asked_scope.to_owned()),
            created_ms: if created_ms == 0 { now } else { created_ms },
            updated_ms: now,
            expires_ms: issued.expires_in.map_or(0, |s| now + s * 1000),
            refreshable: tokens.refresh_token.is_some(),
        })
    }

    /// The consent link for `owner`.
    fn consent_required(&self, owner: Owner) -> Result<CredentialError, CredentialError> {
        let nonce = self
            .keeper
            .vault
            .random(16)
            .map_err(|e| CredentialError::Invalid(e.to_string()))?;
        let ticket = Ticket {
            owner,
            exp_ms: crate::clock::now_ms() + self.keeper.link_ttl.as_millis() as u64,
            nonce: nonce.clone(),
        };
        let plain =
            serde_json::to_vec(&ticket).map_err(|e| CredentialError::Invalid(e.to_string()))?;
        let sealed = self
            .keeper
            .vault
            .seal(&["connect ticket", &self.upstream], &plain)
            .map_err(|e| CredentialError::Invalid(e.to_string()))?;
        let url = format!(
            "{}/connect/{}?ticket={}",
            self.keeper.public_url,
            self.upstream,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sealed)
        );
        Ok(CredentialError::ConsentRequired {
            upstream: self.upstream.clone(),
            url,
            id: nonce,
            url_client: false,
        })
    }

    /// The ticket of a consent link, if it is this upstream's and has not
    /// expired.
    ///
    /// # Errors
    /// Altered, another upstream's, or expired.
    pub(crate) fn open_ticket(&self, text: &str) -> Result<Ticket, ConnectError> {
        let sealed = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| ConnectError::BadTicket("not a ticket"))?;
        let plain = self
            .keeper
            .vault
            .open(&["connect ticket", &self.upstream], &sealed)
            .map_err(|_| ConnectError::BadTicket("altered, or for another upstream"))?;
        let t: Ticket =
            serde_json::from_slice(&plain).map_err(|_| ConnectError::BadTicket("unreadable"))?;
        if t.owner.upstream != self.upstream {
            return Err(ConnectError::BadTicket("for another upstream"));
        }
        if t.exp_ms <= crate::clock::now_ms() {
            return Err(ConnectError::BadTicket("expired"));
        }
        Ok(t)
    }

    /// The redirect URI registered at the authorization server.
    pub(crate) fn redirect_uri(&self) -> String {
        format!(
            "{}/connect/{}/callback",
            self.keeper.public_url, self.upstream
        )
    }

    /// Begins the consent `ticket` allows (once): a `state` and a PKCE
    /// verifier kept, and where the user's browser goes next.
    ///
    /// # Errors
    /// The link was used, the server's endpoints cannot be had, or the
    /// store cannot be asked.
    pub(crate) async fn begin(&self, ticket: Ticket) -> Result<String, ConnectError> {
        let endpoints = self
            .endpoints()
            .await
            .map_err(|e| ConnectError::Failed(e.to_string()))?;
        let rand = |n| {
            self.keeper
                .vault
                .random(n)
                .map_err(|e| ConnectError::Failed(e.to_string()))
        };
        let state = rand(24)?;
        let verifier = rand(32)?;
        let challenge = {
            let mut h = crate::digest::Sha256::new();
            h.update(verifier.as_bytes());
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.finalize())
        };
        let exp_ms = ticket.exp_ms;
        let nonce = ticket.nonce.clone();
        let pending = Pending { ticket, verifier };
        let plain =
            serde_json::to_vec(&pending).map_err(|e| ConnectError::Failed(e.to_string()))?;
        let sealed = self
            .keeper
            .vault
            .seal(&["consent", &self.upstream, &state], &plain)
            .map_err(|e| ConnectError::Failed(e.to_string()))?;
        let fresh = self
            .keeper
            .store
            .begin_consent(&state, &nonce, &sealed, exp_ms)
            .await
            .map_err(|e| ConnectError::Failed(e.to_string()))?;
        if !fresh {
            return Err(ConnectError::Used);
        }
        let redirect = self.redirect_uri();
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("response_type", "code")
            .append_pair("client_id", &self.config.client_id)
            .append_pair("redirect_uri", &redirect)
            .append_pair("state", &state)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("resource", &self.config.resource);
        if !self.config.scope.is_empty() {
            q.append_pair("scope", &self.config.scope);
        }
        let base = endpoints.authorization.to_string();
        let sep = if base.contains('?') { '&' } else { '?' };
        Ok(format!("{base}{sep}{}", q.finish()))
    }

    /// Completes the consent `state` names with the server's `code`: the
    /// token redeemed and kept for the ticket's owner, replacing any
    /// earlier one.
    ///
    /// # Errors
    /// The state is unknown, used or expired; the code was refused.
    pub(crate) async fn complete(&self, state: &str, code: &str) -> Result<Owner, ConnectError> {
        let pending = self.take(state).await?;
        let endpoints = self
            .endpoints()
            .await
            .map_err(|e| ConnectError::Failed(e.to_string()))?;
        let redirect = self.redirect_uri();
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect.as_str()),
            ("code_verifier", pending.verifier.as_str()),
            ("resource", self.config.resource.as_str()),
        ];
        let answer = self.redeem(&endpoints.token, &form).await;
        let outcome = answer.as_ref().map_or_else(|e| e.outcome(), |_| "ok");
        self.metrics
            .credential_exchange(&self.upstream, "consent", outcome);
        let issued = answer.map_err(|e| match e {
            CredentialError::Refused { error, .. } => ConnectError::Denied(error),
            e => ConnectError::Failed(e.to_string()),
        })?;
        let owner = pending.ticket.owner;
        let rec = self
            .record(
                owner.clone(),
                &issued,
                issued.refresh_token.clone(),
                0,
                &self.config.scope,
            )
            .map_err(|e| ConnectError::Failed(e.to_string()))?;
        let put = self
            .keeper
            .store
            .update(&owner, |_| {
                Box::pin(async move { Ok::<_, StoreError>((Change::Put(rec), ())) })
            })
            .await;
        put.map_err(|e| ConnectError::Failed(e.to_string()))?;
        tracing::info!(upstream = %self.upstream, tenant = %owner.tenant, subject = %owner.subject, "user connected their account");
        Ok(owner)
    }

    /// The consent in flight under `state`, taken once.
    async fn take(&self, state: &str) -> Result<Pending, ConnectError> {
        let sealed = self
            .keeper
            .store
            .take_consent(state)
            .await
            .map_err(|e| ConnectError::Failed(e.to_string()))?
            .ok_or(ConnectError::UnknownState)?;
        let plain = self
            .keeper
            .vault
            .open(&["consent", &self.upstream, state], &sealed)
            .map_err(|_| ConnectError::UnknownState)?;
        serde_json::from_slice(&plain).map_err(|_| ConnectError::UnknownState)
    }

    /// A consent declined at the server: its state is spent.
    pub(crate) async fn decline(&self, state: &str) {
        let _ = self.take(state).await;
    }

    /// Removes the tokens `filter` matches (of this upstream), revoking
    /// each refresh token (else its access token) at the server when it
    /// has a revocation endpoint; returns how many were removed.
    ///
    /// # Errors
    /// The store cannot be asked.
    pub(crate) async fn revoke(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        let mut filter = filter.clone();
        filter.upstream = Some(self.upstream.clone());
        let removed = self.keeper.store.remove(&filter).await?;
        for r in &removed {
            self.metrics
                .credential_exchange(&self.upstream, "revoke", "ok");
            let Ok(t) = self.tokens(r) else { continue };
            let Ok(endpoints) = self.endpoints().await else {
                continue;
            };
            let Some(at) = &endpoints.revocation else {
                continue;
            };
            let (token, hint) = match &t.refresh_token {
                Some(rt) => (rt.as_str(), "refresh_token"),
                None => (t.access_token.as_str(), "access_token"),
            };
            let form = [("token", token), ("token_type_hint", hint)];
            match post_token(
                &self.client,
                at,
                &self.config.client_id,
                self.auth.as_ref(),
                &form,
                self.config.timeout,
            )
            .await
            {
                Ok((s, _, _)) if s.is_success() => {}
                Ok((s, _, _)) => {
                    tracing::warn!(upstream = %self.upstream, status = s.as_u16(), "revocation at the authorization server refused; the token is removed here")
                }
                Err(e) => {
                    tracing::warn!(upstream = %self.upstream, error = %e, "revocation at the authorization server failed; the token is removed here")
                }
            }
        }
        Ok(removed)
    }

    /// A code or refresh token redeemed at the token endpoint.
    async fn redeem(
        &self,
        endpoint: &Uri,
        form: &[(&str, &str)],
    ) -> Result<Issued, CredentialError> {
        let (status, json, body) = post_token(
            &self.client,
            endpoint,
            &self.config.client_id,
            self.auth.as_ref(),
            form,
            self.config.timeout,
        )
        .await?;
        read_issued(status, json, &body, false)
    }

    /// The server's endpoints: configured, or discovered once (and again
    /// after a failure).
    async fn endpoints(&self) -> Result<Endpoints, CredentialError> {
        let mut known = self.endpoints.lock().await;
        if let Some(e) = known.as_ref() {
            return Ok(e.clone());
        }
        let issuer = match &self.config.server {
            AuthorizationServer::Endpoints(e) => return Ok(e.clone()),
            AuthorizationServer::Issuer(i) => i.to_string(),
            AuthorizationServer::Discovered => self.protected_resource().await?,
        };
        let e = self.server_metadata(&issuer).await?;
        *known = Some(e.clone());
        Ok(e)
    }

    /// RFC 9728: the upstream's protected-resource metadata names its
    /// authorization server (its `resource` must be the upstream's).
    async fn protected_resource(&self) -> Result<String, CredentialError> {
        #[derive(Deserialize)]
        struct Resource {
            resource: String,
            #[serde(default)]
            authorization_servers: Vec<String>,
        }
        let urls = well_known(&self.upstream_url, "oauth-protected-resource")?;
        let mut last = CredentialError::Unavailable("no metadata".to_owned());
        for url in urls {
            match self.fetch::<Resource>(&url).await {
                Ok(r) => {
                    if r.resource.trim_end_matches('/') != self.upstream_url.trim_end_matches('/') {
                        return Err(CredentialError::Invalid(format!(
                            "the protected-resource metadata names resource {:?}, not this upstream",
                            r.resource
                        )));
                    }
                    return r.authorization_servers.into_iter().next().ok_or_else(|| {
                        CredentialError::Invalid(
                            "the protected-resource metadata names no authorization server"
                                .to_owned(),
                        )
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// RFC 8414 (then OpenID Connect discovery): the issuer's endpoints;
    /// its `issuer` must be the one asked, and it must support S256.
    async fn server_metadata(&self, issuer: &str) -> Result<Endpoints, CredentialError> {
        #[derive(Deserialize)]
        struct Server {
            issuer: String,
            authorization_endpoint: String,
            token_endpoint: String,
            #[serde(default)]
            revocation_endpoint: Option<String>,
            #[serde(default)]
            code_challenge_methods_supported: Vec<String>,
        }
        let mut urls = well_known(issuer, "oauth-authorization-server")?;
        urls.extend(well_known(issuer, "openid-configuration")?);
        let mut last = CredentialError::Unavailable("no metadata".to_owned());
        for url in urls {
            match self.fetch::<Server>(&url).await {
                Ok(m) => {
                    if m.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
                        return Err(CredentialError::Invalid(format!(
                            "the metadata's issuer {:?} is not {issuer:?}",
                            m.issuer
                        )));
                    }
                    if !m
                        .code_challenge_methods_supported
                        .iter()
                        .any(|c| c == "S256")
                    {
                        return Err(CredentialError::Invalid(
                            "the authorization server does not say it supports PKCE (S256)"
                                .to_owned(),
                        ));
                    }
                    let endpoint = |s: &str| -> Result<Uri, CredentialError> {
                        let u: Uri = s.parse().map_err(|_| {
                            CredentialError::Invalid(format!("endpoint {s:?} is not a URL"))
                        })?;
                        match (u.scheme_str(), u.host()) {
                            (Some("https"), Some(_)) => Ok(u),
                            (Some("http"), Some(h)) if crate::auth::is_loopback(h) => Ok(u),
                            _ => Err(CredentialError::Invalid(format!(
                                "endpoint {s:?} is not https://"
                            ))),
                        }
                    };
                    return Ok(Endpoints {
                        authorization: endpoint(&m.authorization_endpoint)?,
                        token: endpoint(&m.token_endpoint)?,
                        revocation: m.revocation_endpoint.as_deref().map(endpoint).transpose()?,
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A metadata document, read strictly (200, JSON, bounded).
    async fn fetch<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, CredentialError> {
        let uri: Uri = url
            .parse()
            .map_err(|_| CredentialError::Invalid(format!("{url:?} is not a URL")))?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| CredentialError::Invalid(e.to_string()))?;
        let work = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| CredentialError::Unavailable(e.to_string()))?;
            if resp.status() != StatusCode::OK {
                return Err(CredentialError::Unavailable(format!(
                    "{url}: HTTP {}",
                    resp.status().as_u16()
                )));
            }
            let body = Limited::new(resp.into_body(), MAX_METADATA_BYTES)
                .collect()
                .await
                .map_err(|e| CredentialError::Unavailable(format!("{url}: {e}")))?
                .to_bytes();
            crate::http_util::read_json(&body)
                .map_err(|why| CredentialError::Invalid(format!("{url}: not the metadata: {why}")))
        };
        tokio::time::timeout(self.config.timeout, work)
            .await
            .map_err(|_| CredentialError::Unavailable(format!("{url}: no answer in time")))?
    }
}

/// The runs whose client declared, at its `initialize`, that it takes
/// URL-mode elicitation (a 2025-11-25 client says so once per session; a
/// 2026-07-28 request says so itself). Per process and bounded: a run
/// another replica initialized, or one forgotten, gets the link in an
/// error instead, which every client can show.
#[derive(Default)]
pub(crate) struct UrlClients {
    runs: dashmap::DashMap<String, ()>,
}

/// Most runs remembered; past it the memory starts over.
const MAX_URL_CLIENTS: usize = 100_000;

impl UrlClients {
    fn key(c: &Claims) -> String {
        let mut k = String::new();
        for p in [&*c.iss, &*c.tenant_id, &*c.sub, &*c.run_id] {
            k.push_str(&p.len().to_string());
            k.push(':');
            k.push_str(p);
        }
        k
    }

    /// Notes what an `initialize` request's `params` declare for the run.
    pub(crate) fn initialize(&self, c: &Claims, params: Option<&serde_json::value::RawValue>) {
        #[derive(Deserialize)]
        struct Init {
            #[serde(default)]
            capabilities: serde_json::Value,
        }
        let takes = params
            .and_then(|p| serde_json::from_str::<Init>(p.get()).ok())
            .is_some_and(|i| {
                i.capabilities
                    .pointer("/elicitation/url")
                    .is_some_and(serde_json::Value::is_object)
            });
        let key = Self::key(c);
        if takes {
            if self.runs.len() >= MAX_URL_CLIENTS {
                self.runs.clear();
            }
            self.runs.insert(key, ());
        } else {
            self.runs.remove(&key);
        }
    }

    /// Whether the run's client said it takes URL-mode elicitation.
    pub(crate) fn takes(&self, c: &Claims) -> bool {
        !self.runs.is_empty() && self.runs.contains_key(&Self::key(c))
    }
}

/// Whether a record's access token is due for refresh.
fn due(r: &Record) -> bool {
    if r.expires_ms == 0 {
        return false;
    }
    let life = r.expires_ms.saturating_sub(r.updated_ms);
    let margin = (life / 10)
        .max(REFRESH_MARGIN.as_millis() as u64)
        .min(life / 2);
    crate::clock::now_ms() + margin >= r.expires_ms
}

fn store_down(e: StoreError) -> CredentialError {
    CredentialError::Store(e.0)
}

impl From<StoreError> for CredentialError {
    fn from(e: StoreError) -> Self {
        store_down(e)
    }
}

/// The well-known URLs of `base` for `suffix` (RFC 8615, with the path
/// inserted after the suffix as RFC 8414 and RFC 9728 say), then at the
/// root.
fn well_known(base: &str, suffix: &str) -> Result<Vec<String>, CredentialError> {
    let uri: Uri = base
        .parse()
        .map_err(|_| CredentialError::Invalid(format!("{base:?} is not a URL")))?;
    let (Some(scheme), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
        return Err(CredentialError::Invalid(format!(
            "{base:?} is not an absolute URL"
        )));
    };
    let path = uri.path().trim_end_matches('/');
    let mut out = Vec::with_capacity(2);
    if !path.is_empty() {
        out.push(format!("{scheme}://{auth}/.well-known/{suffix}{path}"));
    }
    out.push(format!("{scheme}://{auth}/.well-known/{suffix}"));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_urls_insert_the_path_then_try_the_root() {
        assert_eq!(
            well_known("https://gh.example/mcp/", "oauth-protected-resource").unwrap(),
            vec![
                "https://gh.example/.well-known/oauth-protected-resource/mcp",
                "https://gh.example/.well-known/oauth-protected-resource"
            ]
        );
        assert_eq!(
            well_known("https://idp.example", "oauth-authorization-server").unwrap(),
            vec!["https://idp.example/.well-known/oauth-authorization-server"]
        );
    }

    #[test]
    fn a_token_is_due_in_its_last_tenth_or_minute() {
        let now = crate::clock::now_ms();
        let rec = |updated_ms, expires_ms| Record {
            owner: Owner {
                issuer: "i".into(),
                tenant: "t".into(),
                subject: "s".into(),
                upstream: "u".into(),
            },
            sealed: vec![],
            credential_id: String::new(),
            scope: String::new(),
            created_ms: updated_ms,
            updated_ms,
            expires_ms,
            refreshable: true,
        };
        assert!(!due(&rec(now, 0)), "no expiry said: used as is");
        assert!(!due(&rec(now, now + 3_600_000)));
        assert!(
            due(&rec(now - 3_000_000, now + 300_000)),
            "last tenth of an hour"
        );
        assert!(!due(&rec(now, now + 30_000)), "a fresh 30 s token is used");
        assert!(
            due(&rec(now - 16_000, now + 14_000)),
            "a 30 s token is refreshed past half its life"
        );
        assert!(due(&rec(now - 10, now - 1)));
    }
}
