//! What a verified tool token says: its audience, its mode, and the claims the
//! proxy trusts once the signature and lifetimes pass.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Which world a token is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Audience {
    /// MCP calls through the proxy (`auth.mcp_audience`, `auth.required_scope`).
    Mcp,
    /// The admin API, e.g. approvals (`auth.admin_audience`, `auth.admin_scope`).
    Admin,
}

impl Audience {
    /// Lower-case name, as used in messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            Audience::Mcp => "mcp",
            Audience::Admin => "admin",
        }
    }
}

impl fmt::Display for Audience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// On whose authority the run acts (claim `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// On behalf of a human caller, limited to the caller's `projects`.
    Caller,
    /// As the agent itself.
    Agent,
    /// As a service account; only tokens from `auth.service_account_issuer`.
    ServiceAccount,
}

impl Mode {
    /// The claim value.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Caller => "caller",
            Mode::Agent => "agent",
            Mode::ServiceAccount => "service_account",
        }
    }

    /// Parses the claim value.
    pub fn from_name(name: &str) -> Option<Mode> {
        Some(match name {
            "caller" => Mode::Caller,
            "agent" => Mode::Agent,
            "service_account" => Mode::ServiceAccount,
            _ => return None,
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The verified contents of a tool token. Every string here came from a token
/// whose signature, issuer, audience and times were checked, and is non-empty,
/// at most [`token::MAX_CLAIM_BYTES`](crate::auth::token::MAX_CLAIM_BYTES)
/// long and free of control characters (so it is safe in an HTTP header or a
/// log line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claims {
    /// The principal (`sub`).
    pub sub: Arc<str>,
    /// The tenant the run belongs to.
    pub tenant_id: Arc<str>,
    /// The agent running.
    pub agent: Arc<str>,
    /// The run this token was minted for.
    pub run_id: String,
    /// On whose authority the run acts.
    pub mode: Mode,
    /// Projects the run may touch (empty allowed except where policy says).
    pub projects: Arc<[String]>,
    /// Upper bound on projects the run may ever touch, if the issuer set one.
    pub project_ceiling: Option<Arc<[String]>>,
    /// The token's scopes (claim `scope`, space-separated).
    pub scopes: Arc<[String]>,
    /// Unique token id, for audit and replay tracking.
    pub jti: String,
    /// Issuer.
    pub iss: Arc<str>,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Issue time, seconds since the epoch.
    pub iat: u64,
    /// Not-before, seconds since the epoch, if present.
    pub nbf: Option<u64>,
    /// When the run ends (`run_exp`, seconds since the epoch), if the
    /// issuer ends it before the firewall's run lifetime would.
    pub run_exp: Option<u64>,
    /// The audience it was verified for.
    pub audience: Audience,
    /// The `kid` of the key that verified it, if the token named one.
    pub kid: Option<String>,
    /// Who acts for the principal (RFC 8693 `act`): each actor's `sub`, the
    /// current actor first; empty when the token delegates nothing.
    pub delegation: Arc<[String]>,
}

impl Claims {
    /// Whether `scope` is among the token's scopes.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope)
    }
}
