//! Tests of the RowBinary encoding: every field in column order, fixed offsets,
//! and agreement with the shipped schema.

use super::*;
use crate::audit::clickhouse::SCHEMA_SQL;

/// Test-only RowBinary reader mirroring `encode_row`.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        out
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let mut len = 0u64;
        let mut shift = 0;
        loop {
            let b = self.take(1)[0];
            len |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        String::from_utf8(self.take(len as usize).to_vec()).unwrap()
    }
}

fn full_row() -> AuditRow {
    let mut r = AuditRow::new();
    r.time_ms = 1_700_000_000_999;
    r.tenant = "t".into();
    r.subject = "s".into();
    r.agent_role = "role".into();
    r.run_id = "run".into();
    r.session_id = "sess".into();
    r.token_id = "jti".into();
    r.client_ip = Some("10.1.2.3".parse().unwrap());
    r.upstream = "up".into();
    r.project = "proj".into();
    r.protocol_version = "2025-06-18".into();
    r.method = "tools/call".into();
    r.tool = "x".repeat(300); // multi-byte LEB128 length
    r.risk = Some(Risk::Write);
    r.decision = "deny".into();
    r.reason = "why".into();
    r.stop_reason = "denied".into();
    r.jsonrpc_id = "7".into();
    r.is_error = true;
    r.upstream_status = 503;
    r.latency_us = 11;
    r.upstream_latency_us = 12;
    r.bytes_in = 13;
    r.bytes_out = 14;
    r.trace_id = "trace".into();
    r.screen_kinds = vec!["card_number", "instruction_cue"];
    r.screen_action = "redact";
    r.run_labels = crate::policy::Labels::UNTRUSTED;
    r.virtual_server = "ops".into();
    r.approval_id = "apr-1".into();
    r.approver = "oncall".into();
    r.approved_ms = 1_700_000_001_234;
    r.policy_sha256 = "ab".repeat(32);
    r.pin_sha256 = "cd".repeat(32);
    r.delegation = vec!["agent:planner".to_owned(), "user:olga".to_owned()].into();
    r.token_jti = "jti".into();
    r.shadow_decision = "deny";
    r.principal_claims = r#"{"mode":"caller"}"#.into();
    r.upstream_auth = "exchange";
    r.credential_id = "0f".repeat(16);
    r
}

/// `row` without the columns format 4 added, as format 3 wrote it.
fn format_3(row: &AuditRow) -> AuditRow {
    let mut r = row.clone();
    r.approval_id.clear();
    r.approver.clear();
    r.approved_ms = 0;
    r.policy_sha256.clear();
    r.pin_sha256.clear();
    r.delegation = std::sync::Arc::from(Vec::new());
    r.token_jti.clear();
    r.shadow_decision = "";
    r.principal_claims.clear();
    r.upstream_auth = "";
    r.credential_id.clear();
    r
}

#[test]
fn encoded_row_decodes_to_every_field_in_column_order() {
    let r = full_row();
    let mut out = Vec::new();
    encode_row(&r, br#"{"a":1}"#, b"res", "inst", &mut out);
    let mut rd = Reader { data: &out, pos: 0 };
    let (hi, lo) = r.event_id.as_u64_pair();
    assert_eq!(rd.u64(), hi);
    assert_eq!(rd.u64(), lo);
    assert_eq!(
        u32::from_le_bytes(rd.take(4).try_into().unwrap()),
        1_700_000_000
    );
    assert_eq!(rd.u64(), 1_700_000_000_999);
    let strings = [
        "t",
        "s",
        "role",
        "run",
        "sess",
        "jti",
        "10.1.2.3",
        "up",
        "proj",
        "2025-06-18",
        "tools/call",
    ];
    for want in strings {
        assert_eq!(rd.string(), want);
    }
    assert_eq!(rd.string(), "x".repeat(300));
    for want in ["write", "deny", "why", "denied", "7", r#"{"a":1}"#, "res"] {
        assert_eq!(rd.string(), want);
    }
    assert_eq!(rd.take(1), [1]);
    assert_eq!(u16::from_le_bytes(rd.take(2).try_into().unwrap()), 503);
    for want in [11, 12, 13, 14] {
        assert_eq!(rd.u64(), want);
    }
    assert_eq!(rd.string(), "inst");
    assert_eq!(rd.string(), "trace");
    assert_eq!(rd.take(1), [1], "row_version");
    assert_eq!(rd.take(1), [2], "two kinds");
    assert_eq!(rd.string(), "card_number");
    assert_eq!(rd.string(), "instruction_cue");
    assert_eq!(rd.string(), "redact");
    assert_eq!(rd.take(1), [1], "one label");
    assert_eq!(rd.string(), "untrusted");
    assert_eq!(rd.string(), "ops", "virtual_server");
    assert_eq!(rd.string(), "apr-1", "approval_id");
    assert_eq!(rd.string(), "oncall", "approver");
    assert_eq!(rd.u64(), 1_700_000_001_234, "approved_ms");
    assert_eq!(rd.string(), "ab".repeat(32), "policy_sha256");
    assert_eq!(rd.string(), "cd".repeat(32), "pin_sha256");
    assert_eq!(rd.take(1), [2], "two actors");
    assert_eq!(rd.string(), "agent:planner");
    assert_eq!(rd.string(), "user:olga");
    assert_eq!(rd.string(), "jti", "token_jti");
    assert_eq!(rd.string(), "deny", "shadow_decision");
    assert_eq!(rd.string(), r#"{"mode":"caller"}"#, "principal_claims");
    assert_eq!(rd.string(), "exchange", "upstream_auth");
    assert_eq!(rd.string(), "0f".repeat(16), "credential_id");
    assert_eq!(rd.pos, out.len(), "no trailing bytes");
}

#[test]
fn the_tails_are_the_empty_values_of_the_columns_added_since() {
    let row = full_row();
    let mut new = Vec::new();
    encode_row(&format_3(&row), b"", b"", "", &mut new);
    // The columns format 4 added, empty, encode as the format-3 tail.
    assert!(new.ends_with(&VIRTUAL_TAIL));
    let v3 = &new[..new.len() - VIRTUAL_TAIL.len()];
    assert_eq!(
        decode_row(v3).expect("a format-3 row")["virtual_server"],
        "ops"
    );
    assert_eq!(
        COLUMNS[VIRTUAL_COLUMNS - 1],
        "virtual_server",
        "format 3 ends here"
    );
    let mut completed = v3.to_vec();
    completed.extend_from_slice(&VIRTUAL_TAIL);
    assert_eq!(completed, new);
    // Older formats: their own tail, then the format-3 one.
    assert_eq!(SCREENING_TAIL[1..], VIRTUAL_TAIL);
    assert_eq!(LEGACY_TAIL[4..], VIRTUAL_TAIL);
    let mut plain = format_3(&row);
    plain.screen_kinds.clear();
    plain.screen_action = "";
    plain.run_labels = crate::policy::Labels::NONE;
    plain.virtual_server.clear();
    let mut empty = Vec::new();
    encode_row(&plain, b"", b"", "", &mut empty);
    assert!(empty.ends_with(&LEGACY_TAIL));
    assert!(empty.ends_with(&SCREENING_TAIL));
}

#[test]
fn time_ms_is_read_from_its_fixed_offset() {
    let r = full_row();
    let mut out = Vec::new();
    encode_row(&r, b"", b"", "", &mut out);
    assert_eq!(payload_time_ms(&out), Some(1_700_000_000_999));
    assert_eq!(payload_time_ms(&out[..10]), None);
}

#[test]
fn absent_ip_and_risk_encode_as_empty_strings() {
    let mut r = full_row();
    r.client_ip = None;
    r.risk = None;
    let mut out = Vec::new();
    encode_row(&r, b"", b"", "", &mut out);
    let mut rd = Reader {
        data: &out,
        pos: 28,
    };
    for _ in 0..6 {
        rd.string();
    }
    assert_eq!(rd.string(), "", "client_ip");
    for _ in 0..5 {
        rd.string();
    }
    assert_eq!(rd.string(), "", "risk");
}

#[test]
fn new_rows_get_distinct_time_ordered_ids() {
    let a = AuditRow::new();
    let b = AuditRow::default();
    assert_ne!(a.event_id, b.event_id);
    assert_eq!(a.event_id.get_version_num(), 7);
    assert!(a.time_ms > 1_600_000_000_000);
}

#[test]
fn columns_match_the_shipped_schema_in_order() {
    let start = SCHEMA_SQL
        .find("CREATE TABLE IF NOT EXISTS {database}.{table}\n(")
        .expect("main table DDL");
    let body = &SCHEMA_SQL[start..];
    let body = &body[body.find('(').unwrap() + 1..body.find("\n)").unwrap()];
    let names: Vec<&str> = body
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, COLUMNS);
}

#[test]
fn decode_row_reads_back_what_encode_row_wrote() {
    let row = full_row();
    let mut out = Vec::new();
    encode_row(&row, br#"{"a":1}"#, br#"{"ok":true}"#, "fw-1", &mut out);
    let d = decode_row(&out).expect("one whole row");
    assert_eq!(d["event_id"], row.event_id.to_string());
    assert_eq!(d["time_ms"], 1_700_000_000_999u64);
    assert_eq!(d["client_ip"], "10.1.2.3");
    assert_eq!(d["tool"], "x".repeat(300));
    assert_eq!(d["risk"], "write");
    assert_eq!(d["stop_reason"], "denied");
    assert_eq!(d["arguments"], r#"{"a":1}"#);
    assert_eq!(d["result_summary"], r#"{"ok":true}"#);
    assert_eq!(d["is_error"], 1);
    assert_eq!(d["upstream_status"], 503);
    assert_eq!(d["latency_us"], 11);
    assert_eq!(d["upstream_latency_us"], 12);
    assert_eq!(d["bytes_in"], 13);
    assert_eq!(d["bytes_out"], 14);
    assert_eq!(d["instance"], "fw-1");
    assert_eq!(d["trace_id"], "trace");
    assert_eq!(d["row_version"], row.row_version);
    assert_eq!(
        d["screen_kinds"],
        serde_json::json!(["card_number", "instruction_cue"])
    );
    assert_eq!(d["screen_action"], "redact");
    assert_eq!(d["run_labels"], serde_json::json!(["untrusted"]));
    assert_eq!(d["virtual_server"], "ops");
    assert_eq!(d["approval_id"], "apr-1");
    assert_eq!(d["approver"], "oncall");
    assert_eq!(d["approved_ms"], 1_700_000_001_234u64);
    assert_eq!(d["policy_sha256"], "ab".repeat(32));
    assert_eq!(d["pin_sha256"], "cd".repeat(32));
    assert_eq!(
        d["delegation"],
        serde_json::json!(["agent:planner", "user:olga"])
    );
    assert_eq!(d["token_jti"], "jti");
    assert_eq!(d["shadow_decision"], "deny");
    assert_eq!(d["principal_claims"], r#"{"mode":"caller"}"#);
    assert_eq!(d["upstream_auth"], "exchange");
    assert_eq!(d["credential_id"], "0f".repeat(16));
    assert_eq!(d.len(), COLUMNS.len() - 1, "every column but `time`");
    // Every older format decodes with empty values in the columns added
    // since, so every row has every column.
    let mut old = Vec::new();
    encode_row(
        &format_3(&row),
        br#"{"a":1}"#,
        br#"{"ok":true}"#,
        "fw-1",
        &mut old,
    );
    let v3 = &old[..old.len() - VIRTUAL_TAIL.len()];
    let t = decode_row(v3).expect("a format-3 row");
    assert_eq!(t["virtual_server"], "ops");
    assert_eq!(t["approval_id"], "");
    assert_eq!(t["approved_ms"], 0);
    assert_eq!(t["delegation"], serde_json::json!([]));
    assert_eq!(t["token_jti"], "");
    assert_eq!(t.len(), COLUMNS.len() - 1);
    // A row spooled by a release before virtual servers.
    let screening = &v3[..v3.len() - 4];
    let s = decode_row(screening).expect("a format-2 row");
    assert_eq!(s["virtual_server"], "");
    assert_eq!(s["run_labels"], serde_json::json!(["untrusted"]));
    assert_eq!(s["approver"], "");
    assert_eq!(s.len(), COLUMNS.len() - 1);
    // A row spooled by a release before screening decodes with empty
    // screening columns.
    let legacy = &v3[..v3.len() - (1 + 12 + 16 + 7 + 1 + 10 + 4)];
    let l = decode_row(legacy).expect("a legacy row");
    assert_eq!(l["screen_kinds"], serde_json::json!([]));
    assert_eq!(l["screen_action"], "");
    assert_eq!(l["trace_id"], "trace");
    assert_eq!(l["pin_sha256"], "");
    assert_eq!(l.len(), COLUMNS.len() - 1);
    assert!(decode_row(&out[..out.len() - 1]).is_none(), "a torn row");
    let mut longer = out.clone();
    longer.push(0);
    assert!(decode_row(&longer).is_none(), "trailing bytes");
}

#[test]
fn rows_are_split_and_their_version_read_without_decoding() {
    let mut first = full_row();
    first.row_version = 0;
    let second = full_row();
    let mut body = Vec::new();
    encode_row(&first, br#"{"a":1}"#, b"", "fw-1", &mut body);
    let one = body.len();
    encode_row(&second, b"", br#"{"ok":true}"#, "fw-1", &mut body);
    assert_eq!(row_len(&body), Some(one));
    assert_eq!(row_version(&body[..one]), Some(0));
    assert_eq!(row_len(&body[one..]), Some(body.len() - one));
    assert_eq!(row_version(&body[one..]), Some(1));
    // Torn rows and garbage lengths are not rows.
    assert_eq!(row_len(&body[..one - 1]), None);
    assert_eq!(row_len(&[0xff; 40]), None);
    assert_eq!(row_len(&[]), None);
}

#[test]
fn a_row_chained_before_the_shadow_columns_hashes_the_same_with_them_empty() {
    let mut row = full_row();
    row.shadow_decision = "";
    row.principal_claims.clear();
    row.upstream_auth = "";
    row.credential_id.clear();
    let mut now = Vec::new();
    encode_row(&row, b"{}", b"", "fw", &mut now);
    assert!(now.ends_with(&APPROVAL_TAIL));
    // What format 4 hashed: the row without the two columns.
    let before = &now[..now.len() - APPROVAL_TAIL.len()];
    assert_eq!(hashed_part(&now), before);
    assert_eq!(
        crate::audit::chain::row_hash("w", 1, &[0; 32], &now),
        crate::audit::chain::row_hash("w", 1, &[0; 32], before)
    );
    // A shadow decision or claims on record are covered by the hash.
    row.shadow_decision = "deny";
    let mut with = Vec::new();
    encode_row(&row, b"{}", b"", "fw", &mut with);
    // (What format 5 hashed: all but the credential columns, empty here.)
    assert_eq!(hashed_part(&with), &with[..with.len() - SHADOW_TAIL.len()]);
    row.shadow_decision = "";
    row.principal_claims = "{}".into();
    let mut claims = Vec::new();
    encode_row(&row, b"{}", b"", "fw", &mut claims);
    assert_eq!(
        hashed_part(&claims),
        &claims[..claims.len() - SHADOW_TAIL.len()]
    );
    assert_ne!(
        crate::audit::chain::row_hash("w", 1, &[0; 32], &claims),
        crate::audit::chain::row_hash("w", 1, &[0; 32], before)
    );
}

#[test]
fn a_row_chained_before_the_credential_columns_hashes_the_same_with_them_empty() {
    let mut row = full_row();
    row.upstream_auth = "";
    row.credential_id.clear();
    let mut now = Vec::new();
    encode_row(&row, b"{}", b"", "fw", &mut now);
    assert!(now.ends_with(&SHADOW_TAIL));
    // What format 5 hashed (its last columns set): the row without them.
    let before = &now[..now.len() - SHADOW_TAIL.len()];
    assert_eq!(hashed_part(&now), before);
    // A credential on record is covered by the hash, and changing it breaks it.
    for (auth, id) in [("static", ""), ("exchange", "ab"), ("exchange", "ac")] {
        row.upstream_auth = auth;
        row.credential_id = id.into();
        let mut with = Vec::new();
        encode_row(&row, b"{}", b"", "fw", &mut with);
        assert_eq!(hashed_part(&with), &with[..], "{auth} {id}");
        assert_ne!(
            crate::audit::chain::content_hash(&with),
            crate::audit::chain::content_hash(before)
        );
    }
}

#[test]
fn a_length_has_one_spelling() {
    // Found by the `audit_entry` fuzz target: 0x81 0x00 also read as 1.
    assert_eq!(leb128(&[0x01], 0), Some((1, 1)));
    assert_eq!(leb128(&[0x00], 0), Some((0, 1)));
    assert_eq!(leb128(&[0x81, 0x00], 0), None, "over-long");
    assert_eq!(leb128(&[0x80, 0x80, 0x00], 0), None, "over-long");
    assert_eq!(leb128(&[0x80, 0x01], 0), Some((128, 2)));
    let mut max = vec![0xff; 9];
    max.push(0x01);
    assert_eq!(leb128(&max, 0), Some((u64::MAX, 10)));
    let mut over = vec![0xff; 9];
    over.push(0x02);
    assert_eq!(leb128(&over, 0), None, "past 64 bits");
    for len in [0usize, 1, 127, 128, 300, 70_000] {
        let mut out = Vec::new();
        put_str(&mut out, &"x".repeat(len));
        assert_eq!(leb128(&out, 0).map(|(v, _)| v), Some(len as u64));
    }
}

#[test]
fn the_hashed_part_skips_the_walk_only_where_the_walk_leaves_the_row_whole() {
    // Every tail a row can end with: credentials on record or not, shadow
    // and claims columns set or not; whole rows, cut rows and bytes that
    // are no row.
    let mut rows: Vec<Vec<u8>> = Vec::new();
    for (auth, id) in [("", ""), ("static", ""), ("exchange", "ab"), ("user", "")] {
        for (shadow, claims) in [("", ""), ("deny", ""), ("", "{}")] {
            let mut row = full_row();
            row.upstream_auth = auth;
            row.credential_id = id.into();
            row.shadow_decision = shadow;
            row.principal_claims = claims.into();
            let mut out = Vec::new();
            encode_row(&row, b"{}", b"", "fw", &mut out);
            rows.push(out);
        }
    }
    let whole = rows.clone();
    for row in &whole {
        for cut in [1, 2, 3, 5, row.len() / 2] {
            rows.push(row[..row.len().saturating_sub(cut)].to_vec());
        }
    }
    rows.extend([vec![], vec![0], vec![0, 0], vec![1, 0, 0], vec![0; 64]]);
    for row in &rows {
        assert_eq!(
            super::hashed_part(row),
            super::hashed_part_by_columns(row),
            "{row:?}"
        );
    }
}
