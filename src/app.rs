//! Starting and stopping the firewall: binds the listeners, builds the shared
//! state, spawns the background tasks (certificate reload, ...), and on
//! shutdown stops accepting, marks itself not ready, and drains in-flight
//! requests and streams up to the configured deadline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::admin::{self, Admin};
use crate::approval::Approvals;
use crate::audit::{self, AuditHandle, Auditor};
use crate::auth::Verifier;
use crate::config::Config;
use crate::policy::reload::PolicyStore;
use crate::proxy::stack;
use crate::proxy::State;
use crate::server::{listener, tls};
use crate::telemetry::{self, Metrics};

/// A running firewall.
pub struct Running {
    /// Where the MCP listener is bound.
    pub mcp_addr: SocketAddr,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    /// The request-path state (tests inspect it).
    pub state: Arc<State>,
    shutdown: watch::Sender<bool>,
    admin_shutdown: watch::Sender<bool>,
    drain: Duration,
    admin: Arc<Admin>,
    servers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    audit: Option<AuditHandle>,
}

/// Binds and starts everything described by `config`.
pub async fn start(config: Arc<Config>) -> anyhow::Result<Running> {
    let mut registry = telemetry::registry();
    let verifier = Verifier::new(&config.auth)
        .await
        .context("loading token keys")?;
    let upstreams = config
        .upstreams
        .iter()
        .map(|u| crate::policy::reload::Facts::of(u.facts()))
        .collect();
    let policy = PolicyStore::load_with_shadow(
        &config.policy_dir,
        config.shadow_dir.as_deref(),
        upstreams,
        &mut registry,
    )
    .context("loading the policy")?;
    start_with(config, verifier, policy, registry).await
}

async fn start_audit(
    config: &Config,
    registry: &mut Registry,
) -> anyhow::Result<(Auditor, Option<AuditHandle>)> {
    match &config.audit {
        Some(a) if a.enabled => {
            let (auditor, handle) = audit::start(a, registry)
                .await
                .context("starting the audit pipeline")?;
            Ok((auditor, Some(handle)))
        }
        _ => {
            tracing::warn!("audit is disabled: no [audit] section (or enabled = false); decisions are only logged");
            Ok((Auditor::disabled(), None))
        }
    }
}

/// Starts with an already built verifier and policy (the demo embeds its
/// policy instead of reading a directory).
pub async fn start_with(
    config: Arc<Config>,
    verifier: Verifier,
    policy: Arc<PolicyStore>,
    mut registry: Registry,
) -> anyhow::Result<Running> {
    let (auditor, audit_handle) = start_audit(&config, &mut registry).await?;
    let (mcp_listener, admin_listener) = bind_listeners(&config).await?;
    let mcp_addr = mcp_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    let config = with_bound_url(config, mcp_addr);
    let approvals = start_approvals(&config, &mut registry, admin_addr).await?;
    let pins = crate::pins::PinStore::open(&config.policy_dir, &mut registry)
        .context("loading the tool pins")?;
    let parts = StateParts {
        verifier,
        policy: policy.clone(),
        auditor,
        approvals,
        pins: pins.clone(),
    };
    let state = build_state(&config, parts, &mut registry).await?;
    let mut background = spawn_watchers(&config, &state, &policy, &pins);
    let acceptor = tls_acceptor(&config, &mut background)?;

    let (shutdown, rx) = watch::channel(false);
    let (admin_shutdown, admin_rx) = watch::channel(false);
    let (not_ready, degraded) = register_readiness(&mut registry);
    let budget_store = state.budgets.store().map(|s| s.redis().clone());
    background.extend(share_budgets(&state).await);
    background.push(tokio::spawn(publish_policy_hash(
        policy.clone(),
        state.metrics.clone(),
    )));
    let admin = Arc::new(Admin {
        registry: Arc::new(Mutex::new(registry)),
        draining: AtomicBool::new(false),
        auditor: state.auditor.clone(),
        approvals: state.approvals.clone().map(|a| (a, state.verifier.clone())),
        pins: (state.pins.clone(), state.verifier.clone()),
        not_ready,
        budget_store,
        degraded,
        allowed_hosts: config.admin_allowed_hosts.clone(),
        virtuals: state.virtuals.values().cloned().collect(),
        stdio: stdio_bridges(&state),
        credentials: state
            .upstreams
            .values()
            .filter_map(|u| u.credentials.clone())
            .collect(),
        users: (
            state
                .upstreams
                .values()
                .filter_map(|u| u.users.clone())
                .collect(),
            state.verifier.clone(),
        ),
    });
    // The gauges follow the state even when nobody probes /readyz.
    background.push(tokio::spawn(watch_readiness(admin.clone())));

    let drain = config.server.drain_timeout;
    let mcp = serve_mcp(&config, &state, acceptor, mcp_listener, rx)?;
    let admin_task = serve_admin(admin.clone(), admin_listener, admin_rx, drain);

    tracing::info!(%mcp_addr, %admin_addr, tls = config.server.tls.is_some(), upstreams = config.upstreams.len(), "mcp-firewall listening");
    Ok(Running {
        mcp_addr,
        admin_addr,
        state,
        shutdown,
        admin_shutdown,
        drain,
        admin,
        servers: vec![mcp, admin_task],
        background,
        audit: audit_handle,
    })
}

/// Binds the MCP listener, then the admin listener.
async fn bind_listeners(config: &Config) -> anyhow::Result<(TcpListener, TcpListener)> {
    let mcp_listener = TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("binding the MCP listener on {}", config.server.listen))?;
    let admin_listener = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("binding the admin listener on {}", config.admin_listen))?;
    Ok((mcp_listener, admin_listener))
}

/// The config with `public_url` (and the origins it implies) derived from
/// the address actually bound (port 0 in tests), unless it was set.
fn with_bound_url(config: Arc<Config>, mcp_addr: SocketAddr) -> Arc<Config> {
    if config.server.public_url_explicit {
        return config;
    }
    let mut c = (*config).clone();
    let scheme = if c.server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    c.server.public_url = format!("{scheme}://{mcp_addr}");
    if c.server.origins_from_public_url {
        c.server.allowed_origins = crate::http_util::origin_of(&c.server.public_url, false)
            .into_iter()
            .collect();
    }
    Arc::new(c)
}

/// What the request-path state is built from, besides the config.
struct StateParts {
    verifier: Verifier,
    policy: Arc<PolicyStore>,
    auditor: Auditor,
    approvals: Option<Arc<Approvals>>,
    pins: Arc<crate::pins::PinStore>,
}

/// The request-path state: its metrics registered, traces exported when
/// configured, the stdio sandboxes checked, approvals and pins wired.
async fn build_state(
    config: &Arc<Config>,
    parts: StateParts,
    registry: &mut Registry,
) -> anyhow::Result<Arc<State>> {
    let pins = parts.pins.clone();
    let keeper = match &config.credentials {
        Some(c) => Some(Arc::new(
            crate::credential::Keeper::open(c)
                .await
                .map_err(|e| anyhow::anyhow!("credentials.store: {e}"))?,
        )),
        None => None,
    };
    let mut state = State::new(
        config.clone(),
        parts.verifier,
        parts.policy,
        parts.auditor,
        Metrics::register(registry),
        parts.approvals,
        parts.pins,
        keeper.as_ref(),
    )
    .context("building upstream clients")?;
    if let Some(otlp) = &config.telemetry.otlp {
        state.traces = Some(crate::trace::Traces::start(otlp)?);
        tracing::info!(endpoint = %otlp.endpoint, "traces: exporting spans over OTLP/HTTP");
    }
    let state = Arc::new(state);
    for b in stdio_bridges(&state) {
        // Reported at start; a required layer missing refuses its starts.
        let _ = b.check_sandbox().await;
    }
    crate::proxy::request::approval_flow::wire_pins(&state, &pins);

    if let Some(approvals) = &state.approvals {
        crate::proxy::request::approval_flow::wire(&state, approvals);
    }
    Ok(state)
}

/// Spawns the tasks that follow files and clocks: policy and pin reload,
/// budget sweeps, catalog expiry, virtual servers' members.
fn spawn_watchers(
    config: &Config,
    state: &Arc<State>,
    policy: &Arc<PolicyStore>,
    pins: &Arc<crate::pins::PinStore>,
) -> Vec<JoinHandle<()>> {
    let mut background = vec![
        tokio::spawn(policy.clone().watch(config.policy_reload)),
        tokio::spawn(sweep_budgets(state.clone())),
        tokio::spawn(watch_pins(pins.clone(), config.policy_reload)),
        tokio::spawn(expire_catalogs(
            state.catalogs.clone(),
            Duration::from_secs(config.state.catalog_ttl_s),
        )),
    ];
    if !state.virtuals.is_empty() {
        background.push(tokio::spawn(watch_virtual_servers(state.clone())));
    }
    background
}

/// The TLS acceptor when `[server.tls]` is set, its certificate reloaded by
/// a task pushed onto `background`.
fn tls_acceptor(
    config: &Config,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Option<TlsAcceptor>> {
    let Some(tls_cfg) = &config.server.tls else {
        return Ok(None);
    };
    let resolver = tls::ReloadingCert::load(tls_cfg)?;
    background.push(tokio::spawn(tls::watch(resolver.clone(), tls_cfg.clone())));
    Ok(Some(TlsAcceptor::from(Arc::new(tls::server_config(
        resolver,
    )))))
}

/// The `not_ready` and `degraded` gauge families, registered.
fn register_readiness(
    registry: &mut Registry,
) -> (
    Family<admin::ReasonLabel, Gauge>,
    Family<admin::ReasonLabel, Gauge>,
) {
    let not_ready = Family::default();
    registry.register(
        "not_ready",
        "1 while /readyz answers 503 for this reason (draining, audit_spool_refusing, audit_backlog)",
        not_ready.clone(),
    );
    let degraded = Family::default();
    registry.register(
        "degraded",
        "1 while a shared store cannot be asked (budget_store_unavailable, approvals_store_unavailable); /readyz still answers 200",
        degraded.clone(),
    );
    (not_ready, degraded)
}

/// When budgets are shared in Redis: loads them (logged either way) and
/// returns the task that follows other replicas' `list_changed`.
async fn share_budgets(state: &State) -> Option<JoinHandle<()>> {
    let shared = state.budgets.store()?;
    match shared.load().await {
        Ok(()) => tracing::info!("budgets and rate limits shared in Redis"),
        Err(e) => {
            tracing::error!(error = %e, "Redis not reachable at start; calls take their on_store_unavailable fallback until it is")
        }
    }
    Some(tokio::spawn(crate::catalog::follow_list_changed(
        shared.redis().clone(),
        state.catalogs.clone(),
    )))
}

/// The connection limits of the MCP listener, refusals counted in `metrics`.
fn conn_limits(config: &Config, metrics: Arc<Metrics>) -> listener::ConnLimits {
    listener::ConnLimits {
        connections: Arc::new(Semaphore::new(config.server.max_connections)),
        write_idle: config.server.write_idle_timeout,
        max_header_bytes: config.server.max_header_bytes,
        spread: Some(crate::server::shards::Spread::new(config.server.threads)),
        on_refused: Arc::new(move |why| {
            let counter = match why {
                listener::Refused::TooMany => &metrics.refused_connections,
                listener::Refused::WriteIdle => &metrics.write_idle_closed,
            };
            counter.inc();
        }),
    }
}

/// Serves MCP on its serving threads (`server.threads`), each with its own
/// accept loop on the one socket.
fn serve_mcp(
    config: &Config,
    state: &Arc<State>,
    acceptor: Option<TlsAcceptor>,
    mcp_listener: TcpListener,
    rx: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let permits = Arc::new(Semaphore::new(config.server.max_concurrent_requests));
    let drain = config.server.drain_timeout;
    let shared = stack::Shared::new(state.clone(), permits);
    let limits = conn_limits(config, state.metrics.clone());
    let mcp_listener = Arc::new(mcp_listener.into_std()?);
    let serving = crate::server::shards::spawn(config.server.threads, move |_shard| {
        let (shared, acceptor, rx, limits) =
            (shared.clone(), acceptor.clone(), rx.clone(), limits.clone());
        let listener = mcp_listener.try_clone().and_then(TcpListener::from_std);
        async move {
            match listener {
                Ok(listener) => {
                    listener::serve(
                        listener,
                        acceptor,
                        move |conn| stack::mcp(&shared, conn),
                        rx,
                        drain,
                        limits,
                    )
                    .await;
                }
                Err(e) => tracing::error!(error = %e, "a serving thread cannot listen"),
            }
        }
    })
    .context("starting the serving threads")?;
    Ok(tokio::spawn(serving))
}

/// Serves the admin endpoints, without connection limits.
fn serve_admin(
    admin: Arc<Admin>,
    admin_listener: TcpListener,
    admin_rx: watch::Receiver<bool>,
    drain: Duration,
) -> JoinHandle<()> {
    tokio::spawn(listener::serve(
        admin_listener,
        None,
        move |_conn| {
            let admin = admin.clone();
            hyper::service::service_fn(move |req| admin::handle(admin.clone(), req))
        },
        admin_rx,
        drain,
        listener::ConnLimits::unlimited(),
    ))
}

// === impl Running ===

impl Running {
    /// Drains and stops: not ready at once (the admin listener stays up
    /// until the end, so load balancers see it), the MCP listener stops
    /// accepting and closes connections that sent nothing; streams still
    /// open just before the drain deadline end with a final error event (and
    /// their completion rows); then background tasks and the audit pipeline
    /// stop, and the admin listener last.
    pub async fn shutdown(self) {
        self.admin.draining.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        let margin = (self.drain / 4).min(Duration::from_secs(1));
        let state = self.state.clone();
        let end_streams = tokio::spawn(async move {
            tokio::time::sleep(self.drain.saturating_sub(margin)).await;
            state.closing.send_replace(true);
        });
        let mut servers = self.servers.into_iter();
        if let Some(mcp) = servers.next() {
            let _ = mcp.await;
        }
        end_streams.abort();
        // The stdio servers get the close sequence, all at once.
        futures_util::future::join_all(
            stdio_bridges(&self.state)
                .into_iter()
                .map(|b| async move { b.shutdown().await }),
        )
        .await;
        for b in self.background {
            b.abort();
        }
        if let Some(audit) = self.audit {
            // Flush what it can; the rest stays in the spool for the next start.
            audit.shutdown(Duration::from_secs(5)).await;
        }
        if let Some(traces) = self.state.traces.clone() {
            // The last spans; the SDK's flush blocks.
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
        let _ = self.admin_shutdown.send(true);
        for s in servers {
            let _ = s.await;
        }
        tracing::info!("mcp-firewall stopped");
    }

    /// Runs until SIGTERM or Ctrl-C, then shuts down gracefully.
    pub async fn until_signal(self) {
        wait_for_signal().await;
        tracing::info!("shutdown requested; draining");
        self.shutdown().await;
    }
}

/// The bridges of the stdio upstreams.
fn stdio_bridges(state: &State) -> Vec<Arc<crate::stdio::Bridge>> {
    state
        .upstreams
        .values()
        .filter_map(|u| u.bridge.clone())
        .collect()
}

async fn start_approvals(
    config: &Config,
    registry: &mut Registry,
    admin_addr: SocketAddr,
) -> anyhow::Result<Option<Arc<Approvals>>> {
    let Some(cfg) = &config.approvals else {
        tracing::warn!("approvals are not configured: calls behind an approve gate are refused");
        return Ok(None);
    };
    let approvals = Approvals::open(cfg, registry)
        .await
        .context("opening the approvals store")?;
    if cfg.public_url.is_none() {
        approvals.set_public_url(&format!("http://{admin_addr}"));
    }
    Ok(Some(approvals))
}

/// Re-reads the pin files when they change; invalid ones leave the pins in
/// force (logged).
async fn watch_pins(pins: Arc<crate::pins::PinStore>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
    loop {
        tick.tick().await;
        if let Err(e) = pins.reload_if_changed() {
            tracing::error!(error = %e, "pin files not reloaded; the pins in force stay");
        }
    }
}

/// Forgets catalogs older than `ttl` (a missed `list_changed` heals).
async fn expire_catalogs(catalogs: Arc<crate::catalog::Catalogs>, ttl: Duration) {
    let mut tick = tokio::time::interval(ttl.max(Duration::from_secs(1)) / 4);
    loop {
        tick.tick().await;
        for upstream in catalogs.expire(ttl) {
            tracing::debug!(%upstream, "tool catalog older than its ttl; relearned on the next list");
        }
    }
}

/// Keeps `policy_info{sha256}` on the policy in force.
async fn publish_policy_hash(policy: Arc<PolicyStore>, metrics: Arc<Metrics>) {
    let mut shown = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let hash = policy.load_full().content_hash().to_owned();
        if hash != shown {
            metrics.set_policy(&hash);
            shown = hash;
        }
    }
}

/// Keeps the `not_ready` gauges current.
async fn watch_readiness(admin: Arc<Admin>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        admin.not_ready();
        admin.degraded();
    }
}

/// Drops budget state of runs idle past their lifetime, off the request path.
async fn sweep_budgets(state: Arc<State>) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        tick.tick().await;
        state.budgets.sweep();
        state.tasks.sweep(&state.budgets, false);
        state.metrics.budget_runs.set(state.budgets.runs() as i64);
        let evicted = state.budgets.evicted();
        let counted = state.metrics.budget_runs_evicted.get();
        state
            .metrics
            .budget_runs_evicted
            .inc_by(evicted.saturating_sub(counted));
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Lists every virtual server's members at start and every 30 s: names left
/// out are logged and counted as soon as they are, and `/readyz` knows which
/// members are down without waiting for a client.
async fn watch_virtual_servers(state: Arc<State>) {
    loop {
        for vs in state.virtuals.values() {
            vs.warm(&state).await;
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}
