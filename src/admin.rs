//! The admin listener, on its own port: `/healthz` (liveness: the process
//! serves), `/readyz` (the firewall can promise what its configuration
//! asks), `/metrics` (Prometheus text format), and the approvals API and
//! console (`/approvals`, `/console`, admin-audience tokens only). None of
//! it is reachable from the MCP listener.
//!
//! `/readyz` answers 503 with every reason that holds, one word each, in the
//! body and as `mcp_firewall_not_ready{reason}` (1 while it holds):
//! - `draining`: SIGTERM was received (until exit; this listener stays up
//!   while the MCP listener drains, so a load balancer sees it);
//! - `audit_spool_refusing`: the spool does not take rows (full disk, failing
//!   or stalled writes) and some risk is fail-closed, so those calls are
//!   refused;
//! - `audit_backlog`: the oldest row not yet in ClickHouse is older than
//!   `audit.max_backlog_age_s`.
//!
//! A shared store that cannot be asked makes the firewall *degraded*, not
//! unready: every replica shares it, so taking them all out of rotation
//! would stop reads that `on_store_unavailable` keeps open. `/readyz` then
//! answers 200 `ready, degraded: …` and `mcp_firewall_degraded{reason}` is
//! 1 for `budget_store_unavailable` (Redis) or `approvals_store_unavailable`
//! (PostgreSQL), and for `upstream_credentials_unavailable` when an
//! upstream's last token exchange failed (its calls answer `-31007` until
//! one succeeds; every replica asks the same provider).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;

use crate::approval::{api, Approvals};
use crate::audit::Auditor;
use crate::auth::Verifier;
use crate::http_util::{full, Body};

/// What the admin endpoints read.
pub(crate) struct Admin {
    /// All metrics.
    pub registry: Arc<Mutex<Registry>>,
    /// True from SIGTERM until exit (load balancers stop sending traffic).
    pub draining: AtomicBool,
    /// The audit trail, for its readiness.
    pub auditor: Auditor,
    /// The approvals API and console, when approvals are configured.
    pub approvals: Option<(Arc<Approvals>, Verifier)>,
    /// The pins review API.
    pub pins: (Arc<crate::pins::PinStore>, Verifier),
    /// `not_ready{reason}`.
    pub not_ready: Family<ReasonLabel, Gauge>,
    /// The shared budget store, if budgets are shared.
    pub budget_store: Option<Arc<crate::state::Redis>>,
    /// `degraded{reason}`.
    pub degraded: Family<ReasonLabel, Gauge>,
    /// Host names requests may name (IP addresses always pass).
    pub allowed_hosts: Vec<String>,
    /// The virtual servers, for the members that are down.
    pub virtuals: Vec<Arc<crate::proxy::virtual_server::Virtual>>,
    /// The bridges of the stdio upstreams.
    pub stdio: Vec<Arc<crate::stdio::Bridge>>,
    /// The token exchanges of the upstreams that take exchanged tokens.
    pub credentials: Vec<Arc<crate::credential::Credentials>>,
    /// The users' tokens of the upstreams that take users' own accounts
    /// (`/connect`, `/credentials`), with the verifier of admin tokens.
    pub users: (Vec<Arc<crate::credential::UserCredentials>>, Verifier),
}

/// The admin listener's `Host` check: the listed names, or any IP address.
fn admin_host(allowed: &[String], req: &Request<Incoming>) -> Result<(), String> {
    crate::http_util::check_hosts(req.uri(), req.headers(), |name| {
        name.parse::<std::net::IpAddr>().is_ok() || allowed.iter().any(|h| h == name)
    })
}

/// Label of `mcp_firewall_not_ready`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    /// The reason.
    pub reason: &'static str,
}

/// Every reason `/readyz` can give.
pub(crate) const REASONS: [&str; 3] = ["draining", "audit_spool_refusing", "audit_backlog"];

/// Every way `/readyz` can be degraded.
pub(crate) const DEGRADED: [&str; 6] = [
    "budget_store_unavailable",
    "approvals_store_unavailable",
    "virtual_server_member_down",
    "stdio_sandbox_unavailable",
    "stdio_start_failed",
    "upstream_credentials_unavailable",
];

impl Admin {
    /// `<virtual server>/<member>` of every member that did not answer when
    /// last asked.
    pub(crate) fn members_down(&self) -> Vec<String> {
        self.virtuals
            .iter()
            .flat_map(|v| {
                v.index
                    .down()
                    .into_iter()
                    .map(move |m| format!("{}/{m}", v.config.name))
            })
            .collect()
    }

    /// The reasons the firewall is not ready now (empty: ready); also sets
    /// the `not_ready` gauges.
    pub(crate) fn not_ready(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.draining.load(Ordering::Relaxed) {
            out.push("draining");
        }
        out.extend(self.auditor.not_ready());
        for r in REASONS {
            self.not_ready
                .get_or_create(&ReasonLabel { reason: r })
                .set(i64::from(out.contains(&r)));
        }
        out
    }

    /// The shared stores that cannot be asked now; also sets the
    /// `degraded` gauges.
    pub(crate) fn degraded(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self
            .budget_store
            .as_ref()
            .is_some_and(|r| r.breaker().is_open())
        {
            out.push("budget_store_unavailable");
        }
        if self
            .approvals
            .as_ref()
            .is_some_and(|(a, _)| a.unavailable())
        {
            out.push("approvals_store_unavailable");
        }
        if !self.members_down().is_empty() {
            out.push("virtual_server_member_down");
        }
        if self.stdio.iter().any(|b| b.unavailable().is_some()) {
            out.push("stdio_sandbox_unavailable");
        }
        if self.stdio.iter().any(|b| b.start_failed().is_some()) {
            out.push("stdio_start_failed");
        }
        if self.credentials.iter().any(|c| c.failing()) || self.users.0.iter().any(|u| u.failing())
        {
            out.push("upstream_credentials_unavailable");
        }
        for r in DEGRADED {
            self.degraded
                .get_or_create(&ReasonLabel { reason: r })
                .set(i64::from(out.contains(&r)));
        }
        out
    }
}

/// Serves one admin request.
pub(crate) async fn handle(
    admin: Arc<Admin>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    // DNS rebinding: a browser on the operator's machine made to resolve a
    // foreign name to this listener names that name; an address never is.
    if let Err(host) = admin_host(&admin.allowed_hosts, &req) {
        tracing::info!(host, "admin request refused: Host not allowed");
        return Ok(text(
            StatusCode::FORBIDDEN,
            format!("Host {host:?} is not allowed on the admin listener (admin.allowed_hosts)\n"),
        ));
    }
    if !admin.users.0.is_empty() && crate::credential::connect::owns(req.uri().path()) {
        let (users, verifier) = &admin.users;
        return Ok(crate::credential::connect::handle(users, verifier, req).await);
    }
    if crate::pins::api::owns(req.uri().path()) {
        let (pins, verifier) = &admin.pins;
        return Ok(crate::pins::api::handle(pins.clone(), verifier.clone(), req).await);
    }
    if let Some((approvals, verifier)) = &admin.approvals {
        if api::owns(req.uri().path()) {
            if let Some(r) = api::handle(approvals.clone(), verifier.clone(), req).await {
                return Ok(r);
            }
            return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
        }
    } else if req.uri().path() == "/console" && matches!(*req.method(), Method::GET | Method::HEAD)
    {
        // The console also reviews pins, with or without approvals.
        return Ok(crate::approval::console::page());
    }
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            let reasons = admin.not_ready();
            let degraded = admin.degraded();
            if reasons.is_empty() && degraded.is_empty() {
                text(StatusCode::OK, "ready\n")
            } else if reasons.is_empty() {
                let down = admin.members_down();
                let members = if down.is_empty() {
                    String::new()
                } else {
                    format!(" (members down: {})", down.join(", "))
                };
                text(
                    StatusCode::OK,
                    format!("ready, degraded: {}{members}\n", degraded.join(", ")),
                )
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", reasons.join(", ")),
                )
            }
        }
        (&Method::GET, "/metrics") => {
            let mut out = String::with_capacity(8 * 1024);
            let encoded = match admin.registry.lock() {
                Ok(reg) => prometheus_client::encoding::text::encode(&mut out, &reg).is_ok(),
                Err(_) => false,
            };
            if encoded {
                let mut r = text(StatusCode::OK, out);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                r
            } else {
                text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n")
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(resp)
}

fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
