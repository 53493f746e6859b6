use super::*;

const BASE: &str = r#"
mcp_audience = "https://fw.test/mcp"
admin_audience = "https://fw.test/admin"
issuers = ["https://issuer.test", "https://sa.test"]
service_account_issuer = "https://sa.test"

[[keys]]
kid = "k0"
alg = "ES256"
pem_file = "keys/ec.pem"

[[keys]]
kid = "k1"
alg = "HS256"
secret = "0123456789abcdef0123456789abcdef"

[[keys]]
kid = "k2"
alg = "EdDSA"
pem_file = "/abs/ed.pem"

[[jwks]]
url = "https://idp.test/.well-known/jwks.json"
"#;

fn parse(extra: &str) -> Result<AuthConfig, toml::de::Error> {
    toml::from_str(&format!("{BASE}{extra}"))
}

fn base() -> AuthConfig {
    parse("").expect("base config parses")
}

#[test]
fn defaults_are_applied() {
    let cfg = base();
    assert_eq!(cfg.validate(), Ok(()));
    assert_eq!(cfg.header, "X-Tool-Token");
    assert_eq!(cfg.required_scope, "mcp:tools");
    assert_eq!(cfg.admin_scope, "approvals");
    assert_eq!(
        (cfg.leeway_s, cfg.max_lifetime_s, cfg.cache_entries),
        (30, 900, 65_536)
    );
    let jwks = &cfg.jwks[0];
    assert_eq!(
        (
            jwks.refresh_s,
            jwks.min_refresh_interval_s,
            jwks.rsa_alg.as_str()
        ),
        (300, 10, "RS256")
    );
    assert_eq!(cfg.header_name().expect("header").as_str(), "x-tool-token");
}

#[test]
fn unknown_keys_are_refused() {
    let err =
        parse("\n[[jwks]]\nurl = \"https://x.test/j\"\nrefresh = 5\n").expect_err("unknown key");
    assert!(err.to_string().contains("refresh"), "{err}");
    let err = toml::from_str::<AuthConfig>(&format!("leway_s = 3\n{BASE}")).expect_err("typo");
    assert!(err.to_string().contains("leway_s"), "{err}");
}

#[test]
fn alg_none_names_the_key() {
    let mut cfg = base();
    cfg.keys[2].alg = "none".into();
    let err = cfg.validate().expect_err("none");
    assert_eq!(
        err.to_string(),
        "auth.keys[2].alg: \"none\" is never accepted"
    );
}

#[test]
fn unsupported_alg_lists_the_supported_ones() {
    let mut cfg = base();
    cfg.keys[0].alg = "HS512".into();
    assert_eq!(
        cfg.validate().expect_err("HS512").to_string(),
        "auth.keys[0].alg: \"HS512\" is not supported (expected one of RS256, PS256, ES256, ES384, EdDSA, HS256)"
    );
}

#[test]
fn key_material_must_be_exactly_one_and_fit_the_alg() {
    let mut cfg = base();
    cfg.keys[1].secret_env = Some("X".into());
    assert_eq!(
        cfg.validate(),
        Err(ConfigError::ExactlyOne {
            key: "auth.keys[1]".into(),
            options: "pem_file, secret_env, secret_file, secret",
            found: 2
        })
    );
    let mut cfg = base();
    cfg.keys[0].pem_file = None;
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::ExactlyOne { found: 0, .. })
    ));
    let mut cfg = base();
    cfg.keys[0].pem_file = None;
    cfg.keys[0].secret = Some(SecretString::new("x".repeat(40)));
    assert_eq!(
        cfg.validate().expect_err("secret for ES256").to_string(),
        "auth.keys[0]: ES256 needs a public key (pem_file); secrets are only for HS256"
    );
    let mut cfg = base();
    cfg.keys[1].secret = None;
    cfg.keys[1].pem_file = Some("k.pem".into());
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::MaterialMismatch {
            alg: Alg::HS256,
            ..
        })
    ));
}

#[test]
fn duplicate_kids_are_refused() {
    let mut cfg = base();
    cfg.keys[2].kid = Some("k0".into());
    assert_eq!(
        cfg.validate(),
        Err(ConfigError::Duplicate {
            key: "auth.keys[2].kid".into(),
            value: "k0".into()
        })
    );
}

#[test]
fn audiences_must_differ() {
    let mut cfg = base();
    cfg.admin_audience = cfg.mcp_audience.clone();
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::SameAudiences { .. })
    ));
}

#[test]
fn service_account_issuer_must_be_trusted() {
    let mut cfg = base();
    cfg.service_account_issuer = Some("https://other.test".into());
    assert_eq!(
        cfg.validate().expect_err("untrusted").to_string(),
        "auth.service_account_issuer: \"https://other.test\" is not in auth.issuers"
    );
}

#[test]
fn issuers_are_required_and_unique() {
    let mut cfg = base();
    cfg.issuers.clear();
    cfg.service_account_issuer = None;
    assert_eq!(cfg.validate(), Err(ConfigError::NoIssuers));
    let mut cfg = base();
    cfg.issuers.push("https://issuer.test".into());
    assert!(matches!(cfg.validate(), Err(ConfigError::Duplicate { .. })));
}

#[test]
fn some_key_source_is_required() {
    let mut cfg = base();
    cfg.keys.clear();
    cfg.jwks.clear();
    assert_eq!(cfg.validate(), Err(ConfigError::NoKeys));
}

#[test]
fn jwks_source_must_be_exactly_one_kind() {
    let mut cfg = base();
    cfg.jwks[0].inline = Some("{}".into());
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::ExactlyOne { found: 2, .. })
    ));
}

#[test]
fn jwks_urls_must_be_https_unless_loopback() {
    for (url, ok) in [
        ("http://idp.test/jwks", false),
        ("http://10.0.0.1/jwks", false),
        ("ftp://idp.test/jwks", false),
        ("not a url", false),
        ("http://127.0.0.1:8080/jwks", true),
        ("http://localhost/jwks", true),
        ("http://[::1]:9/jwks", true),
        ("https://idp.test/jwks", true),
    ] {
        let mut cfg = base();
        cfg.jwks[0].url = Some(url.into());
        assert_eq!(cfg.validate().is_ok(), ok, "{url}: {:?}", cfg.validate());
    }
}

#[test]
fn ca_file_only_applies_to_urls() {
    let mut cfg = base();
    cfg.jwks[0].url = None;
    cfg.jwks[0].file = Some("jwks.json".into());
    cfg.jwks[0].ca_file = Some("ca.pem".into());
    assert_eq!(
        cfg.validate(),
        Err(ConfigError::OnlyForUrl {
            key: "auth.jwks[0].ca_file".into()
        })
    );
}

#[test]
fn rsa_default_alg_must_be_an_rsa_alg() {
    let mut cfg = base();
    cfg.jwks[0].rsa_alg = "ES256".into();
    assert_eq!(
        cfg.validate().expect_err("ES256").to_string(),
        "auth.jwks[0].rsa_alg: \"ES256\" is not supported (expected one of RS256, PS256)"
    );
}

#[test]
fn numbers_out_of_range_are_refused() {
    let mut cfg = base();
    cfg.leeway_s = 301;
    assert_eq!(
        cfg.validate(),
        Err(ConfigError::OutOfRange {
            key: "auth.leeway_s".into(),
            value: 301,
            min: 0,
            max: 300
        })
    );
    let mut cfg = base();
    cfg.max_lifetime_s = 0;
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::OutOfRange { .. })
    ));
    let mut cfg = base();
    cfg.jwks[0].min_refresh_interval_s = 0;
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::OutOfRange { .. })
    ));
}

#[test]
fn token_header_must_be_a_name_other_than_authorization() {
    for bad in ["Authorization", "bad header", ""] {
        let mut cfg = base();
        cfg.header = bad.into();
        assert!(
            matches!(cfg.validate(), Err(ConfigError::BadHeader { .. })),
            "{bad}"
        );
    }
}

#[test]
fn scopes_must_be_single_words() {
    let mut cfg = base();
    cfg.required_scope = "mcp tools".into();
    assert!(matches!(
        cfg.validate(),
        Err(ConfigError::ScopeWhitespace { .. })
    ));
}

#[test]
fn debug_output_never_shows_secrets() {
    let text = format!("{:?}", base());
    assert!(!text.contains("0123456789abcdef"), "{text}");
    assert!(text.contains("[redacted]"));
}

#[test]
fn relative_paths_resolve_against_the_config_directory() {
    let mut cfg = base();
    cfg.resolve_paths(Path::new("/etc/fw"));
    assert_eq!(
        cfg.keys[0].pem_file.as_deref(),
        Some(Path::new("/etc/fw/keys/ec.pem"))
    );
    assert_eq!(
        cfg.keys[2].pem_file.as_deref(),
        Some(Path::new("/abs/ed.pem"))
    );
}
