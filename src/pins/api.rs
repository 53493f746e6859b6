//! The pins review API on the admin listener.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /pins` | pending reviews: per tool the definition seen and the one pinned, with a line diff |
//! | `POST /pins/{upstream}/{name}/accept` | body `{"sha256": "…", "subject": "tool"}`: pin that definition (written to `pins/<upstream>.toml`) |
//! | `POST /pins/{upstream}/{name}/reject` | body `{"sha256": "…", "subject": "tool"}`: keep it refused, stop proposing it |
//!
//! `subject` is `tool` (the default), `prompt` or `resource_template`; a
//! template's name is its URI template, percent-encoded in the path.
//!
//! Every request needs an admin-audience token carrying the `pins` scope
//! (pins are the security team's, not a tenant's); the hash in the body
//! must be the pending one, so a definition that changed again after the
//! person looked is not accepted unseen. Accepting writes the pin file on
//! this replica: commit it with the policy so every replica gets it.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::approval::api::{authenticate, json_response, ApiError};
use crate::auth::Verifier;
use crate::http_util::{Body, BoxError};

use super::{PinStore, Proposal, ReviewError, Subject};

/// The scope an admin token needs for `/pins`.
pub(crate) const SCOPE: &str = "pins";

/// A pending review as shown.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReviewView {
    /// The upstream.
    pub upstream: String,
    /// `tool`, `prompt` or `resource_template`.
    #[serde(default = "tool_subject")]
    pub subject: String,
    /// The tool's or prompt's name, or the template's URI template.
    pub tool: String,
    /// `new`, `changed` or `shadowing`.
    pub kind: String,
    /// SHA-256 of the definition seen.
    pub sha256: String,
    /// The definition seen, pretty-printed.
    pub definition: String,
    /// The pinned definition, pretty-printed, if any.
    pub pinned: Option<String>,
    /// SHA-256 of the pinned definition.
    pub pinned_sha256: Option<String>,
    /// Who pinned it, when.
    pub pinned_by: Option<String>,
    /// A line diff, pinned → seen (`-`, `+`, ` ` prefixes).
    pub diff: String,
    /// When this replica first saw it (ms).
    pub first_seen_ms: u64,
}

/// `GET /pins`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReviewList {
    /// Pending reviews, oldest first.
    pub pending: Vec<ReviewView>,
}

/// The body of accept and reject.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReviewBody {
    /// The definition's hash, as shown.
    pub sha256: String,
    /// What is reviewed (default: a tool).
    #[serde(default)]
    pub subject: Subject,
}

fn tool_subject() -> String {
    Subject::Tool.as_str().to_owned()
}

/// Whether `path` is this API's.
pub(crate) fn owns(path: &str) -> bool {
    path == "/pins" || path.starts_with("/pins/")
}

/// Serves one `/pins` request.
pub(crate) async fn handle<B>(
    pins: Arc<PinStore>,
    verifier: Verifier,
    req: Request<B>,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match serve(&pins, &verifier, req).await {
        Ok(r) => r,
        Err(e) => e,
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": code, "message": message }))
}

async fn serve<B>(
    pins: &PinStore,
    verifier: &Verifier,
    req: Request<B>,
) -> Result<Response<Body>, Response<Body>>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let who = authenticate(verifier, req.headers())
        .await
        .map_err(ApiError::into_response)?;
    if !who.scopes.iter().any(|s| s == SCOPE) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "scope",
            "reviewing pins needs an admin token with the `pins` scope",
        ));
    }
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path
        .trim_start_matches("/pins")
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let method = req.method().clone();
    match (segments.as_slice(), method) {
        ([], Method::GET) => Ok(json_response(
            StatusCode::OK,
            &ReviewList {
                pending: pins.proposals().iter().map(view).collect(),
            },
        )),
        ([upstream, tool, action @ ("accept" | "reject")], Method::POST) => {
            let (upstream, tool, accept) = (
                crate::http_util::decode_segment(upstream),
                crate::http_util::decode_segment(tool),
                *action == "accept",
            );
            let body = read_body(req).await?;
            let result = if accept {
                pins.accept(&upstream, body.subject, &tool, &body.sha256, &who.subject)
                    .map(|_| ())
            } else {
                pins.reject(&upstream, body.subject, &tool, &body.sha256)
            };
            match result {
                Ok(()) => {
                    tracing::info!(%upstream, %tool, sha256 = %body.sha256, by = %who.subject, accepted = accept, "pin review");
                    Ok(json_response(
                        StatusCode::OK,
                        &json!({"upstream": upstream, "subject": body.subject.as_str(), "tool": tool, "sha256": body.sha256,
                                "status": if accept { "pinned" } else { "rejected" }}),
                    ))
                }
                Err(e) => Err(review_error(&e)),
            }
        }
        _ => Err(error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such endpoint; see GET /pins",
        )),
    }
}

fn review_error(e: &ReviewError) -> Response<Body> {
    let (status, code) = match e {
        ReviewError::NothingPending => (StatusCode::NOT_FOUND, "not_pending"),
        ReviewError::Stale { .. } => (StatusCode::CONFLICT, "stale"),
        ReviewError::Shadowing => (StatusCode::CONFLICT, "shadowing"),
        ReviewError::Write(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    error(status, code, &e.to_string())
}

async fn read_body<B>(req: Request<B>) -> Result<ReviewBody, Response<Body>>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let bytes = Limited::new(req.into_body(), 4096)
        .collect()
        .await
        .map_err(|_| error(StatusCode::BAD_REQUEST, "bad_request", "unreadable body"))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!("the body must be {{\"sha256\": \"...\"}}: {e}"),
        )
    })
}

fn pretty(canonical: &str) -> String {
    serde_json::from_str::<serde_json::Value>(canonical)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| canonical.to_owned())
}

fn view(p: &Proposal) -> ReviewView {
    let seen = pretty(&p.definition);
    let pinned = p.pinned.as_ref().map(|pin| pretty(&pin.definition));
    ReviewView {
        upstream: p.upstream.clone(),
        subject: p.subject.as_str().to_owned(),
        tool: p.tool.clone(),
        kind: p.kind.to_owned(),
        sha256: p.sha256.clone(),
        diff: diff(pinned.as_deref().unwrap_or(""), &seen),
        definition: seen,
        pinned_sha256: p.pinned.as_ref().map(|x| x.sha256.clone()),
        pinned_by: p
            .pinned
            .as_ref()
            .map(|x| format!("{} at {}", x.pinned_by, x.pinned_at)),
        pinned,
        first_seen_ms: p.first_seen_ms,
    }
}

/// A line diff (longest common subsequence; definitions are small).
pub(crate) fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push_str(&format!("  {}\n", a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("- {}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!("+ {}\n", b[j]));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_show_what_changed() {
        let d = diff("a\nb\nc\n", "a\nB\nc\nd\n");
        assert_eq!(d, "  a\n- b\n+ B\n  c\n+ d\n");
        assert_eq!(
            crate::http_util::decode_segment("get%5Fincident"),
            "get_incident"
        );
        assert_eq!(crate::http_util::decode_segment("a%2Fb"), "a/b");
        assert_eq!(crate::http_util::decode_segment("100%"), "100%");
    }
}
