//! Policy hot reload under load: a valid change is swapped in without a
//! failed request; an invalid one keeps the old policy and raises the error
//! gauge on /metrics.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, mcp::*};
use crate::through_firewall::{connect_via, setup_in};

async fn names(client: &Client) -> Vec<String> {
    let mut n: Vec<String> = client
        .list_all_tools()
        .await
        .expect("tools/list")
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    n.sort();
    n
}

async fn metric(admin: &str, name: &str) -> Option<f64> {
    let text = common::http()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_change_swaps_in_and_invalid_change_keeps_the_old_policy() {
    let dir = common::policy_dir(&[]);
    let s = setup_in(options(true), dir.path()).await;
    let token = common::sign(&common::claims("incident-investigator", &["sre"]));
    let client = Arc::new(connect_via(&s, Era::V2026_07_28, &token).await);
    assert_eq!(names(&client).await.len(), 8);

    // Load: a second client lists continuously while the policy changes.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let loader = {
        let client = Arc::new(connect_via(&s, Era::V2026_07_28, &token).await);
        let (stop, ok) = (stop.clone(), ok.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                client
                    .list_all_tools()
                    .await
                    .expect("no request fails during a reload");
                ok.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let agents = dir.path().join("20-agents.toml");
    let original = std::fs::read_to_string(&agents).unwrap();
    let narrowed = original.replace(
        r#"allow = [{ upstream = "incidents" }, { category = "metrics" }, { category = "knowledge" }]"#,
        r#"allow = [{ upstream = "incidents", tools = ["list_*"] }]"#,
    );
    assert_ne!(
        narrowed, original,
        "the test edits the investigator's allow list"
    );
    std::fs::write(&agents, &narrowed).unwrap();
    wait_for("the narrowed policy", async || {
        names(&client).await == ["list_incidents", "list_recent_deployments"]
    })
    .await;
    assert_eq!(
        metric(&s.fw.admin, "mcp_firewall_policy_reload_error").await,
        Some(0.0)
    );

    // An invalid file: the previous policy stays in force.
    let conditions = dir.path().join("30-conditions.toml");
    let good_conditions = std::fs::read_to_string(&conditions).unwrap();
    std::fs::write(&conditions, "[[conditions]]\nbogus_key = 1\n").unwrap();
    wait_for("the reload error gauge", async || {
        metric(&s.fw.admin, "mcp_firewall_policy_reload_error").await == Some(1.0)
    })
    .await;
    assert_eq!(
        names(&client).await,
        ["list_incidents", "list_recent_deployments"]
    );

    // Fixed again: the gauge clears.
    std::fs::write(&conditions, good_conditions).unwrap();
    std::fs::write(&agents, &original).unwrap();
    wait_for("the restored policy", async || {
        names(&client).await.len() == 8
    })
    .await;
    assert_eq!(
        metric(&s.fw.admin, "mcp_firewall_policy_reload_error").await,
        Some(0.0)
    );

    stop.store(true, Ordering::Relaxed);
    loader.await.expect("the loader saw no failure");
    assert!(ok.load(Ordering::Relaxed) > 5, "the load actually ran");
    s.fw.stop().await;
}
