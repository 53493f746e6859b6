//! The answer side: everything the upstream sends toward the client, the
//! one relay every POST, GET, DELETE and approved held call goes through.
//! Read it in this order:
//!
//! - [`decide`](crate::verdict::answer::decide): what happens to each
//!   upstream message, decided on what the strict reader accepted, without
//!   I/O (lists filtered, input requests policed, tasks sealed, server
//!   requests refused…);
//! - [`gate`]: **the one place every message passes before any byte of it
//!   leaves**: screened whole as it is about to leave, the run labelled
//!   by its source, withheld or redacted; its [`gate::FIELDS`] table says
//!   what of each message reaches the model;
//! - this file: the exchange and the relay that carries bytes and
//!   verdicts — by status and content type, [`Exchange::respond`];
//! - `inspect.rs`: every JSON text (a whole answer, an SSE event, a batch)
//!   through [`Exchange::inspect`], each message through `on_message.rs`
//!   (the verdict, then the gate, then its row);
//! - `lists.rs`, `task_answers.rs`: what the verdicts on lists and tasks
//!   rewrite; `event_stream.rs`: SSE event by event; `large.rs`: an answer too large
//!   to hold (only where the gate has nothing to do); `status_answers.rs`:
//!   202/204 and 4xx answers; `due.rs`: what the exchange owes an end;
//!   `settle.rs`: how each ends (its budget settled, its row completed and
//!   written, the drop guard).
//!
//! By status and content type:
//! - **5xx**, and **401/407** (the upstream refused the firewall's own
//!   credentials: not the client's problem to solve): every request waiting
//!   for an answer gets a JSON-RPC error naming the upstream.
//! - **Other 4xx** reach the client with their status and body (a `404
//!   Session not found` makes the client re-initialize, as the spec
//!   requires), through the gate: a JSON body must be JSON-RPC error
//!   responses only (anything else is replaced by the firewall's error), a
//!   text body passes capped.
//! - **202/204**: accepted; nothing to inspect.
//! - **2xx JSON**: read whole up to `max_response_bytes` and inspected; a
//!   larger answer streams only where the gate has nothing to screen or
//!   label ([`gate::may_stream`]), else it is an upstream error.
//! - **2xx SSE**: event by event as they arrive (progress reaches the client
//!   while the call runs); events the firewall does not change are forwarded
//!   byte for byte except their `id:`, which is sealed with the stream's
//!   context ([`crate::session`]).
//! - **2xx anything else**: the firewall cannot inspect it, so it does not
//!   pass: an upstream error.
//!
//! Every answer is on record before it is relayed: its intent row is
//! completed and spooled first. When the client goes away, the exchange's
//! drop guard completes the rows still open as `client_gone` and settles
//! their budgets (the upstream may have acted).

use crate::audit::{AuditRow, JsonPayload};
use crate::budget::Settle;
use crate::http_util::{content_type, mime_is};
use crate::http_util::{full, Body, BoxError};
use crate::mcp::jsonrpc::{self, Id, Kind, Message};
use crate::mcp::methods::{Class, ListKind, TaskMethod};
use crate::mcp::scan::{Facts, Scan};
use crate::mcp::{rewrite, sse};
use crate::outcome::StopReason;
use crate::policy::Labels;
use crate::proxy::answer;
use crate::proxy::decision::Granted;
use crate::proxy::decision::RunContext;
use crate::proxy::error::ProxyError;
use crate::proxy::record::{write_rows, AnswerParts, Recorder};
use crate::screen::content::{Action, Carry, Recall};
use crate::server::listener::ConnInfo;
use crate::session::EventContext;
use crate::tasks;
use crate::upstream::body::{Collected, UpstreamBody, UpstreamIncoming};
use crate::upstream::client::{response_headers, Forward};
use crate::upstream::failure::UpstreamFailure;
use crate::verdict;
use crate::verdict::answer::{result_text, Answering, Content, NewTask, TaskIds, Verdict};
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::header::{HeaderMap, HeaderName};
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

mod due;
mod event_stream;
pub(crate) mod gate;
mod inspect;
mod large;
mod lists;
mod on_message;
mod settle;
mod status_answers;
mod task_answers;
pub(crate) use due::Due;
mod exchange;
pub(crate) use self::exchange::*;
