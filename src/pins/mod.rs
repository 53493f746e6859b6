//! Tool-definition pinning against rug pulls: a vendor server cannot change
//! what a tool is after a person reviewed it.
//!
//! A **pin** is the SHA-256 of a tool's whole definition as the upstream
//! lists it (name, title, description, input and output schemas,
//! annotations, `_meta`, anything else it sends), in RFC 8785 canonical
//! JSON ([`crate::canonical`]), so an auditor recomputes it with any JCS library.
//! Pins live in the policy directory, in `pins/<upstream>.toml`, which the
//! security team commits: per tool the hash, the canonical definition it
//! was computed from, who pinned it and when. Files are re-read when they
//! change.
//!
//! Each upstream has a mode (`[[upstream]] pinning`):
//! - `off`: no pins are asked for;
//! - `record` (trust on first use): calls go through; a definition without
//!   a pin, or unlike its pin, is proposed for review;
//! - `enforce`: such a tool is hidden from `tools/list` and refused on
//!   `tools/call` exactly like an unknown tool (stop reason `unpinned` or
//!   `pin_mismatch`), until a person accepts its definition.
//!
//! In every mode, a tool whose name differs from a pinned one only by case,
//! whitespace, invisible characters or confusable letters (UTS #39
//! skeleton) is refused: it can only be there to be mistaken for the other.
//!
//! Every drift (first sighting of a new or changed definition, per replica)
//! is an event: an audit row (`method = 'pins'`), the metric
//! `mcp_firewall_pin_drift_total{upstream,tool}`, a webhook, and a pending
//! review with the pinned and the new definition side by side, accepted or
//! rejected through the admin API ([`api`]), the console or `mcp-firewall
//! pins`. Accepting writes the pin file.
//!
//! Prompts and resource templates are pinned the same way ([`Subject`]):
//! their descriptions reach the model too. A changed or unpinned one is
//! hidden from `prompts/list` / `resources/templates/list` in `enforce`,
//! and a prompt is refused on `prompts/get` like an unknown prompt.

pub(crate) mod api;
mod check;
mod store;
pub(crate) use self::check::*;
pub(crate) use self::store::*;
