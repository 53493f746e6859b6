use super::*;

/// A shape where anything may stand anywhere, and `m` is a named member.
#[derive(Clone, Copy)]
struct Any;

impl Shape for Any {
    fn members(self) -> Option<(&'static [&'static str], &'static str)> {
        Some((&["member"], "test"))
    }
    fn child(self, _: &str) -> Any {
        Any
    }
    fn element(self, _: usize) -> Any {
        Any
    }
    fn holds_scalar(self) -> bool {
        true
    }
    fn holds_array(self) -> bool {
        true
    }
    fn is_batch(self) -> bool {
        true
    }
}

fn tape(text: &str) -> Option<Tape> {
    read(text, Any, 64, 8, 3)
}

#[test]
fn records_kinds_spans_and_keys_of_the_first_levels() {
    let text = r#" {"a": [1, "two", {"deep": {"x": 1}}], "b\u0063": null, "t": true} "#;
    let t = tape(text).unwrap();
    let root = t.root().unwrap();
    assert_eq!(t.kind(root), Some(Kind::Object));
    assert_eq!(t.text(text, root), text.trim());
    let members: Vec<_> = t.children(root).unwrap().collect();
    assert_eq!(members.len(), 3);
    assert_eq!(t.plain_key(text, members[0]), Some("a"));
    assert_eq!(t.plain_key(text, members[1]), None, "escaped");
    assert_eq!(t.key(text, members[1]).as_deref(), Some("bc"));
    assert_eq!(t.kind(members[1]), Some(Kind::Null));
    assert_eq!(t.kind(members[2]), Some(Kind::Bool));
    let a = t.member(text, root, "a").unwrap();
    assert_eq!(t.text(text, a), r#"[1, "two", {"deep": {"x": 1}}]"#);
    let items: Vec<_> = t.children(a).unwrap().collect();
    assert_eq!(
        items
            .iter()
            .map(|&i| t.kind(i).unwrap())
            .collect::<Vec<_>>(),
        [Kind::Number, Kind::String, Kind::Object]
    );
    assert_eq!(t.text(text, items[1]), r#""two""#);
    // Level 3 is the last recorded: its members are not on the tape.
    assert!(t.children(items[2]).is_none());
    assert_eq!(t.text(text, items[2]), r#"{"deep": {"x": 1}}"#);
    assert_eq!(t.member(text, root, "zz"), None);
}

#[test]
fn refuses_what_the_strict_reader_refuses() {
    for text in [
        r#"{"a":1,"a":2}"#,
        r#"{"a":1,"A":2}"#,
        r#"{"a":1,"\u0061":2}"#,
        r#"{"MEMBER":1}"#,
        r#"{"a":"\ud800"}"#,
        r#"{"a":"\udc00"}"#,
        r#"{"a":"\ud800\u0041"}"#,
        "{\"a\":\"\u{1f}\"}",
        r#"{"a":"\x"}"#,
        r#"{"a":"\u12"}"#,
        r#"{"a":01}"#,
        r#"{"a":1.}"#,
        r#"{"a":-}"#,
        r#"{"a":1e}"#,
        r#"{"a":1e400}"#,
        r#"{"a":-1e309}"#,
        r#"{"a":tru}"#,
        r#"{"a":1,}"#,
        r#"[1,]"#,
        r#"{"a" 1}"#,
        r#"{"a":1} x"#,
        r#"{"a":1}}"#,
        r#"{"a":"#,
        r#""scalar""#,
        "",
        r#"[1,2,3,4,5,6,7,8,9]"#,
    ] {
        assert!(tape(text).is_none(), "accepted {text:?}");
    }
    let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
    assert!(tape(&deep).is_none(), "past max_depth");
    let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
    assert!(tape(&ok).is_some());
}

#[test]
fn accepts_every_escape_and_number_json_allows() {
    for text in [
        r#"{"a":"\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"}"#,
        r#"{"a":[0,-0,1.5,-2e-3,3E+2,12345678901234567890,1e-400]}"#,
        "{\"a\":\"é世\u{1F600}\"}",
        " \t\r\n[ ] ",
    ] {
        assert!(tape(text).is_some(), "refused {text:?}");
    }
}

#[test]
fn keys_are_compared_folded_like_a_case_insensitive_decoder() {
    assert!(Folded::eq_str("pods", "pod\u{17F}"));
    assert!(Folded::eq_str("kind", "\u{212A}ind"));
    assert!(!Folded::eq_str("a", "b"));
    // Past the linear scan, the hash set still finds twins.
    let many: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
    let text = format!("{{{},\"K7\":0}}", many.join(","));
    assert!(tape(&text).is_none());
    let text = format!("{{{}}}", many.join(","));
    assert!(tape(&text).is_some());
}

#[test]
fn a_string_ends_at_its_first_stop_wherever_it_falls_in_a_chunk() {
    // Every stop byte at every offset around the chunk boundaries, with
    // plain bytes (ASCII, DEL, multi-byte UTF-8) before it.
    let stops: Vec<u8> = (0u8..0x20).chain([b'"', b'\\']).collect();
    for len in 0..(3 * PLAIN_CHUNK + 3) {
        let plain: Vec<u8> = "aé\u{7f}z".bytes().cycle().take(len).collect();
        assert_eq!(plain_run(&plain), len, "no stop in {len} plain bytes");
        for &stop in &stops {
            let mut b = plain.clone();
            b.push(stop);
            b.extend_from_slice(b"\"tail\\");
            assert_eq!(plain_run(&b), len, "stop {stop:#x} after {len} bytes");
        }
    }
    // And the reader: a raw control character anywhere in a long string is
    // refused, the same string escaped is read.
    for at in [0, 15, 16, 17, 40] {
        let mut s = "x".repeat(48);
        s.insert(at, '\u{1}');
        assert!(
            tape(&format!(r#"{{"a":"{s}"}}"#)).is_none(),
            "control at {at}"
        );
        let escaped = s.replace('\u{1}', "\\u0001");
        assert!(tape(&format!(r#"{{"a":"{escaped}"}}"#)).is_some());
    }
}
