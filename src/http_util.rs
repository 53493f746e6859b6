//! Small HTTP helpers shared by the request path, the admin listener and the
//! config: the boxed body every response uses, media types and what a client
//! accepts, connection-specific headers, and origins.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::Uri;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Errors a response body can end with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the firewall sends.
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub(crate) fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// `true` when a Content-Type's media type (parameters ignored) is `expected`.
pub(crate) fn mime_is(content_type: &str, expected: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(expected))
}

/// Whether the `Accept` headers allow `media` (or anything, `*/*`).
pub(crate) fn accepts(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| mime_is(m, media) || mime_is(m, "*/*"))
}

/// The media type of a message's `Content-Type` (empty when absent or not
/// text).
pub(crate) fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Connection-specific headers (RFC 9110 §7.6.1) that a proxy never forwards.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// `scheme://host[:port]` of an absolute http(s) URL, lower case, without
/// the scheme's default port (the form browsers send in `Origin`).
/// `origin_only`: refuse a URL with a path, query or fragment.
pub(crate) fn origin_of(url: &str, origin_only: bool) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "http" | "https") {
        return None;
    }
    if origin_only
        && uri
            .path_and_query()
            .is_some_and(|p| !matches!(p.as_str(), "" | "/"))
    {
        return None;
    }
    let host = uri.host()?.to_ascii_lowercase();
    let default = if scheme == "https" { 443 } else { 80 };
    Some(match uri.port_u16() {
        Some(p) if p != default => format!("{scheme}://{host}:{p}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// Every name the request gives its target by, against `allowed` (which
/// sees each name without port or brackets): the `Host` header (each of
/// them), and the authority of the request target (HTTP/2 `:authority`, an
/// HTTP/1.1 absolute-form target). A browser made to resolve a foreign name
/// to this listener (DNS rebinding) names that foreign host in one of them.
/// `Err` carries the refused value.
pub(crate) fn check_hosts(
    uri: &http::Uri,
    headers: &HeaderMap,
    allowed: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let check = |value: &[u8]| -> Result<(), String> {
        let text = String::from_utf8_lossy(value).to_ascii_lowercase();
        if allowed(host_name(&text)) {
            Ok(())
        } else {
            Err(text)
        }
    };
    if let Some(authority) = uri.authority() {
        check(authority.as_str().as_bytes())?;
    }
    for host in headers.get_all(http::header::HOST) {
        check(host.as_bytes())?;
    }
    Ok(())
}

/// The host of a `Host` header value or an authority, without userinfo,
/// port or IPv6 brackets.
pub(crate) fn host_name(host: &str) -> &str {
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(h, _)| h)
}

/// Percent-decodes a path segment (names may hold any character); a `%`
/// not followed by two hex digits stays as it is.
pub(crate) fn decode_segment(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

/// An HTML page of the admin listener: never cached, framed, sniffed or
/// given a referrer, its own browsing context, under `csp`.
pub(crate) fn html_page(
    status: http::StatusCode,
    html: impl Into<Bytes>,
    csp: &str,
) -> http::Response<Body> {
    use http::HeaderValue;
    let mut r = http::Response::new(full(html));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Ok(csp) = HeaderValue::from_str(csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// A JSON document from another server (a token endpoint's answer, a
/// server's metadata, a key set), read with one verdict:
/// what a generic JSON reader refuses is refused here too, also where it
/// hides in a member `T` skips (bytes that are not UTF-8, a number no
/// reader holds: found by the `token_answer` fuzz target), and then
/// whatever `T` refuses (a duplicate member it reads). The reason never
/// quotes the document: serde's message may quote a value (a token where
/// a number was due), so only where and what kind of error it was is
/// kept.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let unreadable = |e: serde_json::Error| {
        format!(
            "unreadable ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        )
    };
    let text = std::str::from_utf8(body).map_err(|_| "not UTF-8".to_owned())?;
    serde_json::from_str::<serde_json::Value>(text).map_err(unreadable)?;
    serde_json::from_str(text).map_err(unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_port_and_userinfo() {
        assert_eq!(host_name("example.com:8443"), "example.com");
        assert_eq!(host_name("example.com"), "example.com");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("localhost@evil.example:80"), "evil.example");
    }

    #[test]
    fn every_name_of_the_target_is_checked() {
        let listed = ["localhost"];
        let allowed = |n: &str| listed.contains(&n);
        let mut h = HeaderMap::new();
        h.insert(http::header::HOST, "localhost:8080".parse().unwrap());
        let plain: http::Uri = "/mcp/x".parse().unwrap();
        assert_eq!(check_hosts(&plain, &h, allowed), Ok(()));
        let h2: http::Uri = "http://evil.example:8080/mcp/x".parse().unwrap();
        assert_eq!(
            check_hosts(&h2, &HeaderMap::new(), allowed),
            Err("evil.example:8080".to_owned())
        );
        assert_eq!(
            check_hosts(&h2, &h, allowed),
            Err("evil.example:8080".to_owned()),
            "an allowed Host does not excuse a foreign :authority"
        );
        let ok: http::Uri = "http://localhost/mcp/x".parse().unwrap();
        assert_eq!(check_hosts(&ok, &HeaderMap::new(), allowed), Ok(()));
        h.append(http::header::HOST, "evil.example".parse().unwrap());
        assert!(check_hosts(&plain, &h, allowed).is_err(), "a second Host");
        assert_eq!(check_hosts(&h2, &h, |_| true), Ok(()));
    }

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

/// Why an HTTPS client of a control endpoint (a JWKS URL, a token
/// endpoint) could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsSetupError {
    /// The CA file holds no certificate.
    #[error("no certificate in it")]
    NoCertificate,
    /// rustls refused the configuration.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
}

/// The connector builder of a control endpoint's HTTPS client: the public
/// web roots, or only the CAs in `ca_pem` (a PEM file's bytes) when given.
///
/// # Errors
/// `ca_pem` holds no certificate, or rustls refuses the configuration.
pub(crate) fn https_builder(
    ca_pem: Option<&[u8]>,
) -> Result<
    hyper_rustls::HttpsConnectorBuilder<hyper_rustls::builderstates::WantsSchemes>,
    TlsSetupError,
> {
    use rustls_pki_types::pem::PemObject;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    match ca_pem {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs =
                rustls_pki_types::CertificateDer::pem_slice_iter(pem).filter_map(Result::ok);
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsSetupError::NoCertificate);
            }
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(builder.with_tls_config(tls))
        }
        None => Ok(builder.with_provider_and_webpki_roots(provider)?),
    }
}
