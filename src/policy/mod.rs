//! The policy engine: what each run may see and call. This is where the
//! firewall's decisions are made; the request path asks, this answers.
//!
//! A decision on `tools/call` goes through these steps, in this order, and
//! stops at the first that refuses:
//!
//! 1. **authority**: the run's effective projects ([`Policy::authority`]);
//!    an upstream outside them does not exist for this run (404);
//! 2. **risk**: the policy's risk for the tool (exact name, then the first
//!    matching glob); else, only for upstreams marked `trust_annotations`, the
//!    upstream's annotations; else **destructive**;
//! 3. **role**: the agent role must allow the risk and match an `allow` rule
//!    and no `deny` rule; otherwise the tool is *hidden*: answered exactly as
//!    a tool that does not exist;
//! 4. **gate** for the risk (role override, else policy default): `deny`
//!    hides the tool too (it can never run), `approve` needs a person,
//!    `allow` runs unattended;
//! 5. **conditions**: every matching CEL condition must evaluate to `true`;
//!    `false`, an evaluation error or a missing field refuses the call.
//!
//! `tools/list` applies steps 1–4 to each tool, so the list holds exactly the
//! tools a `tools/call` could reach. Everything here is compiled once
//! ([`compile`](fn@compile)) and read through an `Arc` snapshot; nothing is
//! parsed per request.

use condition::{referenced, Condition};
use globset::{GlobMatcher, GlobSet};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) mod compile;
mod condition;
pub(crate) mod content;
pub(crate) mod diff;
pub(crate) mod file;
pub(crate) mod reload;
pub mod uri;
pub use compile::{compile, load_dir, PolicyError};
pub use content::{Labels, Screening, Taint, TaintRule, Traits};
mod evaluate;
mod model;
pub use self::evaluate::*;
pub use self::model::*;
