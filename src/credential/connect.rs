//! The admin listener's pages and API for users' own upstream accounts
//! (`auth = "oauth_user"`):
//!
//! | method and path | what |
//! |---|---|
//! | `GET /connect/{upstream}?ticket=…` | the consent page of a link a run was given: whom it is for, what is asked, one button |
//! | `POST /connect/{upstream}` | form `ticket=…`: the link spent, a `state` and PKCE verifier kept, the browser sent to the authorization server |
//! | `GET /connect/{upstream}/callback?code=…&state=…` | the code redeemed (with the verifier) and the token kept, sealed, for the link's owner |
//! | `GET /credentials` | the kept tokens of the caller's tenant, without their values (admin token, `credentials` scope) |
//! | `DELETE /credentials/{upstream}/{tenant}/{subject}` | removes that user's token, revoking it at the server (admin token, `credentials` scope, own tenant) |
//!
//! The link is the capability: sealed under the credentials key, for one
//! owner and upstream, until its expiry, spent by the first `POST`. The
//! page does nothing on `GET` (a link preview or a prefetch spends
//! nothing), is never framed, sends no referrer and is not cached.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use serde_json::json;

use super::store::Filter;
use super::user::{ConnectError, UserCredentials};
use crate::approval::api::{authenticate, json_response, ApiError};
use crate::auth::Verifier;
use crate::http_util::{Body, BoxError};

/// The scope an admin token needs for `/credentials`.
pub(crate) const SCOPE: &str = "credentials";

/// Largest form body read.
const MAX_FORM_BYTES: usize = 8 * 1024;

/// Whether `path` is served here.
pub(crate) fn owns(path: &str) -> bool {
    path.starts_with("/connect/") || path == "/credentials" || path.starts_with("/credentials/")
}

/// A kept token as listed (never its value).
#[derive(Debug, Serialize)]
struct Listed {
    upstream: String,
    tenant: String,
    subject: String,
    issuer: String,
    credential_id: String,
    scope: String,
    created_ms: u64,
    updated_ms: u64,
    expires_ms: u64,
    refreshable: bool,
}

/// Serves one request under [`owns`].
pub(crate) async fn handle<B>(
    users: &[Arc<UserCredentials>],
    verifier: &Verifier,
    req: Request<B>,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/connect/") {
        let (name, callback) = match rest.strip_suffix("/callback") {
            Some(n) => (n, true),
            None => (rest, false),
        };
        let Some(u) = users.iter().find(|u| u.upstream() == name) else {
            return page(
                StatusCode::NOT_FOUND,
                "Not found",
                "No upstream takes users' own accounts under this name.",
            );
        };
        return match (req.method().clone(), callback) {
            (Method::GET, false) => consent_page(u, &req),
            (Method::POST, false) => begin(u, req).await,
            (Method::GET, true) => callback_page(u, &req).await,
            _ => page(
                StatusCode::METHOD_NOT_ALLOWED,
                "Not allowed",
                "This page takes GET (and POST from its button).",
            ),
        };
    }
    api(users, verifier, req).await
}

fn query(req: &Request<impl Sized>, key: &str) -> Option<String> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

fn consent_page(u: &UserCredentials, req: &Request<impl Sized>) -> Response<Body> {
    let Some(ticket) = query(req, "ticket") else {
        return page(
            StatusCode::BAD_REQUEST,
            "No link",
            "Open the link your agent gave you.",
        );
    };
    match u.open_ticket(&ticket) {
        Ok(t) => {
            let body = format!(
                "<p>The firewall asks to act on <b>{up}</b> as you, with your own account there.</p>\
                 <p>This link is for <b>{sub}</b> (tenant <b>{ten}</b>). If that is not you, close this page.</p>\
                 <form method=\"post\" action=\"/connect/{up}\"><input type=\"hidden\" name=\"ticket\" value=\"{ticket}\">\
                 <button type=\"submit\" id=\"connect\">Connect my {up} account</button></form>",
                up = esc(u.upstream()),
                sub = esc(&t.owner.subject),
                ten = esc(&t.owner.tenant),
                ticket = esc(&ticket),
            );
            page(StatusCode::OK, "Connect your account", &body)
        }
        Err(e) => connect_error(&e),
    }
}

async fn begin<B>(u: &UserCredentials, req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let form = crate::http_util::mime_is(
        crate::http_util::content_type(req.headers()),
        "application/x-www-form-urlencoded",
    );
    if !form {
        return page(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Not a form",
            "Use the page's button.",
        );
    }
    let body = match Limited::new(req.into_body(), MAX_FORM_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return page(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Too large",
                "Use the page's button.",
            )
        }
    };
    let Some(ticket) = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "ticket")
        .map(|(_, v)| v.into_owned())
    else {
        return page(
            StatusCode::BAD_REQUEST,
            "No link",
            "Open the link your agent gave you.",
        );
    };
    let ticket = match u.open_ticket(&ticket) {
        Ok(t) => t,
        Err(e) => return connect_error(&e),
    };
    match u.begin(ticket).await {
        Ok(location) => {
            let mut r = page(
                StatusCode::SEE_OTHER,
                "Redirecting",
                "On to the authorization server.",
            );
            if let Ok(v) = HeaderValue::from_str(&location) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Err(e) => connect_error(&e),
    }
}

async fn callback_page(u: &UserCredentials, req: &Request<impl Sized>) -> Response<Body> {
    let Some(state) = query(req, "state") else {
        return connect_error(&ConnectError::UnknownState);
    };
    if let Some(error) = query(req, "error") {
        u.decline(&state).await;
        let shown: String = error
            .chars()
            .filter(char::is_ascii_graphic)
            .take(64)
            .collect();
        return connect_error(&ConnectError::Denied(shown));
    }
    let Some(code) = query(req, "code") else {
        return connect_error(&ConnectError::UnknownState);
    };
    match u.complete(&state, &code).await {
        Ok(owner) => page(
            StatusCode::OK,
            "Connected",
            &format!(
                "<p id=\"connected\">Your {} account is connected for <b>{}</b>. You can close this page and return to your agent.</p>",
                esc(u.upstream()),
                esc(&owner.subject)
            ),
        ),
        Err(e) => connect_error(&e),
    }
}

fn connect_error(e: &ConnectError) -> Response<Body> {
    let status = match e {
        ConnectError::BadTicket(_) | ConnectError::UnknownState => StatusCode::BAD_REQUEST,
        ConnectError::Used => StatusCode::CONFLICT,
        ConnectError::Denied(_) => StatusCode::FORBIDDEN,
        ConnectError::Failed(_) => StatusCode::BAD_GATEWAY,
    };
    tracing::info!(error = %e, "consent page refused");
    page(
        status,
        "Not connected",
        &format!("<p id=\"error\">{}</p>", esc(&e.to_string())),
    )
}

/// An HTML page (the admin listener's page headers; no script at all).
fn page(status: StatusCode, title: &str, body: &str) -> Response<Body> {
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head><body><h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    );
    // The form posts here and its answer redirects to the authorization
    // server, which `form-action` would refuse in some browsers: no
    // `form-action` restriction beyond the default.
    crate::http_util::html_page(
        status,
        html,
        "default-src 'none'; frame-ancestors 'none'; base-uri 'none'",
    )
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn api_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": code, "message": message }))
}

/// `/credentials`: list and revoke, for an admin token with the
/// `credentials` scope, within its own tenant.
async fn api<B>(
    users: &[Arc<UserCredentials>],
    verifier: &Verifier,
    req: Request<B>,
) -> Response<Body> {
    let who = match authenticate(verifier, req.headers()).await {
        Ok(w) => w,
        Err(e) => return ApiError::into_response(e),
    };
    if !who.scopes.iter().any(|s| s == SCOPE) {
        return api_error(
            StatusCode::FORBIDDEN,
            "scope",
            "users' upstream credentials need an admin token with the `credentials` scope",
        );
    }
    let path = req.uri().path().to_owned();
    let segments: Vec<String> = path
        .trim_start_matches("/credentials")
        .split('/')
        .filter(|s| !s.is_empty())
        .map(crate::http_util::decode_segment)
        .collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, []) => {
            let filter = Filter {
                tenant: Some(who.tenant.clone()),
                ..Filter::default()
            };
            let Some(first) = users.first() else {
                return json_response(StatusCode::OK, &json!({ "credentials": [] }));
            };
            match first.keeper().store.list(&filter).await {
                Ok(records) => json_response(
                    StatusCode::OK,
                    &json!({ "credentials": records.into_iter().map(|r| Listed {
                        upstream: r.owner.upstream,
                        tenant: r.owner.tenant,
                        subject: r.owner.subject,
                        issuer: r.owner.issuer,
                        credential_id: r.credential_id,
                        scope: r.scope,
                        created_ms: r.created_ms,
                        updated_ms: r.updated_ms,
                        expires_ms: r.expires_ms,
                        refreshable: r.refreshable,
                    }).collect::<Vec<_>>() }),
                ),
                Err(e) => api_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    &e.to_string(),
                ),
            }
        }
        (&Method::DELETE, [upstream, tenant, subject]) => {
            if *tenant != who.tenant {
                return api_error(
                    StatusCode::FORBIDDEN,
                    "tenant",
                    "an admin token revokes its own tenant's credentials only",
                );
            }
            let Some(u) = users.iter().find(|u| u.upstream() == upstream) else {
                return api_error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "no upstream takes users' own accounts under this name",
                );
            };
            let filter = Filter {
                tenant: Some(tenant.clone()),
                subject: Some(subject.clone()),
                ..Filter::default()
            };
            match u.revoke(&filter).await {
                Ok(removed) => {
                    tracing::info!(%upstream, %tenant, %subject, by = %who.subject, removed = removed.len(), "user credential revoked");
                    json_response(StatusCode::OK, &json!({ "revoked": removed.len() }))
                }
                Err(e) => api_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    &e.to_string(),
                ),
            }
        }
        _ => api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "GET /credentials, or DELETE /credentials/{upstream}/{tenant}/{subject}",
        ),
    }
}
