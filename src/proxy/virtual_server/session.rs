//! A virtual server's client sessions: one sealed `Mcp-Session-Id` bound
//! to the principal and run, holding each member's session once opened;
//! opened from the id on any replica ([`open_session`]), the requests in
//! flight kept for their cancellation ([`Inflight`]), ended by DELETE.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::header::{HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use serde_json::Value;

use super::rewrite::Seal;
use super::{Cx, Virtual};
use crate::http_util::Body;
use crate::mcp::jsonrpc::Id;
use crate::proxy::error::ProxyError;
use crate::session::VirtualKind;
use crate::upstream::body::ClientBody;

/// Most client sessions a virtual server keeps on this replica; past it the
/// oldest is let go (its client's next request opens the members again).
const MAX_SESSIONS: usize = 50_000;

/// One client session: the client's `initialize` params and each member's
/// (sealed) session id, once opened.
pub(super) struct VSession {
    key: [u8; 16],
    /// The client's `initialize` params (members opened later are opened
    /// with them).
    pub(super) init: Value,
    /// Each member's (sealed) session id, once opened.
    pub(super) members: Vec<tokio::sync::Mutex<Option<HeaderValue>>>,
    /// Requests in flight, by the client's id: where a cancellation goes.
    pub(super) inflight: Mutex<HashMap<Id, usize>>,
    seq: u64,
}

/// The client's sealed session, this replica's copy (or a new copy made
/// from what the id carries: its members open again lazily).
pub(super) fn open_session(
    vs: &Virtual,
    seal: &Seal,
    headers: &HeaderMap,
) -> Result<Option<Arc<VSession>>, ProxyError> {
    let mut values = headers.get_all("mcp-session-id").iter();
    let Some(sealed) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ProxyError::SessionNotFound);
    }
    let payload = sealed
        .to_str()
        .ok()
        .and_then(|s| seal.open(VirtualKind::Session, s))
        .ok_or(ProxyError::SessionNotFound)?;
    let (key, init) = payload
        .split_first_chunk::<16>()
        .ok_or(ProxyError::SessionNotFound)?;
    if let Some(s) = vs.sessions.get(key) {
        return Ok(Some(s.clone()));
    }
    if vs.ended.contains_key(key) {
        return Err(ProxyError::SessionNotFound);
    }
    let init: Value = serde_json::from_slice(init).unwrap_or(Value::Null);
    if !init.is_object() {
        // Ended here (DELETE), or too large to travel in the id.
        return Err(ProxyError::SessionNotFound);
    }
    Ok(Some(insert_session(vs, *key, init)))
}

pub(super) fn insert_session(vs: &Virtual, key: [u8; 16], init: Value) -> Arc<VSession> {
    // Past the cap by a margin, the oldest sessions go down to the cap: one
    // pass over the map per margin's worth of new sessions.
    if vs.sessions.len() >= MAX_SESSIONS + MAX_SESSIONS / 64 {
        crate::budget::evict_oldest(&vs.sessions, MAX_SESSIONS, |s| s.seq);
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let s = Arc::new(VSession {
        key,
        init,
        members: (0..vs.config.members.len())
            .map(|_| tokio::sync::Mutex::new(None))
            .collect(),
        inflight: Mutex::new(HashMap::new()),
        seq: SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    });
    vs.sessions.insert(key, s.clone());
    s
}

/// A client's request in flight to a member (for its cancellation).
pub(super) struct Inflight {
    session: Arc<VSession>,
    id: Id,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if let Ok(mut f) = self.session.inflight.lock() {
            f.remove(&self.id);
        }
    }
}

impl Cx<'_> {
    /// Remembers where a client's request went (for its cancellation) until
    /// the guard is dropped.
    pub(super) fn track(&self, id: Option<&Id>, m: usize) -> Option<Inflight> {
        let (s, id) = (self.session.clone()?, id?.clone());
        if let Ok(mut f) = s.inflight.lock() {
            if f.len() < 10_000 {
                f.insert(id.clone(), m);
            }
        }
        Some(Inflight { session: s, id })
    }

    /// The members with a session open on this client session.
    pub(super) async fn opened_members(&self) -> Vec<usize> {
        let Some(s) = &self.session else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (m, slot) in s.members.iter().enumerate() {
            if slot.lock().await.is_some() {
                out.push(m);
            }
        }
        out
    }

    /// DELETE: every member's session ended, then the client's.
    pub(super) async fn delete(
        &self,
        req: Request<ClientBody>,
    ) -> Result<Response<Body>, ProxyError> {
        let Some(s) = &self.session else {
            return Err(ProxyError::SessionRequired);
        };
        let headers = req.headers().clone();
        for m in self.opened_members().await {
            let _ = self.call(&headers, m, Method::DELETE, None, None).await;
        }
        self.vs.sessions.remove(&s.key);
        if self.vs.ended.len() >= MAX_SESSIONS {
            self.vs.ended.clear();
        }
        self.vs.ended.insert(s.key, ());
        let mut r = Response::new(crate::http_util::empty());
        *r.status_mut() = StatusCode::OK;
        Ok(r)
    }
}
