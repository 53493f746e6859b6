use std::sync::atomic::Ordering;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};

use super::*;
use crate::auth::testkit::{self, admin_claims, claims, KeyFiles, TestKey, NOW};
use crate::auth::{Alg, JwksSourceConfig, KeyConfig, SigningKey};

/// One verifier trusting an ES256 key (kid `ec1`), an RS256 key (kid `rsa1`)
/// and the dev HS256 key (kid `dev`).
struct Setup {
    verifier: Verifier,
    clock: Arc<std::sync::atomic::AtomicU64>,
    ec: TestKey,
    rsa: TestKey,
    hs: TestKey,
    _files: KeyFiles,
}

async fn setup() -> Setup {
    setup_with(|_| {}).await
}

async fn setup_with(tweak: impl FnOnce(&mut AuthConfig)) -> Setup {
    let files = KeyFiles::new();
    let ec = testkit::key(Alg::ES256, "ec1");
    let rsa = testkit::key(Alg::RS256, "rsa1");
    let hs = testkit::key(Alg::HS256, "dev");
    let mut cfg = testkit::config(vec![files.entry(&ec), files.entry(&rsa), files.entry(&hs)]);
    tweak(&mut cfg);
    let (verifier, clock) = testkit::verifier(&cfg).await;
    Setup {
        verifier,
        clock,
        ec,
        rsa,
        hs,
        _files: files,
    }
}

impl Setup {
    async fn mcp(&self, token: &str) -> Result<Arc<Claims>, TokenError> {
        self.verifier.verify(token, Audience::Mcp).await
    }

    fn ec_token(&self, claims: &Value) -> String {
        self.ec.signing.sign(claims).expect("sign")
    }
}

/// A JWKS source given inline in the config.
fn inline_jwks(jwks: String) -> JwksSourceConfig {
    JwksSourceConfig {
        inline: Some(jwks),
        file: None,
        url: None,
        refresh_s: 300,
        min_refresh_interval_s: 10,
        ca_file: None,
        rsa_alg: "RS256".into(),
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token with an arbitrary header, HMAC-signed with `secret` (so header
/// tricks reach the checks after the signature).
fn hs_raw(header: &str, payload: &str, secret: &[u8]) -> String {
    let signing_input = format!("{}.{}", b64(header.as_bytes()), b64(payload.as_bytes()));
    let key = jsonwebtoken::EncodingKey::from_secret(secret).expect("key");
    let sig = jsonwebtoken::crypto::sign(
        signing_input.as_bytes(),
        &key,
        jsonwebtoken::Algorithm::HS256,
    )
    .expect("sign");
    format!("{signing_input}.{sig}")
}

#[tokio::test]
async fn every_supported_algorithm_verifies() {
    let files = KeyFiles::new();
    let keys: Vec<TestKey> = Alg::ALL
        .iter()
        .map(|alg| testkit::key(*alg, &format!("k-{alg}")))
        .collect();
    let cfg = testkit::config(keys.iter().map(|k| files.entry(k)).collect());
    let (verifier, _) = testkit::verifier(&cfg).await;
    for key in &keys {
        let token = key.signing.sign(&claims(NOW)).expect("sign");
        let got = verifier.verify(&token, Audience::Mcp).await;
        let got = got.unwrap_or_else(|e| panic!("{} token refused: {e}", key.signing.alg()));
        assert_eq!(got.kid.as_deref(), key.signing.kid());
        assert_eq!(&*got.sub, "user-1");
        assert_eq!(&*got.tenant_id, "tenant-1");
        assert_eq!(&*got.agent, "coder");
        assert_eq!(got.run_id, "run-42");
        assert_eq!(got.mode, Mode::Caller);
        assert_eq!(&*got.projects, ["alpha", "beta"]);
        assert_eq!(got.project_ceiling, None);
        assert_eq!(&*got.scopes, ["mcp:tools", "other"]);
        assert_eq!(got.jti, "jti-1");
        assert_eq!(&*got.iss, testkit::ISS);
        assert_eq!((got.iat, got.exp), (NOW, NOW + 300));
        assert_eq!(got.audience, Audience::Mcp);
    }
}

#[tokio::test]
async fn token_without_kid_verifies_with_a_key_pinned_to_its_alg() {
    let s = setup().await;
    let ec_no_kid =
        SigningKey::from_pem(Alg::ES256, s.ec.private_pem.as_bytes(), None).expect("key");
    let got = s
        .mcp(&ec_no_kid.sign(&claims(NOW)).expect("sign"))
        .await
        .expect("no-kid ES256 token verifies");
    assert_eq!(got.kid, None);
    let hs_no_kid = SigningKey::from_secret(testkit::HS_SECRET.as_bytes(), None).expect("key");
    assert!(s
        .mcp(&hs_no_kid.sign(&claims(NOW)).expect("sign"))
        .await
        .is_ok());
    // No ES384 key is configured at all.
    let es384 = testkit::key(Alg::ES384, "x");
    let es384_no_kid =
        SigningKey::from_pem(Alg::ES384, es384.private_pem.as_bytes(), None).expect("key");
    assert_eq!(
        s.mcp(&es384_no_kid.sign(&claims(NOW)).expect("sign")).await,
        Err(TokenError::NoKeyForAlg { alg: Alg::ES384 })
    );
}

#[tokio::test]
async fn expired_token_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW - 600);
    c["exp"] = json!(NOW - 31);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::Expired {
            exp: NOW - 31,
            now: NOW
        })
    );
}

#[tokio::test]
async fn expiry_within_leeway_is_accepted() {
    let s = setup().await;
    let mut c = claims(NOW - 600);
    c["exp"] = json!(NOW - 29);
    assert!(s.mcp(&s.ec_token(&c)).await.is_ok());
}

#[tokio::test]
async fn token_not_yet_valid_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["nbf"] = json!(NOW + 31);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::NotYetValid {
            nbf: NOW + 31,
            now: NOW
        })
    );
    c["nbf"] = json!(NOW + 30);
    assert!(
        s.mcp(&s.ec_token(&c)).await.is_ok(),
        "nbf within the leeway is accepted"
    );
}

#[tokio::test]
async fn token_issued_in_the_future_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["iat"] = json!(NOW + 60);
    c["exp"] = json!(NOW + 120);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::IssuedInFuture {
            iat: NOW + 60,
            now: NOW
        })
    );
}

#[tokio::test]
async fn lifetime_longer_than_the_maximum_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["exp"] = json!(NOW + 901);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::LifetimeTooLong {
            lifetime_s: 901,
            max_s: 900
        })
    );
    c["exp"] = json!(NOW + 900);
    assert!(
        s.mcp(&s.ec_token(&c)).await.is_ok(),
        "exactly the maximum is accepted"
    );
}

#[tokio::test]
async fn exp_not_after_iat_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["iat"] = json!(NOW + 10);
    c["exp"] = json!(NOW + 10);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::InvalidClaim {
            claim: "exp",
            problem: ClaimProblem::NotAfterIat
        })
    );
}

#[tokio::test]
async fn fractional_numeric_dates_are_truncated() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["iat"] = json!(NOW as f64 + 0.5);
    c["exp"] = json!((NOW + 100) as f64 + 0.9);
    let got = s.mcp(&s.ec_token(&c)).await.expect("valid");
    assert_eq!((got.iat, got.exp), (NOW, NOW + 100));
    c["exp"] = json!(-5);
    assert!(matches!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::InvalidClaim {
            claim: "exp",
            problem: ClaimProblem::WrongType { .. }
        })
    ));
}

#[tokio::test]
async fn wrong_audience_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["aud"] = json!("https://some-other-service.test");
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::WrongAudience {
            expected: Audience::Mcp
        })
    );
    c["aud"] = json!(["https://a.test", "https://b.test"]);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::WrongAudience {
            expected: Audience::Mcp
        })
    );
}

#[tokio::test]
async fn audience_array_containing_the_audience_is_accepted() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["aud"] = json!(["https://elsewhere.test", testkit::MCP_AUD]);
    assert!(s.mcp(&s.ec_token(&c)).await.is_ok());
}

#[tokio::test]
async fn admin_token_on_the_mcp_audience_is_refused() {
    let s = setup().await;
    let token = s.ec_token(&admin_claims(NOW));
    assert_eq!(
        s.mcp(&token).await,
        Err(TokenError::WrongAudience {
            expected: Audience::Mcp
        })
    );
    assert!(
        s.verifier.verify(&token, Audience::Admin).await.is_ok(),
        "it is a valid admin token"
    );
}

#[tokio::test]
async fn mcp_token_on_the_admin_audience_is_refused() {
    let s = setup().await;
    let token = s.ec_token(&claims(NOW));
    assert_eq!(
        s.verifier.verify(&token, Audience::Admin).await,
        Err(TokenError::WrongAudience {
            expected: Audience::Admin
        })
    );
}

#[tokio::test]
async fn token_naming_both_audiences_is_refused_for_both() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["aud"] = json!([testkit::MCP_AUD, testkit::ADMIN_AUD]);
    c["scope"] = json!("mcp:tools approvals");
    let token = s.ec_token(&c);
    assert_eq!(s.mcp(&token).await, Err(TokenError::BothAudiences));
    assert_eq!(
        s.verifier.verify(&token, Audience::Admin).await,
        Err(TokenError::BothAudiences)
    );
}

#[tokio::test]
async fn untrusted_issuer_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["iss"] = json!("https://evil.test");
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::UntrustedIssuer {
            iss: "https://evil.test".into()
        })
    );
}

#[tokio::test]
async fn alg_none_is_refused() {
    let s = setup().await;
    let payload = b64(claims(NOW).to_string().as_bytes());
    for alg in ["none", "None", "NONE"] {
        let header = b64(json!({ "alg": alg, "typ": "JWT" }).to_string().as_bytes());
        let unsigned = format!("{header}.{payload}.");
        assert_eq!(
            s.mcp(&unsigned).await,
            Err(TokenError::AlgNone),
            "{alg}, empty signature"
        );
        // A "signature" copied from a real token changes nothing.
        let real = s.ec_token(&claims(NOW));
        let sig = real.rsplit('.').next().expect("sig");
        assert_eq!(
            s.mcp(&format!("{header}.{payload}.{sig}")).await,
            Err(TokenError::AlgNone),
            "{alg}, signed"
        );
    }
}

#[tokio::test]
async fn hs256_signed_with_the_rsa_public_key_is_refused() {
    let s = setup().await;
    let body = claims(NOW).to_string();
    // The classic confusion attack: HMAC over the token with the verifier's
    // own RSA public key PEM as the secret, naming the RSA key.
    let secret = testkit::rsa_public_pem();
    let forged = hs_raw(
        r#"{"alg":"HS256","typ":"JWT","kid":"rsa1"}"#,
        &body,
        secret.as_bytes(),
    );
    assert_eq!(
        s.mcp(&forged).await,
        Err(TokenError::AlgMismatch {
            kid: "rsa1".into(),
            token_alg: Alg::HS256,
            key_alg: Alg::RS256
        })
    );
    // Without a kid only HS256 keys are tried, and the dev secret is not the PEM.
    let forged = hs_raw(r#"{"alg":"HS256","typ":"JWT"}"#, &body, secret.as_bytes());
    assert_eq!(s.mcp(&forged).await, Err(TokenError::BadSignature));
}

#[tokio::test]
async fn hs256_signed_with_the_ec_public_key_is_refused_without_an_hs256_key() {
    let s = setup_with(|cfg| cfg.keys.retain(|k| k.alg != "HS256")).await;
    let body = claims(NOW).to_string();
    let secret = s.ec.public_pem.clone();
    let with_kid = hs_raw(r#"{"alg":"HS256","kid":"ec1"}"#, &body, secret.as_bytes());
    assert_eq!(
        s.mcp(&with_kid).await,
        Err(TokenError::AlgMismatch {
            kid: "ec1".into(),
            token_alg: Alg::HS256,
            key_alg: Alg::ES256
        })
    );
    let without_kid = hs_raw(r#"{"alg":"HS256"}"#, &body, secret.as_bytes());
    assert_eq!(
        s.mcp(&without_kid).await,
        Err(TokenError::NoKeyForAlg { alg: Alg::HS256 })
    );
}

#[tokio::test]
async fn token_alg_differing_from_the_pinned_alg_is_refused() {
    let s = setup().await;
    // PS256 with the RS256-pinned key: same RSA key, other algorithm.
    let ps = SigningKey::from_pem(
        Alg::PS256,
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/keys/rsa2048-private.pem"
        ))
        .expect("fixture")
        .as_slice(),
        Some("rsa1"),
    )
    .expect("key");
    assert_eq!(
        s.mcp(&ps.sign(&claims(NOW)).expect("sign")).await,
        Err(TokenError::AlgMismatch {
            kid: "rsa1".into(),
            token_alg: Alg::PS256,
            key_alg: Alg::RS256
        })
    );
}

#[tokio::test]
async fn tampered_signature_is_refused() {
    let s = setup().await;
    for token in [
        s.ec_token(&claims(NOW)),
        s.rsa.signing.sign(&claims(NOW)).expect("sign"),
        s.hs.signing.sign(&claims(NOW)).expect("sign"),
    ] {
        let (input, sig) = token.rsplit_once('.').expect("parts");
        let mut raw = URL_SAFE_NO_PAD.decode(sig).expect("b64");
        raw[5] ^= 0x01;
        assert_eq!(
            s.mcp(&format!("{input}.{}", b64(&raw))).await,
            Err(TokenError::BadSignature)
        );
        // A truncated signature is no better.
        assert_eq!(
            s.mcp(&format!("{input}.{}", b64(&raw[..10]))).await,
            Err(TokenError::BadSignature)
        );
    }
}

#[tokio::test]
async fn tampered_payload_is_refused() {
    let s = setup().await;
    let token = s.ec_token(&claims(NOW));
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let mut c = claims(NOW);
    c["tenant_id"] = json!("tenant-2");
    parts[1] = b64(c.to_string().as_bytes());
    assert_eq!(s.mcp(&parts.join(".")).await, Err(TokenError::BadSignature));
}

#[tokio::test]
async fn unknown_kid_is_refused() {
    let s = setup().await;
    let stranger = testkit::key(Alg::ES256, "who-is-this");
    let token = stranger.signing.sign(&claims(NOW)).expect("sign");
    assert_eq!(
        s.mcp(&token).await,
        Err(TokenError::UnknownKid {
            kid: "who-is-this".into()
        })
    );
}

#[tokio::test]
async fn right_kid_wrong_key_material_is_refused() {
    let s = setup().await;
    let impostor = testkit::key(Alg::ES256, "ec1");
    let token = impostor.signing.sign(&claims(NOW)).expect("sign");
    assert_eq!(s.mcp(&token).await, Err(TokenError::BadSignature));
}

#[tokio::test]
async fn missing_tenant_id_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c.as_object_mut().expect("object").remove("tenant_id");
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::MissingClaim { claim: "tenant_id" })
    );
}

#[tokio::test]
async fn every_required_claim_is_named_when_missing() {
    let s = setup().await;
    for claim in [
        "iss",
        "aud",
        "exp",
        "iat",
        "sub",
        "tenant_id",
        "agent",
        "run_id",
        "mode",
        "jti",
    ] {
        let mut c = claims(NOW);
        c.as_object_mut().expect("object").remove(claim);
        assert_eq!(
            s.mcp(&s.ec_token(&c)).await,
            Err(TokenError::MissingClaim { claim }),
            "{claim}"
        );
        // null is the same as absent
        let mut c = claims(NOW);
        c[claim] = Value::Null;
        assert_eq!(
            s.mcp(&s.ec_token(&c)).await,
            Err(TokenError::MissingClaim { claim }),
            "{claim}: null"
        );
    }
}

#[tokio::test]
async fn projects_are_required_for_caller_mode_only() {
    let s = setup().await;
    let mut c = claims(NOW);
    c.as_object_mut().expect("object").remove("projects");
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::MissingClaim { claim: "projects" })
    );
    c["mode"] = json!("agent");
    let got = s
        .mcp(&s.ec_token(&c))
        .await
        .expect("agent mode without projects");
    assert!(got.projects.is_empty());
    assert_eq!(got.mode, Mode::Agent);
}

#[tokio::test]
async fn empty_projects_and_a_ceiling_are_accepted() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["projects"] = json!([]);
    c["project_ceiling"] = json!(["alpha", "gamma"]);
    let got = s.mcp(&s.ec_token(&c)).await.expect("valid");
    assert!(got.projects.is_empty());
    assert_eq!(
        got.project_ceiling.as_deref(),
        Some(&["alpha".to_owned(), "gamma".to_owned()][..])
    );
}

#[tokio::test]
async fn malformed_claims_name_the_claim_and_the_problem() {
    let s = setup().await;
    let cases = [
        (
            "projects",
            json!("alpha"),
            ClaimProblem::WrongType {
                expected: "an array of strings",
            },
        ),
        ("projects", json!(["ok", ""]), ClaimProblem::Empty),
        (
            "project_ceiling",
            json!([1]),
            ClaimProblem::WrongType {
                expected: "an array of strings",
            },
        ),
        (
            "tenant_id",
            json!(7),
            ClaimProblem::WrongType {
                expected: "a string",
            },
        ),
        ("tenant_id", json!(""), ClaimProblem::Empty),
        (
            "agent",
            json!("evil\r\nX-Injected: 1"),
            ClaimProblem::ControlCharacter,
        ),
        (
            "run_id",
            json!("r".repeat(257)),
            ClaimProblem::TooLong { max: 256 },
        ),
        ("mode", json!("root"), ClaimProblem::UnknownMode),
        (
            "scope",
            json!(["mcp:tools"]),
            ClaimProblem::WrongType {
                expected: "a space-separated string",
            },
        ),
        (
            "aud",
            json!(42),
            ClaimProblem::WrongType {
                expected: "a string or an array of strings",
            },
        ),
    ];
    for (claim, value, problem) in cases {
        let mut c = claims(NOW);
        c[claim] = value;
        assert_eq!(
            s.mcp(&s.ec_token(&c)).await,
            Err(TokenError::InvalidClaim { claim, problem }),
            "{claim}"
        );
    }
}

#[tokio::test]
async fn missing_scope_is_refused_with_403() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["scope"] = json!("other things");
    let err = s.mcp(&s.ec_token(&c)).await.expect_err("refused");
    assert_eq!(
        err,
        TokenError::MissingScope {
            scope: "mcp:tools".into()
        }
    );
    assert_eq!(err.status(), http::StatusCode::FORBIDDEN);
    assert_eq!(err.oauth_error(), "insufficient_scope");
    c.as_object_mut().expect("object").remove("scope");
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::MissingScope {
            scope: "mcp:tools".into()
        })
    );
}

#[tokio::test]
async fn admin_audience_requires_the_admin_scope() {
    let s = setup().await;
    let mut c = admin_claims(NOW);
    c["scope"] = json!("mcp:tools");
    assert_eq!(
        s.verifier.verify(&s.ec_token(&c), Audience::Admin).await,
        Err(TokenError::MissingScope {
            scope: "approvals".into()
        })
    );
}

#[tokio::test]
async fn service_account_mode_from_another_issuer_is_refused() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["mode"] = json!("service_account");
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::ServiceAccountNotAllowed {
            iss: testkit::ISS.into()
        })
    );
    c["iss"] = json!(testkit::SA_ISS);
    let got = s
        .mcp(&s.ec_token(&c))
        .await
        .expect("the service-account issuer may");
    assert_eq!(got.mode, Mode::ServiceAccount);
}

#[tokio::test]
async fn service_account_mode_is_refused_when_no_issuer_is_configured_for_it() {
    let s = setup_with(|cfg| cfg.service_account_issuer = None).await;
    let mut c = claims(NOW);
    c["mode"] = json!("service_account");
    c["iss"] = json!(testkit::SA_ISS);
    assert_eq!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::ServiceAccountNotAllowed {
            iss: testkit::SA_ISS.into()
        })
    );
}

#[tokio::test]
async fn critical_header_parameters_are_refused() {
    let s = setup().await;
    let token = hs_raw(
        r#"{"alg":"HS256","kid":"dev","crit":["exp"],"exp":1}"#,
        &claims(NOW).to_string(),
        testkit::HS_SECRET.as_bytes(),
    );
    assert_eq!(s.mcp(&token).await, Err(TokenError::CriticalHeader));
}

#[tokio::test]
async fn unsupported_algorithms_are_refused_by_name() {
    let s = setup().await;
    let token = hs_raw(
        r#"{"alg":"HS512\"x"}"#,
        &claims(NOW).to_string(),
        testkit::HS_SECRET.as_bytes(),
    );
    let err = s.mcp(&token).await.expect_err("refused");
    assert_eq!(
        err,
        TokenError::UnsupportedAlg {
            alg: "HS512?x".into()
        }
    );
    assert!(
        !err.to_string().contains('"'),
        "messages must fit a quoted header: {err}"
    );
}

#[tokio::test]
async fn repeated_claims_are_refused() {
    let s = setup().await;
    let c = claims(NOW).to_string();
    let payload = c.replacen('{', &format!("{{\"aud\":\"{}\",", "https://evil.test"), 1);
    let token = hs_raw(
        r#"{"alg":"HS256","kid":"dev"}"#,
        &payload,
        testkit::HS_SECRET.as_bytes(),
    );
    assert_eq!(
        s.mcp(&token).await,
        Err(TokenError::Malformed(Malformed::PayloadJson))
    );
}

#[tokio::test]
async fn malformed_tokens_are_refused_precisely() {
    let s = setup().await;
    let good = s.ec_token(&claims(NOW));
    let (h, rest) = good.split_once('.').expect("parts");
    let cases = [
        ("not-a-jwt".to_owned(), Malformed::NotThreeParts),
        (format!("{good}.extra"), Malformed::NotThreeParts),
        (format!("!!.{rest}"), Malformed::HeaderEncoding),
        (format!("{}.{rest}", b64(b"[1,2]")), Malformed::HeaderJson),
        (
            format!("{h}.{}", rest.replacen('.', "*.", 1)),
            Malformed::PayloadEncoding,
        ),
        (
            format!("{}.", good.rsplit_once('.').expect("sig").0),
            Malformed::SignatureEncoding,
        ),
    ];
    for (token, why) in cases {
        let got = s.mcp(&token).await;
        // A corrupted payload breaks the signature before it is decoded.
        if why == Malformed::PayloadEncoding {
            assert_eq!(got, Err(TokenError::BadSignature), "{token}");
        } else {
            assert_eq!(got, Err(TokenError::Malformed(why)), "{token}");
        }
    }
}

#[tokio::test]
async fn oversized_tokens_are_refused_before_any_work() {
    let s = setup().await;
    let token = "a".repeat(token::MAX_TOKEN_BYTES + 1);
    assert_eq!(
        s.mcp(&token).await,
        Err(TokenError::TooLarge {
            len: token.len(),
            max: token::MAX_TOKEN_BYTES
        })
    );
}

#[tokio::test]
async fn cache_hit_returns_the_same_claims() {
    let s = setup().await;
    let token = s.ec_token(&claims(NOW));
    let first = s.mcp(&token).await.expect("valid");
    assert_eq!(s.verifier.cached_tokens(), 1);
    let second = s.mcp(&token).await.expect("valid");
    assert!(
        Arc::ptr_eq(&first, &second),
        "the second call is served from the cache"
    );
}

#[tokio::test]
async fn cached_token_is_refused_once_expired() {
    let s = setup_with(|cfg| cfg.leeway_s = 0).await;
    let mut c = claims(NOW);
    c["exp"] = json!(NOW + 60);
    let token = s.ec_token(&c);
    assert!(s.mcp(&token).await.is_ok());
    s.clock.store(NOW + 59, Ordering::SeqCst);
    assert!(
        s.mcp(&token).await.is_ok(),
        "still valid one second before exp"
    );
    s.clock.store(NOW + 60, Ordering::SeqCst);
    assert_eq!(
        s.mcp(&token).await,
        Err(TokenError::Expired {
            exp: NOW + 60,
            now: NOW + 60
        })
    );
    assert_eq!(s.verifier.cached_tokens(), 0, "the dead entry was dropped");
}

#[tokio::test]
async fn cached_token_is_still_checked_against_the_audience() {
    let s = setup().await;
    let token = s.ec_token(&claims(NOW));
    assert!(s.mcp(&token).await.is_ok());
    assert_eq!(
        s.verifier.verify(&token, Audience::Admin).await,
        Err(TokenError::WrongAudience {
            expected: Audience::Admin
        })
    );
}

#[tokio::test]
async fn cache_stays_within_its_bound() {
    let s = setup_with(|cfg| cfg.cache_entries = 4).await;
    for i in 0..20 {
        let mut c = claims(NOW);
        c["jti"] = json!(format!("jti-{i}"));
        assert!(s.mcp(&s.hs.signing.sign(&c).expect("sign")).await.is_ok());
        assert!(
            s.verifier.cached_tokens() <= 4,
            "{} entries after {i}",
            s.verifier.cached_tokens()
        );
    }
}

#[tokio::test]
async fn refused_tokens_are_never_cached() {
    let s = setup().await;
    let mut c = claims(NOW);
    c["scope"] = json!("nothing");
    assert!(s.mcp(&s.ec_token(&c)).await.is_err());
    assert_eq!(s.verifier.cached_tokens(), 0);
}

#[tokio::test]
async fn disabled_cache_still_verifies() {
    let s = setup_with(|cfg| cfg.cache_entries = 0).await;
    let token = s.ec_token(&claims(NOW));
    let a = s.mcp(&token).await.expect("valid");
    let b = s.mcp(&token).await.expect("valid");
    assert!(!Arc::ptr_eq(&a, &b));
    assert_eq!(s.verifier.cached_tokens(), 0);
}

#[tokio::test]
async fn invalid_config_is_refused_at_construction() {
    let mut cfg = testkit::config(Vec::new());
    cfg.keys.push(KeyConfig {
        kid: None,
        alg: "none".into(),
        pem_file: None,
        secret_env: None,
        secret_file: None,
        secret: Some(crate::auth::SecretString::new(testkit::HS_SECRET)),
    });
    let err = Verifier::new(&cfg).await.expect_err("refused");
    assert_eq!(
        err.to_string(),
        "auth.keys[0].alg: \"none\" is never accepted"
    );
}

#[tokio::test]
async fn small_rsa_keys_are_refused_at_load() {
    let mut cfg = testkit::config(Vec::new());
    cfg.keys.push(KeyConfig {
        kid: Some("small".into()),
        alg: "RS256".into(),
        pem_file: Some(testkit::rsa1024_public_pem_path()),
        secret_env: None,
        secret_file: None,
        secret: None,
    });
    let err = Verifier::new(&cfg).await.expect_err("refused");
    assert!(
        matches!(
            &err,
            VerifierError::Key(KeyError::BadPem {
                problem: crate::auth::JwkProblem::RsaTooSmall { bits: 1024 },
                ..
            })
        ),
        "{err}"
    );
}

#[tokio::test]
async fn pem_of_the_wrong_curve_is_refused_at_load() {
    let files = KeyFiles::new();
    let p384 = testkit::key(Alg::ES384, "k");
    let mut entry = files.entry(&p384);
    entry.alg = "ES256".into();
    let err = Verifier::new(&testkit::config(vec![entry]))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &err,
            VerifierError::Key(KeyError::BadPem {
                alg: Alg::ES256,
                ..
            })
        ),
        "{err}"
    );
}

#[tokio::test]
async fn short_hs256_secrets_are_refused_at_load() {
    let mut cfg = testkit::config(Vec::new());
    cfg.keys.push(KeyConfig {
        kid: None,
        alg: "HS256".into(),
        pem_file: None,
        secret_env: None,
        secret_file: None,
        secret: Some(crate::auth::SecretString::new("too-short")),
    });
    let err = Verifier::new(&cfg).await.expect_err("refused");
    assert!(
        matches!(
            &err,
            VerifierError::Key(KeyError::SecretTooShort {
                len: 9,
                min: 32,
                ..
            })
        ),
        "{err}"
    );
    assert!(
        !err.to_string().contains("too-short"),
        "the secret must not appear in the message"
    );
}

#[tokio::test]
async fn inline_jwks_keys_verify() {
    let ec = testkit::key(Alg::ES256, "inline-ec");
    let ed = testkit::key(Alg::EdDSA, "inline-ed");
    let jwks = json!({ "keys": [ec.signing.public_jwk().expect("jwk"), ed.signing.public_jwk().expect("jwk")] });
    let mut cfg = testkit::config(Vec::new());
    cfg.jwks.push(inline_jwks(jwks.to_string()));
    let (verifier, _) = testkit::verifier(&cfg).await;
    assert_eq!(verifier.key_count(), 2);
    assert!(verifier.ready());
    for key in [&ec, &ed] {
        let token = key.signing.sign(&claims(NOW)).expect("sign");
        assert!(
            verifier.verify(&token, Audience::Mcp).await.is_ok(),
            "{}",
            key.signing.alg()
        );
    }
}

#[tokio::test]
async fn inline_jwks_with_an_unusable_key_is_refused_at_start() {
    let mut cfg = testkit::config(Vec::new());
    cfg.jwks.push(inline_jwks(
        r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#.into(),
    ));
    let err = Verifier::new(&cfg).await.expect_err("refused");
    assert_eq!(
        err.to_string(),
        "auth.jwks[0]: keys[0] (kid s): symmetric (oct) keys are not accepted from a JWKS"
    );
}

#[test]
fn verifier_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Verifier>();
}

/// Flips one bit of the signature part: still valid base64url, never valid.
fn tamper_signature(token: &str) -> String {
    let (input, sig) = token.rsplit_once('.').expect("three parts");
    let mut bytes = URL_SAFE_NO_PAD.decode(sig).expect("b64");
    bytes[0] ^= 0x01;
    format!("{input}.{}", b64(&bytes))
}

#[tokio::test]
async fn every_algorithm_verifies_its_own_signatures_and_nothing_else() {
    let files = KeyFiles::new();
    let keys: Vec<TestKey> = Alg::ALL
        .iter()
        .map(|&alg| testkit::key(alg, alg.name()))
        .collect();
    let cfg = testkit::config(keys.iter().map(|k| files.entry(k)).collect());
    let (verifier, _) = testkit::verifier(&cfg).await;
    for key in &keys {
        let alg = key.signing.alg();
        let token = key.signing.sign(&claims(NOW)).expect("sign");
        let got = verifier.verify(&token, Audience::Mcp).await;
        assert!(got.is_ok(), "{alg}: {got:?}");
        let tampered = tamper_signature(&token);
        assert!(
            matches!(
                verifier.verify(&tampered, Audience::Mcp).await,
                Err(TokenError::BadSignature)
            ),
            "{alg}: a tampered signature must not verify"
        );
        // The same signature over other claims does not verify either.
        let (_, sig) = token.rsplit_once('.').expect("parts");
        let other = key.signing.sign(&claims(NOW + 1)).expect("sign");
        let (other_input, _) = other.rsplit_once('.').expect("parts");
        assert!(
            matches!(
                verifier
                    .verify(&format!("{other_input}.{sig}"), Audience::Mcp)
                    .await,
                Err(TokenError::BadSignature)
            ),
            "{alg}: a signature moved to other claims must not verify"
        );
    }
}

#[tokio::test]
async fn jwk_component_keys_verify_for_every_asymmetric_algorithm() {
    let keys: Vec<TestKey> = Alg::ALL
        .iter()
        .filter(|&&alg| alg != Alg::HS256 && alg != Alg::PS256)
        .map(|&alg| testkit::key(alg, &format!("jwk-{}", alg.name())))
        .collect();
    let jwks = json!({
        "keys": keys.iter().map(|k| k.signing.public_jwk().expect("jwk")).collect::<Vec<_>>()
    });
    let mut cfg = testkit::config(Vec::new());
    cfg.jwks.push(inline_jwks(jwks.to_string()));
    let (verifier, _) = testkit::verifier(&cfg).await;
    assert_eq!(verifier.key_count(), keys.len());
    for key in &keys {
        let token = key.signing.sign(&claims(NOW)).expect("sign");
        let alg = key.signing.alg();
        assert!(
            verifier.verify(&token, Audience::Mcp).await.is_ok(),
            "{alg}"
        );
        assert!(
            matches!(
                verifier
                    .verify(&tamper_signature(&token), Audience::Mcp)
                    .await,
                Err(TokenError::BadSignature)
            ),
            "{alg}"
        );
    }
}

#[tokio::test]
async fn the_act_chain_is_read_current_actor_first_and_bounded() {
    let s = setup().await;
    let c = claims(NOW);
    assert!(s
        .mcp(&s.ec_token(&c))
        .await
        .expect("valid")
        .delegation
        .is_empty());
    let mut c = claims(NOW);
    c["act"] = serde_json::json!({"sub": "agent:planner", "act": {"sub": "user:olga", "iss": "https://idp"}});
    let got = s.mcp(&s.ec_token(&c)).await.expect("valid");
    assert_eq!(&*got.delegation, ["agent:planner", "user:olga"]);
    // Not an actor: refused, naming the claim.
    for bad in [
        serde_json::json!("agent:planner"),
        serde_json::json!({"iss": "https://idp"}),
        serde_json::json!({"sub": ""}),
        serde_json::json!({"sub": "a\u{7}b"}),
        serde_json::json!({"sub": "a", "act": {"sub": 7}}),
    ] {
        let mut c = claims(NOW);
        c["act"] = bad.clone();
        assert!(
            matches!(
                s.mcp(&s.ec_token(&c)).await,
                Err(TokenError::InvalidClaim { claim: "act", .. })
            ),
            "{bad}"
        );
    }
    // Nine nested actors: past the bound.
    let mut act = serde_json::json!({"sub": "a8"});
    for i in (0..8).rev() {
        act = serde_json::json!({"sub": format!("a{i}"), "act": act});
    }
    let mut c = claims(NOW);
    c["act"] = act;
    assert!(matches!(
        s.mcp(&s.ec_token(&c)).await,
        Err(TokenError::InvalidClaim {
            claim: "act",
            problem: crate::auth::token::ClaimProblem::TooLong { max: 8 }
        })
    ));
}
