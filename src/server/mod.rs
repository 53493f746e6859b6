//! The listeners: accepting connections (TCP, TLS, HTTP/1.1 and HTTP/2), the
//! certificates they present, and the one function that assembles the
//! per-request service stack.

pub mod listener;
pub mod stack;
pub mod tls;
