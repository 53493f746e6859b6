//! `[approvals]`: the settings of the approval gates (store, expiry, hold,
//! webhook, self-approval), their defaults, and their validation.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::{ApprovalError, ConfigProblem};

/// The `[approvals]` section of the firewall's config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// Seconds a pending approval waits for a person; capped by the tool
    /// token's expiry.
    #[serde(default = "default_expiry_s")]
    pub expiry_s: u64,
    /// Seconds the request path holds a gated call open waiting for the
    /// decision before answering "approval required" (used by the proxy);
    /// 0 never holds (every gated call gets the resumable answer at once).
    #[serde(default = "default_hold_s")]
    pub hold_s: u64,
    /// Seconds between progress notifications while a call is held (used by
    /// the proxy).
    #[serde(default = "default_progress_interval_s")]
    pub progress_interval_s: u64,
    /// Where the journal lives; relative paths resolve against the config
    /// file's directory ([`ApprovalsConfig::resolve_paths`]).
    #[serde(default = "default_store_dir")]
    pub store_dir: PathBuf,
    /// Whether the run's own caller may approve its calls when the policy
    /// says nothing (the request path passes the result in
    /// [`NewApproval::self_approval`](crate::approval::NewApproval::self_approval)).
    #[serde(default = "default_self_approval")]
    pub self_approval_default: bool,
    /// The admin listener's external base URL (status and console links);
    /// when absent the firewall sets it from the bound admin address.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Seconds decided approvals stay listed (and journaled) after they end.
    #[serde(default = "default_history_s")]
    pub history_s: u64,
    /// Most pending approvals one tenant may have at once; beyond it
    /// [`Approvals::request`](crate::approval::Approvals::request) refuses,
    /// so a looping agent cannot flood the approvers or the disk.
    #[serde(default = "default_max_pending_per_tenant")]
    pub max_pending_per_tenant: usize,
    /// Optional notifications of created and decided approvals.
    #[serde(default)]
    pub webhook: Option<WebhookConfig>,
    /// `file` (a journal in `store_dir`, one replica; the default) or
    /// `postgres` (one database shared by every replica).
    #[serde(default)]
    pub store: StoreKind,
    /// `postgres://user@host:port/db?sslmode=…`; required for `postgres`.
    #[serde(default)]
    pub postgres_url: Option<String>,
    /// An environment variable holding the database password.
    #[serde(default)]
    pub postgres_password_env: Option<String>,
    /// A file holding the database password (trailing newline trimmed).
    #[serde(default)]
    pub postgres_password_file: Option<PathBuf>,
    /// PEM CA certificates for TLS to the database (default: webpki roots).
    #[serde(default)]
    pub postgres_ca_file: Option<PathBuf>,
    /// Longest one approvals operation may take. Default 500.
    #[serde(default = "default_postgres_timeout_ms")]
    pub postgres_timeout_ms: u64,
    /// Connections per replica. Default 16.
    #[serde(default = "default_postgres_pool_size")]
    pub postgres_pool_size: usize,
    /// How often held calls re-read their approval when notifications are
    /// lost. Default 2000.
    #[serde(default = "default_postgres_poll_ms")]
    pub postgres_poll_ms: u64,
}

/// Where approvals are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A journal file (one replica).
    #[default]
    File,
    /// PostgreSQL (any number of replicas).
    Postgres,
}

/// Default [`ApprovalsConfig::postgres_timeout_ms`].
pub fn default_postgres_timeout_ms() -> u64 {
    500
}
/// Default [`ApprovalsConfig::postgres_pool_size`].
pub fn default_postgres_pool_size() -> usize {
    16
}
/// Default [`ApprovalsConfig::postgres_poll_ms`].
pub fn default_postgres_poll_ms() -> u64 {
    2000
}

/// `[approvals.webhook]`: where notifications are POSTed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://` endpoint receiving JSON POSTs.
    pub url: String,
    /// Per-attempt timeout, connect to response headers.
    #[serde(default = "default_webhook_timeout_ms")]
    pub timeout_ms: u64,
    /// Attempts after the first one before a notification is dropped.
    #[serde(default = "default_webhook_max_retries")]
    pub max_retries: u32,
    /// First retry delay; doubled per attempt, capped at 30 s.
    #[serde(default = "default_webhook_backoff_ms")]
    pub backoff_ms: u64,
}

/// Default [`ApprovalsConfig::expiry_s`]: 10 minutes.
pub fn default_expiry_s() -> u64 {
    600
}
/// Default [`ApprovalsConfig::hold_s`]: 2 minutes.
pub fn default_hold_s() -> u64 {
    120
}
/// Default [`ApprovalsConfig::progress_interval_s`]: 5 seconds.
pub fn default_progress_interval_s() -> u64 {
    5
}
/// Default [`ApprovalsConfig::store_dir`]: `approvals`.
pub fn default_store_dir() -> PathBuf {
    PathBuf::from("approvals")
}
/// Default [`ApprovalsConfig::self_approval_default`]: no.
pub fn default_self_approval() -> bool {
    false
}
/// Default [`ApprovalsConfig::history_s`]: one day.
pub fn default_history_s() -> u64 {
    86_400
}
/// Default [`ApprovalsConfig::max_pending_per_tenant`]: 1000.
pub fn default_max_pending_per_tenant() -> usize {
    1000
}
/// Default [`WebhookConfig::timeout_ms`]: 5 seconds.
pub fn default_webhook_timeout_ms() -> u64 {
    5000
}
/// Default [`WebhookConfig::max_retries`]: 5.
pub fn default_webhook_max_retries() -> u32 {
    5
}
/// Default [`WebhookConfig::backoff_ms`]: 250 ms.
pub fn default_webhook_backoff_ms() -> u64 {
    250
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            expiry_s: default_expiry_s(),
            hold_s: default_hold_s(),
            progress_interval_s: default_progress_interval_s(),
            store_dir: default_store_dir(),
            self_approval_default: default_self_approval(),
            public_url: None,
            history_s: default_history_s(),
            max_pending_per_tenant: default_max_pending_per_tenant(),
            webhook: None,
            store: StoreKind::File,
            postgres_url: None,
            postgres_password_env: None,
            postgres_password_file: None,
            postgres_ca_file: None,
            postgres_timeout_ms: default_postgres_timeout_ms(),
            postgres_pool_size: default_postgres_pool_size(),
            postgres_poll_ms: default_postgres_poll_ms(),
        }
    }
}

impl ApprovalsConfig {
    /// Rejects values the subsystem cannot run with.
    pub fn validate(&self) -> Result<(), ApprovalError> {
        let positive = |field: &'static str, v: u64| {
            if v == 0 {
                Err(ApprovalError::InvalidConfig {
                    field,
                    problem: ConfigProblem::Zero,
                })
            } else {
                Ok(())
            }
        };
        positive("approvals.expiry_s", self.expiry_s)?;
        positive("approvals.progress_interval_s", self.progress_interval_s)?;
        positive(
            "approvals.max_pending_per_tenant",
            self.max_pending_per_tenant as u64,
        )?;
        if let Some(url) = &self.public_url {
            if !is_http_url(url) {
                return Err(ApprovalError::InvalidConfig {
                    field: "approvals.public_url",
                    problem: ConfigProblem::NotHttpUrl,
                });
            }
        }
        if let Some(w) = &self.webhook {
            if !is_http_url(&w.url) || w.url.parse::<http::Uri>().is_err() {
                return Err(ApprovalError::InvalidConfig {
                    field: "approvals.webhook.url",
                    problem: ConfigProblem::NotHttpUrl,
                });
            }
            positive("approvals.webhook.timeout_ms", w.timeout_ms)?;
            positive("approvals.webhook.backoff_ms", w.backoff_ms)?;
        }
        if self.store == StoreKind::Postgres {
            match self.postgres_url.as_deref() {
                Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {}
                Some(_) => {
                    return Err(ApprovalError::InvalidConfig {
                        field: "approvals.postgres_url",
                        problem: ConfigProblem::NotPostgresUrl,
                    })
                }
                None => {
                    return Err(ApprovalError::InvalidConfig {
                        field: "approvals.postgres_url",
                        problem: ConfigProblem::Required,
                    })
                }
            }
            positive("approvals.postgres_timeout_ms", self.postgres_timeout_ms)?;
            positive(
                "approvals.postgres_pool_size",
                self.postgres_pool_size as u64,
            )?;
        }
        Ok(())
    }

    /// Makes a relative `store_dir` relative to `base` (the config file's
    /// directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        for p in [
            Some(&mut self.store_dir),
            self.postgres_password_file.as_mut(),
            self.postgres_ca_file.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

fn is_http_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}
