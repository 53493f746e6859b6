//! Webhook notifications: a JSON POST to `[approvals.webhook] url` when an
//! approval is requested, approved, denied or expires, so on-call hears
//! about it in chat or a pager.
//!
//! Invariants:
//! - never on the request path: [`Webhook::notify`] serializes the event and
//!   `try_send`s it to a bounded queue (a full queue drops and counts the
//!   notification, it never waits); delivery happens on background tasks;
//! - bounded effort: `1 + max_retries` attempts, each bounded by
//!   `timeout_ms`, with exponential backoff (`backoff_ms` doubled per
//!   attempt, capped at 30 s); a 4xx other than 408/429 is final;
//! - at most [`MAX_CONCURRENT`] deliveries at once, so a dead endpoint costs
//!   a bounded number of sockets.
//!
//! Body: `{"event": "approval.requested" | "approval.approved" |
//! "approval.denied" | "approval.expired", "at_ms", "from", "approval": {…},
//! "status_url", "console_url"}`, where `approval` is the same object the
//! admin API shows (arguments already redacted). Headers name the event
//! (`X-Mcp-Firewall-Event`) and a delivery id (`X-Mcp-Firewall-Delivery`,
//! `<approval id>.<status>`) that stays the same across retries, so
//! receivers can drop duplicates.

use crate::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::Full;
use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};

use super::client::{http_client, HttpClient};
use super::metrics::Metrics;
use super::{Approval, Status, Transition, WebhookConfig};

/// Notifications waiting for delivery before new ones are dropped.
pub(crate) const QUEUE: usize = 1024;
/// Deliveries in flight at once.
pub(crate) const MAX_CONCURRENT: usize = 8;
/// Longest delay between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why the webhook sender could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    /// The URL does not parse or is not HTTP(S).
    #[error("approvals.webhook.url {url:?} is not an http:// or https:// URL")]
    InvalidUrl {
        /// The configured URL.
        url: String,
    },
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] super::client::ClientError),
}

/// The body of a notification.
#[derive(Serialize)]
struct Event<'a> {
    event: &'static str,
    at_ms: u64,
    from: Option<Status>,
    approval: &'a Approval,
    status_url: &'a str,
    console_url: &'a str,
}

struct Delivery {
    body: Bytes,
    event: &'static str,
    delivery_id: String,
}

/// The handle [`super::Approvals`] notifies through. Dropping it stops the
/// dispatcher once the queue is drained.
pub(crate) struct Webhook {
    tx: mpsc::Sender<Delivery>,
    metrics: Metrics,
}

struct Settings {
    client: HttpClient,
    url: Uri,
    timeout: Duration,
    max_retries: u32,
    backoff: Duration,
    metrics: Metrics,
}

impl Webhook {
    /// Starts the dispatcher task. Must run inside a Tokio runtime.
    pub(crate) fn start(cfg: &WebhookConfig, metrics: Metrics) -> Result<Webhook, WebhookError> {
        let url: Uri = cfg
            .url
            .parse()
            .ok()
            .filter(|u: &Uri| matches!(u.scheme_str(), Some("http" | "https")))
            .ok_or_else(|| WebhookError::InvalidUrl {
                url: cfg.url.clone(),
            })?;
        let settings = Arc::new(Settings {
            client: http_client(Duration::from_millis(cfg.timeout_ms))?,
            url,
            timeout: Duration::from_millis(cfg.timeout_ms),
            max_retries: cfg.max_retries,
            backoff: Duration::from_millis(cfg.backoff_ms),
            metrics: metrics.clone(),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(dispatch(rx, settings));
        Ok(Webhook { tx, metrics })
    }

    /// Queues a notification of `t`; never waits.
    pub(crate) fn notify(&self, t: &Transition, status_url: &str, console_url: &str) {
        let event = match t.to {
            Status::Pending => "approval.requested",
            Status::Approved => "approval.approved",
            Status::Denied => "approval.denied",
            Status::Expired => "approval.expired",
            Status::Consumed => "approval.consumed",
            Status::Withdrawn => "approval.withdrawn",
        };
        let body = match serde_json::to_vec(&Event {
            event,
            at_ms: t.at_ms,
            from: t.from,
            approval: &t.approval,
            status_url,
            console_url,
        }) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode an approval notification");
                self.metrics.webhook_dropped();
                return;
            }
        };
        let delivery = Delivery {
            body,
            event,
            delivery_id: format!("{}.{}", t.approval.id, t.to),
        };
        if self.tx.try_send(delivery).is_err() {
            tracing::warn!(approval = %t.approval.id, event, "approval webhook queue full; notification dropped");
            self.metrics.webhook_dropped();
        }
    }

    /// Queues another kind of event (a pin drift); never waits.
    pub(crate) fn notify_event(
        &self,
        event: &'static str,
        delivery_id: String,
        body: &serde_json::Value,
    ) {
        let delivery = Delivery {
            body: Bytes::from(body.to_string()),
            event,
            delivery_id,
        };
        if self.tx.try_send(delivery).is_err() {
            tracing::warn!(event, "webhook queue full; notification dropped");
            self.metrics.webhook_dropped();
        }
    }
}

async fn dispatch(mut rx: mpsc::Receiver<Delivery>, settings: Arc<Settings>) {
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT));
    while let Some(d) = rx.recv().await {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let settings = settings.clone();
        tokio::spawn(async move {
            deliver(&settings, d).await;
            drop(permit);
        });
    }
}

/// What one attempt came to.
enum Attempt {
    Delivered,
    /// Worth retrying (network error, timeout, 5xx, 408, 429).
    Retry(String),
    /// Not worth retrying (other 4xx, malformed request).
    Final(String),
}

async fn deliver(s: &Settings, d: Delivery) {
    let mut last = String::new();
    for attempt in 0..=s.max_retries {
        match once(s, &d).await {
            Attempt::Delivered => {
                s.metrics.webhook_delivered();
                return;
            }
            Attempt::Retry(why) => {
                s.metrics.webhook_attempt_failed();
                tracing::debug!(delivery = %d.delivery_id, attempt, error = %why, "approval webhook attempt failed");
                last = why;
            }
            Attempt::Final(why) => {
                s.metrics.webhook_attempt_failed();
                last = why;
                break;
            }
        }
        if attempt < s.max_retries {
            tokio::time::sleep(schedule(s.backoff).delay(attempt.saturating_add(1))).await;
        }
    }
    s.metrics.webhook_dropped();
    tracing::warn!(delivery = %d.delivery_id, url = %s.url, error = %last, "approval webhook notification dropped");
}

/// The webhook's retry schedule: `backoff_ms` doubled per retry, capped at
/// [`MAX_BACKOFF`].
pub(crate) fn schedule(first: Duration) -> Backoff {
    Backoff {
        first,
        max: MAX_BACKOFF,
    }
}

async fn once(s: &Settings, d: &Delivery) -> Attempt {
    let req = Request::builder()
        .method(Method::POST)
        .uri(s.url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::USER_AGENT, "mcp-firewall")
        .header("x-mcp-firewall-event", HeaderValue::from_static(d.event))
        .header("x-mcp-firewall-delivery", d.delivery_id.as_str())
        .body(Full::new(d.body.clone()));
    let req = match req {
        Ok(r) => r,
        Err(e) => return Attempt::Final(format!("cannot build the request: {e}")),
    };
    match tokio::time::timeout(s.timeout, s.client.request(req)).await {
        Err(_) => Attempt::Retry(format!("no answer within {} ms", s.timeout.as_millis())),
        Ok(Err(e)) => Attempt::Retry(e.to_string()),
        Ok(Ok(resp)) => {
            let status = resp.status();
            if status.is_success() {
                Attempt::Delivered
            } else if status.is_client_error()
                && status != StatusCode::REQUEST_TIMEOUT
                && status != StatusCode::TOO_MANY_REQUESTS
            {
                Attempt::Final(format!("answered {status}"))
            } else {
                Attempt::Retry(format!("answered {status}"))
            }
        }
    }
}

#[cfg(test)]
#[path = "webhook_tests.rs"]
mod tests;
