use super::*;

fn decode_all(stream: &[u8]) -> Vec<Event> {
    let mut d = Decoder::new(1 << 20);
    d.push(stream).expect("within limit");
    std::iter::from_fn(|| d.next_event()).collect()
}

fn single(stream: &str) -> Event {
    let mut events = decode_all(stream.as_bytes());
    assert_eq!(events.len(), 1, "{stream:?} gave {events:?}");
    events.remove(0)
}

#[test]
fn a_message_event_is_decoded_with_its_raw_bytes() {
    let e = single("event: message\nid: 42\ndata: {\"a\":1}\n\n");
    assert_eq!(e.event.as_deref(), Some("message"));
    assert_eq!(e.id.as_deref(), Some("42"));
    assert_eq!(e.data, "{\"a\":1}");
    assert!(e.has_data);
    assert_eq!(&e.raw[..], b"event: message\nid: 42\ndata: {\"a\":1}\n\n");
}

#[test]
fn all_three_line_endings_are_accepted() {
    for ending in ["\n", "\r", "\r\n"] {
        let stream = format!("data: a{ending}data: b{ending}{ending}");
        let e = single(&stream);
        assert_eq!(e.data, "a\nb", "{ending:?}");
        assert_eq!(&e.raw[..], stream.as_bytes());
    }
}

#[test]
fn mixed_line_endings_in_one_event_work() {
    let e = single("data: a\r\ndata: b\rdata: c\n\r\n");
    assert_eq!(e.data, "a\nb\nc");
}

#[test]
fn crlf_split_across_chunks_is_one_line_ending() {
    let mut d = Decoder::new(1024);
    d.push(b"data: a\r").expect("ok");
    d.push(b"\ndata: b\r\n\r\n").expect("ok");
    let e = d.next_event().expect("one event");
    assert_eq!(e.data, "a\nb", "the LF must not be read as a blank line");
    assert_eq!(&e.raw[..], b"data: a\r\ndata: b\r\n\r\n");
    assert!(d.next_event().is_none());
}

#[test]
fn event_ending_in_cr_at_chunk_end_is_dispatched_immediately() {
    let mut d = Decoder::new(1024);
    d.push(b"data: a\r\n\r").expect("ok");
    let e = d
        .next_event()
        .expect("dispatched without waiting for the LF");
    assert_eq!(e.data, "a");
    assert_eq!(&e.raw[..], b"data: a\r\n\r");
    d.push(b"\ndata: b\r\n\r\n").expect("ok");
    let e = d.next_event().expect("second event");
    assert_eq!(e.data, "b");
    assert_eq!(
        &e.raw[..],
        b"data: b\r\n\r\n",
        "the completing LF belongs to no event"
    );
}

#[test]
fn utf8_bom_at_stream_start_is_skipped_even_when_split() {
    let mut d = Decoder::new(1024);
    d.push(b"\xEF").expect("ok");
    d.push(b"\xBB").expect("ok");
    d.push(b"\xBFdata: x\n\n").expect("ok");
    let e = d.next_event().expect("event");
    assert_eq!(e.data, "x");
    assert_eq!(&e.raw[..], b"data: x\n\n");
}

#[test]
fn bom_after_the_start_is_not_skipped() {
    // The second event starts with a BOM mid-stream: the field name is then
    // "\u{FEFF}data", an unknown field.
    let events = decode_all("data: a\n\n\u{FEFF}data: b\n\n".as_bytes());
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].data, "a");
    assert!(!events[1].has_data);
}

#[test]
fn one_leading_space_is_stripped_from_values() {
    let e = single("data:a\ndata: b\ndata:  c\n\n");
    assert_eq!(e.data, "a\nb\n c");
}

#[test]
fn a_field_without_colon_has_an_empty_value() {
    let e = single("data\ndata\n\n");
    assert_eq!(e.data, "\n");
    assert!(e.has_data);
    let e = single("id\n\n");
    assert_eq!(e.id.as_deref(), Some(""));
}

#[test]
fn empty_data_line_still_dispatches() {
    let e = single("id: 7\ndata:\n\n");
    assert!(e.has_data);
    assert_eq!(e.data, "");
    assert_eq!(e.id.as_deref(), Some("7"));
}

#[test]
fn id_and_retry_only_events_are_kept() {
    let e = single("id: evt-1\nretry: 3000\n\n");
    assert_eq!(e.id.as_deref(), Some("evt-1"));
    assert_eq!(e.retry, Some(3000));
    assert!(!e.has_data);
    assert_eq!(&e.raw[..], b"id: evt-1\nretry: 3000\n\n");
}

#[test]
fn id_containing_nul_is_ignored() {
    let e = single("id: good\nid: b\0d\ndata: x\n\n");
    assert_eq!(e.id.as_deref(), Some("good"));
}

#[test]
fn retry_must_be_all_ascii_digits() {
    for (line, expected) in [
        ("retry: 1500", Some(1500)),
        ("retry: 15a", None),
        ("retry: -1", None),
        ("retry: 1.5", None),
        ("retry:", None),
        ("retry:  15", None),
        ("retry: 99999999999999999999999", None),
    ] {
        let e = single(&format!("{line}\ndata: x\n\n"));
        assert_eq!(e.retry, expected, "{line}");
    }
}

#[test]
fn comment_only_block_is_an_event_for_relaying() {
    let events = decode_all(b": ping\n\n:\n\ndata: x\n\n");
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].comments, vec!["ping".to_string()]);
    assert_eq!(events[0].data, "");
    assert!(!events[0].has_data);
    assert_eq!(&events[0].raw[..], b": ping\n");
    assert_eq!(events[1].comments, vec![String::new()]);
    assert_eq!(events[2].data, "x");
    assert_eq!(&events[2].raw[..], b"data: x\n\n");
}

#[test]
fn keep_alive_comment_line_is_dispatched_without_a_blank_line() {
    let mut d = Decoder::new(1024);
    d.push(b":\r\n").expect("ok");
    let e = d.next_event().expect("keep-alive relayed at once");
    assert_eq!(e.comments, vec![String::new()]);
    assert_eq!(&e.raw[..], b":\r\n");
    d.push(b":\r\n:\r\n").expect("ok");
    assert!(d.next_event().is_some() && d.next_event().is_some());
    assert_eq!(d.finish(), None, "nothing accumulates between keep-alives");
}

#[test]
fn comment_inside_an_event_stays_in_it() {
    let e = single("id: 1\n: note\ndata: x\n\n");
    assert_eq!(e.comments, vec!["note".to_string()]);
    assert_eq!(e.data, "x");
    assert_eq!(&e.raw[..], b"id: 1\n: note\ndata: x\n\n");
}

#[test]
fn unknown_fields_are_ignored_but_kept_in_raw() {
    let e = single("foo: bar\ndata: x\nData: y\n\n");
    assert_eq!(e.data, "x", "field names are case-sensitive");
    assert_eq!(&e.raw[..], b"foo: bar\ndata: x\nData: y\n\n");
}

#[test]
fn last_event_and_id_fields_win() {
    let e = single("event: a\nevent: b\nid: 1\nid: 2\ndata: x\n\n");
    assert_eq!(e.event.as_deref(), Some("b"));
    assert_eq!(e.id.as_deref(), Some("2"));
}

#[test]
fn blank_lines_between_events_belong_to_no_event() {
    let events = decode_all(b"\n\r\n\rdata: a\n\n\n\ndata: b\n\n");
    assert_eq!(events.len(), 2);
    assert_eq!(&events[0].raw[..], b"data: a\n\n");
    assert_eq!(&events[1].raw[..], b"data: b\n\n");
}

#[test]
fn invalid_utf8_is_replaced_in_fields_but_kept_in_raw() {
    let e = single("data: a\u{FFFD}b\n\n");
    assert_eq!(e.data, "a\u{FFFD}b");
    let events = decode_all(b"data: a\xFFb\n\n");
    assert_eq!(events[0].data, "a\u{FFFD}b");
    assert_eq!(&events[0].raw[..], b"data: a\xFFb\n\n");
}

#[test]
fn unterminated_final_event_is_discarded_and_reported() {
    let mut d = Decoder::new(1024);
    d.push(b"data: a\n\ndata: b\n").expect("ok");
    assert_eq!(d.next_event().map(|e| e.data), Some("a".into()));
    assert!(d.next_event().is_none());
    assert_eq!(d.finish().as_deref(), Some(&b"data: b\n"[..]));
    assert!(d.next_event().is_none());

    let mut d = Decoder::new(1024);
    d.push(b"data: a\n\n").expect("ok");
    assert_eq!(d.finish(), None, "a clean end has nothing pending");
    assert!(d.next_event().is_some(), "complete events survive finish");
}

#[test]
fn oversized_event_is_rejected_whatever_the_chunking() {
    let event = b"data: 0123456789\n\n"; // 18 bytes
    let mut exact = Decoder::new(event.len());
    exact
        .push(event)
        .expect("an event of exactly the limit is fine");
    assert!(exact.next_event().is_some());

    let mut one = Decoder::new(event.len() - 1);
    assert_eq!(
        one.push(event),
        Err(SseError::EventTooLarge {
            limit: event.len() - 1
        })
    );

    let mut bytewise = Decoder::new(event.len() - 1);
    let first_error = event.iter().position(|b| bytewise.push(&[*b]).is_err());
    assert!(first_error.is_some(), "some byte must trip the limit");
    assert!(bytewise.next_event().is_none());
}

#[test]
fn unterminated_stream_cannot_grow_past_the_limit() {
    let mut d = Decoder::new(64);
    let mut result = Ok(());
    for _ in 0..100 {
        result = d.push(b"data: xxxxxxxx");
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(SseError::EventTooLarge { limit: 64 }));
    assert!(d.buf.len() <= 64 + 14, "buffer stays bounded");
    assert_eq!(
        d.push(b"\n\n"),
        Err(SseError::EventTooLarge { limit: 64 }),
        "the decoder stays failed"
    );
}

#[test]
fn events_before_an_oversized_one_are_still_delivered() {
    let mut d = Decoder::new(16);
    let result = d.push(b"data: ok\n\ndata: far too long for this\n\n");
    assert!(result.is_err());
    assert_eq!(d.next_event().map(|e| e.data), Some("ok".into()));
    assert!(d.next_event().is_none());
}

#[test]
fn limit_ignores_where_a_final_crlf_was_split() {
    let event = b"data: abc\r\n\r\n"; // 13 bytes, measured as 12
    let mut whole = Decoder::new(12);
    whole.push(event).expect("measured without the final LF");
    let mut split = Decoder::new(12);
    split.push(&event[..12]).expect("ok");
    split.push(&event[12..]).expect("ok");
    assert_eq!(
        whole.next_event().map(|e| e.data),
        split.next_event().map(|e| e.data)
    );
}

#[test]
fn encode_writes_the_canonical_form() {
    let event = Event {
        id: Some("9".into()),
        event: Some("message".into()),
        data: "line1\nline2".into(),
        retry: Some(500),
        comments: vec!["hi".into(), String::new()],
        has_data: true,
        raw: Bytes::new(),
    };
    let mut out = BytesMut::new();
    encode(&event, &mut out);
    assert_eq!(
        &out[..],
        b"event: message\nid: 9\nretry: 500\ndata: line1\ndata: line2\n: hi\n:\n\n"
    );
}

#[test]
fn comment_only_event_encodes_to_lines_relayed_one_by_one() {
    let event = Event {
        comments: vec!["a".into(), "b".into()],
        ..Event::default()
    };
    let mut out = BytesMut::new();
    encode(&event, &mut out);
    assert_eq!(&out[..], b": a\n: b\n\n");
    let decoded = decode_all(&out);
    let comments: Vec<_> = decoded.iter().map(|e| e.comments.clone()).collect();
    assert_eq!(comments, vec![vec!["a".to_string()], vec!["b".to_string()]]);
    assert_eq!(&decoded[1].raw[..], b": b\n");
}

#[test]
fn encode_cannot_be_used_to_inject_fields() {
    let event = Event {
        id: Some("1\ndata: evil".into()),
        event: Some("x\r\nid: 666".into()),
        comments: vec!["a\nretry: 1".into()],
        data: "ok\rdata: more".into(),
        has_data: true,
        ..Event::default()
    };
    let mut out = BytesMut::new();
    encode(&event, &mut out);
    let decoded = decode_all(&out);
    assert_eq!(decoded.len(), 1);
    let d = &decoded[0];
    assert_eq!(d.id.as_deref(), Some("1"));
    assert_eq!(d.event.as_deref(), Some("x"));
    assert_eq!(d.retry, None);
    assert_eq!(d.comments, vec!["a".to_string(), "retry: 1".to_string()]);
    assert_eq!(d.data, "ok\ndata: more");
}

#[test]
fn encode_message_writes_one_data_line_for_compact_json() {
    let mut out = BytesMut::new();
    encode_message(
        Some("s1-7"),
        br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        &mut out,
    );
    assert_eq!(
        &out[..],
        b"id: s1-7\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"
    );
    out.clear();
    encode_message(None, b"{\n  \"a\": 1\n}", &mut out);
    assert_eq!(&out[..], b"data: {\ndata:   \"a\": 1\ndata: }\n\n");
    let e = single(std::str::from_utf8(&out).expect("utf8"));
    assert_eq!(e.data, "{\n  \"a\": 1\n}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// One generated line and the effect it should have.
    #[derive(Debug, Clone)]
    enum Line {
        Data(String, bool),
        Event(String, bool),
        Id(String, bool),
        Retry(String),
        Comment(String),
        Unknown(String),
        BareData,
    }

    fn value() -> impl Strategy<Value = String> {
        // Multi-byte characters make chunk splits land inside them.
        "[ a-z:\u{e9}\u{4e16}\u{1F600}\0]{0,8}"
    }

    fn line() -> impl Strategy<Value = Line> {
        prop_oneof![
            3 => (value(), any::<bool>()).prop_map(|(v, s)| Line::Data(v, s)),
            1 => (value(), any::<bool>()).prop_map(|(v, s)| Line::Event(v, s)),
            1 => (value(), any::<bool>()).prop_map(|(v, s)| Line::Id(v, s)),
            1 => "[0-9]{1,22}|[0-9a]{0,3}".prop_map(Line::Retry),
            1 => value().prop_map(Line::Comment),
            1 => value().prop_map(Line::Unknown),
            1 => Just(Line::BareData),
        ]
    }

    fn ending() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("\n"), Just("\r"), Just("\r\n")]
    }

    type Spec = Vec<(Vec<(Line, &'static str)>, &'static str)>;

    fn stream() -> impl Strategy<Value = (bool, Spec)> {
        let event = (prop::collection::vec((line(), ending()), 1..5), ending());
        (any::<bool>(), prop::collection::vec(event, 0..6))
    }

    fn render(line: &Line) -> String {
        let sep = |s: bool| if s { " " } else { "" };
        match line {
            Line::Data(v, s) => format!("data:{}{v}", sep(*s)),
            Line::Event(v, s) => format!("event:{}{v}", sep(*s)),
            Line::Id(v, s) => format!("id:{}{v}", sep(*s)),
            Line::Retry(v) => format!("retry: {v}"),
            Line::Comment(v) => format!(":{v}"),
            Line::Unknown(v) => format!("x-{v}"),
            Line::BareData => "data".into(),
        }
    }

    fn stripped(v: &str, space: bool) -> String {
        if space {
            v.to_string()
        } else {
            v.strip_prefix(' ').unwrap_or(v).to_string()
        }
    }

    /// The bytes of the stream and the events the WHATWG rules say it holds.
    fn build(bom: bool, spec: &Spec) -> (Vec<u8>, Vec<Event>) {
        let mut bytes = Vec::new();
        if bom {
            bytes.extend_from_slice(BOM);
        }
        let mut events = Vec::new();
        for (lines, blank) in spec {
            let mut start = bytes.len();
            let mut e = Event::default();
            let mut started = false;
            let mut last_ending = "";
            for (line, ending) in lines {
                bytes.extend_from_slice(render(line).as_bytes());
                bytes.extend_from_slice(ending.as_bytes());
                last_ending = ending;
                if let (false, Line::Comment(v)) = (started, line) {
                    // A comment outside an event is an event of its own.
                    events.push(Event {
                        comments: vec![stripped(v, false)],
                        raw: Bytes::copy_from_slice(&bytes[start..]),
                        ..Event::default()
                    });
                    start = bytes.len();
                    continue;
                }
                started = true;
                match line {
                    Line::Data(v, s) => {
                        if e.has_data {
                            e.data.push('\n');
                        }
                        e.data.push_str(&stripped(v, *s));
                        e.has_data = true;
                    }
                    Line::BareData => {
                        if e.has_data {
                            e.data.push('\n');
                        }
                        e.has_data = true;
                    }
                    Line::Event(v, s) => e.event = Some(stripped(v, *s)),
                    Line::Id(v, s) => {
                        if !v.contains('\0') {
                            e.id = Some(stripped(v, *s));
                        }
                    }
                    Line::Retry(v) => {
                        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                            if let Ok(ms) = v.parse() {
                                e.retry = Some(ms);
                            }
                        }
                    }
                    Line::Comment(v) => e.comments.push(stripped(v, false)),
                    Line::Unknown(_) => {}
                }
            }
            // A CR line ending followed by a bare LF would merge into one
            // CRLF and swallow the blank line: pick an unambiguous one.
            let blank = if last_ending == "\r" && *blank == "\n" {
                "\r\n"
            } else {
                blank
            };
            bytes.extend_from_slice(blank.as_bytes());
            if started {
                e.raw = Bytes::copy_from_slice(&bytes[start..]);
                events.push(e);
            }
        }
        (bytes, events)
    }

    fn decode_chunked(bytes: &[u8], cuts: &[usize]) -> (Vec<Event>, Option<Bytes>) {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut d = Decoder::new(1 << 20);
        let mut at = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            d.push(&bytes[at..cut]).expect("within limit");
            at = cut;
        }
        let events = std::iter::from_fn(|| d.next_event()).collect();
        (events, d.finish())
    }

    type Fields<'a> = (
        &'a Option<String>,
        &'a Option<String>,
        &'a str,
        Option<u64>,
        &'a [String],
        bool,
    );

    fn fields(e: &Event) -> Fields<'_> {
        (&e.id, &e.event, &e.data, e.retry, &e.comments, e.has_data)
    }

    proptest! {
        #[test]
        fn any_chunking_decodes_to_the_same_events(
            (bom, spec) in stream(),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let (bytes, expected) = build(bom, &spec);
            let (whole, rest) = decode_chunked(&bytes, &[]);
            prop_assert_eq!(rest, None);
            prop_assert_eq!(&whole, &expected);
            let (chunked, rest) = decode_chunked(&bytes, &cuts);
            prop_assert_eq!(rest, None);
            prop_assert_eq!(chunked.len(), expected.len());
            for (got, want) in chunked.iter().zip(&expected) {
                prop_assert_eq!(fields(got), fields(want));
                // Only a final CRLF split between chunks may lose its LF.
                let same = got.raw == want.raw
                    || (want.raw.ends_with(b"\r\n") && got.raw[..] == want.raw[..want.raw.len() - 1]);
                prop_assert!(same, "raw {:?} vs {:?}", got.raw, want.raw);
            }
        }

        #[test]
        fn byte_at_a_time_matches_whole(
            (bom, spec) in stream(),
        ) {
            let (bytes, expected) = build(bom, &spec);
            let cuts: Vec<usize> = (0..bytes.len()).collect();
            let (events, _) = decode_chunked(&bytes, &cuts);
            prop_assert_eq!(events.len(), expected.len());
            for (got, want) in events.iter().zip(&expected) {
                prop_assert_eq!(fields(got), fields(want));
            }
        }

        #[test]
        fn encode_then_decode_round_trips(
            id in prop::option::of("[ a-z0-9\u{e9}:]{0,8}"),
            event in prop::option::of("[ a-z\u{4e16}]{0,8}"),
            data in prop_oneof![Just(String::new()), "[ a-z\n\u{1F600}:]{0,16}"],
            has_data in any::<bool>(),
            retry in prop::option::of(any::<u64>()),
            comments in prop::collection::vec("[ a-z:]{0,6}", 0..3),
        ) {
            let has_data = has_data || !data.is_empty();
            let original = Event { id, event, data, retry, comments, has_data, raw: Bytes::new() };
            let mut out = BytesMut::new();
            encode(&original, &mut out);
            let decoded = decode_all(&out);
            let fieldless = original.id.is_none() && original.event.is_none()
                && original.retry.is_none() && !original.has_data;
            if fieldless {
                // Nothing but comments: one comment event per line.
                prop_assert_eq!(decoded.len(), original.comments.len());
                let mut relayed = Vec::new();
                for (got, comment) in decoded.iter().zip(&original.comments) {
                    prop_assert_eq!(&got.comments, &vec![comment.clone()]);
                    relayed.extend_from_slice(&got.raw);
                }
                relayed.push(b'\n');
                prop_assert_eq!(&relayed[..], &out[..]);
            } else {
                prop_assert_eq!(decoded.len(), 1);
                prop_assert_eq!(fields(&decoded[0]), fields(&original));
                prop_assert_eq!(&decoded[0].raw[..], &out[..]);
            }
        }
    }
}
