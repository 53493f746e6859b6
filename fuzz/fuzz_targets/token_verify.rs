//! Tool tokens and key sets. A token the firewall minted verifies; any
//! change to its text (a byte set anywhere, a cut, bytes added) is refused
//! unless it is the same text: a token has one spelling. Any key set
//! document parses or is refused without a panic, and every key of its
//! `keys` is either usable or listed as skipped.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mcp_firewall::auth::{
    parse_jwks, Alg, Audience, AuthConfig, KeyConfig, SecretString, SigningKey, Verifier,
};

const SECRET: &str = "fuzz-secret-that-is-long-enough-for-hs256!";

struct Fixture {
    rt: tokio::runtime::Runtime,
    verifier: Verifier,
    token: String,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let cfg = AuthConfig {
            header: "X-Tool-Token".into(),
            mcp_audience: "mcp".into(),
            admin_audience: "admin".into(),
            required_scope: "mcp:tools".into(),
            admin_scope: "approvals".into(),
            issuers: vec!["https://idp.fuzz".into()],
            service_account_issuer: None,
            leeway_s: 30,
            max_lifetime_s: 900,
            cache_entries: 1024,
            keys: vec![KeyConfig {
                kid: Some("k".into()),
                alg: "HS256".into(),
                pem_file: None,
                secret_env: None,
                secret_file: None,
                secret: Some(SecretString::new(SECRET)),
            }],
            jwks: Vec::new(),
        };
        let verifier = rt.block_on(Verifier::new(&cfg)).expect("verifier");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = serde_json::json!({
            "iss": "https://idp.fuzz", "aud": "mcp", "sub": "user-1",
            "tenant_id": "tenant-1", "agent": "coder", "run_id": "run-1",
            "mode": "caller", "projects": ["alpha"], "scope": "mcp:tools",
            "jti": "j", "iat": now, "exp": now + 600,
        });
        let key = SigningKey::from_secret(SECRET.as_bytes(), Some("k")).expect("key");
        let token = key.sign(&claims).expect("sign");
        Fixture {
            rt,
            verifier,
            token,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    match op % 3 {
        0 => {
            // Edits to the minted token: (position, byte) pairs, then a cut
            // or an append chosen by the tail.
            let mut t = f.token.clone().into_bytes();
            for pair in rest.chunks(2) {
                if let [at, b] = *pair {
                    let n = t.len();
                    t[usize::from(at) * 7 % n] = b;
                }
            }
            let Ok(t) = String::from_utf8(t) else {
                return;
            };
            let ok = f.rt.block_on(f.verifier.verify(&t, Audience::Mcp)).is_ok();
            assert!(!ok || t == f.token, "an edited token verified: {t}");
        }
        1 => {
            // Any text as a token: never a panic, never verified.
            if let Ok(t) = std::str::from_utf8(rest) {
                let ok = f.rt.block_on(f.verifier.verify(t, Audience::Mcp)).is_ok();
                assert!(!ok || t == f.token, "a token from nowhere verified: {t}");
            }
        }
        _ => {
            if let Ok(parsed) = parse_jwks(rest, Alg::RS256, "fuzz") {
                let doc: serde_json::Value = serde_json::from_slice(rest).expect("JSON");
                let listed = doc["keys"].as_array().map_or(0, Vec::len);
                assert_eq!(parsed.keys.len() + parsed.skipped.len(), listed);
            }
        }
    }
});
