//! Sessions bound to the principal that opened them.
//!
//! The upstream sees only the firewall's credentials, so it cannot tell two
//! callers apart: whoever presents a session id is, to it, that session. The
//! firewall therefore never shows a client the upstream's session id as it
//! is. It hands out a **sealed** id instead,
//! `s1.<key id>.<upstream id, base64url>.<tag, base64url>`, where the tag is
//! an HMAC-SHA256 (truncated to 128 bits) over the upstream's id and the
//! principal it was issued to: issuer, tenant and subject of the verified
//! token, the upstream route, and the run (`run_id`). Every POST, GET and DELETE carrying a
//! session id is unsealed against the caller's own principal; a forged,
//! altered or other principal's id is answered as an unknown session (404)
//! and never forwarded. The binding is to the principal and run, not to the
//! token bytes: a refreshed token of the same run keeps its session.
//!
//! SSE event ids are sealed the same way (`e1.…`), so `Last-Event-ID`
//! resumes only a stream of the caller's own session. A sealed event id also
//! carries the stream's context, the requests whose answers were still due
//! (id and method): a resumed stream replays answers to earlier requests,
//! and the firewall must inspect each as an answer to *that* method (filter
//! a `tools/list`, settle a `tools/call`), never by guessing from its shape.
//! A stream whose context does not fit ([`MAX_EVENT_CONTEXT`]) gets no ids,
//! so it cannot be resumed through the firewall rather than resumed blind.
//!
//! Keys come from `[sessions] keys` (the first seals, all open, so keys
//! rotate without breaking live sessions); every replica given the same
//! keys accepts every replica's sessions. Without configured keys a random
//! key is made at start: sessions then live as long as the process (a
//! client seeing 404 starts a new session, as the transport spec requires).
//!
//! Task ids (`t1.…`) and multi-round `requestState`s (`r1.…`) are sealed
//! the same way, each under its own tag domain, so no kind opens as another.
//!
//! On 2026-07-28 requests there are no sessions: `Mcp-Session-Id` is
//! ignored, never forwarded, and never minted.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::hmac;
use serde::Deserialize;

use crate::mcp::jsonrpc::Id;

/// Bytes of the HMAC tag kept in a sealed value.
const TAG_BYTES: usize = 16;
/// Least length of a configured key.
pub(crate) const MIN_KEY_BYTES: usize = 32;
/// What every `requestState` the firewall seals starts with.
pub(crate) const STATE_PREFIX: &str = "r1.";
/// Largest stream context (pending requests and the upstream's event id)
/// carried in a sealed event id.
pub(crate) const MAX_EVENT_CONTEXT: usize = 512;

/// `[sessions]`: the keys that seal session and event ids.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsConfig {
    /// Seal keys; the first seals, every one opens. Absent: a random key per
    /// process (one replica only).
    #[serde(default)]
    pub keys: Vec<RawSessionKey>,
}

/// One key: an id (it travels in every sealed value) and the secret from
/// exactly one of `value`, `env` or `file`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSessionKey {
    /// `[A-Za-z0-9_-]`, 1–16 characters.
    pub id: String,
    /// The secret itself (for tests; prefer `env` or `file`).
    pub value: Option<String>,
    /// An environment variable holding it.
    pub env: Option<String>,
    /// A file holding it (trailing newline trimmed).
    pub file: Option<std::path::PathBuf>,
}

impl fmt::Debug for RawSessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawSessionKey")
            .field("id", &self.id)
            .field("env", &self.env)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// A validated key.
#[derive(Clone)]
pub struct SessionKey {
    /// Its id.
    pub id: String,
    /// The secret.
    pub secret: Vec<u8>,
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey({:?}, <redacted>)", self.id)
    }
}

/// Whether a key id is acceptable.
pub(crate) fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 16
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Who a session belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Principal<'a> {
    /// `iss` of the verified token.
    pub issuer: &'a str,
    /// `tenant_id`.
    pub tenant: &'a str,
    /// `sub`.
    pub subject: &'a str,
    /// The upstream route.
    pub upstream: &'a str,
    /// The run (`run_id`): what the firewall hands one run is not another's.
    pub run: &'a str,
}

/// Why a sealed value was refused. Callers answer every case alike (an
/// unknown session): the distinction is for logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not of the sealed form.
    #[error("not a session id this firewall issued")]
    Malformed,
    /// Sealed with a key this firewall does not have.
    #[error("sealed with an unknown key")]
    UnknownKey,
    /// The tag does not match: altered, or another principal's.
    #[error("does not belong to this caller")]
    Mismatch,
}

/// A request still waiting for its answer on a stream (part of a sealed
/// event id's context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// Its JSON-RPC id.
    pub id: Id,
    /// Its method.
    pub method: String,
}

/// What a sealed event id carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventContext {
    /// Requests whose answers were still due on the stream.
    pub due: Vec<Due>,
    /// The upstream's own event id.
    pub upstream_event_id: String,
}

/// The seal keys of this firewall.
pub struct Sessions {
    keys: Vec<(String, hmac::Key)>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("Sessions").field("keys", &ids).finish()
    }
}

// === impl Sessions ===

impl Sessions {
    /// Sessions sealed with `keys` (the first seals); with none, a random
    /// key of this process.
    pub fn new(keys: &[SessionKey]) -> Result<Sessions, ring::error::Unspecified> {
        let mut out: Vec<(String, hmac::Key)> = keys
            .iter()
            .map(|k| (k.id.clone(), hmac::Key::new(hmac::HMAC_SHA256, &k.secret)))
            .collect();
        if out.is_empty() {
            let rng = ring::rand::SystemRandom::new();
            let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)?;
            out.push(("local".to_owned(), key));
        }
        Ok(Sessions { keys: out })
    }

    /// Whether keys were configured (several replicas can share sessions).
    pub fn shared(&self) -> bool {
        self.keys.first().is_some_and(|(id, _)| id != "local")
    }

    /// The sealed form of the upstream's session id, for `who`.
    pub fn seal(&self, who: &Principal<'_>, upstream_id: &[u8]) -> String {
        let (kid, key) = self.current();
        let tag = session_tag(key, who, upstream_id);
        format!(
            "s1.{kid}.{}.{}",
            URL_SAFE_NO_PAD.encode(upstream_id),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The upstream's session id inside `sealed`, if it was issued to `who`.
    pub fn open(&self, who: &Principal<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let (key, body, tag) = self.split(sealed, b"s1")?;
        let upstream_id = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Malformed)?;
        if upstream_id.is_empty() || !upstream_id.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(SealError::Malformed);
        }
        let expected = session_tag(key, who, &upstream_id);
        if !same(&expected, &tag) {
            return Err(SealError::Mismatch);
        }
        Ok(upstream_id)
    }

    /// A stable, keyed name of a session for audit rows (the upstream's id
    /// never appears there as it is).
    pub fn audit_name(&self, who: &Principal<'_>, upstream_id: &[u8]) -> String {
        let (_, key) = self.current();
        let tag = session_tag(key, who, upstream_id);
        hex::encode(&tag[..12])
    }

    /// The sealed form of an upstream event id with its stream context;
    /// `None` when the context is too large to carry (the event is then
    /// relayed without an id).
    pub fn seal_event(
        &self,
        who: &Principal<'_>,
        session: Option<&[u8]>,
        context: &EventContext,
    ) -> Option<String> {
        let payload = encode_context(context)?;
        let (kid, key) = self.current();
        let tag = event_tag(key, who, session, &payload);
        Some(format!(
            "e1.{kid}.{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(tag)
        ))
    }

    /// The context of a sealed event id, if it was issued on `session` to
    /// `who`.
    pub fn open_event(
        &self,
        who: &Principal<'_>,
        session: Option<&[u8]>,
        sealed: &[u8],
    ) -> Result<EventContext, SealError> {
        let (key, body, tag) = self.split(sealed, b"e1")?;
        let payload = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Malformed)?;
        let expected = event_tag(key, who, session, &payload);
        if !same(&expected, &tag) {
            return Err(SealError::Mismatch);
        }
        decode_context(&payload).ok_or(SealError::Malformed)
    }

    /// A sealed `requestState` for a multi-round call (2026-07-28) the
    /// firewall wants back on the retry: `payload` (its own bytes) bound to
    /// `who`. Clients must echo it unchanged; anything else fails to open.
    pub fn seal_state(&self, who: &Principal<'_>, payload: &[u8]) -> String {
        self.seal_payload("r1", payload, |key| state_tag(key, who, payload))
    }

    /// The payload of a sealed `requestState`, if it was sealed for `who`.
    pub fn open_state(&self, who: &Principal<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        self.open_payload(sealed, "r1", |key, payload| state_tag(key, who, payload))
    }

    /// The sealed form of an upstream task id (and what the firewall needs
    /// to know of its call), for `who`: the only task id a client sees, so
    /// `tasks/*` reach only the tasks of the principal and run that created
    /// them.
    pub fn seal_task(&self, who: &Principal<'_>, payload: &[u8]) -> String {
        self.seal_payload("t1", payload, |key| task_tag(key, who, payload))
    }

    /// The payload of a sealed task id, if it was sealed for `who`.
    pub fn open_task(&self, who: &Principal<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        self.open_payload(sealed, "t1", |key, payload| task_tag(key, who, payload))
    }

    /// What a virtual server hands its client (its session id, list
    /// cursors, and the ids of its members' requests, tasks and progress
    /// tokens), sealed for `who` (`who.upstream` is the virtual server)
    /// under `kind`: a value of one kind never opens as another.
    pub fn seal_virtual(&self, kind: VirtualKind, who: &Principal<'_>, payload: &[u8]) -> String {
        self.seal_payload(kind.prefix(), payload, |key| {
            virtual_tag(key, kind, who, payload)
        })
    }

    /// The payload of a value [`Sessions::seal_virtual`] sealed for `who`
    /// under `kind`.
    pub fn open_virtual(
        &self,
        kind: VirtualKind,
        who: &Principal<'_>,
        sealed: &[u8],
    ) -> Result<Vec<u8>, SealError> {
        self.open_payload(sealed, kind.prefix(), |key, payload| {
            virtual_tag(key, kind, who, payload)
        })
    }

    /// `<prefix>.<kid>.<payload>.<tag>` with the current key.
    fn seal_payload(
        &self,
        prefix: &str,
        payload: &[u8],
        tag: impl FnOnce(&hmac::Key) -> [u8; TAG_BYTES],
    ) -> String {
        let (kid, key) = self.current();
        format!(
            "{prefix}.{kid}.{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag(key))
        )
    }

    /// The payload of a value [`Sessions::seal_payload`] sealed under
    /// `prefix`, if `tag` gives the tag it carries.
    fn open_payload(
        &self,
        sealed: &[u8],
        prefix: &str,
        tag: impl FnOnce(&hmac::Key, &[u8]) -> [u8; TAG_BYTES],
    ) -> Result<Vec<u8>, SealError> {
        let (key, body, carried) = self.split(sealed, prefix.as_bytes())?;
        let payload = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Malformed)?;
        if !same(&tag(key, &payload), &carried) {
            return Err(SealError::Mismatch);
        }
        Ok(payload)
    }

    fn current(&self) -> (&str, &hmac::Key) {
        // `new` always leaves at least one key.
        let (id, key) = &self.keys[0];
        (id, key)
    }

    /// `<prefix>.<kid>.<body>.<tag>` → (key, body, tag bytes).
    fn split<'s>(
        &self,
        sealed: &'s [u8],
        prefix: &[u8],
    ) -> Result<(&hmac::Key, &'s [u8], Vec<u8>), SealError> {
        let mut parts = sealed.split(|b| *b == b'.');
        let (Some(p), Some(kid), Some(body), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(SealError::Malformed);
        };
        if p != prefix {
            return Err(SealError::Malformed);
        }
        let key = self
            .keys
            .iter()
            .find(|(id, _)| id.as_bytes() == kid)
            .map(|(_, k)| k)
            .ok_or(SealError::UnknownKey)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| SealError::Malformed)?;
        if tag.len() != TAG_BYTES {
            return Err(SealError::Malformed);
        }
        Ok((key, body, tag))
    }
}

/// Length-prefixed fields: no two different field lists give the same bytes.
fn frame(ctx: &mut hmac::Context, fields: &[&[u8]]) {
    for f in fields {
        ctx.update(&(f.len() as u32).to_be_bytes());
        ctx.update(f);
    }
}

/// The tag of `domain` fields, then `who`'s, then `tail`: length-prefixed
/// ([`frame`]), so no two field lists give the same bytes.
fn principal_tag(
    key: &hmac::Key,
    domain: &[&[u8]],
    who: &Principal<'_>,
    tail: &[&[u8]],
) -> [u8; TAG_BYTES] {
    let mut fields: Vec<&[u8]> = Vec::with_capacity(domain.len() + 5 + tail.len());
    fields.extend_from_slice(domain);
    fields.extend_from_slice(&[
        who.issuer.as_bytes(),
        who.tenant.as_bytes(),
        who.subject.as_bytes(),
        who.upstream.as_bytes(),
        who.run.as_bytes(),
    ]);
    fields.extend_from_slice(tail);
    let mut ctx = hmac::Context::with_key(key);
    frame(&mut ctx, &fields);
    truncate(ctx.sign())
}

fn session_tag(key: &hmac::Key, who: &Principal<'_>, upstream_id: &[u8]) -> [u8; TAG_BYTES] {
    principal_tag(key, &[b"mcp-firewall session v1"], who, &[upstream_id])
}

fn event_tag(
    key: &hmac::Key,
    who: &Principal<'_>,
    session: Option<&[u8]>,
    payload: &[u8],
) -> [u8; TAG_BYTES] {
    principal_tag(
        key,
        &[b"mcp-firewall event v1"],
        who,
        &[session.unwrap_or(b""), payload],
    )
}

fn state_tag(key: &hmac::Key, who: &Principal<'_>, payload: &[u8]) -> [u8; TAG_BYTES] {
    principal_tag(key, &[b"mcp-firewall request state v1"], who, &[payload])
}

fn task_tag(key: &hmac::Key, who: &Principal<'_>, payload: &[u8]) -> [u8; TAG_BYTES] {
    principal_tag(key, &[b"mcp-firewall task v1"], who, &[payload])
}

/// What a virtual server seals ([`Sessions::seal_virtual`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtualKind {
    /// Its `Mcp-Session-Id`.
    Session,
    /// A merged list's cursor.
    Cursor,
    /// A member's request to the client, its id as the client sees it.
    Request,
    /// A member's task id.
    Task,
    /// A progress token as the member sees it.
    Progress,
}

impl VirtualKind {
    fn prefix(self) -> &'static str {
        match self {
            VirtualKind::Session => "vs1",
            VirtualKind::Cursor => "vc1",
            VirtualKind::Request => "vr1",
            VirtualKind::Task => "vt1",
            VirtualKind::Progress => "vp1",
        }
    }
}

fn virtual_tag(
    key: &hmac::Key,
    kind: VirtualKind,
    who: &Principal<'_>,
    payload: &[u8],
) -> [u8; TAG_BYTES] {
    principal_tag(
        key,
        &[b"mcp-firewall virtual v1", kind.prefix().as_bytes()],
        who,
        &[payload],
    )
}

/// Compares two tags in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn truncate(tag: hmac::Tag) -> [u8; TAG_BYTES] {
    let mut out = [0u8; TAG_BYTES];
    out.copy_from_slice(&tag.as_ref()[..TAG_BYTES]);
    out
}

/// `[n] n × ([kind][len u16][id][len u8][method])` then the upstream event
/// id; kind 0 is an integer id (decimal text), 1 a string id.
fn encode_context(c: &EventContext) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + c.upstream_event_id.len());
    out.push(u8::try_from(c.due.len()).ok()?);
    for d in &c.due {
        let (kind, text) = match &d.id {
            Id::Number(n) => (0u8, n.to_string()),
            Id::String(s) => (1u8, s.clone()),
        };
        out.push(kind);
        out.extend_from_slice(&u16::try_from(text.len()).ok()?.to_be_bytes());
        out.extend_from_slice(text.as_bytes());
        out.push(u8::try_from(d.method.len()).ok()?);
        out.extend_from_slice(d.method.as_bytes());
    }
    out.extend_from_slice(c.upstream_event_id.as_bytes());
    (out.len() <= MAX_EVENT_CONTEXT).then_some(out)
}

fn decode_context(b: &[u8]) -> Option<EventContext> {
    let (&n, mut rest) = b.split_first()?;
    let mut due = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let (&kind, r) = rest.split_first()?;
        let len = usize::from(u16::from_be_bytes([*r.first()?, *r.get(1)?]));
        let text = std::str::from_utf8(r.get(2..2 + len)?).ok()?;
        let r = r.get(2 + len..)?;
        let (&mlen, r) = r.split_first()?;
        let method = std::str::from_utf8(r.get(..usize::from(mlen))?).ok()?;
        rest = r.get(usize::from(mlen)..)?;
        let id = match kind {
            0 => Id::Number(text.parse().ok()?),
            1 => Id::String(text.to_owned()),
            _ => return None,
        };
        due.push(Due {
            id,
            method: method.to_owned(),
        });
    }
    Some(EventContext {
        due,
        upstream_event_id: std::str::from_utf8(rest).ok()?.to_owned(),
    })
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
