//! Tests of the config section (defaults, parsing, validation), risk names and
//! the auditor's fail modes.

use super::*;

#[test]
fn empty_section_gets_documented_defaults() {
    let cfg: AuditConfig = toml::from_str("").unwrap();
    assert_eq!(cfg, AuditConfig::default());
    assert!(cfg.enabled);
    assert_eq!(cfg.batch.max_rows, 10_000);
    assert_eq!(cfg.batch.max_age_ms, 1_000);
    assert_eq!(cfg.redact.max_result_bytes, 2048);
    assert_eq!(
        cfg.redact.key_patterns,
        ["password", "secret", "token", "authorization", "api_key"]
    );
    assert_eq!(cfg.on_spool_failure.read, FailMode::Open);
    assert_eq!(cfg.on_spool_failure.write, FailMode::Closed);
    assert_eq!(cfg.on_spool_failure.destructive, FailMode::Closed);
    assert_eq!(cfg.retention_days, None);
    assert!(cfg.validate().is_ok());
}

#[test]
fn full_section_parses() {
    let cfg: AuditConfig = toml::from_str(
        r#"
        enabled = true
        retention_days = 90
        instance = "fw-a"
        [clickhouse]
        url = "https://ch.internal:8443"
        database = "audit"
        table = "events"
        user = "firewall"
        password_env = "CH_PASSWORD"
        create_schema = false
        [spool]
        dir = "/var/spool/fw"
        segment_bytes = 1048576
        fsync_interval_ms = 0
        max_bytes = 10485760
        [batch]
        max_rows = 500
        max_bytes = 1000000
        max_age_ms = 250
        [redact]
        key_patterns = ["cookie", "*_pin"]
        max_result_bytes = 100
        [on_spool_failure]
        read = "closed"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.clickhouse.table, "events");
    assert_eq!(cfg.spool.fsync_interval_ms, 0);
    assert_eq!(cfg.on_spool_failure.read, FailMode::Closed);
    assert_eq!(cfg.on_spool_failure.write, FailMode::Closed);
    assert_eq!(cfg.retention_days, Some(90));
    assert!(cfg.validate().is_ok());
}

#[test]
fn unknown_keys_are_rejected() {
    let err = toml::from_str::<AuditConfig>("[spool]\ndirectory = \"/x\"").unwrap_err();
    assert!(err.to_string().contains("directory"), "{err}");
}

#[test]
fn identifiers_that_would_inject_sql_are_rejected() {
    let mut cfg = AuditConfig::default();
    cfg.clickhouse.table = "events; DROP TABLE x".into();
    assert!(matches!(
        cfg.validate(),
        Err(AuditError::InvalidIdentifier { field: "table", .. })
    ));
    let mut cfg = AuditConfig::default();
    cfg.clickhouse.database = "1db".into();
    assert!(cfg.validate().is_err());
}

#[test]
fn out_of_range_values_are_rejected() {
    let cases: [fn(&mut AuditConfig); 6] = [
        |c| c.clickhouse.url = "ftp://x".into(),
        |c| c.spool.segment_bytes = 10,
        |c| c.batch.max_rows = 0,
        |c| c.batch.retry_max_ms = 1,
        |c| c.retention_days = Some(0),
        |c| {
            c.clickhouse.password_env = Some("A".into());
            c.clickhouse.password_file = Some("/b".into());
        },
    ];
    for (i, f) in cases.iter().enumerate() {
        let mut cfg = AuditConfig::default();
        f(&mut cfg);
        assert!(cfg.validate().is_err(), "case {i}");
    }
    let mut cfg = AuditConfig::default();
    cfg.spool.segment_bytes = 10;
    let err = cfg.validate().unwrap_err();
    assert!(matches!(
        err,
        AuditError::SegmentTooSmall {
            segment_bytes: 10,
            min: 4096
        }
    ));
    assert_eq!(
        err.to_string(),
        "invalid audit config: spool.segment_bytes 10 is below the minimum 4096"
    );
    let mut cfg = AuditConfig::default();
    cfg.batch.max_in_flight = 0;
    assert!(matches!(
        cfg.validate(),
        Err(AuditError::ZeroLimit {
            field: "batch.max_in_flight"
        })
    ));
}

#[test]
fn risk_parses_its_three_names_only() {
    assert_eq!("read".parse::<Risk>().unwrap(), Risk::Read);
    assert_eq!("destructive".parse::<Risk>().unwrap(), Risk::Destructive);
    assert_eq!(Risk::Write.as_str(), "write");
    assert!("Write".parse::<Risk>().is_err());
}

#[tokio::test]
async fn disabled_auditor_is_a_no_op_that_fails_open() {
    let a = Auditor::disabled();
    assert!(!a.is_enabled());
    assert!(a.record(AuditRow::new()).await.is_ok());
    assert_eq!(a.fail_mode(Risk::Destructive), FailMode::Open);
    assert_eq!(
        a.record_or_fail(AuditRow::new()).await.unwrap(),
        Recorded::Disabled
    );
    assert_eq!(a.rows_lost(), 0);
}

#[tokio::test]
async fn second_pipeline_on_the_same_spool_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = AuditConfig::default();
    cfg.spool.dir = dir.path().to_owned();
    cfg.clickhouse.url = "http://127.0.0.1:9".into();
    let (_a, h) = start(&cfg, &mut Registry::default()).await.unwrap();
    let err = start(&cfg, &mut Registry::default()).await.unwrap_err();
    assert!(err.to_string().contains("locked"), "{err}");
    h.shutdown(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn oversized_arguments_and_results_are_capped_before_spooling() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = AuditConfig::default();
    cfg.spool.dir = dir.path().to_owned();
    cfg.clickhouse.url = "http://127.0.0.1:9".into();
    cfg.redact.max_arguments_bytes = 100;
    cfg.redact.max_result_bytes = 50;
    let (a, h) = start(&cfg, &mut Registry::default()).await.unwrap();
    let mut row = AuditRow::new();
    row.arguments = serde_json::json!({"blob": "a".repeat(10_000)}).into();
    row.result = serde_json::json!({"text": "b".repeat(10_000)}).into();
    a.record(row).await.unwrap();
    h.shutdown(Duration::from_millis(50)).await;
    let seg = spool::list_segments(dir.path()).unwrap();
    let bytes: usize = seg
        .iter()
        .map(|&s| {
            std::fs::read(spool::segment_path(dir.path(), s))
                .unwrap()
                .len()
        })
        .sum();
    // Header + one row of ~100 + ~50 bytes of JSON plus fixed fields.
    assert!(bytes < 400, "{bytes}");
}

#[test]
fn auditor_and_its_futures_can_cross_threads() {
    fn send_sync<T: Send + Sync + Clone>(_: &T) {}
    fn send<T: Send>(_: T) {}
    let a = Auditor::disabled();
    send_sync(&a);
    // Request handlers run on a multi-threaded runtime: the futures must be Send.
    send(a.record(AuditRow::new()));
    send(a.record_or_fail(AuditRow::new()));
}

#[test]
fn the_chain_settings_parse_and_bad_ones_are_named() {
    let cfg: AuditConfig = toml::from_str("").unwrap();
    assert!(cfg.chain);
    assert_eq!(cfg.checkpoint_every.limits(), (1000, 10));
    let cfg: AuditConfig = toml::from_str("checkpoint_every = 500").unwrap();
    assert_eq!(cfg.checkpoint_every.limits(), (500, 10));
    let cfg: AuditConfig =
        toml::from_str("checkpoint_every = { rows = 50, seconds = 2 }\nwriter_id = \"fw-1.eu:a\"")
            .unwrap();
    assert_eq!(cfg.checkpoint_every.limits(), (50, 2));
    cfg.validate().unwrap();
    let bad: AuditConfig = toml::from_str("writer_id = \"fw 1\"").unwrap();
    let err = bad.validate().unwrap_err().to_string();
    assert!(err.contains("writer_id \"fw 1\""), "{err}");
    let zero: AuditConfig = toml::from_str("checkpoint_every = 0").unwrap();
    assert!(zero
        .validate()
        .unwrap_err()
        .to_string()
        .contains("checkpoint_every"));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.pem");
    std::fs::write(&key, "not a key").unwrap();
    let err = load_signer(&key).unwrap_err().to_string();
    assert!(err.contains("k.pem") && err.contains("PEM"), "{err}");
}

#[test]
fn a_spool_keeps_its_writer_id() {
    let dir = tempfile::tempdir().unwrap();
    let first = spool_writer_id(dir.path()).unwrap();
    assert!(is_writer_id(&first), "{first}");
    assert_eq!(spool_writer_id(dir.path()).unwrap(), first);
    std::fs::write(dir.path().join("writer_id"), "no spaces allowed\n").unwrap();
    assert!(spool_writer_id(dir.path()).is_err());
}
