//! Human approval gates: a `tools/call` behind an `approve` gate waits until a
//! person approves **that exact call**.
//!
//! The request path calls [`Approvals::request`] (a pending approval bound to
//! the run, the tool and the SHA-256 of the canonical arguments),
//! [`Approvals::wait`] while it holds the call, and [`Approvals::consume`]
//! before the call finally runs. The approver's side is [`api`] (admin HTTP
//! API and the [`console`] page), [`client`] (the CLI) and [`webhook`]
//! (notifications).
//!
//! Invariants:
//! - an approval id carries 128 bits from the OS RNG and is only ever
//!   resolved within its tenant: another tenant's id is indistinguishable
//!   from one that does not exist;
//! - status moves `pending → approved | denied | expired`, `approved →
//!   consumed | expired`, nothing else; every move is atomic (one lock) and
//!   durable (journaled and fsynced by [`store`]) before anyone observes it;
//! - an approval never outlives the tool token of the call it approves, and
//!   is consumed at most once, so one human "yes" runs one call;
//! - expiry is decided by the clock on every read, whether or not the
//!   background sweeper has journaled it yet.
#![deny(missing_docs)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::Risk;

pub mod api;
pub mod client;
pub mod console;
pub(crate) mod postgres;
pub mod store;
pub mod webhook;

use store::Store;

/// How long a failed preview is remembered before it is tried again, so a
/// console refreshing every 2 s does not hammer a failing upstream.
const PREVIEW_ERROR_TTL: Duration = Duration::from_secs(15);
/// Longest a preview call may take before it is reported as failed.
const PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the sweeper journals expiries and compacts.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Longest reason an approver may give, in bytes.
pub const MAX_REASON_BYTES: usize = 2000;

// ---------------------------------------------------------------------------
// Configuration

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
    /// [`NewApproval::self_approval`]).
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
    /// [`Approvals::request`] refuses, so a looping agent cannot flood the
    /// approvers or the disk.
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

/// What is wrong with a config value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigProblem {
    /// Must be at least 1.
    Zero,
    /// Must be an `http://` or `https://` URL.
    NotHttpUrl,
    /// Must be a `postgres://` URL.
    NotPostgresUrl,
    /// Must be set.
    Required,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigProblem::Zero => "must be at least 1",
            ConfigProblem::NotHttpUrl => "must be an http:// or https:// URL",
            ConfigProblem::NotPostgresUrl => "must be a postgres:// URL",
            ConfigProblem::Required => "is required when approvals.store = \"postgres\"",
        })
    }
}

// ---------------------------------------------------------------------------
// Errors

/// Why an approvals operation failed. [`api`] maps each to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// No approval with this id in the caller's tenant (404).
    #[error("no approval {id:?} in this tenant")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// The run's own caller tried to approve it (403).
    #[error("{subject:?} requested this call and may not decide it: self-approval is not allowed for this approval; ask another on-call engineer")]
    SelfApproval {
        /// The approver, who is also the requester.
        subject: String,
    },
    /// Already approved, denied or consumed (409).
    #[error("approval {id} is already {status}; it cannot be decided again")]
    NotPending {
        /// The approval.
        id: ApprovalId,
        /// Its current status.
        status: Status,
    },
    /// Past its deadline (410).
    #[error("approval {id} expired at {} and can no longer be decided", crate::clock::fmt_ms(*expires_ms))]
    Expired {
        /// The approval.
        id: ApprovalId,
        /// When it expired, ms since the epoch.
        expires_ms: u64,
    },
    /// A deny without a reason (400).
    #[error("a reason is required to deny an approval")]
    ReasonRequired,
    /// A reason longer than [`MAX_REASON_BYTES`] (400).
    #[error("the reason is {len} bytes; at most {max} are allowed")]
    ReasonTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A reason with control characters other than newline and tab (400).
    #[error("the reason contains control characters")]
    ReasonControlCharacter,
    /// The tool token is already past its expiry: nothing may be approved
    /// for it.
    #[error("the tool token expired at {token_exp} (now {now_s}); no approval can outlive it")]
    TokenExpired {
        /// The token's `exp`.
        token_exp: u64,
        /// Now, seconds since the epoch.
        now_s: u64,
    },
    /// The tenant has too many pending approvals (429).
    #[error("tenant {tenant:?} already has {pending} pending approvals (limit approvals.max_pending_per_tenant = {max})")]
    TooManyPending {
        /// The tenant.
        tenant: String,
        /// Pending now.
        pending: usize,
        /// The limit.
        max: usize,
    },
    /// The journal could not record the transition; nothing changed.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The shared approvals database could not be asked (503); nothing
    /// changed.
    #[error("{0}")]
    Unavailable(String),
    /// The OS random number generator failed.
    #[error("the OS random number generator failed: {0}")]
    Random(#[source] rand::rand_core::OsError),
    /// A config value is unusable.
    #[error("invalid config: {field} {problem}")]
    InvalidConfig {
        /// Dotted path of the setting.
        field: &'static str,
        /// What is wrong.
        problem: ConfigProblem,
    },
}

// ---------------------------------------------------------------------------
// The model

/// An approval's id: `ap_` and 22 URL-safe base64 characters encoding 128
/// bits from the OS RNG. Unguessable, so holding one proves it was shown to
/// you; still only resolved within its tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApprovalId(String);

impl ApprovalId {
    /// A fresh random id.
    pub fn generate() -> Result<ApprovalId, ApprovalError> {
        use base64::Engine;
        use rand::TryRngCore;
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(ApprovalError::Random)?;
        let mut s = String::with_capacity(3 + 22);
        s.push_str("ap_");
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(bytes, &mut s);
        Ok(ApprovalId(s))
    }

    /// Accepts text shaped like an id (at most 64 URL-safe characters), so
    /// junk from a URL is refused before any lookup.
    pub fn parse(s: &str) -> Option<ApprovalId> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        ok.then(|| ApprovalId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for ApprovalId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ApprovalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for a person.
    Pending,
    /// A person said yes; the call may run once.
    Approved,
    /// A person said no.
    Denied,
    /// Nobody decided (or the approved call never ran) in time.
    Expired,
    /// The approved call ran.
    Consumed,
    /// The caller cancelled the call before it ran; it never will.
    Withdrawn,
}

impl Status {
    /// The lower-case name used in JSON and URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Approved => "approved",
            Status::Denied => "denied",
            Status::Expired => "expired",
            Status::Consumed => "consumed",
            Status::Withdrawn => "withdrawn",
        }
    }

    /// Parses [`Status::as_str`].
    pub fn from_name(s: &str) -> Option<Status> {
        Some(match s {
            "pending" => Status::Pending,
            "approved" => Status::Approved,
            "denied" => Status::Denied,
            "expired" => Status::Expired,
            "consumed" => Status::Consumed,
            "withdrawn" => Status::Withdrawn,
            _ => return None,
        })
    }

    /// Pending or approved: the approval can still change and still binds
    /// its call.
    pub fn is_live(self) -> bool {
        matches!(self, Status::Pending | Status::Approved)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Exactly which call an approval is for. Two calls with the same key are
/// the same call: same run, same tool, same arguments (by canonical hash).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallKey {
    /// The tenant of the run.
    pub tenant: String,
    /// The run (tool token `run_id`).
    pub run_id: String,
    /// `sub` of the tool token: who asked. Part of the key: an approval
    /// granted for one caller's call never runs another caller's identical
    /// call of the same run.
    pub subject: String,
    /// The upstream route name.
    pub upstream: String,
    /// The tool.
    pub tool: String,
    /// SHA-256 of the canonical arguments ([`args_sha256`]).
    #[serde(with = "hex32")]
    pub args_sha256: [u8; 32],
}

/// What the request path knows when a call meets an `approve` gate.
#[derive(Debug, Clone)]
pub struct NewApproval {
    /// The call (with who asked).
    pub key: CallKey,
    /// The agent role.
    pub agent: String,
    /// The tool's risk.
    pub risk: Risk,
    /// The arguments, already redacted for display.
    pub arguments: Value,
    /// The tool token's `exp` (seconds since the epoch); the approval
    /// expires no later.
    pub token_exp: u64,
    /// A read-only tool of the same upstream that previews the call's effect.
    pub preview_tool: Option<String>,
    /// Whether the requester may approve it themselves.
    pub self_approval: bool,
}

/// A person's decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Whether it was approved.
    pub approved: bool,
    /// `sub` of the approver's admin token.
    pub by: String,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// Why (required for a denial; may be empty for an approval).
    pub reason: String,
}

/// One approval, as stored and as shown to approvers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// The id.
    pub id: ApprovalId,
    /// The call it is for, and who asked (`subject`).
    #[serde(flatten)]
    pub key: CallKey,
    /// The agent role.
    pub agent: String,
    /// The tool's risk.
    #[serde(with = "risk_name")]
    pub risk: Risk,
    /// Redacted arguments, for display. Shared: clones are cheap.
    #[serde(with = "arc_value")]
    pub arguments: Arc<Value>,
    /// The tool token's expiry, seconds since the epoch.
    pub token_exp: u64,
    /// The preview tool, if the policy names one.
    pub preview_tool: Option<String>,
    /// Whether the requester may decide it.
    pub self_approval: bool,
    /// When it was requested, ms since the epoch.
    pub created_ms: u64,
    /// Its deadline, ms since the epoch (never past `token_exp`).
    pub expires_ms: u64,
    /// Its status (as of the read: an overdue live approval reads expired).
    pub status: Status,
    /// Who decided, when, why.
    pub decision: Option<Decision>,
    /// When the approved call ran.
    pub consumed_ms: Option<u64>,
}

impl Approval {
    /// The status at `now_ms`: a live approval past its deadline is expired,
    /// whether or not the sweeper journaled it yet.
    pub fn status_at(&self, now_ms: u64) -> Status {
        if self.status.is_live() && now_ms >= self.expires_ms {
            Status::Expired
        } else {
            self.status
        }
    }

    /// When it stopped being live, if it did (for history retention).
    pub fn ended_ms(&self) -> Option<u64> {
        match self.status {
            Status::Pending | Status::Approved => None,
            Status::Denied => self.decision.as_ref().map(|d| d.at_ms),
            Status::Expired => Some(self.expires_ms),
            Status::Consumed | Status::Withdrawn => self.consumed_ms,
        }
    }
}

/// Who is deciding: taken from a verified admin-audience token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approver {
    /// `sub` of the admin token.
    pub subject: String,
    /// `tenant_id` of the admin token; only this tenant's approvals exist
    /// for them.
    pub tenant: String,
    /// The token's scopes (recorded for the audit trail).
    pub scopes: Vec<String>,
}

/// One status change, handed to [`Approvals::on_transition`] hooks.
#[derive(Debug, Clone)]
pub struct Transition {
    /// The approval after the change (who asked: `subject`; who decided:
    /// `decision.by`).
    pub approval: Approval,
    /// The status before (`None` when it was created).
    pub from: Option<Status>,
    /// The status after.
    pub to: Status,
    /// When, ms since the epoch.
    pub at_ms: u64,
}

/// A hook receiving every transition (the audit trail).
pub type TransitionHook = Box<dyn Fn(&Transition) + Send + Sync>;

/// Calls the preview tool for an approval; set by the request path, which
/// knows how to reach upstreams.
pub type PreviewFn =
    Arc<dyn Fn(&Approval) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// A preview result as shown: the value, or why there is none.
pub type PreviewResult = Result<Arc<Value>, String>;

// ---------------------------------------------------------------------------
// Canonical arguments

/// The hash a call's arguments are bound by: SHA-256 of their RFC 8785
/// canonical text ([`crate::canonical`]), so an auditor recomputes it with
/// any JCS implementation. Two texts parsing to the same value hash alike;
/// so do `1` and `1.0` (RFC 8785 prints one number one way), while two
/// different integers never do, however large.
pub fn args_sha256(value: &Value) -> [u8; 32] {
    crate::canonical::sha256(value)
}

// ---------------------------------------------------------------------------
// Metrics

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The subsystem's metrics (prefix `approvals_`). Cheap clones of atomics.
#[derive(Clone, Debug, Default)]
pub(crate) struct Metrics {
    pending: Gauge,
    oldest_pending_age: Gauge,
    created: Counter,
    decisions: Family<OutcomeLabel, Counter>,
    webhook_failures: Family<KindLabel, Counter>,
    webhook_sent: Counter<u64, AtomicU64>,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("approvals");
        r.register(
            "pending",
            "Approvals waiting for a person",
            m.pending.clone(),
        );
        r.register(
            "oldest_pending_age_seconds",
            "Age of the oldest approval still waiting for a person (0: none), as of the last sweep",
            m.oldest_pending_age.clone(),
        );
        r.register(
            "created",
            "Approvals requested (new pending approvals)",
            m.created.clone(),
        );
        r.register(
            "decisions",
            "Approvals leaving pending or approved, by outcome (approved, denied, expired, consumed)",
            m.decisions.clone(),
        );
        r.register(
            "webhook_failures",
            "Webhook notifications that failed: kind=attempt per failed try, kind=dropped when given up",
            m.webhook_failures.clone(),
        );
        r.register(
            "webhook_sent",
            "Webhook notifications delivered (2xx)",
            m.webhook_sent.clone(),
        );
        m
    }

    pub(crate) fn webhook_attempt_failed(&self) {
        self.webhook_failures
            .get_or_create(&KindLabel { kind: "attempt" })
            .inc();
    }

    pub(crate) fn webhook_dropped(&self) {
        self.webhook_failures
            .get_or_create(&KindLabel { kind: "dropped" })
            .inc();
    }

    pub(crate) fn webhook_delivered(&self) {
        self.webhook_sent.inc();
    }
}

// ---------------------------------------------------------------------------
// The subsystem

/// The subsystem's notion of now. Tests move a manual clock to cross
/// deadlines without sleeping.
#[derive(Clone)]
pub(crate) enum Clock {
    System,
    #[cfg(test)]
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub(crate) fn now_ms(&self) -> u64 {
        match self {
            // A clock before 1970 reads as 0: everything looks young, which
            // only delays expiry until the clock is fixed.
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            #[cfg(test)]
            Clock::Manual(ms) => ms.load(std::sync::atomic::Ordering::SeqCst),
        }
    }
}

type PreviewSlot = Arc<tokio::sync::Mutex<Option<(Instant, PreviewResult)>>>;

/// The approvals subsystem, shared via `Arc`. Every method is safe to call
/// concurrently, from any replica when the store is PostgreSQL. The ones the
/// request path calls ([`Approvals::request`], [`Approvals::consume`]) cost a
/// lock and a lookup (file) or one statement (PostgreSQL) unless they change
/// state.
pub struct Approvals {
    cfg: ApprovalsConfig,
    backend: Backend,
    clock: Clock,
    metrics: Metrics,
    hooks: RwLock<Vec<TransitionHook>>,
    preview: RwLock<Option<PreviewFn>>,
    previews: dashmap::DashMap<ApprovalId, PreviewSlot>,
    public_url: ArcSwap<String>,
    webhook: Option<webhook::Webhook>,
}

/// Where approvals live.
enum Backend {
    /// A journal in `store_dir`, this replica only.
    File(Box<Store>),
    /// PostgreSQL, every replica.
    Postgres(postgres::PgStore),
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approvals")
            .field("store", &self.cfg.store)
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

impl Approvals {
    /// Validates `cfg`, opens the store (replaying and compacting the
    /// journal in `store_dir`, or migrating the PostgreSQL schema),
    /// registers the metrics and starts the sweeper and the webhook sender.
    /// Must run inside a Tokio runtime; the background tasks stop when the
    /// last `Arc` is dropped.
    pub async fn open(
        cfg: &ApprovalsConfig,
        registry: &mut Registry,
    ) -> anyhow::Result<Arc<Approvals>> {
        Self::open_with_clock(cfg, registry, Clock::System).await
    }

    pub(crate) async fn open_with_clock(
        cfg: &ApprovalsConfig,
        registry: &mut Registry,
        clock: Clock,
    ) -> anyhow::Result<Arc<Approvals>> {
        cfg.validate()?;
        let metrics = Metrics::register(registry);
        let now = clock.now_ms();
        let history_ms = cfg.history_s.saturating_mul(1000);
        let backend = match cfg.store {
            StoreKind::File => {
                let dir = cfg.store_dir.clone();
                // Replay reads and fsyncs files: off the runtime's worker threads.
                let store = tokio::task::spawn_blocking(move || Store::open(&dir, now, history_ms))
                    .await
                    .map_err(|e| anyhow::anyhow!("approvals store replay task failed: {e}"))??;
                Backend::File(Box::new(store))
            }
            StoreKind::Postgres => Backend::Postgres(postgres::PgStore::open(cfg).await?),
        };
        let webhook = cfg
            .webhook
            .as_ref()
            .map(|w| webhook::Webhook::start(w, metrics.clone()))
            .transpose()?;
        let public_url = cfg
            .public_url
            .clone()
            .unwrap_or_else(|| "http://127.0.0.1:9090".to_owned());
        let approvals = Arc::new(Approvals {
            cfg: cfg.clone(),
            backend,
            clock,
            metrics,
            hooks: RwLock::new(Vec::new()),
            preview: RwLock::new(None),
            previews: dashmap::DashMap::new(),
            public_url: ArcSwap::from_pointee(public_url.trim_end_matches('/').to_owned()),
            webhook,
        });
        approvals.metrics.pending.set(approvals.pending() as i64);
        tokio::spawn(sweeper(Arc::downgrade(&approvals)));
        Ok(approvals)
    }

    /// The configuration it was opened with (the proxy reads `hold_s`,
    /// `progress_interval_s`, `self_approval_default`).
    pub fn config(&self) -> &ApprovalsConfig {
        &self.cfg
    }

    /// The file store (tests).
    #[cfg(test)]
    pub(crate) fn file_store(&self) -> &Store {
        match &self.backend {
            Backend::File(s) => s,
            Backend::Postgres(_) => panic!("not a file store"),
        }
    }

    /// Pending approvals (as of the last sweep for PostgreSQL).
    pub fn pending(&self) -> usize {
        match &self.backend {
            Backend::File(s) => s.pending(),
            Backend::Postgres(p) => p.pending(),
        }
    }

    /// Whether the shared store cannot be asked now (for `/readyz`).
    pub fn unavailable(&self) -> bool {
        match &self.backend {
            Backend::File(_) => false,
            Backend::Postgres(p) => p.unavailable(),
        }
    }

    /// Sets the admin listener's external base URL when the config gave
    /// none (the firewall knows it once the listener is bound).
    pub fn set_public_url(&self, base: &str) {
        self.public_url
            .store(Arc::new(base.trim_end_matches('/').to_owned()));
    }

    /// Adds a hook that sees every transition this replica made, after it
    /// is durable (the audit trail). Hooks run on the caller's thread,
    /// outside any lock; they must be quick.
    pub fn on_transition(&self, hook: TransitionHook) {
        if let Ok(mut hooks) = self.hooks.write() {
            hooks.push(hook);
        }
    }

    /// Sets how previews are computed.
    pub fn set_preview(&self, f: PreviewFn) {
        if let Ok(mut p) = self.preview.write() {
            *p = Some(f);
        }
    }

    /// The pending or approved approval for exactly this call, or a new
    /// pending one. Idempotent for identical calls, across replicas with
    /// PostgreSQL: retries of a held call find the same approval.
    pub async fn request(&self, new: NewApproval) -> Result<Approval, ApprovalError> {
        let now = self.clock.now_ms();
        let expiry_ms = self.cfg.expiry_s.saturating_mul(1000);
        let max = self.cfg.max_pending_per_tenant;
        let mut transitions = Vec::new();
        let result = match &self.backend {
            Backend::File(s) => s.request(new, now, expiry_ms, max, &mut transitions),
            Backend::Postgres(p) => p.request(new, now, expiry_ms, max, &mut transitions).await,
        };
        self.emit(&transitions);
        result
    }

    /// If an approved, unconsumed, unexpired approval exists for exactly this
    /// call, marks it consumed (durably) and returns it. Exactly once: of
    /// concurrent identical calls, on any replica, one gets it. A store
    /// failure returns `None` (the call does not run).
    pub async fn consume(&self, key: &CallKey) -> Option<Approval> {
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let approval = match &self.backend {
            Backend::File(s) => s.consume(key, now, &mut transitions),
            Backend::Postgres(p) => match p.consume(key, now, &mut transitions).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume an approval; the call does not run");
                    None
                }
            },
        };
        self.emit(&transitions);
        approval
    }

    /// Withdraws the live approval `id` of `tenant` (its call was cancelled
    /// by the caller before it ran): it can no longer be decided or
    /// consumed. Returns it when it was live.
    pub async fn withdraw(&self, tenant: &str, id: &ApprovalId) -> Option<Approval> {
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let approval = match &self.backend {
            Backend::File(s) => s.withdraw(tenant, id, now, &mut transitions),
            Backend::Postgres(p) => match p.withdraw(tenant, id, now, &mut transitions).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(approval = %id, error = %e, "cannot withdraw an approval; it expires at its deadline");
                    None
                }
            },
        };
        self.emit(&transitions);
        approval
    }

    /// Withdraws from a synchronous caller (a drop guard): at once with the
    /// file store, on a task with PostgreSQL.
    pub fn withdraw_now_or_soon(self: &Arc<Self>, tenant: &str, id: &ApprovalId) {
        match &self.backend {
            Backend::File(s) => {
                let mut transitions = Vec::new();
                s.withdraw(tenant, id, self.clock.now_ms(), &mut transitions);
                self.emit(&transitions);
            }
            Backend::Postgres(_) => {
                let me = self.clone();
                let (tenant, id) = (tenant.to_owned(), id.clone());
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        me.withdraw(&tenant, &id).await;
                    });
                }
            }
        }
    }

    /// Resolves when the approval leaves `pending` (whichever replica
    /// decided it), at its deadline, or at `until`, whichever is first,
    /// returning its status then. An unknown id reads as expired (purged
    /// approvals are long past their deadline).
    pub async fn wait(&self, id: &ApprovalId, until: Instant) -> Status {
        let now = self.clock.now_ms();
        let subscribed = match &self.backend {
            Backend::File(s) => s.subscribe(id, now),
            Backend::Postgres(p) => match p.subscribe(id, now).await {
                Ok(sub) => sub,
                // Unknown while the database is down: still pending as far
                // as anyone can tell; the hold ends at `until`.
                Err(_) => {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
                    return self.status(id).await.unwrap_or(Status::Pending);
                }
            },
        };
        let (mut rx, expires_ms) = match subscribed {
            Ok(sub) => sub,
            Err(status) => return status,
        };
        let to_expiry = Duration::from_millis(expires_ms.saturating_sub(now));
        let deadline =
            tokio::time::Instant::from_std(until).min(tokio::time::Instant::now() + to_expiry);
        loop {
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let status = *rx.borrow_and_update();
                    if status != Status::Pending {
                        return status;
                    }
                }
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.status(id).await.unwrap_or(Status::Expired)
    }

    /// The status of `id` now, any tenant; `None` when unknown or when the
    /// store cannot be asked.
    async fn status(&self, id: &ApprovalId) -> Option<Status> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => s.status(id.as_str(), now),
            Backend::Postgres(p) => p.status(id.as_str(), now).await.ok().flatten(),
        }
    }

    /// One approval of `tenant`; another tenant's id reads as absent.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<Approval>, ApprovalError> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => Ok(s.get(tenant, id, now)),
            Backend::Postgres(p) => p.get(tenant, id, now).await,
        }
    }

    /// The tenant's approvals (optionally of one status), newest first;
    /// from every replica with PostgreSQL.
    pub async fn list(
        &self,
        tenant: &str,
        status: Option<Status>,
    ) -> Result<Vec<Approval>, ApprovalError> {
        let now = self.clock.now_ms();
        match &self.backend {
            Backend::File(s) => Ok(s.list(tenant, status, now)),
            Backend::Postgres(p) => p.list(tenant, status, now).await,
        }
    }

    /// Approves or denies a pending approval of the approver's tenant.
    /// Refuses: another tenant's or unknown id ([`ApprovalError::NotFound`]),
    /// the requester deciding without `self_approval`
    /// ([`ApprovalError::SelfApproval`]), not pending
    /// ([`ApprovalError::NotPending`]), past the deadline
    /// ([`ApprovalError::Expired`]), a denial without reason.
    pub async fn decide(
        &self,
        tenant: &str,
        id: &str,
        by: &Approver,
        approve: bool,
        reason: &str,
    ) -> Result<Approval, ApprovalError> {
        if by.tenant != tenant {
            return Err(ApprovalError::NotFound { id: id.to_owned() });
        }
        check_reason(approve, reason)?;
        let now = self.clock.now_ms();
        let mut transitions = Vec::new();
        let result = match &self.backend {
            Backend::File(s) => s.decide(id, by, approve, reason, now, &mut transitions),
            Backend::Postgres(p) => {
                p.decide(id, by, approve, reason, now, &mut transitions)
                    .await
            }
        };
        self.emit(&transitions);
        result
    }

    /// Where the approval's status is served on the admin listener.
    pub fn status_url(&self, id: &ApprovalId) -> String {
        format!("{}/approvals/{id}", self.public_url.load())
    }

    /// Sends another event through the approvals webhook, if one is
    /// configured (never waits). `delivery_id` stays the same across
    /// retries.
    pub fn notify(&self, event: &'static str, delivery_id: String, body: Value) {
        if let Some(w) = &self.webhook {
            w.notify_event(event, delivery_id, &body);
        }
    }

    /// The console page (for links to its other sections).
    pub fn console_url_base(&self) -> String {
        format!("{}/console", self.public_url.load())
    }

    /// The console page focused on the approval (for a person).
    pub fn console_url(&self, id: &ApprovalId) -> String {
        format!("{}/console#{id}", self.public_url.load())
    }

    /// The preview of a pending approval: `None` when it names no preview
    /// tool, no preview function is set, or it is no longer pending (its
    /// effect is history). Computed once per approval and cached; a failure
    /// is cached for 15 s, a slow preview fails after 10 s.
    pub async fn preview(&self, approval: &Approval) -> Option<PreviewResult> {
        let tool = approval.preview_tool.as_ref()?;
        if approval.status_at(self.clock.now_ms()) != Status::Pending {
            return None;
        }
        let f = self.preview.read().ok()?.clone()?;
        let slot = self
            .previews
            .entry(approval.id.clone())
            .or_default()
            .clone();
        // One computation per approval at a time: concurrent viewers wait
        // for the first one's result.
        let mut cached = slot.lock().await;
        if let Some((at, result)) = cached.as_ref() {
            if result.is_ok() || at.elapsed() < PREVIEW_ERROR_TTL {
                return Some(result.clone());
            }
        }
        let result = match tokio::time::timeout(PREVIEW_TIMEOUT, f(approval)).await {
            Ok(Ok(v)) => Ok(Arc::new(v)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!(
                "preview tool {tool} did not answer within {} s",
                PREVIEW_TIMEOUT.as_secs()
            )),
        };
        *cached = Some((Instant::now(), result.clone()));
        Some(result)
    }

    /// Records expiries that are due, forgets old history, compacts the
    /// journal when it has grown; the sweeper calls it every second. With
    /// PostgreSQL, each due expiry is made (and emitted) by one replica.
    pub async fn sweep(&self) {
        let now = self.clock.now_ms();
        let history_ms = self.cfg.history_s.saturating_mul(1000);
        let transitions = match &self.backend {
            Backend::File(_) => return self.sweep_file(),
            Backend::Postgres(p) => {
                let t = p.sweep(now, history_ms).await.unwrap_or_default();
                if !self.previews.is_empty() {
                    let ids: Vec<ApprovalId> =
                        self.previews.iter().map(|e| e.key().clone()).collect();
                    for id in ids {
                        if p.status(id.as_str(), now).await.ok().flatten() != Some(Status::Pending)
                        {
                            self.previews.remove(&id);
                        }
                    }
                }
                t
            }
        };
        self.metrics.pending.set(self.pending() as i64);
        self.set_oldest_pending(now);
        self.emit(&transitions);
    }

    /// The oldest pending approval's age, for the dashboard.
    fn set_oldest_pending(&self, now: u64) {
        let oldest = match &self.backend {
            Backend::File(s) => s.oldest_pending_ms(now),
            Backend::Postgres(p) => p.oldest_pending_ms(),
        };
        let age_s = oldest.map_or(0, |created| now.saturating_sub(created) / 1000);
        self.metrics
            .oldest_pending_age
            .set(i64::try_from(age_s).unwrap_or(i64::MAX));
    }

    /// [`Approvals::sweep`] of the file store (blocking: it may compact).
    fn sweep_file(&self) {
        let Backend::File(s) = &self.backend else {
            return;
        };
        let now = self.clock.now_ms();
        let transitions = s.sweep(now, self.cfg.history_s.saturating_mul(1000));
        self.set_oldest_pending(now);
        // Previews are only shown while pending.
        self.previews
            .retain(|id, _| s.status(id.as_str(), now) == Some(Status::Pending));
        self.emit(&transitions);
    }

    /// Hands transitions to metrics, waiters are already woken by the store,
    /// then hooks and the webhook.
    fn emit(&self, transitions: &[Transition]) {
        if transitions.is_empty() {
            return;
        }
        if let Backend::File(s) = &self.backend {
            self.metrics.pending.set(s.pending() as i64);
        }
        let hooks = self.hooks.read().ok();
        for t in transitions {
            match t.to {
                Status::Pending => {
                    self.metrics.created.inc();
                }
                other => {
                    self.metrics
                        .decisions
                        .get_or_create(&OutcomeLabel {
                            outcome: other.as_str(),
                        })
                        .inc();
                }
            }
            tracing::info!(
                approval = %t.approval.id,
                tenant = %t.approval.key.tenant,
                run = %t.approval.key.run_id,
                tool = %t.approval.key.tool,
                from = t.from.map_or("none", Status::as_str),
                to = %t.to,
                by = t.approval.decision.as_ref().map_or("", |d| d.by.as_str()),
                "approval transition"
            );
            if let Some(hooks) = &hooks {
                for hook in hooks.iter() {
                    hook(t);
                }
            }
            if let Some(w) = &self.webhook {
                if t.to != Status::Consumed {
                    w.notify(
                        t,
                        &self.status_url(&t.approval.id),
                        &self.console_url(&t.approval.id),
                    );
                }
            }
        }
    }
}

/// Creates or upgrades the PostgreSQL schema of `cfg`; returns its version.
pub async fn migrate(cfg: &ApprovalsConfig) -> anyhow::Result<u32> {
    postgres::migrate(cfg).await
}

/// Connects to the PostgreSQL store of `cfg` and reads its schema version
/// (0: not created yet), changing nothing.
pub async fn probe(cfg: &ApprovalsConfig) -> anyhow::Result<u32> {
    postgres::probe(cfg).await
}

fn check_reason(approve: bool, reason: &str) -> Result<(), ApprovalError> {
    if !approve && reason.trim().is_empty() {
        return Err(ApprovalError::ReasonRequired);
    }
    if reason.len() > MAX_REASON_BYTES {
        return Err(ApprovalError::ReasonTooLong {
            len: reason.len(),
            max: MAX_REASON_BYTES,
        });
    }
    if reason
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(ApprovalError::ReasonControlCharacter);
    }
    Ok(())
}

async fn sweeper(approvals: Weak<Approvals>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(a) = approvals.upgrade() else {
            return;
        };
        match a.backend {
            // Compaction fsyncs: keep it off the async workers.
            Backend::File(_) => {
                let _ = tokio::task::spawn_blocking(move || a.sweep_file()).await;
            }
            Backend::Postgres(_) => a.sweep().await,
        }
    }
}

mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        // Owned: flattened and tagged containers buffer strings.
        let s = String::deserialize(d)?;
        let err = || serde::de::Error::custom("args_sha256 must be 64 lower-case hex digits");
        if s.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err(err());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(&s, &mut out).map_err(|_| err())?;
        Ok(out)
    }
}

mod risk_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::policy::Risk;

    pub fn serialize<S: Serializer>(risk: &Risk, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(risk.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Risk, D::Error> {
        Risk::deserialize(d)
    }
}

mod arc_value {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(v: &Arc<Value>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Value>, D::Error> {
        Value::deserialize(d).map(Arc::new)
    }
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
