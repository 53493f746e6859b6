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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::FutureExt;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};

use crate::proxy::body::{full, Body};
use crate::proxy::error::ProxyError;
use crate::proxy::{self, State};

use super::listener::ConnInfo;

/// Request ids: a random per-process prefix and a counter. Unique, cheap
/// (no system call per request, unlike random UUIDs), and sortable per
/// instance.
#[derive(Clone)]
pub struct MakeId {
    prefix: Arc<str>,
    next: Arc<AtomicU64>,
}

impl MakeId {
    fn new() -> MakeId {
        let prefix: u32 = rand::random();
        MakeId {
            prefix: Arc::from(format!("{prefix:08x}")),
            next: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _request: &Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::from_str(&format!("{}-{n:x}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
}

/// What the per-connection services share.
#[derive(Clone)]
pub struct Shared {
    state: Arc<State>,
    permits: Arc<Semaphore>,
    ids: MakeId,
}

impl Shared {
    /// The shared parts of the MCP listener's services.
    pub fn new(state: Arc<State>, permits: Arc<Semaphore>) -> Shared {
        Shared {
            state,
            permits,
            ids: MakeId::new(),
        }
    }
}

/// Builds the MCP listener's service for one connection. The service type is
/// concrete (no boxing): hyper keeps each request's future inside the
/// connection's own state instead of allocating and copying it per request.
pub fn mcp(
    shared: &Shared,
    conn: ConnInfo,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future: Send + 'static,
> + Send
       + 'static {
    let state = shared.state.clone();
    let permits = shared.permits.clone();
    let handler = tower::service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        let permits = permits.clone();
        async move {
            let Ok(_permit) = permits.try_acquire_owned() else {
                return Ok::<_, Infallible>(ProxyError::Overloaded.into_response());
            };
            // Boxed once here: the handler's state machine is large, and every
            // layer above would otherwise move it by value.
            let handled =
                AssertUnwindSafe(Box::pin(proxy::handle(state, conn, req))).catch_unwind();
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
        .layer(SetRequestIdLayer::x_request_id(shared.ids.clone()))
        .layer(PropagateRequestIdLayer::x_request_id())
        .service(handler);
    TowerToHyperService::new(svc)
}
