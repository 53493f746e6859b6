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

use super::{LogFormat, RawConfig, RawHeaderValue, RawServer, RawTls, RawUpstream, TlsConfig};
use crate::http_util::origin_of;
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
    pub virtual_servers: Vec<Arc<crate::virtual_names::VirtualServer>>,
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
    /// Users' own upstream tokens: their key and store.
    pub credentials: Option<std::sync::Arc<super::CredentialsConfig>>,
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
    /// What the firewall presents to it (`auth`).
    pub auth: super::UpstreamAuth,
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
    /// The claim a header's configured name (`sub`, `tenant_id`, ...) names.
    pub(super) fn parse(s: &str) -> Option<IdentityClaim> {
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

pub(super) struct Validator<'a> {
    pub(super) file: &'a Path,
    pub(super) base: &'a Path,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
}

impl Validator<'_> {
    /// An error about `key` of this file.
    pub(super) fn invalid(&self, key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// `p`, relative to the config file's directory unless absolute.
    pub(super) fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base.join(p)
        }
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let mut s = raw.server;
        let s_authorization_servers = s.authorization_servers.take();
        let server = self.server(s)?;
        let (auth, token_header) = self.auth(raw.auth)?;
        let authorization_servers = s_authorization_servers.unwrap_or_else(|| auth.issuers.clone());
        let approvals = self.approvals(raw.approvals)?;
        let audit = self.audit(raw.audit)?;

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
        let upstreams = self.upstreams(raw.upstreams, &mut names, &server, &token_header, &host)?;
        let virtual_servers = self.virtual_servers(raw.virtual_servers, &mut names, &upstreams)?;
        let credentials = raw
            .credentials
            .map(|c| self.credentials(c, approvals.as_ref(), raw.admin.listen))
            .transpose()?
            .map(std::sync::Arc::new);
        if credentials.is_none() {
            if let Some(i) = upstreams
                .iter()
                .position(|u| matches!(u.auth, super::UpstreamAuth::User(_)))
            {
                return Err(self.invalid(
                    format!("upstream[{i}].auth"),
                    "\"oauth_user\" keeps each user's token encrypted: add a [credentials] section (key_file, store)",
                ));
            }
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
            credentials,
        })
    }

    /// `[server]`: TLS or plaintext, the limits, the public URL and who may
    /// reach it (origins, hosts, trusted proxies).
    fn server(&self, s: RawServer) -> Result<ServerConfig, ConfigError> {
        let tls = self.tls(s.plaintext, s.tls.as_ref())?;
        self.check_server_limits(&s)?;
        let public_url_explicit = s.public_url.is_some();
        let public_url = self.public_url(s.public_url.as_deref(), tls.is_some(), s.listen)?;
        let allowed_origins = match &s.allowed_origins {
            Some(list) => self.allowed_origins(list)?,
            None => origin_of(&public_url, false).into_iter().collect(),
        };
        let trusted_proxies = self.trusted_proxies(&s.trusted_proxies)?;
        let allowed_hosts = match &s.allowed_hosts {
            Some(list) => list.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            None => default_allowed_hosts(&public_url, public_url_explicit, s.listen),
        };
        Ok(ServerConfig {
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
        })
    }

    /// `[server.tls]`, or none with an explicit `plaintext = true`.
    fn tls(&self, plaintext: bool, tls: Option<&RawTls>) -> Result<Option<TlsConfig>, ConfigError> {
        match (plaintext, tls) {
            (true, Some(_)) => Err(self.invalid(
                "server.plaintext",
                "`plaintext = true` and a [server.tls] section exclude each other",
            )),
            (false, None) => Err(self.invalid(
                "server.tls",
                "missing: TLS is required unless `plaintext = true` is set explicitly (local development only)",
            )),
            (true, None) => Ok(None),
            (false, Some(t)) => {
                let cert = self.path(&t.cert);
                let key = self.path(&t.key);
                for (k, p) in [("server.tls.cert", &cert), ("server.tls.key", &key)] {
                    if !p.is_file() {
                        return Err(self.invalid(k, format!("{} is not a readable file", p.display())));
                    }
                }
                Ok(Some(TlsConfig {
                    cert,
                    key,
                    reload_interval: Duration::from_millis(t.reload_interval_ms.max(100)),
                }))
            }
        }
    }

    /// The server's sizes, counts and timeouts are above 0, and its request
    /// head cap is one HTTP/1.1 can be read with.
    fn check_server_limits(&self, s: &RawServer) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// `server.public_url` without its final `/`, or the one `listen` and
    /// the scheme imply.
    fn public_url(
        &self,
        explicit: Option<&str>,
        tls: bool,
        listen: SocketAddr,
    ) -> Result<String, ConfigError> {
        let Some(u) = explicit else {
            let scheme = if tls { "https" } else { "http" };
            return Ok(format!("{scheme}://{listen}"));
        };
        let uri: Uri = u
            .parse()
            .map_err(|e| self.invalid("server.public_url", format!("not a URL: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(self.invalid("server.public_url", "must be an absolute http(s) URL"));
        }
        Ok(u.trim_end_matches('/').to_owned())
    }

    /// `server.allowed_origins`, each an origin.
    fn allowed_origins(&self, list: &[String]) -> Result<Vec<String>, ConfigError> {
        list.iter()
            .enumerate()
            .map(|(i, o)| {
                origin_of(o, true).ok_or_else(|| {
                    self.invalid(
                        format!("server.allowed_origins[{i}]"),
                        format!("{o:?} is not an origin (scheme://host[:port], no path)"),
                    )
                })
            })
            .collect()
    }

    /// `server.trusted_proxies`: addresses and CIDR networks.
    fn trusted_proxies(&self, list: &[String]) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        list.iter()
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
            .collect()
    }

    /// `[auth]`, its paths resolved and checked, and the token header it
    /// names.
    fn auth(
        &self,
        mut auth: crate::auth::AuthConfig,
    ) -> Result<(crate::auth::AuthConfig, HeaderName), ConfigError> {
        auth.resolve_paths(self.base);
        auth.validate().map_err(|source| ConfigError::Auth {
            file: self.file.to_owned(),
            source,
        })?;
        let token_header = auth
            .header_name()
            .map_err(|e| self.invalid("auth.header", e.to_string()))?;
        Ok((auth, token_header))
    }

    /// `[approvals]`, its paths resolved and checked.
    fn approvals(
        &self,
        raw: Option<crate::approval::ApprovalsConfig>,
    ) -> Result<Option<crate::approval::ApprovalsConfig>, ConfigError> {
        let Some(mut a) = raw else {
            return Ok(None);
        };
        a.resolve_paths(self.base);
        a.validate()
            .map_err(|e| self.invalid("approvals", e.to_string()))?;
        Ok(Some(a))
    }

    /// `[audit]`, its paths resolved and checked, its redaction patterns
    /// compiled.
    fn audit(
        &self,
        raw: Option<crate::audit::AuditConfig>,
    ) -> Result<Option<crate::audit::AuditConfig>, ConfigError> {
        let Some(mut a) = raw else {
            return Ok(None);
        };
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
        Ok(Some(a))
    }

    /// The `[[upstream]]`s, their names added to `names` (a name used twice
    /// is an error).
    fn upstreams(
        &self,
        raw: Vec<RawUpstream>,
        names: &mut HashSet<String>,
        server: &ServerConfig,
        token_header: &HeaderName,
        host: &crate::stdio::HostConfig,
    ) -> Result<Vec<Arc<Upstream>>, ConfigError> {
        let mut upstreams = Vec::with_capacity(raw.len());
        for (i, u) in raw.into_iter().enumerate() {
            let up = self.upstream(i, u, server, token_header, host)?;
            if !names.insert(up.name.clone()) {
                return Err(self.invalid(
                    format!("upstream[{i}].name"),
                    format!("duplicate upstream name {:?}", up.name),
                ));
            }
            upstreams.push(Arc::new(up));
        }
        Ok(upstreams)
    }

    /// The `[[virtual_server]]`s over `upstreams`, their names added to
    /// `names` (a name an upstream or another one has is an error).
    fn virtual_servers(
        &self,
        raw: Vec<crate::virtual_names::RawVirtualServer>,
        names: &mut HashSet<String>,
        upstreams: &[Arc<Upstream>],
    ) -> Result<Vec<Arc<crate::virtual_names::VirtualServer>>, ConfigError> {
        let upstream_names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
        let mut virtual_servers = Vec::with_capacity(raw.len());
        for (i, v) in raw.into_iter().enumerate() {
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
        Ok(virtual_servers)
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

    /// A header value injected upstream, from one of `value`, `env` or `file`.
    pub(super) fn secret(&self, key: &str, v: RawHeaderValue) -> Result<Secret, ConfigError> {
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

/// The `Host` names accepted when `server.allowed_hosts` is not set: the
/// public URL's host when it was set (`explicit`), the loopback names on a
/// loopback listener, else any (empty).
fn default_allowed_hosts(public_url: &str, explicit: bool, listen: SocketAddr) -> Vec<String> {
    if explicit {
        public_url
            .parse::<Uri>()
            .ok()
            .and_then(|u| {
                u.host()
                    .map(|h| h.trim_matches(['[', ']']).to_ascii_lowercase())
            })
            .into_iter()
            .collect()
    } else if listen.ip().is_loopback() {
        vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ]
    } else {
        Vec::new()
    }
}

/// `v` sorted, without duplicates.
pub(super) fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
