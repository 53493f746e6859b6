//! The bridge between streamable HTTP and a stdio server's pipes: sessions
//! mapped to instances, one message in, answers and notifications out as SSE.

use super::instance::{Instance, Item};
use super::*;
use crate::http_util::{self, Body};
use crate::telemetry::Metrics;
use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What every instance of one upstream shares.
pub(crate) struct Shared {
    /// The upstream's name.
    pub name: String,
    /// What to start.
    pub launch: Launch,
    /// Largest line a process may write (the upstream's response cap).
    pub max_line: usize,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The egress proxy of an allow-list, started with the first process.
    egress: tokio::sync::OnceCell<egress::Egress>,
    /// This upstream's runtime directory (the egress socket, instance
    /// directories), `Err` when it could not be made.
    homes: Result<PathBuf, String>,
    /// Why the last start failed (the server exited before it answered),
    /// until one succeeds.
    pub(super) start_failed: Mutex<Option<String>>,
    /// Why no process may start (a required sandbox layer is unavailable).
    pub(super) refused: Mutex<Option<String>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Ok(dir) = &self.homes {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Shared {
    /// The egress proxy's socket (an allow-list only), started on first
    /// use.
    pub(crate) async fn egress_socket(&self) -> Result<Option<PathBuf>, String> {
        let allow = match &self.launch.sandbox.network {
            crate::sandbox::Network::None => return Ok(None),
            crate::sandbox::Network::Allow(a) => a.clone(),
        };
        let socket = self.homes.clone()?.join("egress.sock");
        self.egress
            .get_or_try_init(|| async {
                egress::Egress::start(&self.name, &allow, &socket, self.metrics.clone())
                    .map_err(|e| format!("cannot start the egress proxy: {e}"))
            })
            .await?;
        Ok(Some(socket))
    }
}

/// Which process a message goes to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Key {
    /// A client session's own.
    Session(u64),
    /// A principal and run's (no session).
    Principal(String),
    /// The one shared process.
    Shared,
}

/// One client session of the bridge.
pub(super) struct Session {
    /// Its number (what the instance knows it by).
    number: u64,
    /// The process it speaks to.
    instance: Arc<Instance>,
}

/// The streamable HTTP side of one stdio upstream.
pub struct Bridge {
    shared: Arc<Shared>,
    instances: Mutex<HashMap<Key, Arc<Instance>>>,
    sessions: Mutex<HashMap<String, Session>>,
    next: AtomicU64,
}

impl Bridge {
    /// The bridge of upstream `name`; starts its reaper.
    pub fn new(name: &str, launch: Launch, max_line: usize, metrics: Arc<Metrics>) -> Arc<Bridge> {
        let homes = launch.host.runtime_dir_for(name);
        if let Err(why) = &homes {
            tracing::error!(upstream = %name, reason = %why, "stdio upstream: no runtime directory; its server is not started");
        }
        let idle = launch.idle_timeout;
        process::become_subreaper();
        let bridge = Arc::new(Bridge {
            shared: Arc::new(Shared {
                name: name.to_owned(),
                launch,
                max_line,
                metrics,
                egress: tokio::sync::OnceCell::new(),
                homes,
                start_failed: Mutex::new(None),
                refused: Mutex::new(None),
            }),
            instances: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&bridge);
            let every = (idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(5));
            rt.spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    let Some(b) = weak.upgrade() else { return };
                    b.reap().await;
                }
            });
        }
        bridge
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Probes the sandbox (in a child, as a server would be confined),
    /// reports the layers in the log and metrics, and refuses every start
    /// when a required layer is unavailable.
    pub async fn check_sandbox(&self) -> Result<crate::sandbox::Report, String> {
        let launch = self.shared.launch.clone();
        let probed = tokio::task::spawn_blocking(move || probe(&launch))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        let name = &self.shared.name;
        match &probed {
            Ok(report) => {
                let applied: Vec<String> = report.applied.iter().map(|l| layer_name(*l)).collect();
                for (layer, why) in &report.missing {
                    tracing::warn!(upstream = %name, layer = %layer_name(*layer), reason = %why, "stdio server runs without a sandbox layer");
                }
                for l in crate::sandbox::Layer::ALL {
                    let missing = report.missing.iter().any(|(m, _)| *m == l);
                    self.shared
                        .metrics
                        .sandbox_layer_missing(name, &layer_name(l), missing);
                }
                tracing::info!(upstream = %name, applied = %applied.join(", "), "stdio upstream: sandbox layers");
                *self.shared.refused.lock() = None;
            }
            Err(why) => {
                tracing::error!(upstream = %name, reason = %why, "stdio upstream: the sandbox cannot be applied; its server is not started");
                *self.shared.refused.lock() = Some(why.clone());
            }
        }
        probed
    }

    /// Why its servers are not started, if they are not.
    pub fn unavailable(&self) -> Option<String> {
        if let Err(why) = &self.shared.homes {
            return Some(why.clone());
        }
        self.shared.refused.lock().clone()
    }

    /// Why its last server could not start, until one does.
    pub fn start_failed(&self) -> Option<String> {
        self.shared.start_failed.lock().clone()
    }

    /// Stops every process (the close sequence, in parallel).
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Instance>> = self.instances.lock().drain().map(|(_, i)| i).collect();
        self.sessions.lock().clear();
        futures_util::future::join_all(all.iter().map(|i| i.close("shutdown"))).await;
        self.gauge();
        if let Ok(dir) = &self.shared.homes {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Stops the processes unused for `idle_timeout`.
    async fn reap(&self) {
        let idle = self.shared.launch.idle_timeout;
        let done: Vec<(Key, Arc<Instance>)> = {
            let mut map = self.instances.lock();
            let keys: Vec<Key> = map
                .iter()
                .filter(|(_, i)| i.idle_for() >= idle)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| map.remove(&k).map(|i| (k, i)))
                .collect()
        };
        if done.is_empty() {
            return;
        }
        {
            let ended: Vec<u64> = done.iter().map(|(_, i)| i.number).collect();
            self.sessions
                .lock()
                .retain(|_, s| !ended.contains(&s.instance.number));
        }
        for (_, i) in &done {
            i.close("idle").await;
        }
        self.gauge();
    }

    fn gauge(&self) {
        let n = self.instances.lock().len();
        self.shared.metrics.stdio_instances(&self.shared.name, n);
    }

    /// The instance for `key`, created (not yet started) when new; `Err`
    /// says why not.
    fn instance(&self, key: Key) -> Result<Arc<Instance>, String> {
        let mut map = self.instances.lock();
        if let Some(i) = map.get(&key) {
            return Ok(i.clone());
        }
        if map.len() >= self.shared.launch.max_instances {
            tracing::warn!(upstream = %self.shared.name, max = self.shared.launch.max_instances, "stdio upstream at max_instances: a new session is refused");
            return Err(format!(
                "stdio upstream {:?} runs max_instances = {} processes; try again when one ends",
                self.shared.name, self.shared.launch.max_instances
            ));
        }
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let Ok(homes) = self.shared.homes.clone() else {
            return Err(self.unavailable().unwrap_or_default());
        };
        let i = Instance::new(self.shared.clone(), number, homes);
        map.insert(key, i.clone());
        let n = map.len();
        drop(map);
        self.shared.metrics.stdio_instances(&self.shared.name, n);
        Ok(i)
    }

    /// Serves one streamable HTTP request of the request path.
    pub async fn serve(self: Arc<Self>, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let sid = parts
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match parts.method {
            Method::POST => {
                let body = match body.collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(e) => return plain(StatusCode::BAD_REQUEST, &e.to_string()),
                };
                self.post(&parts.headers, sid, body).await
            }
            Method::GET => match sid.and_then(|s| self.session(&s)) {
                Some((number, i)) => sse(i.listen(number)),
                None => plain(StatusCode::METHOD_NOT_ALLOWED, "no session to listen to"),
            },
            Method::DELETE => match sid {
                Some(s) => self.end(&s).await,
                None => plain(StatusCode::BAD_REQUEST, "no session to end"),
            },
            _ => plain(StatusCode::METHOD_NOT_ALLOWED, "POST, GET or DELETE"),
        }
    }

    fn session(&self, sid: &str) -> Option<(u64, Arc<Instance>)> {
        self.sessions
            .lock()
            .get(sid)
            .map(|s| (s.number, s.instance.clone()))
    }

    async fn end(&self, sid: &str) -> Response<Body> {
        let Some(s) = self.sessions.lock().remove(sid) else {
            return plain(StatusCode::NOT_FOUND, "no such session");
        };
        if self.shared.launch.instances == Instances::PerSession {
            self.instances
                .lock()
                .retain(|_, i| i.number != s.instance.number);
            self.gauge();
            s.instance.close("session ended").await;
        } else {
            s.instance.forget(s.number);
        }
        Response::new(http_util::empty())
    }

    async fn post(&self, headers: &HeaderMap, sid: Option<String>, body: Bytes) -> Response<Body> {
        let msg: Value = match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return plain(StatusCode::BAD_REQUEST, "one JSON-RPC message per POST"),
            Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("not JSON: {e}")),
        };
        let method = msg.get("method").and_then(Value::as_str);
        let is_request = method.is_some() && msg.get("id").is_some();
        let initialize = is_request && method == Some("initialize");
        let (number, instance, new_sid) = match self.instance_for(headers, sid, initialize) {
            Ok(found) => found,
            Err(Refusal::Plain(status, text)) => return plain(status, text),
            Err(Refusal::Rpc(why)) => return refuse(&msg, &why),
        };
        if !is_request {
            return match instance.notify(number, msg).await {
                Ok(()) => {
                    let mut r = Response::new(http_util::empty());
                    *r.status_mut() = StatusCode::ACCEPTED;
                    r
                }
                Err(e) => plain(StatusCode::BAD_GATEWAY, &e),
            };
        }
        let mut rx = instance.call(number, msg).await;
        let first = rx.recv().await;
        // An initialize opens a session only when it has a result.
        let initialized = match &first {
            Some(Item::Final(b)) => {
                serde_json::from_slice::<Value>(b).is_ok_and(|v| v.get("result").is_some())
            }
            // Messages before the answer: a stream, taken as a session.
            Some(Item::Event(_)) => true,
            None => false,
        };
        let mut resp = answer(headers, first, rx).await;
        if let Some(s) = new_sid {
            self.settle_session(s, initialized, number, instance, &mut resp)
                .await;
        }
        resp
    }

    /// The instance a POST goes to, with the client's number on it and,
    /// when the POST is an `initialize` without a session (`initialize`),
    /// the id of the session it would open.
    fn instance_for(
        &self,
        headers: &HeaderMap,
        sid: Option<String>,
        initialize: bool,
    ) -> Result<(u64, Arc<Instance>, Option<String>), Refusal> {
        match sid {
            Some(s) => match self.session(&s) {
                Some((n, i)) => Ok((n, i, None)),
                None => Err(Refusal::Plain(StatusCode::NOT_FOUND, "session not found")),
            },
            None if initialize => {
                let number = self.next.fetch_add(1, Ordering::Relaxed);
                let key = match self.shared.launch.instances {
                    Instances::PerSession => Key::Session(number),
                    Instances::Shared => Key::Shared,
                };
                let i = self.instance(key).map_err(Refusal::Rpc)?;
                Ok((number, i, Some(new_session_id())))
            }
            None => {
                let key = match self.shared.launch.instances {
                    Instances::Shared => Key::Shared,
                    Instances::PerSession => Key::Principal(
                        headers
                            .get(INSTANCE_HEADER)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned(),
                    ),
                };
                let i = self.instance(key).map_err(Refusal::Rpc)?;
                Ok((0, i, None))
            }
        }
    }

    /// After an `initialize` without a session: opens session `sid` when it
    /// was `initialized` (its id in `resp`), or else ends a per-session
    /// process at once.
    async fn settle_session(
        &self,
        sid: String,
        initialized: bool,
        number: u64,
        instance: Arc<Instance>,
        resp: &mut Response<Body>,
    ) {
        if initialized {
            if let Ok(v) = http::HeaderValue::from_str(&sid) {
                resp.headers_mut().insert("mcp-session-id", v);
            }
            self.sessions
                .lock()
                .insert(sid, Session { number, instance });
        } else if self.shared.launch.instances == Instances::PerSession {
            // No session: its process goes at once.
            self.instances
                .lock()
                .retain(|_, i| i.number != instance.number);
            self.gauge();
            instance.close("initialize failed").await;
        }
    }
}

/// Why a POST found no instance: a plain answer, or a JSON-RPC error the
/// client reads.
pub(super) enum Refusal {
    /// A plain-text answer with this status.
    Plain(StatusCode, &'static str),
    /// Refused by the bridge (see [`refuse`]).
    Rpc(String),
}

/// The response to a request whose first item is `first`, the rest on `rx`:
/// the answer as JSON, or a stream when the client takes one.
pub(super) async fn answer(
    headers: &HeaderMap,
    first: Option<Item>,
    mut rx: tokio::sync::mpsc::Receiver<Item>,
) -> Response<Body> {
    match first {
        Some(Item::Final(b)) => {
            let mut r = Response::new(http_util::full(b));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Some(Item::Event(b)) if http_util::accepts(headers, "text/event-stream") => {
            sse_from(Some(b), rx)
        }
        Some(Item::Event(_)) => {
            // The client takes JSON only: what comes before the answer
            // is dropped, the answer is the body.
            loop {
                match rx.recv().await {
                    Some(Item::Final(b)) => break Response::new(http_util::full(b)),
                    Some(Item::Event(_)) => continue,
                    None => {
                        break plain(StatusCode::BAD_GATEWAY, "the stdio server did not answer")
                    }
                }
            }
        }
        None => plain(StatusCode::BAD_GATEWAY, "the stdio server did not answer"),
    }
}

/// A request refused by the bridge itself: a JSON-RPC error the client
/// reads (503 for a message that takes no answer).
pub(super) fn refuse(msg: &Value, why: &str) -> Response<Body> {
    match msg.get("id").filter(|_| msg.get("method").is_some()) {
        Some(id) => {
            let mut r = Response::new(http_util::full(instance::error_answer(id, why)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        None => plain(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

pub(super) fn new_session_id() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

pub(super) fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(http_util::full(Bytes::from(text.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// An SSE response of a stream of messages.
pub(super) fn sse(rx: tokio::sync::mpsc::Receiver<Item>) -> Response<Body> {
    sse_from(None, rx)
}

pub(super) fn sse_from(
    first: Option<Bytes>,
    rx: tokio::sync::mpsc::Receiver<Item>,
) -> Response<Body> {
    use futures_util::StreamExt;
    let head = futures_util::stream::iter(first.map(Item::Event));
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let frames = head.chain(rest).map(|item| {
        let b = match item {
            Item::Final(b) | Item::Event(b) => b,
        };
        let mut out = Vec::with_capacity(b.len() + 8);
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&b);
        out.extend_from_slice(b"\n\n");
        Ok::<_, http_util::BoxError>(hyper::body::Frame::data(Bytes::from(out)))
    });
    let body = http_body_util::StreamBody::new(frames).boxed_unsync();
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    r
}
