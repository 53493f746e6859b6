//! The one place the per-request service stack is assembled, outermost first.
//! Each layer's position is deliberate:
//!
//! 1. **Request id**: `x-request-id` is taken from the client or generated, and
//!    echoed on the response, so a client report can be matched to logs and
//!    audit rows.
//! 2. **Shed**: past `max_concurrent_requests` in flight, new requests get 503
//!    at once instead of queueing (queueing under overload only adds latency
//!    to everything). The permit travels inside the response body
//!    ([`Guarded`]): a held SSE stream counts until it ends, not until its
//!    headers were sent.
//! 3. **Client address** ([`ClientAddress`]): the peer, or behind a trusted
//!    proxy the address it names in `X-Forwarded-For`; then the coarse
//!    per-address limit, before anything is spent on a token signature.
//! 4. **Catch panic**: a panic in the handler becomes a 500 answer instead of
//!    a reset connection (there should be none: no `unwrap` in the crate).
//!    Written here rather than `tower_http::catch_panic`: the crate's layer
//!    answers with `Response<UnsyncBoxBody>`, boxing every response body
//!    (an allocation and a dynamic call per frame on every answer, SSE
//!    streams included), and wraps a `Service<Request<B>>`, where this
//!    handler takes the connection's facts with the request; the permit
//!    (step 2) must stay in the one body type the connection sees.
//! 5. **The handler** ([`crate::proxy::handle`]), which runs the MCP steps in
//!    their fixed order.

use std::convert::Infallible;
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};

use crate::http_util::{full, Body, BoxError};
use crate::proxy::error::ProxyError;
use crate::proxy::{self, State};

use crate::server::listener::ConnInfo;

/// Request ids: a random per-process prefix and a counter. Unique, cheap
/// (no system call per request, unlike random UUIDs), and sortable per
/// instance.
#[derive(Clone)]
pub(crate) struct MakeId {
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
pub(crate) struct Shared {
    state: Arc<State>,
    permits: Arc<Semaphore>,
    ids: MakeId,
}

impl Shared {
    /// The shared parts of the MCP listener's services.
    pub(crate) fn new(state: Arc<State>, permits: Arc<Semaphore>) -> Shared {
        Shared {
            state,
            permits,
            ids: MakeId::new(),
        }
    }
}

/// A response body that holds the request's concurrency permit until the
/// body ends or is dropped.
pub(crate) struct Guarded {
    body: Body,
    _permit: Option<OwnedSemaphorePermit>,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The client's address: the peer's, or, when the peer is a trusted proxy,
/// the last `X-Forwarded-For` entry that is not itself a trusted proxy.
/// Entries are read in the forms proxies write (`ip`, `ip:port`, `[v6]`,
/// `[v6]:port`, quoted or not); an entry that is none of them ends the walk
/// at the trusted hop that wrote it, never skipping left to an entry the
/// client chose.
pub(crate) fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[ipnet::IpNet],
) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    let hops: Vec<Option<IpAddr>> = headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|v| match v.to_str() {
            Ok(text) => text.split(',').map(forwarded_address).collect(),
            Err(_) => vec![None],
        })
        .collect();
    // Right to left: each trusted hop vouches for the one before it.
    for hop in hops.into_iter().rev() {
        let Some(hop) = hop else {
            break;
        };
        client = hop;
        if !is_trusted(&hop) {
            break;
        }
    }
    client
}

/// One `X-Forwarded-For` entry as an address, without its port.
fn forwarded_address(entry: &str) -> Option<IpAddr> {
    let e = entry.trim();
    let e = e
        .strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .unwrap_or(e);
    if let Some(rest) = e.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return port_ok
            .then(|| inside.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6))
            .flatten();
    }
    if let Ok(ip) = e.parse::<IpAddr>() {
        return Some(ip);
    }
    let (host, port) = e.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// Resolves the client address and applies its coarse limit before the
/// inner service (the handler) runs.
#[derive(Clone)]
pub(crate) struct ClientAddress<S> {
    inner: S,
    state: Arc<State>,
    conn: ConnInfo,
}

impl<S> tower::Service<Request<Incoming>> for ClientAddress<S>
where
    S: tower::Service<(ConnInfo, Request<Incoming>), Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = futures_util::future::Either<
        S::Future,
        std::future::Ready<Result<Response<Body>, Infallible>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let mut conn = self.conn;
        conn.client = client_address(
            conn.remote.ip(),
            req.headers(),
            &self.state.config.server.trusted_proxies,
        );
        if let Err(retry_after) = self.state.budgets.check_ip(conn.client) {
            self.state.metrics.refused_ip.inc();
            return futures_util::future::Either::Right(std::future::ready(Ok(
                ProxyError::RateLimited { retry_after }.into_response(),
            )));
        }
        futures_util::future::Either::Left(self.inner.call((conn, req)))
    }
}

/// Builds the MCP listener's service for one connection. The service type is
/// concrete (no boxing): hyper keeps each request's future inside the
/// connection's own state instead of allocating and copying it per request.
pub(crate) fn mcp(
    shared: &Shared,
    conn: ConnInfo,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Guarded>,
    Error = Infallible,
    Future: Send + 'static,
> + Send
       + 'static {
    let state = shared.state.clone();
    let permits = shared.permits.clone();
    let handler = tower::service_fn(move |(conn, req): (ConnInfo, Request<Incoming>)| {
        let state = state.clone();
        async move {
            // Boxed once here: the handler's state machine is large, and every
            // layer above would otherwise move it by value. Its size is
            // allocated and copied per request: rare paths inside it (catalog
            // refill, HTTP/2 pool) are boxed where they are awaited (12 KB
            // instead of 44 KB, measured on the release build).
            let handled = AssertUnwindSafe(Box::pin(proxy::handle(
                state,
                conn,
                req.map(http_body_util::Either::Left),
            )))
            .catch_unwind();
            Ok::<_, Infallible>(handled.await.unwrap_or_else(|_panic| {
                tracing::error!("request handler panicked");
                let mut r = Response::new(full(
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}"#,
                ));
                *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                r
            }))
        }
    });
    let addressed = ClientAddress {
        inner: handler,
        state: shared.state.clone(),
        conn,
    };
    let shed = tower::service_fn(move |req: Request<Incoming>| {
        let permit = permits.clone().try_acquire_owned().ok();
        let mut inner = addressed.clone();
        async move {
            let Some(permit) = permit else {
                let r = ProxyError::Overloaded.into_response();
                return Ok::<_, Infallible>(r.map(|body| Guarded {
                    body,
                    _permit: None,
                }));
            };
            let r = tower::Service::call(&mut inner, req).await?;
            Ok(r.map(|body| Guarded {
                body,
                _permit: Some(permit),
            }))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(shared.ids.clone()))
        .layer(PropagateRequestIdLayer::x_request_id())
        .service(shed);
    TowerToHyperService::new(svc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", v.parse().expect("value"));
        h
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().expect("net")];
        let proxy: IpAddr = "10.1.2.3".parse().expect("ip");
        let outsider: IpAddr = "203.0.113.9".parse().expect("ip");
        // An outsider's header is ignored.
        assert_eq!(
            client_address(outsider, &xff("1.2.3.4"), &trusted),
            outsider
        );
        // A trusted proxy names the client; a spoofed leftmost entry is
        // skipped because the first untrusted hop from the right wins.
        assert_eq!(
            client_address(proxy, &xff("6.6.6.6, 198.51.100.7"), &trusted),
            "198.51.100.7".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(
            client_address(proxy, &xff("198.51.100.7, 10.9.9.9"), &trusted),
            "198.51.100.7".parse::<IpAddr>().expect("ip")
        );
        // Without a header the proxy itself is the client.
        assert_eq!(client_address(proxy, &HeaderMap::new(), &trusted), proxy);
        assert_eq!(client_address(proxy, &xff("1.2.3.4"), &[]), proxy);
    }

    #[test]
    fn forwarded_for_entries_with_ports_are_read_and_garbage_ends_the_walk() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().expect("net")];
        let proxy: IpAddr = "10.1.2.3".parse().expect("ip");
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        // The forms real proxies write: the client is the written entry, not
        // the client-chosen one to its left.
        for (header, client) in [
            ("6.6.6.6, 198.51.100.7:4711", "198.51.100.7"),
            ("6.6.6.6, [2001:db8::7]:4711", "2001:db8::7"),
            ("6.6.6.6, [2001:db8::7]", "2001:db8::7"),
            ("6.6.6.6, \"198.51.100.7:80\"", "198.51.100.7"),
            ("6.6.6.6, 2001:db8::7", "2001:db8::7"),
            ("6.6.6.6, 198.51.100.7:80, 10.9.9.9:1234", "198.51.100.7"),
        ] {
            assert_eq!(
                client_address(proxy, &xff(header), &trusted),
                ip(client),
                "{header}"
            );
        }
        // An entry that cannot be read ends the walk at the hop that wrote
        // it: rotating the entries to its left changes nothing.
        for header in [
            "6.6.6.6, unknown",
            "7.7.7.7, 198.51.100.7:99999999",
            "8.8.8.8, [2001:db8::7",
            "9.9.9.9, _hidden",
            "1.1.1.1, 198.51.100.7:",
        ] {
            assert_eq!(
                client_address(proxy, &xff(header), &trusted),
                proxy,
                "{header}"
            );
        }
        assert_eq!(
            client_address(proxy, &xff("6.6.6.6, garbage, 10.9.9.9"), &trusted),
            ip("10.9.9.9")
        );
    }
}
