use super::*;

#[test]
fn xml_escape_makes_any_text_an_attribute() {
    assert_eq!(
        xml_escape("a<b & \"c\" 'd'>\u{1}"),
        "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;\u{fffd}"
    );
}

fn case(expect: &str, reason: Option<&str>) -> RawCase {
    RawCase {
        name: "c".into(),
        claims: toml::Table::new(),
        upstream: "u".into(),
        call: None,
        expect: Some(expect.into()),
        reason: reason.map(str::to_owned),
        rule: None,
        labels: None,
        tool: None,
        tools: toml::Table::new(),
        list: false,
        expect_hidden: vec![],
        expect_listed: vec![],
    }
}

fn verdict(kind: Kind, reason: &str) -> Verdict {
    Verdict {
        kind,
        risk: Some(policy::Risk::Read),
        reason: reason.into(),
        rule: "30-conditions.toml:5".into(),
    }
}

#[test]
fn deny_covers_every_refusal_and_the_reason_must_be_in_it() {
    let c = case("deny", Some("namespace"));
    assert_eq!(
        compare(
            Kind::Deny,
            &c,
            &verdict(Kind::Deny, "namespace must be one of")
        ),
        None
    );
    assert_eq!(
        compare(
            Kind::Deny,
            &c,
            &verdict(Kind::Hidden, "Unknown tool (namespace)")
        ),
        None
    );
    let diff = compare(
        Kind::Deny,
        &c,
        &verdict(Kind::Deny, "deployment_id must look like"),
    )
    .expect("a reason that does not match fails");
    assert!(
        diff.contains("expected: deny (reason containing \"namespace\")"),
        "{diff}"
    );
    assert!(
        diff.contains("got: deny (read): deployment_id must look like"),
        "{diff}"
    );
    assert!(diff.contains("decided by: 30-conditions.toml:5"), "{diff}");
}

#[test]
fn hidden_is_stricter_than_deny() {
    let c = case("hidden", None);
    assert!(compare(Kind::Hidden, &c, &verdict(Kind::Deny, "x")).is_some());
    assert!(compare(Kind::Hidden, &c, &verdict(Kind::Hidden, "x")).is_none());
    let c = case("allow", None);
    assert!(compare(Kind::Allow, &c, &verdict(Kind::Approve, "")).is_some());
}

#[test]
fn junit_names_each_case_and_its_failure() {
    let outcomes = vec![
        Outcome {
            file: "t/a.toml".into(),
            line: 1,
            name: "reads <ok>".into(),
            millis: 0.5,
            failure: None,
        },
        Outcome {
            file: "t/a.toml".into(),
            line: 9,
            name: "denies".into(),
            millis: 0.5,
            failure: Some("  expected: deny\n       got: allow\n".into()),
        },
    ];
    let xml = junit(&outcomes);
    assert!(
        xml.contains("<testsuites name=\"mcp-firewall test\" tests=\"2\" failures=\"1\""),
        "{xml}"
    );
    assert!(
        xml.contains("<testcase name=\"reads &lt;ok&gt;\" classname=\"t/a.toml\""),
        "{xml}"
    );
    assert!(
        xml.contains("<failure message=\"expected: deny\" type=\"policy\">"),
        "{xml}"
    );
    let text = render(&outcomes);
    assert!(text.contains("case denies ... FAILED"), "{text}");
    assert!(text.contains("---- denies (t/a.toml:9) ----"), "{text}");
    assert!(
        text.contains("test result: FAILED. 1 passed; 1 failed"),
        "{text}"
    );
}
