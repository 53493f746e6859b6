//! The one place the per-request service stack is assembled, outermost first.
//! Each layer's position is deliberate:
//!
//! 1. **Request id**: `x-request-id` is taken from the client or generated, and
//!    echoed on the response, so a client report can be matched to logs and
//!    audit rows.
//! 2. **Shed**: past `max_concurrent_requests` in flight, new requests get 503
//!    at once instead of queueing (queueing under overload only adds latency
//!    to everything).
//! 3. **Catch panic**: a panic in the handler becomes a 500 answer instead of
//!    a reset connection (there should be none: no `unwrap` in the crate).
//! 4. **The handler** ([`crate::proxy::handle`]), which runs the MCP steps in
//!    their fixed order.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower::util::BoxCloneService;
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use crate::proxy::body::{full, Body};
use crate::proxy::error::ProxyError;
use crate::proxy::{self, State};

use super::listener::ConnInfo;

/// The per-connection service type the listener serves.
pub type ConnService =
    TowerToHyperService<BoxCloneService<Request<Incoming>, Response<Body>, Infallible>>;

/// Builds the MCP listener's service for one connection.
pub fn mcp(state: Arc<State>, permits: Arc<Semaphore>, conn: ConnInfo) -> ConnService {
    let handler = tower::service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        let permits = permits.clone();
        async move {
            let Ok(_permit) = permits.try_acquire_owned() else {
                return Ok::<_, Infallible>(ProxyError::Overloaded.into_response());
            };
            let handled = AssertUnwindSafe(proxy::handle(state, conn, req)).catch_unwind();
            Ok(handled.await.unwrap_or_else(|_panic| {
                tracing::error!("request handler panicked");
                let mut r = Response::new(full(
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}"#,
                ));
                *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                r
            }))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(PropagateRequestIdLayer::x_request_id())
        .service(handler);
    TowerToHyperService::new(BoxCloneService::new(svc))
}
