//! The errors of the approvals subsystem, and what makes an `[approvals]`
//! section invalid.

use std::fmt;

use super::model::{ApprovalId, Status};
use super::store;

/// Why a later round of an approved call may not run under its approval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoundRefused {
    /// No consumed approval with this id in the caller's tenant.
    #[error("the approval it was sealed for is unknown or was never run")]
    Unknown,
    /// The round already ran (a replayed `requestState`).
    #[error("was already used: an approval releases each round of its call once")]
    Spent,
    /// The store could not record the round, so it does not run.
    #[error("cannot be recorded as used ({0}); the round does not run")]
    Unavailable(String),
}

/// Why an approvals operation failed. [`api`](crate::approval::api) maps
/// each to an HTTP status.
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
    /// A reason longer than
    /// [`MAX_REASON_BYTES`](crate::approval::MAX_REASON_BYTES) (400).
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
    Random(#[from] rand::rand_core::OsError),
    /// A config value is unusable.
    #[error("invalid config: {field} {problem}")]
    InvalidConfig {
        /// Dotted path of the setting.
        field: &'static str,
        /// What is wrong.
        problem: ConfigProblem,
    },
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
