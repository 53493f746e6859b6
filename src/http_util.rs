//! Small HTTP helpers shared by the request path and the admin listener:
//! media types and what a client accepts.

use http::header::{self, HeaderMap};

/// `true` when a Content-Type's media type (parameters ignored) is `expected`.
pub fn mime_is(content_type: &str, expected: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(expected))
}

/// Whether the `Accept` headers allow `media` (or anything, `*/*`).
pub fn accepts(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| mime_is(m, media) || mime_is(m, "*/*"))
}

/// The media type of a message's `Content-Type` (empty when absent or not
/// text).
pub fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_ignore_parameters_and_case() {
        assert!(mime_is(
            "application/json; charset=utf-8",
            "application/json"
        ));
        assert!(mime_is(" Text/Event-Stream ", "text/event-stream"));
        assert!(!mime_is("application/jsonx", "application/json"));
    }

    #[test]
    fn accept_lists_are_split() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            "application/json, text/event-stream;q=0.9".parse().unwrap(),
        );
        assert!(accepts(&h, "text/event-stream"));
        h.insert(header::ACCEPT, "*/*".parse().unwrap());
        assert!(accepts(&h, "text/event-stream"));
        h.insert(header::ACCEPT, "application/json".parse().unwrap());
        assert!(!accepts(&h, "text/event-stream"));
    }
}
