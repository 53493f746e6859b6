//! A token endpoint's answer as the upstream-credential reader takes it
//! (RFC 6749 §5.1, RFC 8693 §2.2): whatever the bytes, it never panics,
//! and what it accepts is what a generic JSON reader reads there too (no
//! parser differential: a duplicate `access_token` is refused, not read
//! first or last), a Bearer token sent as `Bearer <token>`, with a
//! positive `expires_in` when one is given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::internals::read_token_answer;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let status = [200u16, 400, 401, 500][usize::from(flags & 3)];
    let json = flags & 4 != 0;
    let exchange = flags & 8 != 0;
    let Ok((header, expires_in)) = read_token_answer(status, json, body, exchange) else {
        return;
    };
    assert_eq!(status, 200, "only a 200 carries a token");
    assert!(json, "only JSON carries a token");
    let v: serde_json::Value = serde_json::from_slice(body).expect("accepted, so JSON");
    let token = v["access_token"]
        .as_str()
        .expect("accepted, so a string token");
    assert!(!token.is_empty());
    assert_eq!(header.as_bytes(), format!("Bearer {token}").as_bytes());
    assert!(header.is_sensitive());
    assert!(v["token_type"]
        .as_str()
        .is_some_and(|t| t.eq_ignore_ascii_case("bearer")));
    assert_eq!(expires_in, v["expires_in"].as_u64());
    assert_ne!(expires_in, Some(0));
    if exchange {
        assert!(matches!(
            v["issued_token_type"].as_str(),
            Some(
                "urn:ietf:params:oauth:token-type:access_token"
                    | "urn:ietf:params:oauth:token-type:jwt"
            )
        ));
    }
});
