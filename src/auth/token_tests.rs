use http::{HeaderMap, HeaderName, HeaderValue};

use super::*;

fn tool_header() -> HeaderName {
    HeaderName::from_static("x-tool-token")
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
}

#[test]
fn bearer_token_is_found_in_authorization() {
    let h = headers(&[("authorization", "Bearer abc.def.ghi")]);
    assert_eq!(extract(&h, &tool_header()), Ok(Some("abc.def.ghi")));
}

#[test]
fn bearer_scheme_is_case_insensitive() {
    let h = headers(&[("authorization", "bEaReR   abc.def.ghi ")]);
    assert_eq!(extract(&h, &tool_header()), Ok(Some("abc.def.ghi")));
}

#[test]
fn token_is_found_in_the_configured_header() {
    let h = headers(&[("x-tool-token", "abc.def.ghi")]);
    assert_eq!(extract(&h, &tool_header()), Ok(Some("abc.def.ghi")));
    let h = headers(&[("x-tool-token", "Bearer abc.def.ghi")]);
    assert_eq!(
        extract(&h, &tool_header()),
        Ok(Some("abc.def.ghi")),
        "an optional Bearer prefix is stripped"
    );
}

#[test]
fn no_token_is_none() {
    assert_eq!(extract(&HeaderMap::new(), &tool_header()), Ok(None));
}

#[test]
fn other_authorization_schemes_are_ignored() {
    let h = headers(&[
        ("authorization", "Basic dXNlcjpwYXNz"),
        ("x-tool-token", "abc.def.ghi"),
    ]);
    assert_eq!(extract(&h, &tool_header()), Ok(Some("abc.def.ghi")));
    let h = headers(&[("authorization", "Bearerish abc")]);
    assert_eq!(extract(&h, &tool_header()), Ok(None));
}

#[test]
fn same_token_in_both_places_is_accepted() {
    let h = headers(&[
        ("authorization", "Bearer abc.def.ghi"),
        ("x-tool-token", "abc.def.ghi"),
    ]);
    assert_eq!(extract(&h, &tool_header()), Ok(Some("abc.def.ghi")));
}

#[test]
fn two_different_tokens_in_one_request_are_refused() {
    let h = headers(&[
        ("authorization", "Bearer one.one.one"),
        ("x-tool-token", "two.two.two"),
    ]);
    let err = extract(&h, &tool_header()).expect_err("conflict");
    assert_eq!(
        err,
        TokenError::ConflictingTokens {
            first: "authorization".into(),
            second: "x-tool-token".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "the request carries two different tokens (in authorization and x-tool-token)"
    );
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.oauth_error(), "invalid_request");
}

#[test]
fn repeated_headers_with_different_tokens_are_refused() {
    let h = headers(&[
        ("authorization", "Bearer one.one.one"),
        ("authorization", "Bearer two.two.two"),
    ]);
    assert!(matches!(
        extract(&h, &tool_header()),
        Err(TokenError::ConflictingTokens { .. })
    ));
    let h = headers(&[
        ("x-tool-token", "one.one.one"),
        ("x-tool-token", "two.two.two"),
    ]);
    assert_eq!(
        extract(&h, &tool_header()),
        Err(TokenError::ConflictingTokens {
            first: "x-tool-token".into(),
            second: "x-tool-token".into()
        })
    );
}

#[test]
fn empty_bearer_is_refused() {
    let h = headers(&[("authorization", "Bearer   ")]);
    assert_eq!(
        extract(&h, &tool_header()),
        Err(TokenError::EmptyToken {
            header: "authorization".into()
        })
    );
    let h = headers(&[("x-tool-token", "")]);
    assert_eq!(
        extract(&h, &tool_header()),
        Err(TokenError::EmptyToken {
            header: "x-tool-token".into()
        })
    );
}

#[test]
fn non_ascii_header_is_refused() {
    let mut h = HeaderMap::new();
    h.insert(
        tool_header(),
        HeaderValue::from_bytes(b"abc\xff").expect("value"),
    );
    assert_eq!(
        extract(&h, &tool_header()),
        Err(TokenError::UnreadableHeader {
            header: "x-tool-token".into()
        })
    );
}

#[test]
fn split_requires_exactly_three_parts() {
    assert!(split("a.b.c").is_ok());
    for bad in ["a.b", "a", "a.b.c.d", ""] {
        assert_eq!(
            split(bad).err(),
            Some(TokenError::Malformed(Malformed::NotThreeParts)),
            "{bad}"
        );
    }
    let parts = split("hh.pp.ss").expect("parts");
    assert_eq!(
        (
            parts.header,
            parts.payload,
            parts.signature,
            parts.signing_input
        ),
        ("hh", "pp", "ss", "hh.pp")
    );
}

#[test]
fn signature_must_be_unpadded_base64url() {
    for bad in ["a.b.", "a.b.c=", "a.b.c+d", "a.b.c/d"] {
        let parts = split(bad).expect("three parts");
        assert_eq!(
            parts.check_signature_encoding(),
            Err(TokenError::Malformed(Malformed::SignatureEncoding)),
            "{bad}"
        );
    }
}

#[test]
fn header_parsing_reads_alg_and_kid() {
    let h = parse_header(br#"{"alg":"ES256","kid":"k\u0031","typ":"JWT"}"#).expect("header");
    assert_eq!((h.alg, h.kid.as_deref()), (Alg::ES256, Some("k1")));
    assert_eq!(parse_header(br#"{"alg":"EdDSA"}"#).map(|h| h.kid), Ok(None));
}

#[test]
fn header_refusals_are_distinct() {
    assert_eq!(
        parse_header(br#"{"alg":"none"}"#).err(),
        Some(TokenError::AlgNone)
    );
    assert_eq!(
        parse_header(br#"{"alg":"RS512"}"#).err(),
        Some(TokenError::UnsupportedAlg {
            alg: "RS512".into()
        })
    );
    assert_eq!(
        parse_header(br#"{"alg":"es256"}"#).err(),
        Some(TokenError::UnsupportedAlg {
            alg: "es256".into()
        })
    );
    assert_eq!(
        parse_header(br#"{"alg":"HS256","crit":["b64"]}"#).err(),
        Some(TokenError::CriticalHeader)
    );
    assert_eq!(
        parse_header(br#"{"kid":"x"}"#).err(),
        Some(TokenError::Malformed(Malformed::HeaderJson))
    );
    assert_eq!(
        parse_header(br#"{"alg":1}"#).err(),
        Some(TokenError::Malformed(Malformed::HeaderJson))
    );
    assert_eq!(
        parse_header(br#"{"alg":"HS256","alg":"none"}"#).err(),
        Some(TokenError::Malformed(Malformed::HeaderJson)),
        "a repeated alg must not let either value win"
    );
}

#[test]
fn shown_values_are_safe_in_a_quoted_header() {
    assert_eq!(shown("kid-1"), "kid-1");
    assert_eq!(shown("a\"b\\c\r\nd é"), "a?b?c??d??");
    assert_eq!(shown(""), "(empty)");
    let long = shown(&"x".repeat(500));
    assert_eq!(long.len(), MAX_SHOWN + 3);
    assert!(long.ends_with("..."));
}

#[test]
fn every_message_is_header_safe() {
    let errors = [
        TokenError::ConflictingTokens {
            first: "authorization".into(),
            second: "x-tool-token".into(),
        },
        TokenError::UnknownKid {
            kid: shown("\"evil\""),
        },
        TokenError::UntrustedIssuer {
            iss: shown("https://x\\y"),
        },
        TokenError::InvalidClaim {
            claim: "aud",
            problem: ClaimProblem::WrongType {
                expected: "a string",
            },
        },
        TokenError::Malformed(Malformed::PayloadJson),
        TokenError::AlgMismatch {
            kid: "k".into(),
            token_alg: Alg::HS256,
            key_alg: Alg::RS256,
        },
    ];
    for e in errors {
        let text = e.to_string();
        assert!(
            text.bytes()
                .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'),
            "{text}"
        );
    }
}
