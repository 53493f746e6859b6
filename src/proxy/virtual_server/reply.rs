//! The answers a virtual server writes itself: a merged result as JSON
//! or as a one-event stream, an event stream's head, a bare status, a
//! JSON-RPC error.

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde_json::Value;

use super::merge;
use crate::http_util::Body;
use crate::mcp::jsonrpc::Id;
use crate::mcp::sse;
use crate::proxy::error::json_response;

/// A result (JSON text) as JSON, or as a one-event stream.
pub(super) fn raw_answer(id: Option<&Id>, result: &str, stream: bool) -> Response<Body> {
    let message = merge::response(id, result);
    if !stream {
        return json_response(StatusCode::OK, Bytes::from(message));
    }
    let mut out = BytesMut::new();
    sse::encode_message(None, message.as_bytes(), &mut out);
    sse_response(crate::http_util::full(out.freeze()))
}

/// A result as JSON, or as a one-event stream.
pub(super) fn answer(id: Option<&Id>, result: Value, stream: bool) -> Response<Body> {
    raw_answer(id, &result.to_string(), stream)
}

pub(super) fn status_only(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(crate::http_util::empty());
    *r.status_mut() = status;
    r
}

pub(super) fn sse_response(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// A JSON-RPC error, HTTP 200 (what MCP clients read as the answer).
pub(super) fn rpc_error(id: Option<&Id>, code: i32, message: &str) -> Response<Body> {
    crate::proxy::error::rpc(StatusCode::OK, id, code, message, None)
}
