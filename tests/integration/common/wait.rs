//! Waiting for what the product does, not for a time: poll a condition until
//! it holds, failing the test at a deadline. The polls sleep on tokio's
//! timer, so a wait never blocks the test's runtime.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is asked again.
const POLL: Duration = Duration::from_millis(20);

/// Waits until `cond` holds, failing after `timeout` naming `what`.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until`] for a condition that must itself wait (a request, a query).
pub async fn eventually<F: Future<Output = bool>>(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> F,
) {
    let end = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}
