//! Unit tests of the estate: determinism, the metric series, and that every
//! write changes exactly what it says (and nothing when it refuses).

use super::*;
use crate::catalog::CACHED_POINTS;
use serde_json::Value;

fn structured(output: &ToolOutput) -> &Value {
    output.structured.as_ref().expect("structured content")
}

#[test]
fn same_call_gives_same_bytes_across_estates() {
    let (a, b) = (Estate::new(), Estate::new());
    assert_eq!(a.get_incident("INC-1001"), b.get_incident("INC-1001"));
    assert_eq!(
        a.service_health(Service::Search, Namespace::Prod),
        b.service_health(Service::Search, Namespace::Prod)
    );
    assert_eq!(
        a.metrics_csv(Service::Checkout, Namespace::Prod, 3_000),
        b.metrics_csv(Service::Checkout, Namespace::Prod, 3_000)
    );
}

#[test]
fn metrics_csv_has_header_and_requested_rows() {
    let csv = Estate::new()
        .metrics_csv(Service::Payments, Namespace::Staging, 5)
        .expect("csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[0], METRICS_CSV_HEADER);
    assert!(
        lines[1].starts_with("1773187200,payments,staging,"),
        "{}",
        lines[1]
    );
    assert!(
        lines[5].starts_with("1773187440,payments,staging,"),
        "{}",
        lines[5]
    );
    assert!(lines.iter().skip(1).all(|l| l.split(',').count() == 7));
}

#[test]
fn metrics_rows_past_the_cache_continue_the_series() {
    let estate = Estate::new();
    let long = estate
        .metrics_csv(Service::Auth, Namespace::Prod, CACHED_POINTS as u64 + 20)
        .expect("long csv");
    let short = estate
        .metrics_csv(Service::Auth, Namespace::Prod, CACHED_POINTS as u64)
        .expect("cached csv");
    assert!(long.starts_with(&short));
    assert_eq!(long.lines().count(), CACHED_POINTS + 21);
    let last = long.lines().last().expect("last row");
    let ts = METRICS_START_UNIX + (CACHED_POINTS as u64 + 19) * METRICS_STEP_SECS;
    assert!(last.starts_with(&format!("{ts},auth,prod,")), "{last}");
}

#[test]
fn metrics_points_outside_range_are_rejected() {
    let estate = Estate::new();
    for points in [0, MAX_METRIC_POINTS + 1] {
        assert_eq!(
            estate.metrics_csv(Service::Search, Namespace::Prod, points),
            Err(EstateError::OutOfRange {
                field: "points",
                got: points,
                min: 1,
                max: MAX_METRIC_POINTS
            })
        );
    }
}

#[test]
fn checkout_errors_jump_when_the_bad_deploy_goes_live() {
    let csv = Estate::new()
        .metrics_csv(Service::Checkout, Namespace::Prod, 1_010)
        .expect("csv");
    let error_rate = |minute: usize| -> f64 {
        let line = csv.lines().nth(minute + 1).expect("row");
        line.split(',')
            .nth(5)
            .expect("error_rate")
            .parse()
            .expect("number")
    };
    assert!(error_rate(1_004) < 0.01, "before: {}", error_rate(1_004));
    assert!(error_rate(1_005) > 0.08, "after: {}", error_rate(1_005));
}

#[test]
fn rollback_of_live_deployment_moves_version_and_mitigates_incident() {
    let estate = Estate::new();
    let before = estate.service_health(Service::Checkout, Namespace::Prod);
    assert_eq!(structured(&before)["version"], "v2.14.1");
    assert_eq!(structured(&before)["status"], "degraded");

    let done = estate.rollback("dep-1042", "INC-1001").expect("rollback");
    assert_eq!(structured(&done)["to_version"], "v2.14.0");
    assert_eq!(
        structured(&done)["mitigated_incidents"],
        json!(["INC-1001"])
    );

    let after = estate.service_health(Service::Checkout, Namespace::Prod);
    assert_eq!(structured(&after)["version"], "v2.14.0");
    assert_eq!(structured(&after)["status"], "healthy");
    let incident = estate.get_incident("INC-1001").expect("incident");
    assert_eq!(structured(&incident)["status"], "mitigated");
    let deployment = estate.get_deployment("dep-1042").expect("deployment");
    assert_eq!(structured(&deployment)["status"], "rolled_back");
}

#[test]
fn rollbacks_walk_back_until_the_first_deployment() {
    let estate = Estate::new();
    estate.rollback("dep-1042", "r").expect("first");
    let second = estate.rollback("dep-1038", "r").expect("second");
    assert_eq!(structured(&second)["live_deployment"], "dep-1031");
    assert_eq!(
        estate.rollback("dep-1031", "r"),
        Err(EstateError::NoEarlierVersion {
            id: "dep-1031",
            service: Service::Checkout,
            namespace: Namespace::Prod
        })
    );
}

#[test]
fn rollback_of_superseded_deployment_is_refused_and_changes_nothing() {
    let estate = Estate::new();
    let before = estate.get_deployment("dep-1042");
    assert_eq!(
        estate.rollback("dep-1038", "because"),
        Err(EstateError::NotLive {
            id: "dep-1038",
            service: Service::Checkout,
            namespace: Namespace::Prod,
            live: "dep-1042"
        })
    );
    assert_eq!(estate.get_deployment("dep-1042"), before);
    assert_eq!(
        estate.rollback("dep-1042", "  "),
        Err(EstateError::EmptyText { field: "reason" })
    );
    assert_eq!(estate.get_deployment("dep-1042"), before);
}

#[test]
fn preview_describes_without_changing() {
    let estate = Estate::new();
    let preview = estate.preview_rollback("dep-1042").expect("preview");
    assert_eq!(structured(&preview)["to_deployment"], "dep-1038");
    assert_eq!(structured(&preview)["changed"], false);
    let health = estate.service_health(Service::Checkout, Namespace::Prod);
    assert_eq!(structured(&health)["version"], "v2.14.1");
    let restart = estate.preview_restart(Service::Search, Namespace::Prod);
    assert_eq!(structured(&restart)["would_mitigate"], json!(["INC-1002"]));
}

#[test]
fn restart_clears_stale_cache_and_mitigates_latency_incident() {
    let estate = Estate::new();
    let done = estate
        .restart(Service::Search, Namespace::Prod, "INC-1002")
        .expect("restart");
    assert_eq!(structured(&done)["cleared_stale_cache"], true);
    assert_eq!(structured(&done)["restarts"], 1);
    let incident = estate.get_incident("INC-1002").expect("incident");
    assert_eq!(structured(&incident)["status"], "mitigated");
    let again = estate
        .restart(Service::Search, Namespace::Prod, "again")
        .expect("restart");
    assert_eq!(structured(&again)["cleared_stale_cache"], false);
}

#[test]
fn notes_are_appended_numbered_and_validated() {
    let estate = Estate::new();
    let posted = estate
        .post_note("INC-1002", "sre", "cache rebuilt")
        .expect("note");
    assert_eq!(structured(&posted)["note_number"], 2);
    let incident = estate.get_incident("INC-1002").expect("incident");
    assert_eq!(structured(&incident)["notes"][1]["text"], "cache rebuilt");
    assert!(incident
        .text
        .contains("#2 (posted during this session) sre: cache rebuilt"));
    let long = "x".repeat(MAX_NOTE_CHARS + 1);
    assert_eq!(
        estate.post_note("INC-1002", "sre", &long),
        Err(EstateError::TextTooLong {
            field: "note",
            chars: MAX_NOTE_CHARS + 1,
            max: MAX_NOTE_CHARS
        })
    );
    assert_eq!(
        estate.post_note("INC-9", "sre", "x"),
        Err(EstateError::UnknownIncident { id: "INC-9".into() })
    );
}

#[test]
fn findings_get_sequential_ids_and_store_audits() {
    let estate = Estate::new();
    let evidence = vec!["dep-1042 removes the idempotency key".to_owned()];
    let first = estate
        .record_finding(
            "INC-1001",
            "retries lack idempotency",
            FindingSeverity::Critical,
            &evidence,
        )
        .expect("finding");
    assert_eq!(structured(&first)["finding_id"], "F-1");
    let second = estate
        .record_finding("INC-1001", "alert fired late", FindingSeverity::Low, &[])
        .expect("finding");
    assert_eq!(structured(&second)["finding_id"], "F-2");

    let brief = estate.finding_brief("F-1").expect("brief");
    assert_eq!(Estate::rule_verdict(&brief), Verdict::Confirmed);
    let empty = estate.finding_brief("F-2").expect("brief");
    assert_eq!(Estate::rule_verdict(&empty), Verdict::NeedsMoreEvidence);

    let audit = estate
        .record_audit(
            "F-1",
            Verdict::Rejected,
            AuditSource::Sampling { model: "m".into() },
        )
        .expect("audit");
    assert_eq!(structured(&audit)["source"], "sampling");
    let incident = estate.get_incident("INC-1001").expect("incident");
    assert_eq!(structured(&incident)["findings"][0]["verdict"], "rejected");
    for id in ["F-3", "F-0", "X-1"] {
        assert_eq!(
            estate.finding_brief(id),
            Err(EstateError::UnknownFinding { id: id.into() })
        );
    }
}

#[test]
fn estates_do_not_share_writes() {
    let (a, b) = (Estate::new(), Estate::new());
    a.rollback("dep-1042", "r").expect("rollback");
    let health = b.service_health(Service::Checkout, Namespace::Prod);
    assert_eq!(structured(&health)["version"], "v2.14.1");
}

#[test]
fn diff_stats_count_changed_lines_per_file() {
    let diff = Estate::new().deployment_diff("dep-1042").expect("diff");
    let s = structured(&diff);
    assert_eq!(s["additions"], 10);
    assert_eq!(s["deletions"], 2);
    assert_eq!(s["files"][0]["path"], "src/payment/client.rs");
    assert_eq!(s["files"][1]["additions"], 9);
    assert!(diff.text.starts_with("dep-1042 checkout/prod v2.14.1"));
}

#[test]
fn list_filters_apply() {
    let estate = Estate::new();
    let open = estate.list_incidents(Some(IncidentStatus::Open), None);
    assert_eq!(structured(&open)["count"], 2);
    let auth = estate.list_incidents(None, Some(Service::Auth));
    assert_eq!(structured(&auth)["incidents"][0]["incident_id"], "INC-1003");
    let deployments = estate
        .list_recent_deployments(Some(Service::Checkout), Some(Namespace::Prod), 2)
        .expect("list");
    assert_eq!(
        structured(&deployments)["deployments"][0]["deployment_id"],
        "dep-1042"
    );
    assert_eq!(structured(&deployments)["count"], 2);
    assert!(estate.list_recent_deployments(None, None, 0).is_err());
}

#[test]
fn verdicts_are_read_from_free_text() {
    assert_eq!(Verdict::from_reply("Rejected."), Verdict::Rejected);
    assert_eq!(
        Verdict::from_reply("not confirmed: rejected"),
        Verdict::Rejected
    );
    assert_eq!(Verdict::from_reply("confirmed"), Verdict::Confirmed);
    assert_eq!(
        Verdict::from_reply("needs more evidence"),
        Verdict::NeedsMoreEvidence
    );
    assert_eq!(Verdict::from_reply("no idea"), Verdict::NeedsMoreEvidence);
}
