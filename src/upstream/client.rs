//! Talking to one upstream MCP server: a pooled hyper client (HTTP/1.1
//! keep-alive, or HTTP/2 over a set of connections: [`super::h2pool`]),
//! plain or rustls with an optional extra CA, and the header hygiene of every
//! forwarded request.
//!
//! What the upstream sees from the client is decided here and nowhere else,
//! by allow-list: only the headers MCP needs travel (`Content-Type`,
//! `Accept`, `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`,
//! `Mcp-Param-*`, `traceparent`, `tracestate`, `User-Agent`) plus what the
//! upstream's config lists (`forward_headers`); cookies, API keys, spoofed
//! identity headers, `Origin` and everything else stay behind, and the query
//! string is dropped unless `forward_query` is set. `Mcp-Session-Id` and
//! `Last-Event-ID` are the upstream's own values, unsealed by the firewall,
//! never the client's text. `X-Forwarded-For` / `X-Forwarded-Proto` are set
//! from the connection (the client address, behind trusted proxies); the
//! identity headers from the verified token and the upstream's own
//! credentials are set last; `Host` is the upstream's. `Accept-Encoding` is
//! forced to `identity` because the firewall must read (and sometimes
//! rewrite) what comes back.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{Either, FutureExt};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::config::Upstream;
use crate::server::listener::ConnInfo;

use super::body::UpstreamIncoming;
use super::failure::{Cause, UpstreamFailure};
use super::h2pool::H2Pool;

/// A client for one upstream.
pub struct UpstreamClient {
    /// The validated config of this upstream.
    pub config: Arc<Upstream>,
    /// One transport per serving thread (index 0: off them), built there on
    /// first use, so the thread that forwards a call also drives the
    /// connection it goes on ([`crate::server::shards`]).
    transports: Box<[OnceLock<Transport>]>,
    make: Box<dyn Fn() -> Transport + Send + Sync>,
    /// A stdio upstream's bridge (its processes).
    pub bridge: Option<Arc<crate::stdio::Bridge>>,
    /// With `auth = "token_exchange"`: the exchanges and their tokens.
    pub(crate) credentials: Option<Arc<crate::credential::Credentials>>,
    /// Its users' own tokens (`auth = "oauth_user"`).
    pub(crate) users: Option<Arc<crate::credential::UserCredentials>>,
    /// The id of the configured headers' credential (on record).
    static_id: Arc<str>,
}

/// How requests reach the upstream.
// One per upstream, built once and never moved: the size difference is moot.
#[allow(clippy::large_enum_variant)]
enum Transport {
    /// HTTP/1.1 keep-alive, pooled.
    Http1(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
    /// HTTP/2 over as many connections as the streams in flight need.
    Http2(Arc<H2Pool>),
    /// A stdio upstream: in-memory connections to its bridge.
    Stdio(Client<crate::stdio::connector::Local, Full<Bytes>>),
}

/// Why an upstream client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The CA file is unreadable or holds no certificate.
    #[error("upstream {upstream:?}: ca_file {path}: {reason}")]
    CaFile {
        /// Upstream name.
        upstream: String,
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The TLS settings or the upstream's address cannot be used.
    #[error("upstream {upstream:?}: {reason}")]
    Setup {
        /// Upstream name.
        upstream: String,
        /// What went wrong.
        reason: String,
    },
}

/// The headers of a POST the firewall itself sends upstream (its own
/// listing, previews, answers in the client's place): a JSON-RPC body that
/// accepts a JSON or SSE answer.
pub(crate) fn own_post_headers() -> HeaderMap {
    let mut h = HeaderMap::with_capacity(4);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h
}

/// What to forward.
pub struct Forward<'a> {
    /// HTTP method (POST, GET or DELETE).
    pub method: Method,
    /// The client's headers, to be cleaned.
    pub headers: &'a HeaderMap,
    /// The client's query string, if any.
    pub query: Option<&'a str>,
    /// The body (empty for GET/DELETE).
    pub body: Bytes,
    /// The client connection.
    pub conn: ConnInfo,
    /// Headers set by the firewall (identity from the verified token).
    pub set: &'a [(HeaderName, HeaderValue)],
    /// The upstream's session id (unsealed), if any.
    pub session: Option<&'a [u8]>,
    /// The upstream's event id to resume after (unsealed), if any.
    pub last_event_id: Option<&'a str>,
}

/// Client headers every upstream gets (lower case, as [`HeaderMap`] stores
/// them); `Mcp-Param-*` is matched by prefix.
const FORWARDED: [&str; 8] = [
    "content-type",
    "accept",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "traceparent",
    "tracestate",
    "user-agent",
];

// === impl UpstreamClient ===

impl UpstreamClient {
    /// Builds the client; reads the CA file if configured; a stdio
    /// upstream gets its bridge (its processes start on first use).
    pub fn new(
        config: Arc<Upstream>,
        metrics: Arc<crate::telemetry::Metrics>,
    ) -> Result<Self, ClientError> {
        if let Some(launch) = &config.stdio {
            let bridge = crate::stdio::Bridge::new(
                &config.name,
                launch.clone(),
                config.max_response_bytes,
                metrics,
            );
            let client = http1_client(crate::stdio::connector::Local::new(bridge.clone()));
            return Ok(UpstreamClient::with(
                config,
                Box::new(move || Transport::Stdio(client.clone())),
                Some(bridge),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = &config.ca_file {
            let err = |reason: String| ClientError::CaFile {
                upstream: config.name.clone(),
                path: path.display().to_string(),
                reason,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| err(e.to_string()))?;
            if certs.is_empty() {
                return Err(err("no CERTIFICATE block found".to_owned()));
            }
            for c in certs {
                roots.add(c).map_err(|e| err(e.to_string()))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Setup {
                upstream: config.name.clone(),
                reason: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        // Without TCP_NODELAY, small writes wait on delayed ACKs (~40 ms).
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));

        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let transport: Box<dyn Fn() -> Transport + Send + Sync> = if config.http2 {
            // HTTP/2 only: h2 in ALPN on TLS, prior knowledge on plain TCP.
            let connector = builder.enable_http2().wrap_connector(http);
            let mut target = config.url.clone().into_parts();
            target.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
            let target = Uri::from_parts(target).map_err(|e| ClientError::Setup {
                upstream: config.name.clone(),
                reason: e.to_string(),
            })?;
            let max_streams = config.http2_max_streams;
            Box::new(move || {
                Transport::Http2(Arc::new(H2Pool::new(
                    connector.clone(),
                    target.clone(),
                    max_streams,
                    Duration::from_secs(60),
                )))
            })
        } else {
            let connector = builder.enable_http1().wrap_connector(http);
            Box::new(move || Transport::Http1(http1_client(connector.clone())))
        };
        let mut client = UpstreamClient::with(config, transport, None);
        if let crate::config::UpstreamAuth::Exchange(x) = &client.config.auth {
            let credentials =
                crate::credential::Credentials::new(&client.config.name, x.clone(), metrics)
                    .map_err(|reason| ClientError::Setup {
                        upstream: client.config.name.clone(),
                        reason: format!("token_exchange: {reason}"),
                    })?;
            client.credentials = Some(Arc::new(credentials));
        }
        Ok(client)
    }

    /// What a run's requests reach this upstream with: the configured
    /// headers, or the run's exchanged token (`run`'s tool token
    /// exchanged, or kept from an earlier exchange of this run); with no
    /// run, the firewall's own token.
    ///
    /// # Errors
    /// No token could be had (`-31007`): nothing may be sent.
    pub(crate) async fn credential(
        &self,
        run: Option<crate::credential::RunSubject<'_>>,
    ) -> Result<crate::credential::Credential, crate::credential::CredentialError> {
        if let crate::config::UpstreamAuth::User(_) = &self.config.auth {
            return match run {
                Some(run) => self.user_credential(run.claims).await,
                None => Err(crate::credential::CredentialError::NoRunToken),
            };
        }
        let Some(c) = &self.credentials else {
            return Ok(crate::credential::Credential::configured(
                self.static_id.clone(),
            ));
        };
        // Boxed, like the user's below: an exchange (an HTTPS request to
        // the token endpoint) is a large state machine, and inline it would
        // be allocated and copied with every request's future, static
        // credentials' included.
        match run {
            Some(run) => Box::pin(c.for_run(run)).await,
            None => Box::pin(c.own()).await,
        }
    }

    /// What a request of the run of `claims` reaches an `oauth_user`
    /// upstream with: that user's own token (nothing of the run's token
    /// is needed or sent).
    ///
    /// # Errors
    /// The user has not connected (a consent link), or their token cannot
    /// be had.
    pub(crate) async fn user_credential(
        &self,
        claims: &crate::auth::Claims,
    ) -> Result<crate::credential::Credential, crate::credential::CredentialError> {
        match &self.users {
            // Boxed: a store read (a PostgreSQL query) or a refresh.
            Some(users) => Box::pin(users.for_user(claims)).await,
            None => Err(crate::credential::CredentialError::Store(
                "no [credentials] store in this process".to_owned(),
            )),
        }
    }

    /// Gives an `oauth_user` upstream its users' tokens, kept by `keeper`.
    ///
    /// # Errors
    /// Its `ca_file` cannot be used.
    pub(crate) fn with_users(
        mut self,
        keeper: &Arc<crate::credential::Keeper>,
        metrics: Arc<crate::telemetry::Metrics>,
    ) -> Result<Self, ClientError> {
        self.users =
            crate::credential::UserCredentials::for_upstream(&self.config, keeper, metrics)
                .map_err(|reason| ClientError::Setup {
                    upstream: self.config.name.clone(),
                    reason: format!("oauth_user: {reason}"),
                })?
                .map(Arc::new);
        Ok(self)
    }

    fn with(
        config: Arc<Upstream>,
        make: Box<dyn Fn() -> Transport + Send + Sync>,
        bridge: Option<Arc<crate::stdio::Bridge>>,
    ) -> UpstreamClient {
        UpstreamClient {
            transports: (0..=crate::server::shards::MAX_SHARDS)
                .map(|_| OnceLock::new())
                .collect(),
            make,
            static_id: Arc::from(crate::credential::static_id(&config.inject)),
            config,
            bridge,
            credentials: None,
            users: None,
        }
    }

    /// The transport of the thread this runs on.
    fn transport(&self) -> &Transport {
        let i = crate::server::shards::current().min(self.transports.len() - 1);
        self.transports[i].get_or_init(|| (self.make)())
    }

    /// Sends a request and waits (bounded by the request timeout) for the
    /// response headers.
    ///
    /// The request is built before this returns and the future borrows
    /// nothing: callers drop the client's request head before awaiting the
    /// answer, which may take as long as the upstream holds it.
    pub fn send(
        &self,
        fwd: Forward<'_>,
    ) -> impl Future<Output = Result<Response<UpstreamIncoming>, UpstreamFailure>> + Send + 'static
    {
        let sending = self
            .build(fwd)
            .map_err(|e| UpstreamFailure::Invalid(e.to_string()))
            .map(|request| match self.transport() {
                Transport::Http1(client) => {
                    Either::Left(Either::Left(client.request(request).map(|r| {
                        r.map(|r| r.map(UpstreamIncoming::http1)).map_err(classify)
                    })))
                }
                Transport::Stdio(client) => {
                    Either::Left(Either::Right(client.request(request).map(|r| {
                        r.map(|r| r.map(UpstreamIncoming::http1)).map_err(classify)
                    })))
                }
                Transport::Http2(pool) => {
                    let pool = Arc::clone(pool);
                    // Boxed: the pool's send (which may open a connection)
                    // is many times the size of the HTTP/1.1 branch, and this
                    // future is part of every request's state.
                    Either::Right(Box::pin(async move {
                        let (r, slot) = pool.send(request).await?;
                        Ok(r.map(|b| UpstreamIncoming::http2(b, slot)))
                    }))
                }
            });
        let timeout = self.config.request_timeout;
        async move {
            match tokio::time::timeout(timeout, sending?).await {
                Err(_) => Err(UpstreamFailure::Timeout(timeout.as_millis() as u64)),
                Ok(result) => result,
            }
        }
    }

    fn build(&self, fwd: Forward<'_>) -> Result<Request<Full<Bytes>>, http::Error> {
        let query = fwd.query.filter(|_| self.config.forward_query);
        let uri = self.uri(query)?;
        let mut headers = HeaderMap::with_capacity(12);
        for (name, value) in fwd.headers {
            let n = name.as_str();
            if FORWARDED.contains(&n)
                || n.starts_with(crate::mcp::headers::MCP_PARAM_PREFIX)
                || self.config.forward_headers.contains(name)
            {
                headers.append(name.clone(), value.clone());
            }
        }
        if let Some(v) = fwd.session.and_then(|s| HeaderValue::from_bytes(s).ok()) {
            headers.insert(HeaderName::from_static("mcp-session-id"), v);
        }
        if let Some(v) = fwd
            .last_event_id
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            headers.insert(HeaderName::from_static("last-event-id"), v);
        }
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        if let Ok(v) = HeaderValue::from_str(&fwd.conn.client.to_string()) {
            headers.insert(HeaderName::from_static("x-forwarded-for"), v);
        }
        headers.insert(
            HeaderName::from_static("x-forwarded-proto"),
            HeaderValue::from_static(if fwd.conn.tls { "https" } else { "http" }),
        );
        for (name, value) in fwd.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, secret) in &self.config.inject {
            headers.insert(name.clone(), secret.header_value().clone());
        }
        if let Some(authority) = self.config.url.authority() {
            if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
                headers.insert(header::HOST, v);
            }
        }
        let mut req = Request::builder()
            .method(fwd.method)
            .uri(uri)
            .body(Full::new(fwd.body))?;
        *req.headers_mut() = headers;
        Ok(req)
    }

    fn uri(&self, query: Option<&str>) -> Result<Uri, http::Error> {
        let base = &self.config.url;
        let Some(q) = query.filter(|q| !q.is_empty()) else {
            return Ok(base.clone());
        };
        let pq = match base.query() {
            Some(bq) => format!("{}?{bq}&{q}", base.path()),
            None => format!("{}?{q}", base.path()),
        };
        let mut parts = base.clone().into_parts();
        parts.path_and_query = Some(pq.parse()?);
        Ok(Uri::from_parts(parts)?)
    }
}

/// A pooled HTTP/1.1 keep-alive client over `connector`.
fn http1_client<C>(connector: C) -> Client<C, Full<Bytes>>
where
    C: hyper_util::client::legacy::connect::Connect + Clone,
{
    let mut client = Client::builder(TokioExecutor::new());
    client
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(1024);
    client.build(connector)
}

/// Turns a client error into a failure the agent can act on.
fn classify(e: hyper_util::client::legacy::Error) -> UpstreamFailure {
    if e.is_connect() {
        UpstreamFailure::Connect(Cause::new(e))
    } else {
        UpstreamFailure::Reset(Cause::new(e))
    }
}

/// Response headers a client gets from the upstream (lower case); the
/// session id is sealed by the relay, everything else (cookies, the
/// upstream's own `WWW-Authenticate`, server details) stays behind.
const RELAYED: [&str; 4] = [
    "content-type",
    "cache-control",
    "retry-after",
    "mcp-protocol-version",
];

/// Copies the upstream response's headers a client may see.
pub(crate) fn response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(4);
    for (name, value) in upstream {
        if RELAYED.contains(&name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}
