//! Tests of the pure ClickHouse helpers: error classification, retention
//! arithmetic, schema statements, insert SQL, password resolution.

use super::*;
use crate::clock::yyyymmdd_from_days;

#[test]
fn exception_codes_are_parsed_from_old_and_new_error_formats() {
    assert_eq!(
        exception_code("Code: 117, e.displayText() = DB::Exception: Unexpected NULL"),
        Some(117)
    );
    assert_eq!(
        exception_code("Code: 53. DB::Exception: Type mismatch. (TYPE_MISMATCH)"),
        Some(53)
    );
    assert_eq!(exception_code("Service Unavailable"), None);
    assert_eq!(exception_code("Code: x"), None);
}

#[test]
fn bad_data_is_rejected_and_everything_else_retried() {
    for code in [117, 53, 33, 27, 6, 72] {
        assert_eq!(classify_code(Some(code)), Disposition::Reject, "{code}");
    }
    // Overload, auth, missing table, checksum on the wire, unknown: retry.
    for code in [202, 252, 241, 516, 192, 60, 81, 16, 40, 209, 210, 999] {
        assert_eq!(classify_code(Some(code)), Disposition::Retry, "{code}");
    }
    assert_eq!(classify_code(None), Disposition::Retry);
}

#[test]
fn client_errors_are_classified_by_their_server_code() {
    use clickhouse::error::Error;
    let bad = Error::BadResponse(
        "Code: 33, e.displayText() = DB::Exception: Cannot read all data".into(),
    );
    assert_eq!(classify(&bad), Disposition::Reject);
    let overloaded =
        Error::BadResponse("Code: 202. DB::Exception: Too many simultaneous queries".into());
    assert_eq!(classify(&overloaded), Disposition::Retry);
    assert_eq!(classify(&Error::TimedOut), Disposition::Retry);
    assert_eq!(
        classify(&Error::Network("connection refused".into())),
        Disposition::Retry
    );
}

#[test]
fn only_partitions_older_than_the_cutoff_are_dropped() {
    let parts = [20240105, 20231231, 20240101, 20240104, 20231231];
    assert_eq!(
        partitions_to_drop(&parts, 20240104),
        vec![20231231, 20240101]
    );
    assert!(partitions_to_drop(&parts, 20200101).is_empty());
}

#[test]
fn civil_dates_are_computed_from_epoch_days() {
    assert_eq!(yyyymmdd_from_days(0), 19700101);
    assert_eq!(yyyymmdd_from_days(-1), 19691231);
    assert_eq!(yyyymmdd_from_days(59), 19700301);
    assert_eq!(yyyymmdd_from_days(11_016), 20000229);
    assert_eq!(yyyymmdd_from_days(19_723), 20240101);
    assert_eq!(yyyymmdd_from_days(20_513), 20260301);
}

#[test]
fn schema_statements_substitute_names_and_skip_comments_and_set() {
    let stmts = schema_statements("db1", "ev");
    assert_eq!(stmts.len(), 6, "{stmts:#?}");
    assert_eq!(stmts[0], "CREATE DATABASE IF NOT EXISTS db1");
    assert!(stmts[1].starts_with("CREATE TABLE IF NOT EXISTS db1.ev\n("));
    assert!(stmts[1].contains("ReplacingMergeTree(row_version)"));
    assert!(stmts[2].starts_with("CREATE TABLE IF NOT EXISTS db1.ev_daily_stats"));
    assert!(stmts[3].contains("TO db1.ev_daily_stats"));
    assert!(stmts[3].contains("WHERE row_version = 1"));
    assert!(stmts[4].starts_with("CREATE TABLE IF NOT EXISTS db1.ev_chain"));
    assert!(stmts[4].contains("ENGINE = MergeTree()"));
    assert!(stmts[5].starts_with("CREATE TABLE IF NOT EXISTS db1.ev_checkpoints"));
    for s in &stmts {
        assert!(
            !s.contains('{') && !s.contains("--") && !s.ends_with(';'),
            "{s}"
        );
    }
}

#[test]
fn insert_names_every_column_in_order() {
    let sql = insert_sql("db", "t");
    assert!(sql.starts_with("INSERT INTO db.t (event_id, time, time_ms, tenant,"));
    assert!(sql.ends_with(
        "instance, trace_id, row_version, screen_kinds, screen_action, run_labels, virtual_server, \
         approval_id, approver, approved_ms, policy_sha256, pin_sha256, delegation, token_jti, \
         shadow_decision, principal_claims, upstream_auth, credential_id) FORMAT RowBinary"
    ));
}

#[test]
fn the_migration_adds_every_column_after_the_first_release_with_its_schema_type() {
    let added = added_columns_sql("db1", "ev");
    let names: Vec<&str> = added.iter().map(|(c, _)| *c).collect();
    // The first release's table ended at trace_id; everything after it is
    // added, in order.
    let first = COLUMNS.iter().position(|c| *c == "trace_id").unwrap() + 1;
    assert_eq!(names, COLUMNS[first..]);
    let create = &schema_statements("db1", "ev")[1];
    for (column, alter) in &added {
        let declared = create
            .lines()
            .find(|l| l.split_whitespace().next() == Some(column))
            .unwrap_or_else(|| panic!("{column} in the CREATE TABLE"));
        let ty = declared
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            *alter,
            format!(
                "ALTER TABLE db1.ev ADD COLUMN {column} {}",
                ty.trim_end_matches(',')
            )
        );
    }
}

#[test]
fn password_comes_from_env_or_file_and_a_missing_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "s3cret\n").unwrap();
    let cfg = ClickHouseConfig {
        password_file: Some(file),
        ..ClickHouseConfig::default()
    };
    assert_eq!(resolve_password(&cfg).unwrap().as_deref(), Some("s3cret"));
    let cfg = ClickHouseConfig {
        password_env: Some("MCPFW_TEST_SURELY_UNSET_VAR".into()),
        ..ClickHouseConfig::default()
    };
    let err = resolve_password(&cfg).unwrap_err();
    assert!(matches!(err, ClickHouseError::PasswordEnv { .. }));
    assert!(!err.to_string().contains("s3cret"));
    assert_eq!(
        resolve_password(&ClickHouseConfig::default()).unwrap(),
        None
    );
}

#[test]
fn only_18_x_servers_get_the_low_cardinality_opt_in() {
    assert!(needs_low_cardinality_opt_in("18.16.1\n"));
    assert!(needs_low_cardinality_opt_in("1.1.54394"));
    assert!(!needs_low_cardinality_opt_in("19.1.6"));
    assert!(!needs_low_cardinality_opt_in("25.3.2.39"));
    assert!(!needs_low_cardinality_opt_in("garbage"));
}
