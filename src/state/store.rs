//! The `[state]` section and the Redis connection behind shared state: timeouts,
//! the breaker's settings, what to do when Redis is unavailable, key parts.

use super::breaker::{Breaker, Permit};
use crate::policy::Risk;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `[state]`: where budgets and rate limits live.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// `memory` (this process only; the default) or `redis`.
    #[serde(default)]
    pub backend: Backend,
    /// `redis://host:port/db` or `rediss://` (TLS). Required for `redis`.
    pub redis_url: Option<String>,
    /// An environment variable holding the Redis password (instead of one
    /// in the URL).
    pub redis_password_env: Option<String>,
    /// A file holding the Redis password (trailing newline trimmed).
    pub redis_password_file: Option<PathBuf>,
    /// PEM CA certificates for `rediss://` (default: the system's roots).
    pub redis_ca_file: Option<PathBuf>,
    /// Longest a command may take before it counts as failed. Default 50.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Prefix of every key the firewall writes. Default `mcpfw`.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Consecutive failures that open the circuit breaker. Default 3.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker waits before probing again. Default 1000.
    #[serde(default = "default_breaker_cooldown_ms")]
    pub breaker_cooldown_ms: u64,
    /// What a call of each risk gets while the store cannot be asked.
    #[serde(default)]
    pub on_store_unavailable: OnUnavailable,
    /// Seconds a replica keeps an upstream's tool catalog before learning
    /// it again (a missed `list_changed` heals within it). Default 300.
    #[serde(default = "default_catalog_ttl_s")]
    pub catalog_ttl_s: u64,
}

/// Where budgets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In this process.
    #[default]
    Memory,
    /// In Redis, shared by every replica.
    Redis,
}

/// `open` or `closed`, per risk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Admit against this replica's memory budgets.
    Open,
    /// Refuse with `-31006`.
    Closed,
}

/// `on_store_unavailable = { read = "open", write = "closed", destructive = "closed" }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnUnavailable {
    /// Read tools. Default `open`.
    #[serde(default = "open")]
    pub read: Fallback,
    /// Write tools. Default `closed`.
    #[serde(default = "closed")]
    pub write: Fallback,
    /// Destructive tools. Default `closed`.
    #[serde(default = "closed")]
    pub destructive: Fallback,
}

pub(super) fn open() -> Fallback {
    Fallback::Open
}
pub(super) fn closed() -> Fallback {
    Fallback::Closed
}
pub(super) fn default_timeout_ms() -> u64 {
    50
}
pub(super) fn default_key_prefix() -> String {
    "mcpfw".to_owned()
}
pub(super) fn default_breaker_failures() -> u32 {
    3
}
pub(super) fn default_breaker_cooldown_ms() -> u64 {
    1000
}
pub(super) fn default_catalog_ttl_s() -> u64 {
    300
}

impl Default for OnUnavailable {
    fn default() -> Self {
        OnUnavailable {
            read: Fallback::Open,
            write: Fallback::Closed,
            destructive: Fallback::Closed,
        }
    }
}

impl OnUnavailable {
    /// The choice for `risk`.
    pub fn for_risk(&self, risk: Risk) -> Fallback {
        match risk {
            Risk::Read => self.read,
            Risk::Write => self.write,
            Risk::Destructive => self.destructive,
        }
    }
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: Backend::Memory,
            redis_url: None,
            redis_password_env: None,
            redis_password_file: None,
            redis_ca_file: None,
            timeout_ms: default_timeout_ms(),
            key_prefix: default_key_prefix(),
            breaker_failures: default_breaker_failures(),
            breaker_cooldown_ms: default_breaker_cooldown_ms(),
            on_store_unavailable: OnUnavailable::default(),
            catalog_ttl_s: default_catalog_ttl_s(),
        }
    }
}

impl StateConfig {
    /// Checks what serde cannot; `Err` is the key and what is wrong.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.backend == Backend::Redis {
            let url = self.redis_url.as_deref().ok_or((
                "state.redis_url",
                "required when state.backend = \"redis\"".to_owned(),
            ))?;
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                return Err((
                    "state.redis_url",
                    format!("{url:?} is not a redis:// or rediss:// URL"),
                ));
            }
        }
        if self.redis_password_env.is_some() && self.redis_password_file.is_some() {
            return Err((
                "state.redis_password_env",
                "set at most one of redis_password_env and redis_password_file".into(),
            ));
        }
        if self.catalog_ttl_s == 0 {
            return Err(("state.catalog_ttl_s", "must be at least 1".into()));
        }
        if self.timeout_ms == 0 || self.timeout_ms > 10_000 {
            return Err(("state.timeout_ms", "must be between 1 and 10000".into()));
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}', ' ', ':']) {
            return Err((
                "state.key_prefix",
                "must be non-empty, without braces, colons or spaces".into(),
            ));
        }
        Ok(())
    }

    /// Resolves relative paths against the config file's directory.
    pub fn resolve_paths(&mut self, base: &std::path::Path) {
        for p in [&mut self.redis_password_file, &mut self.redis_ca_file]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

/// Why a shared store could not be asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// The breaker is open: the store failed recently.
    #[error(
        "the shared state store is unavailable (circuit breaker open after repeated failures)"
    )]
    Open,
    /// No answer within the timeout.
    #[error("the shared state store did not answer within {0} ms")]
    Timeout(u64),
    /// The store answered with an error, or the connection failed.
    #[error("the shared state store failed: {0}")]
    Failed(String),
}

/// A Redis connection (multiplexed, reconnecting) behind a timeout and a
/// circuit breaker.
pub struct Redis {
    conn: redis::aio::ConnectionManager,
    client: redis::Client,
    breaker: Breaker,
    timeout: Duration,
    prefix: String,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("prefix", &self.prefix)
            .field("breaker_open", &self.breaker.is_open())
            .finish_non_exhaustive()
    }
}

impl Redis {
    /// Connects lazily: the firewall starts while Redis is down (calls then
    /// take their fallback until it is reachable).
    pub fn connect(cfg: &StateConfig) -> anyhow::Result<Arc<Redis>> {
        let client = client(cfg)?;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let manager = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(Duration::from_millis(cfg.timeout_ms.max(250))))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(1000))
            .set_number_of_retries(2);
        let conn = redis::aio::ConnectionManager::new_lazy_with_config(client.clone(), manager)
            .map_err(|e| anyhow::anyhow!("state.redis_url: {e}"))?;
        Ok(Arc::new(Redis {
            conn,
            client,
            breaker: Breaker::new(
                cfg.breaker_failures,
                Duration::from_millis(cfg.breaker_cooldown_ms),
            ),
            timeout,
            prefix: cfg.key_prefix.clone(),
        }))
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Runs `f` on a connection, within the timeout and through the
    /// breaker.
    pub async fn run<T, F, Fut>(&self, f: F) -> Result<T, Unavailable>
    where
        F: FnOnce(redis::aio::ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if self.breaker.permit() == Permit::Refused {
            return Err(Unavailable::Open);
        }
        match tokio::time::timeout(self.timeout, f(self.conn.clone())).await {
            Ok(Ok(v)) => {
                self.breaker.success();
                Ok(v)
            }
            Ok(Err(e)) => {
                // A script error is ours, not the store's health.
                if e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) {
                    self.breaker.failure();
                }
                Err(Unavailable::Failed(e.to_string()))
            }
            Err(_) => {
                self.breaker.failure();
                Err(Unavailable::Timeout(self.timeout.as_millis() as u64))
            }
        }
    }

    /// `PING` within a generous timeout (for `check` and start-up logs).
    pub async fn ping(&self) -> Result<(), String> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(
            Duration::from_secs(3),
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 3 s".to_owned()),
        }
    }

    /// A dedicated pub/sub connection.
    pub async fn pubsub(&self) -> redis::RedisResult<redis::aio::PubSub> {
        self.client.get_async_pubsub().await
    }
}

/// The client for `cfg`'s URL, password and CA.
pub(super) fn client(cfg: &StateConfig) -> anyhow::Result<redis::Client> {
    use redis::IntoConnectionInfo;
    let url = cfg
        .redis_url
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("state.redis_url is required"))?;
    let mut info = url
        .into_connection_info()
        .map_err(|e| anyhow::anyhow!("state.redis_url: {e}"))?;
    let password = match (&cfg.redis_password_env, &cfg.redis_password_file) {
        (Some(var), _) => Some(std::env::var(var).map_err(|_| {
            anyhow::anyhow!("state.redis_password_env: environment variable {var} is not set")
        })?),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "state.redis_password_file: cannot read {}: {e}",
                        path.display()
                    )
                })?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
        ),
        (None, None) => None,
    };
    if let Some(p) = password {
        let settings = info.redis_settings().clone().set_password(p);
        info = info.set_redis_settings(settings);
    }
    match &cfg.redis_ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                anyhow::anyhow!("state.redis_ca_file: cannot read {}: {e}", path.display())
            })?;
            redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
            .map_err(|e| anyhow::anyhow!("state.redis_ca_file: {e}"))
        }
        None => redis::Client::open(info).map_err(|e| anyhow::anyhow!("state.redis_url: {e}")),
    }
}

/// A key component with the characters that structure keys escaped, so two
/// different (tenant, run, tool) never share a key.
pub(crate) fn key_part(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['%', ':', '{', '}']) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_parts_are_injective_over_separators() {
        assert_eq!(key_part("acme"), "acme");
        assert_eq!(key_part("a:b"), "a%3Ab");
        assert_eq!(key_part("a}{b"), "a%7D%7Bb");
        assert_ne!(key_part("a%3Ab"), key_part("a:b"));
    }

    #[test]
    fn config_defaults_and_checks() {
        let cfg: StateConfig = toml::from_str("").unwrap();
        assert_eq!(cfg.backend, Backend::Memory);
        assert_eq!(
            cfg.on_store_unavailable.for_risk(Risk::Read),
            Fallback::Open
        );
        assert_eq!(
            cfg.on_store_unavailable.for_risk(Risk::Destructive),
            Fallback::Closed
        );
        let cfg: StateConfig = toml::from_str("backend = \"redis\"").unwrap();
        assert_eq!(cfg.validate().unwrap_err().0, "state.redis_url");
        let cfg: StateConfig =
            toml::from_str("backend = \"redis\"\nredis_url = \"http://x\"").unwrap();
        assert!(cfg.validate().unwrap_err().1.contains("not a redis://"));
        let cfg: StateConfig = toml::from_str(
            "backend = \"redis\"\nredis_url = \"redis://127.0.0.1:1\"\non_store_unavailable = { read = \"closed\" }",
        )
        .unwrap();
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.on_store_unavailable.read, Fallback::Closed);
        assert_eq!(cfg.on_store_unavailable.write, Fallback::Closed);
        assert!(toml::from_str::<StateConfig>("backend = \"etcd\"").is_err());
    }
}
