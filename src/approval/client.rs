//! `mcp-firewall approvals list | show ID | approve ID | deny ID --reason …`:
//! the admin API from a terminal, printing text a person can read at 3 a.m.
//!
//! Also owns the HTTP client the webhook uses ([`http_client`]): rustls with
//! ring and the webpki roots, HTTP/1.1, no proxy lookups.
//!
//! Errors carry their cause as `source()` (printed by `{:#}`), not in
//! their own message, so the CLI prints each cause once.
//!
//! Invariants: the admin token is only ever sent in an `Authorization`
//! header and never printed (`Debug` of [`AdminClient`] hides it); ids are
//! checked to be id-shaped before they go into a URL path.

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::api::{ApprovalView, DecideBody, ListView};
use super::{ApprovalId, Status};
use crate::clock::fmt_ms;

/// The pooled HTTP(S) client used by the CLI and the webhook.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Largest answer the CLI reads.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Longest the CLI waits for an answer (a preview may call an upstream).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a CLI request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--admin` is not an HTTP(S) base URL.
    #[error("--admin {url:?} is not an http:// or https:// URL")]
    InvalidUrl {
        /// As given.
        url: String,
    },
    /// The id cannot be an approval id.
    #[error("{id:?} is not an approval id (they look like ap_ and 22 letters, digits, - or _)")]
    InvalidId {
        /// As given.
        id: String,
    },
    /// The TLS configuration could not be built.
    #[error("cannot set up TLS")]
    Tls(#[source] rustls::Error),
    /// The request could not be built (a header value the token cannot be).
    #[error("cannot build the request")]
    Build(#[source] http::Error),
    /// The firewall could not be reached.
    #[error("cannot reach the firewall's admin listener at {url}")]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// No answer in time.
    #[error("no answer from {url} within {} s", timeout.as_secs())]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// The answer could not be read.
    #[error("cannot read the answer from {url}")]
    Body {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The firewall refused.
    #[error("the firewall answered {status}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The API's error code (`not_found`, `self_approval`, …).
        code: String,
        /// The API's message.
        message: String,
    },
    /// The answer is not what the API sends.
    #[error("unexpected answer from {url}")]
    Json {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Builds the shared client: rustls (ring, webpki roots), HTTP/1.1.
pub(crate) fn http_client(connect_timeout: Duration) -> Result<HttpClient, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(ClientError::Tls)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector))
}

/// `mcp-firewall approvals …`.
#[derive(clap::Args)]
pub struct ApprovalsArgs {
    /// The firewall's admin listener.
    #[arg(
        long,
        env = "MCP_FIREWALL_ADMIN_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub admin: String,
    /// An admin token (audience `auth.admin_audience`, scope approvals).
    #[arg(long, env = "MCP_FIREWALL_ADMIN_TOKEN", hide_env_values = true)]
    pub token: String,
    /// What to do.
    #[command(subcommand)]
    pub command: ApprovalsCommand,
}

/// The approvals subcommands.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum ApprovalsCommand {
    /// List approvals (pending ones unless --status says otherwise).
    List {
        /// pending, approved, denied, expired, consumed or all.
        #[arg(long, default_value = "pending")]
        status: String,
    },
    /// Show one approval: call, arguments, preview, decision.
    Show {
        /// The approval id.
        id: String,
    },
    /// Approve a pending approval.
    Approve {
        /// The approval id.
        id: String,
        /// Why (recorded in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Deny a pending approval.
    Deny {
        /// The approval id.
        id: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
    },
}

/// Runs one subcommand and returns the text to print.
pub async fn run(args: &ApprovalsArgs) -> Result<String, ClientError> {
    let client = AdminClient::new(&args.admin, &args.token)?;
    match &args.command {
        ApprovalsCommand::List { status } => {
            let status = match status.as_str() {
                "all" => None,
                s => Some(Status::from_name(s).ok_or_else(|| ClientError::Refused {
                    status: 400,
                    code: "bad_request".to_owned(),
                    message: format!("unknown status {s:?}; use pending, approved, denied, expired, consumed or all"),
                })?),
            };
            Ok(render_list(&client.list(status).await?))
        }
        ApprovalsCommand::Show { id } => {
            let v = client.show(id).await?;
            Ok(render_approval(&v, crate::clock::now_ms()))
        }
        ApprovalsCommand::Approve { id, reason } => {
            let v = client.decide(id, true, reason).await?;
            Ok(format!(
                "approved {} ({} on {}); the held call may now run once\n",
                v.approval.id, v.approval.key.tool, v.approval.key.upstream
            ))
        }
        ApprovalsCommand::Deny { id, reason } => {
            let v = client.decide(id, false, reason).await?;
            Ok(format!(
                "denied {} ({} on {})\n",
                v.approval.id, v.approval.key.tool, v.approval.key.upstream
            ))
        }
    }
}

/// A client of one firewall's approvals API.
pub struct AdminClient {
    base: String,
    token: String,
    client: HttpClient,
}

impl fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// A client for the admin listener at `admin_url` (e.g.
    /// `http://127.0.0.1:9090`) using `token`.
    pub fn new(admin_url: &str, token: &str) -> Result<AdminClient, ClientError> {
        let base = admin_url.trim_end_matches('/');
        let ok = (base.starts_with("http://") || base.starts_with("https://"))
            && base.parse::<Uri>().is_ok();
        if !ok {
            return Err(ClientError::InvalidUrl {
                url: admin_url.to_owned(),
            });
        }
        Ok(AdminClient {
            base: base.to_owned(),
            token: token.trim().to_owned(),
            client: http_client(Duration::from_secs(5))?,
        })
    }

    /// `GET /approvals[?status=…]`.
    pub async fn list(&self, status: Option<Status>) -> Result<ListView, ClientError> {
        let path = match status {
            Some(s) => format!("/approvals?status={s}"),
            None => "/approvals".to_owned(),
        };
        self.call(Method::GET, &path, None).await
    }

    /// `GET /approvals/{id}`.
    pub async fn show(&self, id: &str) -> Result<ApprovalView, ClientError> {
        let id = checked_id(id)?;
        self.call(Method::GET, &format!("/approvals/{id}"), None)
            .await
    }

    /// `POST /approvals/{id}/approve` or `/deny`.
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalView, ClientError> {
        let id = checked_id(id)?;
        let action = if approve { "approve" } else { "deny" };
        let body = DecideBody {
            reason: reason.to_owned(),
        };
        let body = serde_json::to_vec(&body).map_err(|source| ClientError::Json {
            url: self.base.clone(),
            source,
        })?;
        self.call(
            Method::POST,
            &format!("/approvals/{id}/{action}"),
            Some(Bytes::from(body)),
        )
        .await
    }

    pub(crate) async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = Request::builder()
            .method(method)
            .uri(&url)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(ClientError::Build)?;
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(req)).await {
            Err(_) => {
                return Err(ClientError::Timeout {
                    url,
                    timeout: REQUEST_TIMEOUT,
                })
            }
            Ok(Err(source)) => return Err(ClientError::Connect { url, source }),
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|source| ClientError::Body {
                url: url.clone(),
                source,
            })?
            .to_bytes();
        if !status.is_success() {
            #[derive(serde::Deserialize)]
            struct ErrorBody {
                error: String,
                message: String,
            }
            let (code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(e) => (e.error, e.message),
                Err(_) => (
                    String::new(),
                    String::from_utf8_lossy(&bytes).trim().to_owned(),
                ),
            };
            return Err(ClientError::Refused {
                status: status.as_u16(),
                code,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Json { url, source })
    }
}

fn checked_id(id: &str) -> Result<ApprovalId, ClientError> {
    ApprovalId::parse(id.trim()).ok_or_else(|| ClientError::InvalidId { id: id.to_owned() })
}

/// `in 8m 12s` / `3m 4s ago`.
fn relative(ms: u64, now_ms: u64) -> String {
    let span = |d: u64| {
        let s = d / 1000;
        match (s / 3600, (s % 3600) / 60, s % 60) {
            (0, 0, s) => format!("{s}s"),
            (0, m, s) => format!("{m}m {s}s"),
            (h, m, _) => format!("{h}h {m}m"),
        }
    };
    if ms >= now_ms {
        format!("in {}", span(ms - now_ms))
    } else {
        format!("{} ago", span(now_ms - ms))
    }
}

/// One line per approval, then how to act on them.
pub fn render_list(list: &ListView) -> String {
    let mut out = String::new();
    if list.approvals.is_empty() {
        out.push_str("no approvals\n");
        return out;
    }
    for v in &list.approvals {
        let a = &v.approval;
        let when = match a.status {
            Status::Pending | Status::Approved => {
                format!("expires {}", relative(a.expires_ms, list.now_ms))
            }
            _ => format!("asked {}", relative(a.created_ms, list.now_ms)),
        };
        let _ = writeln!(
            out,
            "{id}  {status:<8}  {risk:<11}  {tool} on {upstream}  run {run} ({agent}, asked by {sub})  {when}",
            id = a.id,
            status = a.status.as_str(),
            risk = a.risk.as_str(),
            tool = a.key.tool,
            upstream = a.key.upstream,
            run = a.key.run_id,
            agent = a.agent,
            sub = a.key.subject,
        );
    }
    out.push_str("\nmcp-firewall approvals show ID | approve ID | deny ID --reason TEXT\n");
    out
}

/// Everything about one approval, for `show`.
pub fn render_approval(v: &ApprovalView, now_ms: u64) -> String {
    let a = &v.approval;
    let mut out = String::new();
    let _ = writeln!(out, "approval  {}", a.id);
    let _ = writeln!(out, "status    {}", a.status.as_str().to_uppercase());
    let _ = writeln!(out, "tool      {} on {}", a.key.tool, a.key.upstream);
    let _ = writeln!(out, "risk      {}", a.risk.as_str());
    let _ = writeln!(out, "run       {} (agent {})", a.key.run_id, a.agent);
    let _ = writeln!(
        out,
        "asked by  {} at {}",
        a.key.subject,
        fmt_ms(a.created_ms)
    );
    let _ = writeln!(
        out,
        "deadline  {} ({})",
        fmt_ms(a.expires_ms),
        relative(a.expires_ms, now_ms)
    );
    if let Some(d) = &a.decision {
        let verb = if d.approved { "approved" } else { "denied" };
        let _ = write!(out, "decision  {verb} by {} at {}", d.by, fmt_ms(d.at_ms));
        if d.reason.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, ": {}", d.reason);
        }
    }
    if let Some(at) = a.consumed_ms {
        let _ = writeln!(out, "ran at    {}", fmt_ms(at));
    }
    let _ = writeln!(out, "arguments (redacted):");
    let _ = writeln!(out, "{}", indent(&pretty(&a.arguments)));
    if let Some(p) = &v.preview {
        match (&p.result, &p.error) {
            (Some(r), _) => {
                let _ = writeln!(out, "preview ({}):", p.tool);
                let _ = writeln!(out, "{}", indent(&pretty(r)));
            }
            (None, Some(e)) => {
                let _ = writeln!(out, "preview ({}) failed: {e}", p.tool);
            }
            (None, None) => {}
        }
    }
    let _ = writeln!(out, "status    {}", v.status_url);
    out
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn indent(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("  ");
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        assert_eq!(relative(10_000 + 492_000, 10_000), "in 8m 12s");
        assert_eq!(relative(10_000, 15_000), "5s ago");
        assert_eq!(relative(7_200_000 + 60_000, 0), "in 2h 1m");
    }

    #[test]
    fn ids_that_could_change_the_url_path_are_refused() {
        for bad in ["../metrics", "ap_x/approve", "", "ap x", "ap_%2e"] {
            assert!(
                matches!(checked_id(bad), Err(ClientError::InvalidId { .. })),
                "{bad}"
            );
        }
        assert!(checked_id("ap_AbC-d_9").is_ok());
    }

    #[test]
    fn admin_url_must_be_http() {
        assert!(matches!(
            AdminClient::new("ftp://x", "t"),
            Err(ClientError::InvalidUrl { .. })
        ));
        let c = AdminClient::new("http://127.0.0.1:9090/", "secret-token").expect("client");
        assert!(!format!("{c:?}").contains("secret-token"));
    }
}
