//! Raw config -> validated [`Config`]. Every semantic check lives here, and every
//! error names the file and the key it is about.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::Uri;

use super::{LogFormat, RawConfig, RawExtraMethod, RawHeaderValue, RawUpstream, TlsConfig};
use crate::http_util::{is_hop_by_hop, origin_of};
use crate::mcp::methods::Shape;
use crate::policy::Risk;
use crate::session::{valid_key_id, RawSessionKey, SessionKey, MIN_KEY_BYTES};

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (`<embedded>` for the demo).
    pub source: PathBuf,
    /// MCP listener settings.
    pub server: ServerConfig,
    /// Admin listener address.
    pub admin_listen: SocketAddr,
    /// Host names the admin listener answers to (besides IP addresses).
    pub admin_allowed_hosts: Vec<String>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// Upstreams in file order.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Virtual servers in file order (members validated).
    pub virtual_servers: Vec<Arc<crate::virtual_server::VirtualServer>>,
    /// Tool-token verification settings (paths resolved).
    pub auth: crate::auth::AuthConfig,
    /// Authorization servers for the protected-resource metadata.
    pub authorization_servers: Vec<String>,
    /// Rate limits and caps.
    pub limits: crate::budget::LimitsConfig,
    /// Approvals (store path resolved).
    pub approvals: Option<crate::approval::ApprovalsConfig>,
    /// The audit pipeline, if configured (spool path resolved).
    pub audit: Option<crate::audit::AuditConfig>,
    /// The policy directory.
    pub policy_dir: PathBuf,
    /// The shadow policy directory (`[policy] shadow_dir`), if any.
    pub shadow_dir: Option<PathBuf>,
    /// Policy change-check interval.
    pub policy_reload: Duration,
    /// Keys sealing session and event ids (first seals); empty: a random
    /// key per process.
    pub session_keys: Vec<SessionKey>,
    /// Where budgets and rate limits live.
    pub state: crate::state::StateConfig,
    /// Traces.
    pub telemetry: crate::trace::TelemetryConfig,
}

/// Validated `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// TLS, or `None` when `plaintext = true`.
    pub tls: Option<TlsConfig>,
    /// The externally visible base URL, without a trailing slash.
    pub public_url: String,
    /// Whether `public_url` was configured (otherwise it is derived from the
    /// bound address at start).
    pub public_url_explicit: bool,
    /// Request body cap.
    pub max_request_bytes: usize,
    /// Buffered response cap.
    pub max_response_bytes: usize,
    /// SSE event cap.
    pub max_sse_event_bytes: usize,
    /// Request head cap (431 above).
    pub max_header_bytes: usize,
    /// Serving threads of the MCP listener (resolved: at least 1).
    pub threads: usize,
    /// JSON nesting cap.
    pub max_json_depth: usize,
    /// Batch size cap.
    pub max_batch: usize,
    /// SIGTERM drain deadline.
    pub drain_timeout: Duration,
    /// Concurrency limit before shedding.
    pub max_concurrent_requests: usize,
    /// Open connection limit.
    pub max_connections: usize,
    /// Longest wait of a blocked write to a client.
    pub write_idle_timeout: Duration,
    /// Accepted `Origin` values (`scheme://host[:port]`, lower case).
    pub allowed_origins: Vec<String>,
    /// `allowed_origins` was not configured: it follows `public_url`.
    pub origins_from_public_url: bool,
    /// Accepted `Host` names (lower case, no port); empty: any.
    pub allowed_hosts: Vec<String>,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

/// A validated upstream.
#[derive(Debug)]
pub struct Upstream {
    /// Route name.
    pub name: String,
    /// The upstream MCP endpoint.
    pub url: Uri,
    /// `https`?
    pub tls: bool,
    /// Extra trusted CA certificates (PEM file).
    pub ca_file: Option<PathBuf>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Time to response headers.
    pub request_timeout: Duration,
    /// Longest silence on a response body.
    pub idle_timeout: Duration,
    /// Request body cap.
    pub max_request_bytes: usize,
    /// Buffered response cap.
    pub max_response_bytes: usize,
    /// HTTP/2 to the upstream.
    pub http2: bool,
    /// Streams per HTTP/2 connection.
    pub http2_max_streams: usize,
    /// Calls per second to this upstream, all runs together.
    pub max_calls_per_s: Option<u32>,
    /// Injected headers (credentials); values are secrets.
    pub inject: Vec<(HeaderName, Secret)>,
    /// Headers set from the verified token.
    pub identity_headers: Vec<(HeaderName, IdentityClaim)>,
    /// Projects it belongs to (sorted).
    pub projects: Vec<String>,
    /// Categories (sorted).
    pub categories: Vec<String>,
    /// Whether annotations count as risk hints.
    pub trust_annotations: bool,
    /// Client headers forwarded besides the ones MCP needs (lower case).
    pub forward_headers: Vec<HeaderName>,
    /// Forward the client's query string.
    pub forward_query: bool,
    /// Methods beyond MCP, with their risk.
    pub extra_methods: Vec<ExtraMethod>,
    /// Tool-definition pinning.
    pub pinning: crate::pins::Mode,
    /// Its content is untrusted (`trust = "untrusted"`).
    pub untrusted: bool,
    /// It serves private data (`data = "private"`).
    pub private: bool,
    /// Every one of its tools can carry data out.
    pub egress: bool,
    /// A stdio upstream: what the firewall starts (`url` is then a
    /// placeholder nobody connects to).
    pub stdio: Option<crate::stdio::Launch>,
}

impl Upstream {
    /// The facts policy matches on.
    pub fn facts(&self) -> crate::policy::UpstreamFacts<'_> {
        crate::policy::UpstreamFacts {
            name: &self.name,
            projects: &self.projects,
            categories: &self.categories,
            trust_annotations: self.trust_annotations,
            untrusted: self.untrusted,
            private: self.private,
            egress: self.egress,
        }
    }
}

/// A method an upstream serves beyond MCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraMethod {
    /// The exact name.
    pub name: String,
    /// Request or notification.
    pub shape: Shape,
    /// Its risk.
    pub risk: Risk,
}

/// A token claim an identity header carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityClaim {
    /// `sub`.
    Subject,
    /// `tenant_id`.
    Tenant,
    /// `agent`.
    Agent,
    /// `run_id`.
    Run,
    /// `mode`.
    Mode,
    /// `jti`.
    TokenId,
    /// `iss`.
    Issuer,
    /// The run's effective projects, comma-separated.
    Projects,
}

impl IdentityClaim {
    fn parse(s: &str) -> Option<IdentityClaim> {
        Some(match s {
            "sub" => IdentityClaim::Subject,
            "tenant_id" => IdentityClaim::Tenant,
            "agent" => IdentityClaim::Agent,
            "run_id" => IdentityClaim::Run,
            "mode" => IdentityClaim::Mode,
            "jti" => IdentityClaim::TokenId,
            "iss" => IdentityClaim::Issuer,
            "projects" => IdentityClaim::Projects,
            _ => return None,
        })
    }
}

/// Where an injected header value came from, for diagnostics that must not
/// print the value itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValueSource {
    /// Literal in the config.
    Literal,
    /// Environment variable of this name.
    Env(String),
    /// File at this path.
    File(PathBuf),
}

/// A header value that must never be logged.
#[derive(Clone)]
pub struct Secret {
    value: HeaderValue,
    source: HeaderValueSource,
}

/// A configuration error: which file, which key, what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key or a value of the wrong type. The TOML
    /// error carries line, column and key.
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// toml's description, with line/column and the offending key.
        message: String,
    },
    /// An `[auth]` value that is not acceptable (the message names the key).
    #[error("{file}: {source}")]
    Auth {
        /// The file.
        file: PathBuf,
        /// What is wrong, and where.
        source: crate::auth::ConfigError,
    },
    /// A value that parses but is not acceptable.
    #[error("{file}: {key}: {reason}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// Dotted key, e.g. `upstream[1].url`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

// === impl Secret ===

impl Secret {
    /// The value to put on the wire.
    pub fn header_value(&self) -> &HeaderValue {
        &self.value
    }

    /// Where it came from.
    pub fn source(&self) -> &HeaderValueSource {
        &self.source
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({:?}, <redacted>)", self.source)
    }
}

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_owned(),
        source,
    })?;
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    load_str(&text, path, base, &|name| std::env::var(name).ok())
}

/// Validates config text. `file` names it in errors; relative paths resolve
/// against `base`; `env` looks up environment variables (injected so tests
/// need not mutate the process environment).
pub fn load_str(
    text: &str,
    file: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
        file: file.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    Validator { file, base, env }.config(raw)
}

struct Validator<'a> {
    file: &'a Path,
    base: &'a Path,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Validator<'_> {
    fn invalid(&self, key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.into(),
            reason: reason.into(),
        }
    }

    fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base.join(p)
        }
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let s = raw.server;
        let s_authorization_servers = s.authorization_servers.clone();
        let tls = match (s.plaintext, s.tls) {
            (true, Some(_)) => {
                return Err(self.invalid(
                    "server.plaintext",
                    "`plaintext = true` and a [server.tls] section exclude each other",
                ))
            }
            (false, None) => {
                return Err(self.invalid(
                    "server.tls",
                    "missing: TLS is required unless `plaintext = true` is set explicitly (local development only)",
                ))
            }
            (true, None) => None,
            (false, Some(t)) => {
                let cert = self.path(&t.cert);
                let key = self.path(&t.key);
                for (k, p) in [("server.tls.cert", &cert), ("server.tls.key", &key)] {
                    if !p.is_file() {
                        return Err(self.invalid(k, format!("{} is not a readable file", p.display())));
                    }
                }
                Some(TlsConfig {
                    cert,
                    key,
                    reload_interval: Duration::from_millis(t.reload_interval_ms.max(100)),
                })
            }
        };
        for (key, v) in [
            ("server.max_request_bytes", s.max_request_bytes),
            ("server.max_response_bytes", s.max_response_bytes),
            ("server.max_sse_event_bytes", s.max_sse_event_bytes),
            ("server.max_json_depth", s.max_json_depth),
            ("server.max_batch", s.max_batch),
            ("server.max_concurrent_requests", s.max_concurrent_requests),
            ("server.max_connections", s.max_connections),
            (
                "server.write_idle_timeout_ms",
                s.write_idle_timeout_ms as usize,
            ),
        ] {
            if v == 0 {
                return Err(self.invalid(key, "must be greater than 0"));
            }
        }
        if s.max_header_bytes < crate::server::listener::MIN_MAX_HEADER_BYTES {
            return Err(self.invalid(
                "server.max_header_bytes",
                format!(
                    "must be at least {} (the smallest request head HTTP/1.1 can be read with)",
                    crate::server::listener::MIN_MAX_HEADER_BYTES
                ),
            ));
        }
        let public_url_explicit = s.public_url.is_some();
        let public_url = match s.public_url {
            Some(u) => {
                let uri: Uri = u
                    .parse()
                    .map_err(|e| self.invalid("server.public_url", format!("not a URL: {e}")))?;
                if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                    return Err(
                        self.invalid("server.public_url", "must be an absolute http(s) URL")
                    );
                }
                u.trim_end_matches('/').to_owned()
            }
            None => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                format!("{scheme}://{}", s.listen)
            }
        };
        let allowed_origins = match &s.allowed_origins {
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    origin_of(o, true).ok_or_else(|| {
                        self.invalid(
                            format!("server.allowed_origins[{i}]"),
                            format!("{o:?} is not an origin (scheme://host[:port], no path)"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => origin_of(&public_url, false).into_iter().collect(),
        };
        let trusted_proxies = s
            .trusted_proxies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.parse::<ipnet::IpNet>()
                    .or_else(|_| p.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        self.invalid(
                            format!("server.trusted_proxies[{i}]"),
                            format!("{p:?} is not an address or a CIDR network"),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let allowed_hosts = match &s.allowed_hosts {
            Some(list) => list.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            None if public_url_explicit => public_url
                .parse::<Uri>()
                .ok()
                .and_then(|u| {
                    u.host()
                        .map(|h| h.trim_matches(['[', ']']).to_ascii_lowercase())
                })
                .into_iter()
                .collect(),
            None if s.listen.ip().is_loopback() => vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ],
            None => Vec::new(),
        };
        let server = ServerConfig {
            allowed_hosts,
            max_connections: s.max_connections,
            write_idle_timeout: Duration::from_millis(s.write_idle_timeout_ms),
            origins_from_public_url: s.allowed_origins.is_none(),
            allowed_origins,
            trusted_proxies,
            listen: s.listen,
            tls,
            public_url,
            public_url_explicit,
            max_request_bytes: s.max_request_bytes,
            max_response_bytes: s.max_response_bytes,
            max_sse_event_bytes: s.max_sse_event_bytes,
            max_header_bytes: s.max_header_bytes,
            threads: crate::server::shards::count(s.threads),
            max_json_depth: s.max_json_depth,
            max_batch: s.max_batch,
            drain_timeout: Duration::from_millis(s.drain_timeout_ms),
            max_concurrent_requests: s.max_concurrent_requests,
        };

        let mut auth = raw.auth;
        auth.resolve_paths(self.base);
        auth.validate().map_err(|source| ConfigError::Auth {
            file: self.file.to_owned(),
            source,
        })?;
        let token_header = auth
            .header_name()
            .map_err(|e| self.invalid("auth.header", e.to_string()))?;
        let authorization_servers = s_authorization_servers.unwrap_or_else(|| auth.issuers.clone());

        let approvals = match raw.approvals {
            Some(mut a) => {
                a.resolve_paths(self.base);
                a.validate()
                    .map_err(|e| self.invalid("approvals", e.to_string()))?;
                Some(a)
            }
            None => None,
        };
        let audit = match raw.audit {
            Some(mut a) => {
                a.spool.dir = self.path(&a.spool.dir);
                // Like every other path of the config: relative to the
                // config file's directory, whatever the working directory.
                a.signing_key_file = a.signing_key_file.map(|p| self.path(&p));
                a.checkpoint_file = a.checkpoint_file.map(|p| self.path(&p));
                a.validate()
                    .map_err(|e| self.invalid("audit", e.to_string()))?;
                // A pattern that does not compile would turn redaction off:
                // refuse the configuration instead (with audit on or off:
                // approvers see redacted arguments too).
                crate::audit::Redactor::new(&a.redact.key_patterns)
                    .map_err(|e| self.invalid("audit.redact.key_patterns", e.to_string()))?;
                Some(a)
            }
            None => None,
        };

        let session_keys = self.session_keys(raw.sessions.keys)?;
        let mut state = raw.state;
        state.resolve_paths(self.base);
        state
            .validate()
            .map_err(|(key, why)| self.invalid(key, why))?;

        let mut host = raw.stdio;
        host.validate()
            .map_err(|(key, why)| self.invalid(key, why))?;
        host.runtime_dir = host.runtime_dir.map(|d| self.path(&d));
        let mut names = HashSet::new();
        let mut upstreams = Vec::with_capacity(raw.upstreams.len());
        for (i, u) in raw.upstreams.into_iter().enumerate() {
            let up = self.upstream(i, u, &server, &token_header, &host)?;
            if !names.insert(up.name.clone()) {
                return Err(self.invalid(
                    format!("upstream[{i}].name"),
                    format!("duplicate upstream name {:?}", up.name),
                ));
            }
            upstreams.push(Arc::new(up));
        }
        let upstream_names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
        let mut virtual_servers = Vec::with_capacity(raw.virtual_servers.len());
        for (i, v) in raw.virtual_servers.into_iter().enumerate() {
            let v = v
                .validate(i, &upstream_names)
                .map_err(|(key, why)| self.invalid(key, why))?;
            if !names.insert(v.name.clone()) {
                return Err(self.invalid(
                    format!("virtual_server[{i}].name"),
                    format!("duplicate virtual server name {:?}", v.name),
                ));
            }
            virtual_servers.push(Arc::new(v));
        }

        Ok(Config {
            source: self.file.to_owned(),
            server,
            admin_listen: raw.admin.listen,
            admin_allowed_hosts: match &raw.admin.allowed_hosts {
                Some(list) => list.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
                None => vec!["localhost".to_owned()],
            },
            log_format: raw.log.format,
            log_level: raw.log.level,
            upstreams,
            virtual_servers,
            auth,
            authorization_servers,
            limits: raw.limits,
            approvals,
            audit,
            policy_dir: self.path(&raw.policy.dir),
            shadow_dir: raw.policy.shadow_dir.as_deref().map(|d| self.path(d)),
            policy_reload: Duration::from_millis(raw.policy.reload_interval_ms.max(100)),
            session_keys,
            state,
            telemetry: raw.telemetry,
        })
    }

    fn session_keys(&self, raw: Vec<RawSessionKey>) -> Result<Vec<SessionKey>, ConfigError> {
        let mut out: Vec<SessionKey> = Vec::with_capacity(raw.len());
        for (i, k) in raw.into_iter().enumerate() {
            let key = format!("sessions.keys[{i}]");
            if !valid_key_id(&k.id) {
                return Err(self.invalid(
                    format!("{key}.id"),
                    format!("{:?} must be 1-16 characters of [A-Za-z0-9_-]", k.id),
                ));
            }
            if out.iter().any(|o| o.id == k.id) {
                return Err(
                    self.invalid(format!("{key}.id"), format!("duplicate key id {:?}", k.id))
                );
            }
            let secret = self.secret_text(
                &key,
                RawHeaderValue {
                    value: k.value,
                    env: k.env,
                    file: k.file,
                    prefix: String::new(),
                },
            )?;
            if secret.0.len() < MIN_KEY_BYTES {
                return Err(self.invalid(
                    key,
                    format!("a session key needs at least {MIN_KEY_BYTES} bytes"),
                ));
            }
            out.push(SessionKey {
                id: k.id,
                secret: secret.0.into_bytes(),
            });
        }
        Ok(out)
    }

    fn upstream(
        &self,
        i: usize,
        mut u: RawUpstream,
        server: &ServerConfig,
        token_header: &HeaderName,
        host: &crate::stdio::HostConfig,
    ) -> Result<Upstream, ConfigError> {
        let key = |k: &str| format!("upstream[{i}].{k}");
        let name_ok = !u.name.is_empty()
            && u.name.len() <= 64
            && u.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(self.invalid(
                key("name"),
                format!("{:?} must be 1-64 characters of [A-Za-z0-9_-]", u.name),
            ));
        }
        let stdio = self.stdio(&key, &mut u, host)?;
        let url: Uri = u
            .url
            .parse()
            .map_err(|e| self.invalid(key("url"), format!("{:?} is not a URL: {e}", u.url)))?;
        let tls = match url.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(self.invalid(
                    key("url"),
                    format!("{:?} must start with http:// or https://", u.url),
                ))
            }
        };
        if url.host().is_none() {
            return Err(self.invalid(key("url"), format!("{:?} has no host", u.url)));
        }
        let ca_file = match u.ca_file {
            Some(p) if !tls => {
                return Err(self.invalid(
                    key("ca_file"),
                    format!("{} given for a plain http:// upstream", p.display()),
                ))
            }
            Some(p) => {
                let p = self.path(&p);
                if !p.is_file() {
                    return Err(self.invalid(
                        key("ca_file"),
                        format!("{} is not a readable file", p.display()),
                    ));
                }
                Some(p)
            }
            None => None,
        };
        for (k, v) in [
            ("connect_timeout_ms", u.connect_timeout_ms),
            ("request_timeout_ms", u.request_timeout_ms),
            ("idle_timeout_ms", u.idle_timeout_ms),
            ("http2_max_streams", u.http2_max_streams as u64),
        ] {
            if v == 0 {
                return Err(self.invalid(key(k), "must be greater than 0"));
            }
        }
        let mut inject = Vec::with_capacity(u.headers.len());
        for (h, v) in u.headers {
            let hk = key(&format!("headers.{h}"));
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| self.invalid(&hk, "not a valid HTTP header name"))?;
            if is_hop_by_hop(&name)
                || name == http::header::HOST
                || name == http::header::CONTENT_LENGTH
            {
                return Err(self.invalid(
                    &hk,
                    "this header is managed by the proxy and cannot be injected",
                ));
            }
            if name == *token_header {
                return Err(self.invalid(&hk, "the tool-token header is never sent upstream"));
            }
            inject.push((name, self.secret(&hk, v)?));
        }
        let mut identity_headers = Vec::with_capacity(u.identity_headers.len());
        for (h, claim) in u.identity_headers {
            let hk = key(&format!("identity_headers.{h}"));
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| self.invalid(&hk, "not a valid HTTP header name"))?;
            if is_hop_by_hop(&name)
                || name == http::header::HOST
                || name == http::header::AUTHORIZATION
                || name == *token_header
            {
                return Err(self.invalid(&hk, "this header cannot carry identity"));
            }
            if inject.iter().any(|(n, _)| *n == name) {
                return Err(self.invalid(&hk, "also set under `headers`"));
            }
            let claim = IdentityClaim::parse(&claim).ok_or_else(|| {
                self.invalid(
                    &hk,
                    format!("{claim:?} is not one of sub, tenant_id, agent, run_id, mode, jti, iss, projects"),
                )
            })?;
            identity_headers.push((name, claim));
        }
        let mut forward_headers = Vec::with_capacity(u.forward_headers.len());
        for (j, h) in u.forward_headers.iter().enumerate() {
            let hk = key(&format!("forward_headers[{j}]"));
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| self.invalid(&hk, "not a valid HTTP header name"))?;
            if is_hop_by_hop(&name)
                || matches!(
                    name.as_str(),
                    "host"
                        | "authorization"
                        | "cookie"
                        | "content-length"
                        | "mcp-session-id"
                        | "last-event-id"
                        | "origin"
                        | "forwarded"
                        | "x-forwarded-for"
                        | "x-forwarded-host"
                        | "x-forwarded-proto"
                        | crate::stdio::INSTANCE_HEADER
                )
                || name == *token_header
                || identity_headers.iter().any(|(n, _)| *n == name)
                || inject.iter().any(|(n, _)| *n == name)
            {
                return Err(self.invalid(
                    &hk,
                    "this header is managed by the firewall and cannot be forwarded from the client",
                ));
            }
            forward_headers.push(name);
        }
        let mut extra_methods: Vec<ExtraMethod> = Vec::with_capacity(u.extra_methods.len());
        for (j, m) in u.extra_methods.into_iter().enumerate() {
            extra_methods.push(self.extra_method(&key(&format!("extra_methods[{j}]")), m)?);
        }
        Ok(Upstream {
            pinning: u.pinning,
            forward_headers,
            forward_query: u.forward_query,
            extra_methods,
            name: u.name,
            url,
            tls,
            ca_file,
            connect_timeout: Duration::from_millis(u.connect_timeout_ms),
            request_timeout: Duration::from_millis(u.request_timeout_ms),
            idle_timeout: Duration::from_millis(u.idle_timeout_ms),
            max_request_bytes: u.max_request_bytes.unwrap_or(server.max_request_bytes),
            max_response_bytes: u.max_response_bytes.unwrap_or(server.max_response_bytes),
            http2: u.http2,
            http2_max_streams: u.http2_max_streams,
            max_calls_per_s: u.max_calls_per_s,
            inject,
            identity_headers,
            projects: sorted(u.projects),
            categories: sorted(u.categories),
            trust_annotations: u.trust_annotations,
            untrusted: u.trust == super::Trust::Untrusted,
            private: u.data == super::DataClass::Private,
            egress: u.egress,
            stdio,
        })
    }

    /// The stdio part of an upstream: checked (the program found, the
    /// sandbox's paths present, the allow-list parsed) or refused naming
    /// the key; with `transport = "stdio"`, `url` becomes a placeholder.
    fn stdio(
        &self,
        key: &dyn Fn(&str) -> String,
        u: &mut RawUpstream,
        host: &crate::stdio::HostConfig,
    ) -> Result<Option<crate::stdio::Launch>, ConfigError> {
        use super::UpstreamTransport;
        let stdio_keys = [
            ("command", !u.command.is_empty()),
            ("env", !u.env.is_empty()),
            ("env_from", !u.env_from.is_empty()),
            ("instances", u.instances.is_some()),
            ("max_instances", u.max_instances.is_some()),
            ("idle_timeout_s", u.idle_timeout_s.is_some()),
            ("sandbox", u.sandbox.is_some()),
        ];
        if u.transport == UpstreamTransport::Http {
            if let Some((k, _)) = stdio_keys.iter().find(|(_, set)| *set) {
                return Err(self.invalid(key(k), "only with transport = \"stdio\""));
            }
            return Ok(None);
        }
        if !u.url.is_empty() {
            return Err(self.invalid(
                key("url"),
                "not used with transport = \"stdio\" (the firewall starts `command`)",
            ));
        }
        if u.http2 || u.ca_file.is_some() {
            let k = if u.http2 { "http2" } else { "ca_file" };
            return Err(self.invalid(key(k), "not used with transport = \"stdio\""));
        }
        u.url = format!("http://{}.stdio.invalid/", u.name);
        let program = u.command.first().cloned().unwrap_or_default();
        if program.is_empty() {
            return Err(self.invalid(key("command"), "must name the program to start"));
        }
        let Some(resolved) = crate::stdio::which(&program) else {
            return Err(self.invalid(
                key("command"),
                format!("{program:?} is not an executable file nor on PATH"),
            ));
        };
        let mut command = u.command.clone();
        command[0] = resolved.display().to_string();
        let reserved = ["PATH", "HOME", "TMPDIR"];
        let mut env = Vec::with_capacity(u.env.len());
        for (k, v) in &u.env {
            let ok = !k.is_empty()
                && !k.contains(['=', '\0'])
                && !v.contains('\0')
                && !reserved.contains(&k.as_str());
            if !ok {
                return Err(self.invalid(
                    key(&format!("env.{k}")),
                    "a variable name without `=`, not PATH, HOME or TMPDIR (set by the firewall)",
                ));
            }
            env.push((k.clone(), v.clone()));
        }
        for (j, name) in u.env_from.iter().enumerate() {
            if name.is_empty() || name.contains(['=', '\0']) || reserved.contains(&name.as_str()) {
                return Err(self.invalid(
                    key(&format!("env_from[{j}]")),
                    "a variable name without `=`, not PATH, HOME or TMPDIR",
                ));
            }
            if (self.env)(name).is_none() {
                return Err(self.invalid(
                    key(&format!("env_from[{j}]")),
                    format!("{name} is not set in the firewall's environment"),
                ));
            }
        }
        let mut sandbox = u.sandbox.take().unwrap_or_default();
        for (list, name) in [(&mut sandbox.read, "read"), (&mut sandbox.write, "write")] {
            for (j, p) in list.iter_mut().enumerate() {
                let full = self.path(p);
                if !full.exists() {
                    return Err(self.invalid(
                        key(&format!("sandbox.{name}[{j}]")),
                        format!("{} does not exist", full.display()),
                    ));
                }
                *p = full;
            }
        }
        if let crate::sandbox::Network::Allow(pairs) = &sandbox.network {
            for (j, p) in pairs.iter().enumerate() {
                if crate::stdio::egress::parse_pair(p).is_none() {
                    return Err(self.invalid(
                        key(&format!("sandbox.network[{j}]")),
                        format!(
                            "{p:?} is not host:port (a host name or IP address, a port 1-65535)"
                        ),
                    ));
                }
            }
        }
        for (k, v) in [
            ("sandbox.memory_mb", sandbox.memory_mb),
            ("sandbox.cpu_s", sandbox.cpu_s),
            ("sandbox.processes", sandbox.processes),
        ] {
            if v == Some(0) {
                return Err(self.invalid(key(k), "must be greater than 0"));
            }
        }
        let max_instances = u.max_instances.unwrap_or(32);
        if !(1..=4096).contains(&max_instances) {
            return Err(self.invalid(key("max_instances"), "must be 1-4096"));
        }
        let idle = u.idle_timeout_s.unwrap_or(300);
        if idle == 0 {
            return Err(self.invalid(key("idle_timeout_s"), "must be greater than 0"));
        }
        Ok(Some(crate::stdio::Launch {
            command,
            env,
            env_from: u.env_from.clone(),
            instances: u.instances.unwrap_or_default(),
            max_instances,
            idle_timeout: Duration::from_secs(idle),
            sandbox,
            host: host.clone(),
        }))
    }

    fn extra_method(&self, key: &str, m: RawExtraMethod) -> Result<ExtraMethod, ConfigError> {
        let name_ok = !m.name.is_empty()
            && m.name.len() <= 128
            && m.name.bytes().all(|b| b.is_ascii_graphic());
        if !name_ok {
            return Err(self.invalid(
                format!("{key}.name"),
                format!("{:?} must be 1-128 visible ASCII characters", m.name),
            ));
        }
        if crate::mcp::methods::METHODS
            .iter()
            .any(|k| k.name == m.name)
        {
            return Err(self.invalid(
                format!("{key}.name"),
                format!(
                    "{:?} is an MCP method; it is decided by the firewall itself",
                    m.name
                ),
            ));
        }
        let shape = match m.kind.as_str() {
            "request" => Shape::Request,
            "notification" => Shape::Notification,
            other => {
                return Err(self.invalid(
                    format!("{key}.kind"),
                    format!("{other:?} is not `request` or `notification`"),
                ))
            }
        };
        let risk: Risk = m.risk.parse().map_err(|e: crate::policy::UnknownRisk| {
            self.invalid(format!("{key}.risk"), e.to_string())
        })?;
        Ok(ExtraMethod {
            name: m.name,
            shape,
            risk,
        })
    }

    fn secret(&self, key: &str, v: RawHeaderValue) -> Result<Secret, ConfigError> {
        let prefix = v.prefix.clone();
        let (raw, source) = self.secret_text(key, v)?;
        let mut value = HeaderValue::from_str(&format!("{prefix}{raw}")).map_err(|_| {
            self.invalid(
                key,
                "the value contains characters not allowed in an HTTP header",
            )
        })?;
        value.set_sensitive(true);
        Ok(Secret { value, source })
    }

    /// A secret's text from exactly one of `value`, `env` or `file`.
    fn secret_text(
        &self,
        key: &str,
        v: RawHeaderValue,
    ) -> Result<(String, HeaderValueSource), ConfigError> {
        let (raw, source) = match (v.value, v.env, v.file) {
            (Some(value), None, None) => (value, HeaderValueSource::Literal),
            (None, Some(name), None) => {
                let value = (self.env)(&name).ok_or_else(|| {
                    self.invalid(key, format!("environment variable {name} is not set"))
                })?;
                (value, HeaderValueSource::Env(name))
            }
            (None, None, Some(path)) => {
                let path = self.path(&path);
                let value = std::fs::read_to_string(&path).map_err(|e| {
                    self.invalid(key, format!("cannot read {}: {e}", path.display()))
                })?;
                (
                    value.trim_end_matches(['\r', '\n']).to_owned(),
                    HeaderValueSource::File(path),
                )
            }
            _ => {
                return Err(self.invalid(key, "exactly one of `value`, `env` or `file` is required"))
            }
        };
        Ok((raw, source))
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
