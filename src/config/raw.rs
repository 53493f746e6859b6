//! The configuration file as written: every section's raw, deserialized shape
//! and its defaults, before validation turns it into a `Config`.

use super::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The MCP listener.
    pub server: RawServer,
    /// The admin listener (`/healthz`, `/readyz`, `/metrics`, approvals).
    #[serde(default)]
    pub admin: RawAdmin,
    /// Logging.
    #[serde(default)]
    pub log: RawLog,
    /// Tool tokens: keys, issuers, audiences, scopes.
    pub auth: crate::auth::AuthConfig,
    /// Where the policy files are.
    #[serde(default)]
    pub policy: RawPolicy,
    /// Rate limits and per-run caps (defaults; roles and upstreams refine them).
    #[serde(default)]
    pub limits: crate::budget::LimitsConfig,
    /// Human approvals of gated calls. Absent: gated calls are refused with
    /// "approval required" and no approval can be granted.
    pub approvals: Option<crate::approval::ApprovalsConfig>,
    /// The audit trail (ClickHouse through a local spool). Absent: no audit.
    pub audit: Option<crate::audit::AuditConfig>,
    /// The keys that seal session and event ids (shared by replicas).
    #[serde(default)]
    pub sessions: crate::session::SessionsConfig,
    /// Where budgets and rate limits live (this process, or Redis shared by
    /// every replica).
    #[serde(default)]
    pub state: crate::state::StateConfig,
    /// Traces (OpenTelemetry over OTLP/HTTP); absent: none.
    #[serde(default)]
    pub telemetry: crate::trace::TelemetryConfig,
    /// What every stdio upstream shares (`[stdio]`: the uids servers run
    /// as, where runtime directories go).
    #[serde(default)]
    pub stdio: crate::stdio::HostConfig,
    /// Named upstream MCP servers, reachable at `/mcp/<name>`.
    #[serde(default, rename = "upstream")]
    pub upstreams: Vec<RawUpstream>,
    /// Several upstreams behind one endpoint, `/mcp/<name>`.
    #[serde(default, rename = "virtual_server")]
    pub virtual_servers: Vec<crate::virtual_names::RawVirtualServer>,
    /// Users' own upstream tokens (`auth = "oauth_user"`): their key and
    /// store.
    pub credentials: Option<RawCredentials>,
}

/// `[server]`: the listener agents connect to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Address to listen on, e.g. `"0.0.0.0:8443"`.
    pub listen: SocketAddr,
    /// Serve plain HTTP. Must be set explicitly (local development only);
    /// without it a `[server.tls]` section is required.
    #[serde(default)]
    pub plaintext: bool,
    /// TLS termination.
    pub tls: Option<RawTls>,
    /// The URL agents use to reach this firewall (for OAuth resource metadata);
    /// default: derived from `listen` and the scheme.
    pub public_url: Option<String>,
    /// Largest accepted JSON-RPC request body. Default 1 MiB.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// Largest upstream JSON response the firewall buffers to rewrite it
    /// (`tools/list`). Default 8 MiB.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// Largest single SSE event relayed. Default 4 MiB.
    #[serde(default = "default_max_sse_event_bytes")]
    pub max_sse_event_bytes: usize,
    /// Largest request head (request line and headers) accepted: larger is
    /// a 431. Default 16 KiB, at least 8 KiB.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Serving threads for the MCP listener, each a single-threaded
    /// runtime with its own upstream connections (a call never changes
    /// threads). Default 0: one per CPU; at most 64.
    #[serde(default)]
    pub threads: usize,
    /// OAuth authorization servers advertised in the protected-resource
    /// metadata (RFC 9728). Default: `auth.issuers`.
    pub authorization_servers: Option<Vec<String>>,
    /// Deepest JSON nesting accepted. Default 64.
    #[serde(default = "default_max_json_depth")]
    pub max_json_depth: usize,
    /// Most messages in one JSON-RPC batch. Default 64.
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// How long SIGTERM waits for in-flight requests and streams. Default 30 s.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// Most concurrent requests before new ones are shed with 503, counted
    /// until each response body ends (a held stream counts). Default 10 000.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: usize,
    /// Most open client connections; past it new ones are closed at once.
    /// Default 20 000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Longest a write to a client may wait (a client that stopped reading)
    /// before the connection is closed. Default 60 s.
    #[serde(default = "default_write_idle_timeout_ms")]
    pub write_idle_timeout_ms: u64,
    /// `Origin` values accepted from browsers (`scheme://host[:port]`); a
    /// request with any other `Origin` is refused with 403, one without
    /// `Origin` is accepted. Default: the origin of `public_url`.
    pub allowed_origins: Option<Vec<String>>,
    /// `Host` names (without port) the firewall answers to; a request for any
    /// other host is refused with 403 (DNS rebinding). Default: the host of
    /// an explicit `public_url`; without one, the loopback names when
    /// listening on loopback, else any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// Addresses or networks (CIDR) of proxies in front of the firewall whose
    /// `X-Forwarded-For` is believed: the client address is the last entry
    /// not in this list. Default: none (the peer address is the client).
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
}

/// `[server.tls]`: certificate and key, re-read when the files change.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// How often the files are checked for changes. Default 5 s.
    #[serde(default = "default_tls_reload_ms")]
    pub reload_interval_ms: u64,
}

/// `[admin]`: the operations listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// Address; default `127.0.0.1:9090`.
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// Host names a request may name in `Host` (or HTTP/2 `:authority`):
    /// default the local names. An IP address always passes (DNS
    /// rebinding needs a name), so probes and scrapers by address work.
    pub allowed_hosts: Option<Vec<String>>,
}

/// `[log]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// `"text"` (default) or `"json"`.
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing` filter such as `"info,mcp_firewall=debug"`; default `"info"`.
    /// `RUST_LOG` overrides it.
    #[serde(default = "default_log_level")]
    pub level: String,
}

/// `[policy]`: the policy directory, watched for changes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Directory of `*.toml` policy files. Default `policies` (next to the config).
    #[serde(default = "default_policy_dir")]
    pub dir: PathBuf,
    /// How often the directory is checked for changes. Default 1 s.
    #[serde(default = "default_policy_reload_ms")]
    pub reload_interval_ms: u64,
    /// A candidate policy directory: every `tools/call` is also decided
    /// under it, the live answer never changes, and differences are
    /// counted and put on record. Reloaded like `dir`; a broken set is
    /// reported and ignored, never fatal.
    #[serde(default)]
    pub shadow_dir: Option<PathBuf>,
}

/// Whether an upstream's content is trusted (`[[upstream]] trust`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// Content the organization vouches for.
    #[default]
    Trusted,
    /// Content from outside: web pages, tickets, mail.
    Untrusted,
}

/// Whether an upstream serves private data (`[[upstream]] data`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataClass {
    /// Nothing private.
    #[default]
    Public,
    /// Customer records, internal documents.
    Private,
}

/// How the firewall reaches an upstream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamTransport {
    /// Streamable HTTP at `url`.
    #[default]
    Http,
    /// A command the firewall starts, over stdio.
    Stdio,
}

/// `[[upstream]]`: one MCP server behind the firewall.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Route name: the server is reached at `/mcp/<name>`. `[A-Za-z0-9_-]`, 1–64.
    pub name: String,
    /// The upstream's MCP endpoint, `http://` or `https://` (not with
    /// `transport = "stdio"`).
    #[serde(default)]
    pub url: String,
    /// `http` (default: streamable HTTP at `url`) or `stdio` (the firewall
    /// starts `command` in a sandbox and speaks to it over stdio).
    #[serde(default)]
    pub transport: UpstreamTransport,
    /// Stdio: the command (program and arguments), the program on `PATH`
    /// or a path.
    #[serde(default)]
    pub command: Vec<String>,
    /// Stdio: the whole environment it gets, besides `PATH` and a private
    /// `HOME`/`TMPDIR`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Stdio: names passed through from the firewall's own environment.
    #[serde(default)]
    pub env_from: Vec<String>,
    /// Stdio: `per_session` (default: a process per client session) or
    /// `shared` (one process for everyone).
    pub instances: Option<crate::stdio::Instances>,
    /// Stdio: most processes at once. Default 32.
    pub max_instances: Option<usize>,
    /// Stdio: a process unused this long is stopped. Default 300.
    pub idle_timeout_s: Option<u64>,
    /// Stdio: its confinement (`[upstream.sandbox]`; defaults: no network,
    /// nothing beyond the runtime readable, required).
    pub sandbox: Option<crate::sandbox::Spec>,
    /// PEM file of extra CA certificates trusted for this `https` upstream
    /// (in addition to the public web roots).
    pub ca_file: Option<PathBuf>,
    /// TCP + TLS connect timeout. Default 5 s.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Time allowed until the upstream's response headers arrive. Default 60 s.
    /// Streams, once started, are bounded by `idle_timeout_ms` instead.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Longest silence tolerated on a response body (between two chunks). Default 5 min.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Overrides `server.max_request_bytes` for this upstream.
    pub max_request_bytes: Option<usize>,
    /// Overrides `server.max_response_bytes` for this upstream.
    pub max_response_bytes: Option<usize>,
    /// Most `tools/call` per second to this upstream, all runs together
    /// (protects a vendor). Default: no limit.
    pub max_calls_per_s: Option<u32>,
    /// Speak HTTP/2 to this upstream (h2 over TLS via ALPN, or prior-knowledge h2c).
    #[serde(default)]
    pub http2: bool,
    /// With `http2`: most streams one connection carries at once; a request
    /// finding every connection full opens another. Default 100 (at or below
    /// what common servers allow per connection).
    #[serde(default = "default_http2_max_streams")]
    pub http2_max_streams: usize,
    /// Projects this upstream belongs to: a run reaches it only when one of
    /// them is among the run's effective projects. None: nobody reaches it.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Categories (tags) policies refer to, e.g. `kubernetes`, `metrics`,
    /// `database`, `knowledge`, `filesystem`, `ssh`.
    #[serde(default)]
    pub categories: Vec<String>,
    /// Use the upstream's tool annotations as risk hints where the policy
    /// names no risk. Default false: annotations are untrusted.
    #[serde(default)]
    pub trust_annotations: bool,
    /// `trusted` (default) or `untrusted`: every result of an untrusted
    /// upstream gives the run the `untrusted` label.
    #[serde(default)]
    pub trust: Trust,
    /// `public` (default) or `private`: every result of a private
    /// upstream gives the run the `private` label.
    #[serde(default)]
    pub data: DataClass,
    /// Every tool of this upstream can carry data out (as `[[tools]]
    /// egress = true` says of one tool).
    #[serde(default)]
    pub egress: bool,
    /// Headers set from the verified token on every request to this
    /// upstream (header name = claim: `sub`, `tenant_id`, `agent`, `run_id`,
    /// `mode`, `jti`, `iss`, or `projects` for the run's effective projects,
    /// comma-separated). Client-sent headers of these names are replaced.
    #[serde(default)]
    pub identity_headers: BTreeMap<String, String>,
    /// Headers the firewall injects into every request to this upstream
    /// (vendor credentials). Values come from `value`, `env` or `file`.
    #[serde(default)]
    pub headers: BTreeMap<String, RawHeaderValue>,
    /// Client headers forwarded to this upstream besides the ones MCP needs
    /// (`Content-Type`, `Accept`, `MCP-Protocol-Version`, `Mcp-Method`,
    /// `Mcp-Name`, `Mcp-Param-*`, `traceparent`, `tracestate`,
    /// `User-Agent`). Everything else the client sends is dropped.
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// Forward the client's query string. Default false: dropped.
    #[serde(default)]
    pub forward_query: bool,
    /// Methods this upstream adds to MCP, each with a risk; any other method
    /// the revision does not define is refused (-32601).
    #[serde(default)]
    pub extra_methods: Vec<RawExtraMethod>,
    /// Tool-definition pinning: `off`, `record` or `enforce`.
    #[serde(default)]
    pub pinning: crate::pins::Mode,
    /// What the firewall presents to this upstream: `static` (default: the
    /// `headers` above), `token_exchange` (a token exchanged per run, RFC
    /// 8693: `[upstream.token_exchange]`) or `oauth_user` (each user's own
    /// account: `[upstream.oauth_user]`).
    #[serde(default)]
    pub auth: UpstreamAuthMode,
    /// `[upstream.token_exchange]`, with `auth = "token_exchange"`.
    pub token_exchange: Option<RawTokenExchange>,
    /// `[upstream.oauth_user]`, with `auth = "oauth_user"`.
    pub oauth_user: Option<RawOauthUser>,
}

/// `[[upstream]] auth`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamAuthMode {
    /// The configured `headers`, the same for every run.
    #[default]
    Static,
    /// A token exchanged for each run at the identity provider (RFC 8693).
    TokenExchange,
    /// Each user's own account, after their consent.
    OauthUser,
}

/// `[upstream.token_exchange]`: where and how the firewall exchanges a
/// run's tool token for a token of this upstream's audience.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenExchange {
    /// The identity provider's token endpoint (`https://`, or `http://`
    /// on a loopback address).
    pub token_endpoint: String,
    /// The firewall's client id at the identity provider.
    pub client_id: String,
    /// Its secret (`client_secret_basic`): `{ env = "…" }` or
    /// `{ file = "…" }` as in `[upstream.headers]`.
    pub client_secret: Option<RawHeaderValue>,
    /// Or a PEM private key (EC P-256 or RSA) it signs a client assertion
    /// with (`private_key_jwt`).
    pub private_key_file: Option<PathBuf>,
    /// The `audience` asked for (the upstream's, as the provider names it).
    pub audience: Option<String>,
    /// The `resource` asked for (RFC 8707: the upstream's URI).
    pub resource: Option<String>,
    /// The `scope` asked for, space-separated.
    pub scope: Option<String>,
    /// PEM file of extra CA certificates trusted for the token endpoint.
    pub ca_file: Option<PathBuf>,
    /// Time allowed for one exchange. Default 5 s.
    pub timeout_ms: Option<u64>,
}

/// `[upstream.oauth_user]`: the upstream's authorization server and the
/// firewall's client there.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOauthUser {
    /// The authorization server's issuer URL, its endpoints read from its
    /// RFC 8414 metadata; absent (and no endpoints given): discovered from
    /// the upstream's RFC 9728 protected-resource metadata.
    pub authorization_server: Option<String>,
    /// The authorization endpoint, when the server publishes no metadata
    /// (with `token_endpoint`).
    pub authorization_endpoint: Option<String>,
    /// The token endpoint, when the server publishes no metadata.
    pub token_endpoint: Option<String>,
    /// The RFC 7009 revocation endpoint, when the server publishes no
    /// metadata (optional).
    pub revocation_endpoint: Option<String>,
    /// The firewall's client id there.
    pub client_id: String,
    /// Its secret, `{ env }` or `{ file }` (`client_secret_basic`); absent:
    /// a public client (PKCE only).
    pub client_secret: Option<RawHeaderValue>,
    /// Scopes asked for.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The RFC 8707 `resource` asked for. Default: the upstream's URL.
    pub resource: Option<String>,
    /// PEM file of extra CA certificates trusted for the server.
    pub ca_file: Option<PathBuf>,
    /// Time allowed for one request to it. Default 5 s.
    pub timeout_ms: Option<u64>,
}

/// `[credentials]`: where users' upstream tokens (`auth = "oauth_user"`)
/// are kept, and the key they are encrypted under.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredentials {
    /// 32 bytes (raw, 64 hex digits or base64) of AES-256-GCM key; readable
    /// by the firewall's user only.
    pub key_file: PathBuf,
    /// `local` (files in `dir`, one replica; the default) or `postgres`
    /// (the `[approvals]` database, shared by every replica).
    #[serde(default)]
    pub store: CredentialStoreKind,
    /// The local store's directory. Default `credentials` beside the
    /// config file.
    pub dir: Option<PathBuf>,
    /// The admin listener's external base URL, for the consent links and
    /// the redirect URI (`<public_url>/connect/<upstream>/callback`).
    /// Default: `[approvals] public_url`, else the admin address.
    pub public_url: Option<String>,
    /// Seconds a consent link stays valid. Default 600.
    pub link_ttl_s: Option<u64>,
}

/// Where users' upstream tokens are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CredentialStoreKind {
    /// Files in a directory (one replica).
    #[default]
    Local,
    /// The `[approvals]` PostgreSQL database (every replica).
    Postgres,
}

/// `[[upstream.extra_methods]]`: a method the upstream serves beyond MCP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExtraMethod {
    /// The exact method name.
    pub name: String,
    /// `request` (default) or `notification`.
    #[serde(default = "default_extra_kind")]
    pub kind: String,
    /// `read`, `write` or `destructive`; decides with the gates of that risk.
    pub risk: String,
}

/// Where an injected header's value comes from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderValue {
    /// A literal value (fine for non-secrets).
    pub value: Option<String>,
    /// Name of an environment variable holding the value.
    pub env: Option<String>,
    /// A file holding the value (trailing newline trimmed).
    pub file: Option<PathBuf>,
    /// Text put before the value, e.g. `"Bearer "`.
    #[serde(default)]
    pub prefix: String,
}

// === defaults ===

pub(super) fn default_max_request_bytes() -> usize {
    1024 * 1024
}
pub(super) fn default_max_response_bytes() -> usize {
    8 * 1024 * 1024
}
pub(super) fn default_max_header_bytes() -> usize {
    crate::server::listener::DEFAULT_MAX_HEADER_BYTES
}

pub(super) fn default_max_sse_event_bytes() -> usize {
    4 * 1024 * 1024
}
pub(super) fn default_max_json_depth() -> usize {
    64
}
pub(super) fn default_max_batch() -> usize {
    64
}
pub(super) fn default_drain_timeout_ms() -> u64 {
    30_000
}
pub(super) fn default_max_concurrent_requests() -> usize {
    10_000
}
pub(super) fn default_max_connections() -> usize {
    20_000
}
pub(super) fn default_write_idle_timeout_ms() -> u64 {
    60_000
}
pub(super) fn default_extra_kind() -> String {
    "request".to_owned()
}
pub(super) fn default_tls_reload_ms() -> u64 {
    5_000
}
pub(super) fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}
pub(super) fn default_log_level() -> String {
    "info".to_owned()
}
pub(super) fn default_connect_timeout_ms() -> u64 {
    5_000
}
pub(super) fn default_request_timeout_ms() -> u64 {
    60_000
}
pub(super) fn default_idle_timeout_ms() -> u64 {
    300_000
}
pub(super) fn default_http2_max_streams() -> usize {
    100
}

pub(super) fn default_policy_dir() -> PathBuf {
    PathBuf::from("policies")
}
pub(super) fn default_policy_reload_ms() -> u64 {
    1_000
}

impl Default for RawPolicy {
    fn default() -> Self {
        RawPolicy {
            dir: default_policy_dir(),
            reload_interval_ms: default_policy_reload_ms(),
            shadow_dir: None,
        }
    }
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: default_admin_listen(),
            allowed_hosts: None,
        }
    }
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            format: LogFormat::Text,
            level: default_log_level(),
        }
    }
}
