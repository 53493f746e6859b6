//! `[[upstream]] auth` checked into [`UpstreamAuth`]: what the firewall
//! presents to an upstream. `static` is the configured `headers`;
//! `token_exchange` (RFC 8693) names the identity provider's token
//! endpoint, the firewall's client there (a secret or a private key it
//! signs assertions with) and the audience, resource and scope it asks
//! for; `oauth_user` names the upstream's authorization server (or leaves
//! it to discovery), the firewall's client there and the scopes users
//! consent to. Every error names the key; a secret is read here, once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;

use super::validate::{ConfigError, Secret, Validator};
use super::{RawOauthUser, RawTokenExchange, RawUpstream, UpstreamAuthMode};

/// What the firewall presents to an upstream.
#[derive(Debug, Clone, Default)]
pub enum UpstreamAuth {
    /// The configured `headers`, the same for every run.
    #[default]
    Static,
    /// A token exchanged for each run (RFC 8693).
    Exchange(Arc<TokenExchange>),
    /// The run's user's own token, from their consent (authorization code
    /// with PKCE).
    User(Arc<OauthUser>),
}

impl UpstreamAuth {
    /// The name on record (`upstream_auth`): `static`, `exchange` or
    /// `user`.
    pub fn name(&self) -> &'static str {
        match self {
            UpstreamAuth::Static => "static",
            UpstreamAuth::Exchange(_) => "exchange",
            UpstreamAuth::User(_) => "user",
        }
    }
}

/// A checked `[upstream.oauth_user]`.
#[derive(Debug)]
pub struct OauthUser {
    /// Where the endpoints come from.
    pub server: AuthorizationServer,
    /// The firewall's client id.
    pub client_id: String,
    /// Its secret (`client_secret_basic`); none: a public client.
    pub client_secret: Option<Secret>,
    /// The scopes asked for, space-separated (empty: none named).
    pub scope: String,
    /// The RFC 8707 resource asked for.
    pub resource: String,
    /// Extra CA certificates for the server.
    pub ca_file: Option<PathBuf>,
    /// Time allowed for one request to the server.
    pub timeout: Duration,
}

/// Where an `oauth_user` upstream's authorization server is found.
#[derive(Debug, Clone)]
pub enum AuthorizationServer {
    /// Configured endpoints.
    Endpoints(Endpoints),
    /// This issuer's RFC 8414 metadata.
    Issuer(Uri),
    /// The upstream's RFC 9728 metadata names the issuer.
    Discovered,
}

/// An authorization server's endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Where the user's browser is sent.
    pub authorization: Uri,
    /// Where codes and refresh tokens are redeemed.
    pub token: Uri,
    /// RFC 7009 revocation, when the server has it.
    pub revocation: Option<Uri>,
}

/// A checked `[upstream.token_exchange]`.
#[derive(Debug)]
pub struct TokenExchange {
    /// The token endpoint.
    pub token_endpoint: Uri,
    /// The firewall's client id.
    pub client_id: String,
    /// How the firewall authenticates as that client.
    pub client_auth: ClientAuth,
    /// The `audience` asked for.
    pub audience: Option<String>,
    /// The `resource` asked for.
    pub resource: Option<String>,
    /// The `scope` asked for.
    pub scope: Option<String>,
    /// Extra CA certificates for the token endpoint.
    pub ca_file: Option<PathBuf>,
    /// Time allowed for one exchange.
    pub timeout: Duration,
}

/// How the firewall authenticates at the token endpoint.
pub enum ClientAuth {
    /// `client_secret_basic`.
    Secret(Secret),
    /// `private_key_jwt`: an assertion signed with this key.
    PrivateKey {
        /// The key file (for messages).
        path: PathBuf,
        /// The key, parsed.
        key: jsonwebtoken::EncodingKey,
        /// `ES256` (EC P-256) or `RS256`.
        alg: jsonwebtoken::Algorithm,
    },
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientAuth::Secret(s) => write!(f, "client_secret_basic({s:?})"),
            ClientAuth::PrivateKey { path, alg, .. } => {
                write!(f, "private_key_jwt({}, {alg:?})", path.display())
            }
        }
    }
}

/// Default time allowed for one exchange.
const DEFAULT_TIMEOUT_MS: u64 = 5_000;

impl Validator<'_> {
    /// An upstream's `auth` and its section; `static` wants neither
    /// section, the others want theirs and no `Authorization` among the
    /// `headers` (the credential is the firewall's to set).
    pub(super) fn upstream_auth(
        &self,
        key: &dyn Fn(&str) -> String,
        u: &mut RawUpstream,
    ) -> Result<UpstreamAuth, ConfigError> {
        let authorization_set = u
            .headers
            .keys()
            .any(|h| h.eq_ignore_ascii_case("authorization"));
        match u.auth {
            UpstreamAuthMode::Static => {
                if u.token_exchange.is_some() {
                    return Err(
                        self.invalid(key("token_exchange"), "only with auth = \"token_exchange\"")
                    );
                }
                if u.oauth_user.is_some() {
                    return Err(self.invalid(key("oauth_user"), "only with auth = \"oauth_user\""));
                }
                Ok(UpstreamAuth::Static)
            }
            UpstreamAuthMode::OauthUser => {
                if authorization_set {
                    return Err(self.invalid(
                        key("headers.Authorization"),
                        "with auth = \"oauth_user\" the firewall sets Authorization to the user's own token",
                    ));
                }
                if u.token_exchange.is_some() {
                    return Err(
                        self.invalid(key("token_exchange"), "only with auth = \"token_exchange\"")
                    );
                }
                if u.stdio_configured() {
                    return Err(self.invalid(
                        key("auth"),
                        "a stdio server gets no bearer token; use \"static\"",
                    ));
                }
                let raw = u.oauth_user.take().ok_or_else(|| {
                    self.invalid(
                        key("oauth_user"),
                        "auth = \"oauth_user\" needs an [upstream.oauth_user] section",
                    )
                })?;
                let k = |f: &str| key(&format!("oauth_user.{f}"));
                Ok(UpstreamAuth::User(Arc::new(
                    self.oauth_user(&k, raw, &u.url)?,
                )))
            }
            UpstreamAuthMode::TokenExchange => {
                if authorization_set {
                    return Err(self.invalid(
                        key("headers.Authorization"),
                        "with auth = \"token_exchange\" the firewall sets Authorization to the run's exchanged token",
                    ));
                }
                if u.oauth_user.is_some() {
                    return Err(self.invalid(key("oauth_user"), "only with auth = \"oauth_user\""));
                }
                if u.stdio_configured() {
                    return Err(self.invalid(
                        key("auth"),
                        "a stdio server gets no bearer token; use \"static\"",
                    ));
                }
                let raw = u.token_exchange.take().ok_or_else(|| {
                    self.invalid(
                        key("token_exchange"),
                        "auth = \"token_exchange\" needs an [upstream.token_exchange] section",
                    )
                })?;
                let k = |f: &str| key(&format!("token_exchange.{f}"));
                Ok(UpstreamAuth::Exchange(Arc::new(
                    self.token_exchange(&k, raw)?,
                )))
            }
        }
    }

    fn token_exchange(
        &self,
        key: &dyn Fn(&str) -> String,
        raw: RawTokenExchange,
    ) -> Result<TokenExchange, ConfigError> {
        let token_endpoint = self.endpoint(&key("token_endpoint"), &raw.token_endpoint)?;
        if raw.client_id.is_empty() {
            return Err(self.invalid(key("client_id"), "must not be empty"));
        }
        let client_auth = match (raw.client_secret, raw.private_key_file) {
            (Some(secret), None) => {
                if !secret.prefix.is_empty() {
                    return Err(self.invalid(key("client_secret"), "takes no prefix"));
                }
                ClientAuth::Secret(self.secret(&key("client_secret"), secret)?)
            }
            (None, Some(path)) => {
                let path = self.path(&path);
                let pem = std::fs::read(&path).map_err(|e| {
                    self.invalid(
                        key("private_key_file"),
                        format!("{}: cannot read: {e}", path.display()),
                    )
                })?;
                let (key_, alg) = if let Ok(k) = jsonwebtoken::EncodingKey::from_ec_pem(&pem) {
                    (k, jsonwebtoken::Algorithm::ES256)
                } else if let Ok(k) = jsonwebtoken::EncodingKey::from_rsa_pem(&pem) {
                    (k, jsonwebtoken::Algorithm::RS256)
                } else {
                    return Err(self.invalid(
                        key("private_key_file"),
                        format!(
                            "{} is not a PEM EC P-256 or RSA private key",
                            path.display()
                        ),
                    ));
                };
                ClientAuth::PrivateKey {
                    path,
                    key: key_,
                    alg,
                }
            }
            (Some(_), Some(_)) => {
                return Err(self.invalid(
                    key("client_secret"),
                    "give client_secret or private_key_file, not both",
                ))
            }
            (None, None) => return Err(self.invalid(
                key("client_secret"),
                "the firewall authenticates as its client: give client_secret or private_key_file",
            )),
        };
        if raw.audience.is_none() && raw.resource.is_none() {
            return Err(self.invalid(
                key("audience"),
                "name the upstream's audience (or resource): a token for any audience is not asked for",
            ));
        }
        for (k, v) in [
            ("audience", &raw.audience),
            ("resource", &raw.resource),
            ("scope", &raw.scope),
        ] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(self.invalid(key(k), "must not be empty"));
            }
        }
        // A readable file, whatever the endpoint's scheme.
        let ca_file = self.ca_file(key, raw.ca_file, true)?;
        let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=60_000).contains(&timeout_ms) {
            return Err(self.invalid(key("timeout_ms"), "must be 1-60000"));
        }
        Ok(TokenExchange {
            token_endpoint,
            client_id: raw.client_id,
            client_auth,
            audience: raw.audience,
            resource: raw.resource,
            scope: raw.scope,
            ca_file,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    fn oauth_user(
        &self,
        key: &dyn Fn(&str) -> String,
        raw: RawOauthUser,
        upstream_url: &str,
    ) -> Result<OauthUser, ConfigError> {
        if raw.client_id.trim().is_empty() {
            return Err(self.invalid(key("client_id"), "must not be empty"));
        }
        let server = match (
            raw.authorization_server,
            raw.authorization_endpoint,
            raw.token_endpoint,
        ) {
            (None, Some(a), Some(t)) => AuthorizationServer::Endpoints(Endpoints {
                authorization: self.endpoint(&key("authorization_endpoint"), &a)?,
                token: self.endpoint(&key("token_endpoint"), &t)?,
                revocation: raw
                    .revocation_endpoint
                    .map(|r| self.endpoint(&key("revocation_endpoint"), &r))
                    .transpose()?,
            }),
            (Some(issuer), None, None) => {
                if raw.revocation_endpoint.is_some() {
                    return Err(self.invalid(
                        key("revocation_endpoint"),
                        "comes from the authorization server's metadata; give it only with authorization_endpoint and token_endpoint",
                    ));
                }
                AuthorizationServer::Issuer(self.endpoint(&key("authorization_server"), &issuer)?)
            }
            (None, None, None) => {
                if raw.revocation_endpoint.is_some() {
                    return Err(self.invalid(
                        key("revocation_endpoint"),
                        "give it with authorization_endpoint and token_endpoint",
                    ));
                }
                AuthorizationServer::Discovered
            }
            (Some(_), _, _) => {
                return Err(self.invalid(
                    key("authorization_server"),
                    "give the authorization server (its endpoints from its metadata) or authorization_endpoint and token_endpoint, not both",
                ))
            }
            (None, _, _) => {
                return Err(self.invalid(
                    key("authorization_endpoint"),
                    "give both authorization_endpoint and token_endpoint (or authorization_server)",
                ))
            }
        };
        let client_secret = match raw.client_secret {
            Some(secret) => {
                if !secret.prefix.is_empty() {
                    return Err(self.invalid(key("client_secret"), "takes no prefix"));
                }
                Some(self.secret(&key("client_secret"), secret)?)
            }
            None => None,
        };
        for s in &raw.scopes {
            if s.is_empty()
                || !s
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            {
                return Err(self.invalid(
                    key("scopes"),
                    format!("{s:?} is not a scope token (RFC 6749 §3.3)"),
                ));
            }
        }
        let resource = raw.resource.unwrap_or_else(|| upstream_url.to_owned());
        if resource.trim().is_empty() {
            return Err(self.invalid(key("resource"), "must not be empty"));
        }
        let ca_file = self.ca_file(key, raw.ca_file, true)?;
        let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=60_000).contains(&timeout_ms) {
            return Err(self.invalid(key("timeout_ms"), "must be 1-60000"));
        }
        Ok(OauthUser {
            server,
            client_id: raw.client_id,
            client_secret,
            scope: raw.scopes.join(" "),
            resource,
            ca_file,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// An endpoint the firewall sends a credential to: `https://`, or
    /// `http://` only on a loopback address (nothing leaves the machine).
    fn endpoint(&self, key: &str, text: &str) -> Result<Uri, ConfigError> {
        let uri: Uri = text
            .parse()
            .map_err(|e| self.invalid(key, format!("{text:?} is not a URL: {e}")))?;
        let Some(host) = uri.host() else {
            return Err(self.invalid(key, format!("{text:?} has no host")));
        };
        match uri.scheme_str() {
            Some("https") => Ok(uri),
            Some("http") if crate::auth::is_loopback(host) => Ok(uri),
            Some("http") => Err(self.invalid(
                key,
                format!("{text:?}: the client's credentials go there; use https:// (http:// only on a loopback address)"),
            )),
            _ => Err(self.invalid(key, format!("{text:?} must start with https://"))),
        }
    }
}

impl RawUpstream {
    /// Whether this is a stdio upstream.
    fn stdio_configured(&self) -> bool {
        self.transport == super::UpstreamTransport::Stdio
    }
}
