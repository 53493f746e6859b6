use super::*;
use crate::auth::config::{KeyConfig, SecretString};
use crate::auth::testkit::{self, KeyFiles};

fn dev_config() -> AuthConfig {
    testkit::config(vec![KeyConfig {
        kid: Some("dev".into()),
        alg: "HS256".into(),
        pem_file: None,
        secret_env: None,
        secret_file: None,
        secret: Some(SecretString::new(testkit::HS_SECRET)),
    }])
}

fn mint_claims(audience: Audience) -> MintClaims {
    MintClaims {
        audience,
        issuer: None,
        sub: "dev-user".into(),
        tenant_id: "tenant-1".into(),
        agent: "coder".into(),
        run_id: "run-1".into(),
        mode: Mode::Caller,
        projects: vec!["alpha".into()],
        project_ceiling: Some(vec!["alpha".into(), "beta".into()]),
        scopes: Vec::new(),
        jti: None,
        run_exp: None,
    }
}

#[tokio::test]
async fn minted_dev_token_verifies_for_its_audience_only() {
    let cfg = dev_config();
    let verifier = Verifier::new(&cfg).await.expect("verifier");
    let token = mint(&cfg, &mint_claims(Audience::Mcp), Duration::from_secs(300)).expect("mint");
    let claims = verifier.verify(&token, Audience::Mcp).await.expect("valid");
    assert_eq!(&*claims.sub, "dev-user");
    assert_eq!(&*claims.scopes, ["mcp:tools"]);
    assert_eq!(
        claims.project_ceiling.as_deref(),
        Some(&["alpha".to_owned(), "beta".to_owned()][..])
    );
    assert_eq!(claims.exp - claims.iat, 300);
    assert_eq!(claims.kid.as_deref(), Some("dev"));
    assert_eq!(claims.jti.len(), 36, "a random UUID jti");
    assert_eq!(
        verifier.verify(&token, Audience::Admin).await,
        Err(TokenError::WrongAudience {
            expected: Audience::Admin
        })
    );
    let admin = mint(&cfg, &mint_claims(Audience::Admin), Duration::from_secs(60)).expect("mint");
    let claims = verifier
        .verify(&admin, Audience::Admin)
        .await
        .expect("valid");
    assert_eq!(&*claims.scopes, ["approvals"]);
}

#[test]
fn lifetime_beyond_the_maximum_is_refused() {
    let cfg = dev_config();
    let err =
        mint(&cfg, &mint_claims(Audience::Mcp), Duration::from_secs(901)).expect_err("too long");
    assert!(
        matches!(
            err,
            MintError::Lifetime {
                requested_s: 901,
                max_s: 900
            }
        ),
        "{err}"
    );
    assert!(matches!(
        mint(&cfg, &mint_claims(Audience::Mcp), Duration::ZERO),
        Err(MintError::Lifetime { .. })
    ));
}

#[test]
fn untrusted_issuer_is_refused() {
    let mut claims = mint_claims(Audience::Mcp);
    claims.issuer = Some("https://elsewhere.test".into());
    let err = mint(&dev_config(), &claims, Duration::from_secs(60)).expect_err("untrusted");
    assert!(matches!(err, MintError::UntrustedIssuer { .. }), "{err}");
}

#[test]
fn config_without_hs256_key_cannot_mint() {
    let files = KeyFiles::new();
    let cfg = testkit::config(vec![files.entry(&testkit::key(Alg::ES256, "k"))]);
    assert!(matches!(
        mint(&cfg, &mint_claims(Audience::Mcp), Duration::from_secs(60)),
        Err(MintError::NoDevKey)
    ));
}

#[test]
fn secret_from_env_is_used_for_minting() {
    let var = "MCP_FIREWALL_AUTH_TEST_SECRET_MINT";
    // Only this test reads or writes this variable.
    std::env::set_var(var, testkit::HS_SECRET);
    let mut cfg = dev_config();
    cfg.keys[0].secret = None;
    cfg.keys[0].secret_env = Some(var.into());
    assert!(SigningKey::from_config(&cfg).is_ok());
    cfg.keys[0].secret_env = Some("MCP_FIREWALL_AUTH_TEST_UNSET_VAR".into());
    assert!(matches!(
        SigningKey::from_config(&cfg),
        Err(MintError::Key(KeyError::SecretEnvMissing { .. }))
    ));
}

#[test]
fn pem_signing_key_with_wrong_alg_is_refused() {
    let ec = testkit::key(Alg::ES256, "k");
    assert!(matches!(
        SigningKey::from_pem(Alg::EdDSA, ec.private_pem.as_bytes(), None),
        Err(MintError::BadPrivateKey { alg: Alg::EdDSA })
    ));
    assert!(matches!(
        SigningKey::from_secret(b"s".repeat(32).as_slice(), None).map(|k| k.public_jwk()),
        Ok(Err(MintError::NoPublicJwk))
    ));
}

#[tokio::test]
async fn inspect_explains_each_audience() {
    let cfg = dev_config();
    let verifier = Verifier::new(&cfg).await.expect("verifier");
    let token = mint(&cfg, &mint_claims(Audience::Mcp), Duration::from_secs(60)).expect("mint");
    let report = inspect(&verifier, &token).await;
    assert_eq!(
        report.header.as_ref().and_then(|h| h["alg"].as_str()),
        Some("HS256")
    );
    assert_eq!(
        report.claims.as_ref().and_then(|c| c["sub"].as_str()),
        Some("dev-user")
    );
    assert!(report.mcp.is_ok());
    assert_eq!(
        report.admin.as_ref().err(),
        Some(&TokenError::WrongAudience {
            expected: Audience::Admin
        })
    );
    let text = report.to_string();
    assert!(text.contains("mcp: valid"), "{text}");
    assert!(
        text.contains("admin: refused: aud does not include the admin audience"),
        "{text}"
    );
    assert_eq!(
        verifier.cached_tokens(),
        0,
        "inspection does not touch the cache"
    );
}

#[tokio::test]
async fn inspect_of_garbage_says_why() {
    let verifier = Verifier::new(&dev_config()).await.expect("verifier");
    let report = inspect(&verifier, "garbage").await;
    assert!(report.header.is_none() && report.claims.is_none());
    assert_eq!(
        report.mcp.err(),
        Some(TokenError::Malformed(Malformed::NotThreeParts))
    );
}
