//! The admin listener, on its own port: `/healthz` (the process serves),
//! `/readyz` (the firewall can do its job: listeners up, not draining) and
//! `/metrics` (Prometheus text format), and the approvals API and console
//! (`/approvals`, `/console`, admin-audience tokens only). None of it is
//! reachable from the MCP listener.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;

use crate::approval::{api, Approvals};
use crate::auth::Verifier;
use crate::proxy::body::{full, Body};

/// What the admin endpoints read.
pub struct Admin {
    /// All metrics.
    pub registry: Arc<Mutex<Registry>>,
    /// False once draining starts (load balancers stop sending traffic).
    pub ready: AtomicBool,
    /// The approvals API and console, when approvals are configured.
    pub approvals: Option<(Arc<Approvals>, Verifier)>,
}

/// Serves one admin request.
pub async fn handle(
    admin: Arc<Admin>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if let Some((approvals, verifier)) = &admin.approvals {
        if api::owns(req.uri().path()) {
            if let Some(r) = api::handle(approvals.clone(), verifier.clone(), req).await {
                return Ok(r);
            }
            return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
        }
    }
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            if admin.ready.load(Ordering::Relaxed) {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
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
