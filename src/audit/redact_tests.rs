//! Tests of key redaction (nesting, arrays, case, globs, raw-text fast path,
//! escapes) and of UTF-8-safe truncation, with property tests.

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn defaults() -> Redactor {
    Redactor::new(&crate::audit::default_key_patterns()).unwrap()
}

fn render(p: JsonPayload, r: &Redactor, max: usize) -> String {
    let mut out = Vec::new();
    render_payload(&p, r, max, &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn nested_keys_inside_objects_and_arrays_are_redacted() {
    let mut v = json!({
        "user": "bob",
        "config": {"db": {"password": "p1", "host": "h"}},
        "items": [{"token": "t1"}, {"list": [{"Secret": "s1"}]}, "plain"],
    });
    redact_json(&mut v, &defaults());
    assert_eq!(
        v,
        json!({
            "user": "bob",
            "config": {"db": {"password": REDACTED, "host": "h"}},
            "items": [{"token": REDACTED}, {"list": [{"Secret": REDACTED}]}, "plain"],
        })
    );
}

#[test]
fn matching_is_case_insensitive_and_by_substring() {
    let r = defaults();
    for key in [
        "PASSWORD",
        "db_Password",
        "X-Api_Key",
        "AUTHORIZATION",
        "refresh_token",
    ] {
        assert!(r.matches(key), "{key}");
    }
    for key in ["user", "pass", "path", "api", "auth"] {
        assert!(!r.matches(key), "{key}");
    }
}

#[test]
fn a_whole_object_under_a_matching_key_is_replaced() {
    let mut v = json!({"secrets": {"a": 1, "b": [1, 2]}});
    redact_json(&mut v, &defaults());
    assert_eq!(v, json!({"secrets": REDACTED}));
}

#[test]
fn glob_patterns_match_whole_keys_case_insensitively() {
    let r = Redactor::new(&["*_key", "sess?on"]).unwrap();
    assert!(r.matches("SSH_KEY"));
    assert!(r.matches("session"));
    assert!(!r.matches("keyboard"));
    assert!(!r.matches("ssh_keys"));
    assert!(!r.matches("sessions"));
}

#[test]
fn empty_and_invalid_patterns_are_rejected() {
    assert!(matches!(
        Redactor::new(&["ok", ""]),
        Err(RedactError::EmptyPattern { index: 1 })
    ));
    assert!(matches!(
        Redactor::new(&["[unclosed"]),
        Err(RedactError::BadGlob { .. })
    ));
}

#[test]
fn raw_json_without_candidate_keys_is_kept_byte_for_byte() {
    let text = r#"{ "path" : "/a",   "n":1 }"#;
    let raw = serde_json::value::RawValue::from_string(text.to_owned()).unwrap();
    // Whitespace preserved proves the text was copied, not re-serialised.
    assert_eq!(render(JsonPayload::Raw(raw), &defaults(), 1000), text);
}

#[test]
fn raw_json_with_a_matching_key_is_parsed_and_redacted() {
    let raw = serde_json::value::RawValue::from_string(
        r#"{"a":{"Token":"zzz"},"b":[{"password":1}]}"#.to_owned(),
    )
    .unwrap();
    let out = render(JsonPayload::Raw(raw), &defaults(), 1000);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        json!({"a":{"Token":REDACTED},"b":[{"password":REDACTED}]})
    );
}

#[test]
fn escaped_key_in_raw_json_cannot_dodge_redaction() {
    let raw = serde_json::value::RawValue::from_string(r#"{"pass\u0077ord":"hunter2"}"#.to_owned())
        .unwrap();
    let out = render(JsonPayload::Raw(raw), &defaults(), 1000);
    assert!(!out.contains("hunter2"), "{out}");
    assert!(out.contains(REDACTED));
}

#[test]
fn value_that_mentions_a_pattern_only_in_a_value_is_unchanged() {
    let raw =
        serde_json::value::RawValue::from_string(r#"{"note":"my password is long"}"#.to_owned())
            .unwrap();
    let out = render(JsonPayload::Raw(raw), &defaults(), 1000);
    assert_eq!(out, r#"{"note":"my password is long"}"#);
}

#[test]
fn long_output_is_cut_on_a_char_boundary() {
    let v = json!({"text": "ééééééééé"});
    // `{"text":"` is 9 bytes; each é is 2 bytes: 12 bytes cut at 11 keeps one é.
    let out = render(JsonPayload::Value(v), &defaults(), 12);
    assert_eq!(out, "{\"text\":\"é");
    assert_eq!(truncate_utf8("aé", 2), "a");
    assert_eq!(truncate_utf8("abc", 10), "abc");
    assert_eq!(truncate_utf8("", 0), "");
}

#[test]
fn absent_payload_renders_empty() {
    assert_eq!(render(JsonPayload::Absent, &defaults(), 100), "");
}

#[test]
fn no_patterns_redact_nothing() {
    let mut v = json!({"password": "x"});
    redact_json(&mut v, &Redactor::none());
    assert_eq!(v, json!({"password": "x"}));
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        Just("password".to_owned()),
        Just("API_KEY".to_owned()),
        Just("name".to_owned()),
        "[a-z]{1,8}",
    ];
    let leaf = prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-zé]{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(key.clone(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn no_matching_key_keeps_a_value(v: &serde_json::Value, r: &Redactor) -> bool {
    match v {
        serde_json::Value::Object(m) => m.iter().all(|(k, v)| {
            if r.matches(k) {
                v == &serde_json::Value::String(REDACTED.to_owned())
            } else {
                no_matching_key_keeps_a_value(v, r)
            }
        }),
        serde_json::Value::Array(a) => a.iter().all(|v| no_matching_key_keeps_a_value(v, r)),
        _ => true,
    }
}

/// Puts the marker `SECRET` under every matching key (whole values replaced).
fn plant_secrets(v: &mut serde_json::Value, r: &Redactor) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                if r.matches(k) {
                    *v = serde_json::Value::from("SECRET");
                } else {
                    plant_secrets(v, r);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|v| plant_secrets(v, r)),
        _ => {}
    }
}

#[test]
fn only_keys_inside_the_stored_prefix_are_looked_for() {
    let r = defaults();
    let filler = "x".repeat(100);
    // The secret's key starts past the 64 bytes kept: the prefix is stored as
    // it is, without the secret.
    let text = format!(r#"{{"a":"{filler}","password":"SECRET"}}"#);
    let out = render(
        JsonPayload::Raw(serde_json::value::RawValue::from_string(text.clone()).unwrap()),
        &r,
        64,
    );
    assert_eq!(out, text[..64]);
    // A key straddling the cut: its value is past the cut, never stored.
    let pad = "y".repeat(50);
    let text = format!(r#"{{"{pad}":1,"my_password":"SECRET"}}"#);
    let cut = text.find("password").unwrap() + 3;
    let out = render(
        JsonPayload::Raw(serde_json::value::RawValue::from_string(text.clone()).unwrap()),
        &r,
        cut,
    );
    assert!(!out.contains("SECRET"), "{out}");
    // The key and the start of its value inside the prefix: redacted.
    let text = r#"{"password":"SECRET-and-more-text-to-cut"}"#.to_owned();
    let out = render(
        JsonPayload::Raw(serde_json::value::RawValue::from_string(text).unwrap()),
        &r,
        20,
    );
    assert!(!out.contains("SECRET"), "{out}");
    assert!(out.starts_with(r#"{"password":"[REDA"#), "{out}");
}

proptest! {
    #[test]
    fn no_stored_prefix_holds_a_secret(v in arb_json(), cut in 0usize..400) {
        let r = defaults();
        let mut v = v;
        plant_secrets(&mut v, &r);
        let text = v.to_string();
        let raw = serde_json::value::RawValue::from_string(text).unwrap();
        let out = render(JsonPayload::Raw(raw), &r, cut);
        // Nothing else in these documents has an uppercase S: not even the
        // first letter of a secret may be stored.
        prop_assert!(!out.contains('S'), "{}", out);
        prop_assert!(out.len() <= cut);
    }

    #[test]
    fn redaction_leaves_no_secret_at_any_depth(v in arb_json()) {
        let r = defaults();
        let raw = serde_json::value::RawValue::from_string(v.to_string()).unwrap();
        let out = render(JsonPayload::Raw(raw), &r, usize::MAX);
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        prop_assert!(no_matching_key_keeps_a_value(&parsed, &r), "{}", out);
    }

    #[test]
    fn truncation_is_valid_utf8_within_the_limit(s in "\\PC{0,40}", max in 0usize..50) {
        let t = truncate_utf8(&s, max);
        prop_assert!(t.len() <= max);
        prop_assert!(s.starts_with(t));
        // Maximal: one more char would not fit.
        if t.len() < s.len() {
            let next = s[t.len()..].chars().next().unwrap();
            prop_assert!(t.len() + next.len_utf8() > max);
        }
    }
}
