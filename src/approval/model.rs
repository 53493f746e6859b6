//! What an approval is: its id, status, the exact call it is bound to, the
//! decision on it, the transitions others observe, and the errors of the
//! approvals subsystem.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::Risk;

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
    pub fn generate() -> Result<ApprovalId, rand::rand_core::OsError> {
        use base64::Engine;
        use rand::TryRngCore;
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
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
    /// Why it needs approval beyond its risk's gate (a `[taint]` gate:
    /// the content the run took in, and where from).
    pub why: Option<String>,
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
    /// Why it needs approval beyond its risk's gate, if a `[taint]` gate
    /// asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
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
    /// How many later rounds of the approved call (2026-07-28 multi-round
    /// retries) have run under it: each round's sealed `requestState`
    /// releases exactly one, so a replay finds its round already spent.
    #[serde(default)]
    pub rounds: u32,
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

/// One status change, handed to
/// [`Approvals::on_transition`](crate::approval::Approvals::on_transition)
/// hooks.
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
/// Computes the preview of an approval for the approver (`&str`, their
/// subject) who opened it: the firewall's own call is attributed to them.
pub type PreviewFn =
    Arc<dyn Fn(&Approval, &str) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// Reads the labels a run (tenant, run id) holds now, with what brought
/// each in; set by the request path, which keeps them.
pub type LabelsFn = Arc<dyn Fn(&str, &str) -> Vec<RunLabel> + Send + Sync>;

/// A label a run holds, as an approval's card shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunLabel {
    /// `private` or `untrusted`.
    pub label: String,
    /// The call that brought it in (`crm: tools/call get_customer`).
    pub from: String,
}

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

mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
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

    pub(super) fn serialize<S: Serializer>(risk: &Risk, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(risk.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Risk, D::Error> {
        Risk::deserialize(d)
    }
}

mod arc_value {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub(super) fn serialize<S: Serializer>(v: &Arc<Value>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Value>, D::Error> {
        Value::deserialize(d).map(Arc::new)
    }
}
