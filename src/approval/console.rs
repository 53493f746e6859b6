//! The approvals console: one static page (`console.html`, HTML, CSS and JS
//! in one file, embedded at compile time) served at `GET /console` on the
//! admin listener.
//!
//! Invariants:
//! - the page is served byte for byte as compiled in: the server never
//!   splices data into it; all data arrives through the JSON API and is put
//!   into the DOM with `textContent` only;
//! - a strict Content-Security-Policy allows exactly the page's own inline
//!   `<script>` and `<style>` (by SHA-256), same-origin `fetch`, nothing
//!   else, and enforces Trusted Types so even a future `innerHTML` with a
//!   string would throw instead of parsing markup;
//! - the admin token lives in `sessionStorage` (gone with the tab), is sent
//!   only as an `Authorization` header to this origin, never in a URL.

use std::sync::OnceLock;

use crate::digest::Sha256;
use base64::Engine;
use bytes::Bytes;
use http::{Response, StatusCode};

use crate::http_util::Body;

/// The page, exactly as served.
pub const HTML: &str = include_str!("console.html");

/// The Content-Security-Policy header sent with the page.
pub fn content_security_policy() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        let script = element_hash(HTML, "script").unwrap_or_else(|| "'none'".to_owned());
        let style = element_hash(HTML, "style").unwrap_or_else(|| "'none'".to_owned());
        format!(
            "default-src 'none'; script-src {script}; style-src {style}; connect-src 'self'; \
             img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; \
             require-trusted-types-for 'script'; trusted-types 'none'"
        )
    })
}

/// `'sha256-…'` of the text inside the first `<tag>…</tag>` of `html`, as
/// CSP hashes inline elements.
fn element_hash(html: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = html.find(&open)? + open.len();
    let end = start + html[start..].find(&close)?;
    let digest = Sha256::digest(&html.as_bytes()[start..end]);
    Some(format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    ))
}

/// The console page response.
pub fn page() -> Response<Body> {
    crate::http_util::html_page(
        StatusCode::OK,
        Bytes::from_static(HTML.as_bytes()),
        content_security_policy(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    #[test]
    fn csp_names_the_hash_of_the_inline_script_and_style() {
        let csp = content_security_policy();
        let script = element_hash(HTML, "script").expect("script element");
        let style = element_hash(HTML, "style").expect("style element");
        assert!(csp.contains(&format!("script-src {script};")), "{csp}");
        assert!(csp.contains(&format!("style-src {style};")), "{csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
        assert!(csp.starts_with("default-src 'none';"));
    }

    #[test]
    fn page_has_one_script_and_one_style_element() {
        // A second inline element would not be covered by the CSP hash.
        assert_eq!(HTML.matches("<script").count(), 1);
        assert_eq!(HTML.matches("<style").count(), 1);
        assert!(
            !HTML.contains(" style="),
            "inline style attributes are blocked by the CSP"
        );
        // Inline event handlers (` onclick=`) are blocked by the CSP too.
        let handler = HTML.split(' ').any(|word| {
            word.strip_prefix("on").is_some_and(|rest| {
                rest.split_once('=').is_some_and(|(name, _)| {
                    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase())
                })
            })
        });
        assert!(!handler, "inline event handler attribute in console.html");
    }

    #[test]
    fn script_never_parses_strings_as_markup() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setTimeout(\"",
            "localStorage",
        ] {
            assert!(!HTML.contains(sink), "console uses {sink}");
        }
        assert!(HTML.contains("textContent"));
    }

    #[test]
    fn page_response_carries_security_headers() {
        let r = page();
        let h = r.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(
            h[header::CONTENT_SECURITY_POLICY],
            content_security_policy()
        );
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
    }
}
