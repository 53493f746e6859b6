//! One instance of a stdio upstream: the process that serves a session
//! (or everyone, when shared), started on first use and again after a
//! crash (with backoff), and the routing of what it writes.
//!
//! Requests written to the process carry the instance's own numbers (the
//! client's ids are kept beside them and put back on the answer), so ids
//! of two sessions never meet and a forged answer id matches nothing. A
//! request to the client (sampling, elicitation, roots) goes to the stream
//! of the newest call in flight, else to a listening stream, else it is
//! answered with an error so the server does not wait forever; progress
//! goes to the call that carries its token; other notifications to the
//! listening streams, else to the newest call. A crash answers every call
//! in flight with an error (never retried: a call may have run); the next
//! request starts the process again and replays the session's
//! `initialize`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::process::{Out, Process};
use super::Shared;

/// The delay before a restart after crashes in a row.
const RESTART_AFTER_CRASHES: crate::backoff::Backoff = crate::backoff::Backoff {
    first: Duration::from_millis(250),
    max: Duration::from_millis(250 << 6),
};

/// What a stream of the bridge carries.
#[derive(Debug)]
pub(crate) enum Item {
    /// A message before the answer (a notification or a server request).
    Event(Bytes),
    /// The answer: the stream ends after it.
    Final(Bytes),
}

/// A call in flight.
struct Pending {
    /// The session that sent it (0: none).
    session: u64,
    /// The id the client gave it.
    client_id: Value,
    /// Its progress token, if any.
    progress: Option<Value>,
    /// Where its stream goes.
    tx: mpsc::Sender<Item>,
    /// An `initialize` (its result is kept for replays).
    initialize: bool,
}

/// The mutable part of an instance.
struct State {
    process: Option<Arc<Process>>,
    generation: u64,
    next_id: i64,
    pending: HashMap<i64, Pending>,
    /// Listening streams by session.
    listeners: Vec<(u64, mpsc::Sender<Item>)>,
    /// The session's `initialize` (replayed after a restart) and whether
    /// `notifications/initialized` followed it.
    init: Option<Value>,
    initialized: bool,
    /// A shared process's `initialize` result, answered to later sessions.
    init_result: Option<Value>,
    /// Crashes in a row, and when the last was.
    crashes: u32,
    last_crash: Option<Instant>,
    last_used: Instant,
    closing: bool,
    /// Whether the running process has written anything (a process that
    /// ends before it did could not start).
    spoke: bool,
    /// Why the last process ended.
    last_exit: Option<String>,
}

/// One process slot of a stdio upstream.
pub(crate) struct Instance {
    shared: Arc<Shared>,
    /// Its number (logs, its directory).
    pub number: u64,
    /// Its directory (private home, the private root's mount point).
    dir: PathBuf,
    state: Mutex<State>,
    start: tokio::sync::Mutex<()>,
}

/// Longest wait for a replayed `initialize`.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(30);

impl Instance {
    pub(super) fn new(shared: Arc<Shared>, number: u64, homes: PathBuf) -> Arc<Instance> {
        Arc::new(Instance {
            dir: homes.join(format!(
                "{number}-{}",
                hex::encode(rand::random::<[u8; 6]>())
            )),
            shared,
            number,
            state: Mutex::new(State {
                process: None,
                generation: 0,
                next_id: 1,
                pending: HashMap::new(),
                listeners: Vec::new(),
                init: None,
                initialized: false,
                init_result: None,
                crashes: 0,
                last_crash: None,
                last_used: Instant::now(),
                closing: false,
                spoke: false,
                last_exit: None,
            }),
            start: tokio::sync::Mutex::new(()),
        })
    }

    /// How long nothing has used it (zero while calls or streams are open).
    pub(crate) fn idle_for(&self) -> Duration {
        let mut s = self.state.lock();
        s.listeners.retain(|(_, tx)| !tx.is_closed());
        // Calls nobody waits for any more (the client went, or the request
        // path's timeout ended them) do not keep a process alive.
        s.pending.retain(|_, p| !p.tx.is_closed());
        if !s.pending.is_empty() || !s.listeners.is_empty() {
            return Duration::ZERO;
        }
        s.last_used.elapsed()
    }

    /// A session of a shared process ended.
    pub(crate) fn forget(&self, session: u64) {
        let mut s = self.state.lock();
        s.listeners.retain(|(n, _)| *n != session);
        s.pending.retain(|_, p| p.session != session);
    }

    /// The running process, started (or restarted) when there is none.
    async fn running(self: &Arc<Self>) -> Result<Arc<Process>, String> {
        if let Some(p) = self.live() {
            return Ok(p);
        }
        let _one = self.start.lock().await;
        if let Some(p) = self.live() {
            return Ok(p);
        }
        let (delay, replay) = {
            let s = self.state.lock();
            if s.closing {
                return Err("the stdio server is stopping".to_owned());
            }
            let delay = match s.last_crash {
                // Backoff after crashes in a row: 250 ms, doubling, at
                // most 16 s; a minute of health forgets them.
                Some(at) if at.elapsed() < Duration::from_secs(60) && s.crashes > 0 => {
                    RESTART_AFTER_CRASHES
                        .delay(s.crashes)
                        .saturating_sub(at.elapsed())
                }
                _ => Duration::ZERO,
            };
            (delay, s.init.clone().map(|i| (i, s.initialized)))
        };
        if let Some(why) = self.shared.refused.lock().clone() {
            return Err(format!("the stdio server is not started: {why}"));
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let egress = self.shared.egress_socket().await?;
        let started = Instant::now();
        let uid = if nix::unistd::getuid().is_root() {
            Some(super::uids::lease(self.shared.launch.host.uid_range)?)
        } else {
            None
        };
        let (process, out) = Process::spawn(&self.shared, &self.dir, egress, uid)
            .map_err(|e| format!("cannot start the stdio server: {e}"))?;
        let process = Arc::new(process);
        self.shared
            .metrics
            .stdio_started(&self.shared.name, started.elapsed());
        tracing::info!(upstream = %self.shared.name, pid = process.pid, instance = self.number, "stdio server started");
        let generation = {
            let mut s = self.state.lock();
            s.generation += 1;
            s.process = Some(process.clone());
            s.spoke = false;
            s.generation
        };
        let me = Arc::downgrade(self);
        tokio::spawn(dispatch(me, generation, out));
        if let Some((init, initialized)) = replay {
            self.replay(&process, init, initialized).await?;
        }
        Ok(process)
    }

    fn live(&self) -> Option<Arc<Process>> {
        self.state.lock().process.clone()
    }

    /// Sends the session's `initialize` again to a restarted process.
    async fn replay(
        &self,
        process: &Process,
        init: Value,
        initialized: bool,
    ) -> Result<(), String> {
        let (tx, mut rx) = mpsc::channel(4);
        let (line, _) = self.register(0, init, tx, false);
        process.write(line).await?;
        let answered = tokio::time::timeout(REPLAY_TIMEOUT, async {
            loop {
                match rx.recv().await {
                    Some(Item::Final(_)) => return true,
                    Some(Item::Event(_)) => continue,
                    None => return false,
                }
            }
        })
        .await;
        if !matches!(answered, Ok(true)) {
            return Err("the restarted stdio server did not answer its initialize".to_owned());
        }
        if initialized {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            process.write(Bytes::from(note.to_string())).await?;
        }
        Ok(())
    }

    /// Registers a call: its own number replaces the client's id. Returns
    /// the line to write and the number.
    fn register(
        &self,
        session: u64,
        mut msg: Value,
        tx: mpsc::Sender<Item>,
        initialize: bool,
    ) -> (Bytes, i64) {
        let mut s = self.state.lock();
        s.last_used = Instant::now();
        let id = s.next_id;
        s.next_id += 1;
        let client_id = msg.get("id").cloned().unwrap_or(Value::Null);
        let progress = msg.pointer("/params/_meta/progressToken").cloned();
        if let Some(o) = msg.as_object_mut() {
            o.insert("id".to_owned(), Value::from(id));
        }
        s.pending.insert(
            id,
            Pending {
                session,
                client_id,
                progress,
                tx,
                initialize,
            },
        );
        (Bytes::from(msg.to_string()), id)
    }

    /// Sends a request; its stream (events, then the answer) comes back.
    pub(crate) async fn call(self: &Arc<Self>, session: u64, msg: Value) -> mpsc::Receiver<Item> {
        let (tx, rx) = mpsc::channel(64);
        let client_id = msg.get("id").cloned().unwrap_or(Value::Null);
        let is_init = msg.get("method").and_then(Value::as_str) == Some("initialize");
        if is_init {
            let mut s = self.state.lock();
            match (&s.init_result, self.shared.launch.instances) {
                // A shared process is initialized once; later sessions get
                // its answer.
                (Some(result), super::Instances::Shared) => {
                    let answer = json!({"jsonrpc": "2.0", "id": client_id, "result": result});
                    let _ = tx.try_send(Item::Final(Bytes::from(answer.to_string())));
                    return rx;
                }
                _ => {
                    if s.init.is_none() {
                        s.init = Some(msg.clone());
                    }
                }
            }
        }
        let process = match self.running().await {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.try_send(Item::Final(error_answer(&client_id, &e)));
                return rx;
            }
        };
        let (line, id) = self.register(session, msg, tx.clone(), is_init);
        // A process that ended before the call was registered answers it
        // now, with why it ended (one that could not start, say).
        let ended = {
            let mut s = self.state.lock();
            if s.process.is_none() && s.pending.remove(&id).is_some() {
                Some(s.last_exit.clone().unwrap_or_else(|| {
                    format!("the stdio server of upstream {:?} ended", self.shared.name)
                }))
            } else {
                None
            }
        };
        if let Some(text) = ended {
            let _ = tx.try_send(Item::Final(error_answer(&client_id, &text)));
            return rx;
        }
        if let Err(e) = process.write(line).await {
            self.state.lock().pending.remove(&id);
            let _ = tx.try_send(Item::Final(error_answer(&client_id, &e)));
        }
        rx
    }

    /// Sends a notification or an answer of the client.
    pub(crate) async fn notify(
        self: &Arc<Self>,
        session: u64,
        mut msg: Value,
    ) -> Result<(), String> {
        let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
        match method.as_deref() {
            Some("notifications/initialized") => {
                let mut s = self.state.lock();
                if s.initialized && self.shared.launch.instances == super::Instances::Shared {
                    return Ok(());
                }
                s.initialized = true;
            }
            Some("notifications/cancelled") => {
                // The client's id becomes the process's number; a cancel
                // naming no call of this session is dropped.
                let s = self.state.lock();
                let wanted = msg.pointer("/params/requestId").cloned();
                let ours = s
                    .pending
                    .iter()
                    .find(|(_, p)| p.session == session && Some(&p.client_id) == wanted.as_ref())
                    .map(|(id, _)| *id);
                drop(s);
                match ours {
                    Some(id) => {
                        if let Some(p) = msg.pointer_mut("/params/requestId") {
                            *p = Value::from(id);
                        }
                    }
                    None => return Ok(()),
                }
            }
            _ => {}
        }
        self.state.lock().last_used = Instant::now();
        let process = self.running().await?;
        process.write(Bytes::from(msg.to_string())).await
    }

    /// A listening stream of `session`.
    pub(crate) fn listen(&self, session: u64) -> mpsc::Receiver<Item> {
        let (tx, rx) = mpsc::channel(64);
        let mut s = self.state.lock();
        s.listeners.retain(|(_, t)| !t.is_closed());
        s.listeners.push((session, tx));
        rx
    }

    /// Stops the process (the MCP close sequence); `why` is logged.
    pub(crate) async fn close(&self, why: &str) {
        let process = {
            let mut s = self.state.lock();
            s.closing = true;
            s.listeners.clear();
            s.process.take()
        };
        if let Some(p) = process {
            p.close().await;
            tracing::info!(upstream = %self.shared.name, pid = p.pid, instance = self.number, reason = why, "stdio server stopped");
            self.shared.metrics.stdio_exit(&self.shared.name, "stopped");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Routes one message the process wrote.
    async fn route(&self, msg: Value, generation: u64) {
        let has_method = msg.get("method").is_some();
        let id = msg.get("id").cloned();
        match (has_method, id) {
            (false, Some(id)) => self.answer(msg, &id).await,
            (true, Some(_)) => self.server_request(msg, generation).await,
            (true, None) => self.notification(msg).await,
            (false, None) => {
                tracing::warn!(upstream = %self.shared.name, "stdio server wrote a message that is neither a request, an answer nor a notification: dropped");
            }
        }
    }

    async fn answer(&self, mut msg: Value, id: &Value) {
        let pending = id
            .as_i64()
            .and_then(|n| self.state.lock().pending.remove(&n));
        let Some(p) = pending else {
            tracing::debug!(upstream = %self.shared.name, id = %id, "stdio server answered a request nobody waits for (or never sent): dropped");
            return;
        };
        if p.initialize {
            if let Some(r) = msg.get("result") {
                self.state.lock().init_result = Some(r.clone());
            }
        }
        if let Some(o) = msg.as_object_mut() {
            o.insert("id".to_owned(), p.client_id);
        }
        let _ = p.tx.send(Item::Final(Bytes::from(msg.to_string()))).await;
    }

    /// The newest call's stream, else a listening stream.
    fn carrier(&self) -> Option<mpsc::Sender<Item>> {
        let mut s = self.state.lock();
        s.listeners.retain(|(_, t)| !t.is_closed());
        let newest = s
            .pending
            .iter()
            .filter(|(_, p)| !p.tx.is_closed())
            .max_by_key(|(id, _)| **id)
            .map(|(_, p)| p.tx.clone());
        newest.or_else(|| s.listeners.first().map(|(_, t)| t.clone()))
    }

    async fn server_request(&self, msg: Value, generation: u64) {
        let bytes = Bytes::from(msg.to_string());
        if let Some(tx) = self.carrier() {
            if tx.send(Item::Event(bytes)).await.is_ok() {
                return;
            }
        }
        // Nobody to ask: the server gets an error rather than a wait.
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let refusal = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "no client stream is open to carry this request"}});
        let process = {
            let s = self.state.lock();
            s.process.clone().filter(|_| s.generation == generation)
        };
        if let Some(p) = process {
            let _ = p.write(Bytes::from(refusal.to_string())).await;
        }
    }

    async fn notification(&self, msg: Value) {
        let bytes = Bytes::from(msg.to_string());
        let token = (msg.get("method").and_then(Value::as_str) == Some("notifications/progress"))
            .then(|| msg.pointer("/params/progressToken").cloned())
            .flatten();
        let targets: Vec<mpsc::Sender<Item>> = {
            let mut s = self.state.lock();
            s.listeners.retain(|(_, t)| !t.is_closed());
            if let Some(t) = &token {
                s.pending
                    .values()
                    .filter(|p| p.progress.as_ref() == Some(t))
                    .map(|p| p.tx.clone())
                    .collect()
            } else if !s.listeners.is_empty() {
                s.listeners.iter().map(|(_, t)| t.clone()).collect()
            } else {
                Vec::new()
            }
        };
        let targets = if targets.is_empty() && token.is_none() {
            self.carrier().into_iter().collect()
        } else {
            targets
        };
        for tx in targets {
            let _ = tx.send(Item::Event(bytes.clone())).await;
        }
    }

    /// The process of `generation` wrote its first message: it started, and
    /// a failed start before it is forgotten.
    fn started(&self, generation: u64) {
        {
            let mut s = self.state.lock();
            if s.generation == generation {
                s.spoke = true;
            }
        }
        self.shared.start_failed.lock().take();
    }

    /// The process ended: every call in flight is answered with an error.
    fn ended(&self, generation: u64, why: &str) {
        let (pending, listeners, closing, spoke) = {
            let mut s = self.state.lock();
            if s.generation != generation {
                return;
            }
            s.process = None;
            s.last_exit = Some(if s.spoke {
                format!(
                    "the stdio server of upstream {:?} exited ({why}); it is started again on the next request",
                    self.shared.name
                )
            } else {
                format!(
                    "the stdio server of upstream {:?} could not start: {why}",
                    self.shared.name
                )
            });
            let closing = s.closing;
            if !closing {
                // Crashes in a row: a minute of health forgets the earlier.
                let recent = s
                    .last_crash
                    .is_some_and(|at| at.elapsed() < Duration::from_secs(60));
                s.crashes = if recent {
                    s.crashes.saturating_add(1)
                } else {
                    1
                };
                s.last_crash = Some(Instant::now());
            }
            (
                std::mem::take(&mut s.pending),
                std::mem::take(&mut s.listeners),
                closing,
                s.spoke,
            )
        };
        drop(listeners);
        if closing {
            return;
        }
        let text = if spoke {
            tracing::warn!(upstream = %self.shared.name, instance = self.number, calls = pending.len(), reason = why, "stdio server exited; the calls in flight are answered with an error, the next request starts it again");
            self.shared.metrics.stdio_exit(&self.shared.name, "crashed");
            format!(
                "the stdio server of upstream {:?} exited during the call ({why}); it is started again on the next request",
                self.shared.name
            )
        } else {
            // It never wrote a message: it could not start. Every waiting
            // request is answered now, /readyz and the metric say so.
            tracing::error!(upstream = %self.shared.name, instance = self.number, calls = pending.len(), reason = why, "stdio server could not start; the waiting requests are answered with an error");
            self.shared
                .metrics
                .stdio_exit(&self.shared.name, "start_failed");
            *self.shared.start_failed.lock() = Some(why.to_owned());
            format!(
                "the stdio server of upstream {:?} could not start: {why}",
                self.shared.name
            )
        };
        for (_, p) in pending {
            let answer = Item::Final(error_answer(&p.client_id, &text));
            // After whatever the stream still holds: never lost to a full
            // channel.
            tokio::spawn(async move {
                let _ = p.tx.send(answer).await;
            });
        }
    }
}

/// A JSON-RPC error answer to `id`.
pub(super) fn error_answer(id: &Value, message: &str) -> Bytes {
    Bytes::from(
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}})
            .to_string(),
    )
}

/// Reads what one process writes until it ends.
async fn dispatch(me: std::sync::Weak<Instance>, generation: u64, mut out: mpsc::Receiver<Out>) {
    let mut spoke = false;
    while let Some(o) = out.recv().await {
        let Some(instance) = me.upgrade() else { return };
        if !spoke && matches!(o, Out::Message(_)) {
            spoke = true;
            instance.started(generation);
        }
        match o {
            Out::Message(Value::Array(batch)) => {
                for m in batch {
                    instance.route(m, generation).await;
                }
            }
            Out::Message(m) => instance.route(m, generation).await,
            Out::Ended(why) => {
                instance.ended(generation, &why);
                return;
            }
        }
    }
}
