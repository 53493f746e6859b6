//! The listeners: accepting connections (TCP, TLS, HTTP/1.1 and HTTP/2) and
//! the certificates they present. Transport only: what a request means is
//! the proxy's (the per-request service stack is `crate::proxy::stack`).

pub(crate) mod listener;
pub(crate) mod shards;
pub(crate) mod tls;
