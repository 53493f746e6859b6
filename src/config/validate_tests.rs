use std::path::Path;

use super::*;

const MINIMAL: &str = r#"
[server]
listen = "127.0.0.1:8080"
plaintext = true

[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://idp.test"]
[[auth.keys]]
alg = "HS256"
secret = "test-secret-that-is-long-enough-for-hs256!"

[[upstream]]
name = "incidents"
url = "http://127.0.0.1:9000/mcp"
"#;

fn load(text: &str) -> Result<Config, ConfigError> {
    load_with_env(text, &|_| None)
}

fn load_with_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    load_str(text, Path::new("test.toml"), Path::new("/nonexistent"), env)
}

fn err(text: &str) -> String {
    match load(text) {
        Ok(_) => panic!("config unexpectedly valid:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn minimal_plaintext_config_loads_with_defaults() {
    let c = load(MINIMAL).unwrap();
    assert!(c.server.tls.is_none());
    assert_eq!(c.server.public_url, "http://127.0.0.1:8080");
    assert_eq!(c.server.max_request_bytes, 1024 * 1024);
    assert_eq!(c.upstreams.len(), 1);
    let u = &c.upstreams[0];
    assert_eq!(u.name, "incidents");
    assert!(!u.tls);
    assert_eq!(u.connect_timeout, Duration::from_secs(5));
    assert_eq!(u.max_request_bytes, 1024 * 1024);
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let e = err(&MINIMAL.replace("plaintext = true", "plaintext = true\nlisten_port = 3"));
    assert!(e.starts_with("test.toml: "), "{e}");
    assert!(e.contains("listen_port"), "{e}");
    assert!(e.contains("line 5"), "{e}");
}

#[test]
fn tls_is_required_unless_plaintext_is_explicit() {
    let e = err(&MINIMAL.replace("plaintext = true\n", ""));
    assert!(e.contains("server.tls: missing"), "{e}");
}

#[test]
fn plaintext_and_tls_exclude_each_other() {
    let e = err(&MINIMAL.replace(
        "plaintext = true\n",
        "plaintext = true\n[server.tls]\ncert = \"a\"\nkey = \"b\"\n",
    ));
    assert!(e.contains("server.plaintext"), "{e}");
}

#[test]
fn missing_tls_files_are_named() {
    let e = err(&MINIMAL.replace(
        "plaintext = true\n",
        "[server.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n",
    ));
    assert!(
        e.contains("server.tls.cert: /nonexistent/cert.pem is not a readable file"),
        "{e}"
    );
}

#[test]
fn bad_upstream_url_names_its_index() {
    let e = err(&MINIMAL.replace("http://127.0.0.1:9000/mcp", "ftp://x/mcp"));
    assert!(e.contains("upstream[0].url"), "{e}");
    assert!(e.contains("http:// or https://"), "{e}");
}

#[test]
fn bad_upstream_name_is_rejected() {
    let e = err(&MINIMAL.replace("name = \"incidents\"", "name = \"in/cidents\""));
    assert!(e.contains("upstream[0].name"), "{e}");
}

#[test]
fn duplicate_upstream_names_are_rejected() {
    let text = format!("{MINIMAL}\n[[upstream]]\nname = \"incidents\"\nurl = \"http://x/mcp\"\n");
    let e = err(&text);
    assert!(
        e.contains("upstream[1].name: duplicate upstream name"),
        "{e}"
    );
}

#[test]
fn ca_file_on_plain_http_upstream_is_rejected() {
    let e = err(&format!("{MINIMAL}ca_file = \"ca.pem\"\n"));
    assert!(e.contains("upstream[0].ca_file"), "{e}");
}

#[test]
fn zero_http2_streams_per_connection_is_rejected() {
    let e = err(&format!("{MINIMAL}http2 = true\nhttp2_max_streams = 0\n"));
    assert!(
        e.contains("upstream[0].http2_max_streams: must be greater than 0"),
        "{e}"
    );
}

#[test]
fn zero_limits_are_rejected() {
    let e = err(&MINIMAL.replace("plaintext = true", "plaintext = true\nmax_batch = 0"));
    assert!(
        e.contains("server.max_batch: must be greater than 0"),
        "{e}"
    );
}

#[test]
fn injected_secret_from_env_is_read_and_never_printed() {
    let text = format!(
        "{MINIMAL}[upstream.headers]\n\"X-Api-Key\" = {{ env = \"VENDOR_KEY\", prefix = \"Key \" }}\n"
    );
    let c = load_with_env(&text, &|name| {
        (name == "VENDOR_KEY").then(|| "s3cr3t".to_owned())
    })
    .unwrap();
    let (name, secret) = &c.upstreams[0].inject[0];
    assert_eq!(name, "x-api-key");
    assert_eq!(secret.header_value(), "Key s3cr3t");
    assert!(secret.header_value().is_sensitive());
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("s3cr3t"),
        "secret leaked into Debug: {debug}"
    );
}

#[test]
fn missing_secret_env_var_is_named() {
    let text = format!("{MINIMAL}[upstream.headers]\n\"X-Api-Key\" = {{ env = \"NOPE\" }}\n");
    let e = err(&text);
    assert!(
        e.contains("upstream[0].headers.X-Api-Key: environment variable NOPE is not set"),
        "{e}"
    );
}

#[test]
fn header_value_needs_exactly_one_source() {
    let text =
        format!("{MINIMAL}[upstream.headers]\n\"X-Api-Key\" = {{ value = \"a\", env = \"B\" }}\n");
    assert!(err(&text).contains("exactly one of"));
}

#[test]
fn hop_by_hop_headers_cannot_be_injected() {
    let text = format!("{MINIMAL}[upstream.headers]\n\"Connection\" = {{ value = \"close\" }}\n");
    assert!(err(&text).contains("managed by the proxy"));
}

#[test]
fn secret_from_file_has_trailing_newline_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "abc\n").unwrap();
    let text = format!(
        "{MINIMAL}[upstream.headers]\n\"Authorization\" = {{ file = \"token\", prefix = \"Bearer \" }}\n"
    );
    let c = load_str(&text, Path::new("t.toml"), dir.path(), &|_| None).unwrap();
    assert_eq!(c.upstreams[0].inject[0].1.header_value(), "Bearer abc");
}

#[test]
fn request_path_settings_are_validated_and_defaulted() {
    let c = load(MINIMAL).unwrap();
    assert_eq!(c.server.allowed_origins, vec!["http://127.0.0.1:8080"]);
    assert_eq!(
        c.server.allowed_hosts,
        vec!["localhost", "127.0.0.1", "::1"]
    );
    assert!(c.server.trusted_proxies.is_empty());
    assert_eq!(c.server.max_connections, 20_000);
    assert!(c.session_keys.is_empty());
    let u = &c.upstreams[0];
    assert!(!u.forward_query && u.forward_headers.is_empty() && u.extra_methods.is_empty());

    let text = MINIMAL.replace(
        "plaintext = true",
        "plaintext = true\nallowed_origins = [\"https://App.Example.com:443\"]\ntrusted_proxies = [\"10.0.0.0/8\", \"192.0.2.7\"]\n",
    );
    let c = load(&text).unwrap();
    assert_eq!(c.server.allowed_origins, vec!["https://app.example.com"]);
    assert_eq!(c.server.trusted_proxies.len(), 2);
    assert!(err(&MINIMAL.replace(
        "plaintext = true",
        "plaintext = true\nallowed_origins = [\"https://a.example.com/path\"]"
    ))
    .contains("server.allowed_origins[0]"));
    assert!(err(&MINIMAL.replace(
        "plaintext = true",
        "plaintext = true\ntrusted_proxies = [\"10.0.0.0/33\"]"
    ))
    .contains("server.trusted_proxies[0]"));
}

#[test]
fn session_keys_need_an_id_and_enough_bytes() {
    let with = |keys: &str| format!("{MINIMAL}\n[sessions]\nkeys = [{keys}]\n");
    let c = load(&with(
        r#"{ id = "k1", value = "0123456789abcdef0123456789abcdef" }"#,
    ))
    .unwrap();
    assert_eq!(c.session_keys[0].id, "k1");
    assert!(err(&with(r#"{ id = "k1", value = "short" }"#)).contains("at least 32 bytes"));
    assert!(err(&with(
        r#"{ id = "bad id", value = "0123456789abcdef0123456789abcdef" }"#
    ))
    .contains("sessions.keys[0].id"));
    assert!(err(&with(r#"{ id = "k1", value = "0123456789abcdef0123456789abcdef" }, { id = "k1", value = "0123456789abcdef0123456789abcdeX" }"#)).contains("duplicate key id"));
    assert!(err(&with(r#"{ id = "k1", env = "NOPE" }"#)).contains("NOPE"));
}

#[test]
fn extra_methods_and_forwarded_headers_are_checked() {
    let up = |extra: &str| {
        MINIMAL.replace(
            "url = \"http://127.0.0.1:9000/mcp\"",
            &format!("url = \"http://127.0.0.1:9000/mcp\"\n{extra}"),
        )
    };
    let c = load(&up("extra_methods = [{ name = \"vendor/x\", risk = \"write\" }]\nforward_headers = [\"X-Tenant-Hint\"]\nforward_query = true")).unwrap();
    let u = &c.upstreams[0];
    assert_eq!(u.extra_methods[0].name, "vendor/x");
    assert_eq!(u.forward_headers[0].as_str(), "x-tenant-hint");
    assert!(err(&up(
        "extra_methods = [{ name = \"tools/call\", risk = \"read\" }]"
    ))
    .contains("an MCP method"));
    assert!(
        err(&up("extra_methods = [{ name = \"v/x\", risk = \"huge\" }]")).contains("unknown risk")
    );
    assert!(err(&up(
        "extra_methods = [{ name = \"v/x\", kind = \"stream\", risk = \"read\" }]"
    ))
    .contains("kind"));
    for managed in [
        "Cookie",
        "Authorization",
        "Mcp-Session-Id",
        "Host",
        "Origin",
    ] {
        assert!(
            err(&up(&format!("forward_headers = [\"{managed}\"]")))
                .contains("managed by the firewall"),
            "{managed}"
        );
    }
}

const EXCHANGE: &str = r#"auth = "token_exchange"
[upstream.token_exchange]
token_endpoint = "https://idp.example.com/oauth2/token"
client_id = "mcp-firewall"
client_secret = { env = "MCP_FIREWALL_IDP_SECRET" }
audience = "tickets"
scope = "tickets:read tickets:write"
"#;

fn idp_env(name: &str) -> Option<String> {
    (name == "MCP_FIREWALL_IDP_SECRET").then(|| "idp-s3cr3t".to_owned())
}

#[test]
fn token_exchange_is_read_with_its_secret_never_printed() {
    let c = load_with_env(&format!("{MINIMAL}{EXCHANGE}"), &idp_env).unwrap();
    let crate::config::UpstreamAuth::Exchange(x) = &c.upstreams[0].auth else {
        panic!("not an exchange: {:?}", c.upstreams[0].auth);
    };
    assert_eq!(x.token_endpoint, "https://idp.example.com/oauth2/token");
    assert_eq!(x.audience.as_deref(), Some("tickets"));
    assert_eq!(x.scope.as_deref(), Some("tickets:read tickets:write"));
    assert_eq!(x.timeout, std::time::Duration::from_secs(5));
    assert_eq!(c.upstreams[0].auth.name(), "exchange");
    let debug = format!("{c:?}");
    assert!(!debug.contains("idp-s3cr3t"), "{debug}");
    // The default stays static.
    assert_eq!(load(MINIMAL).unwrap().upstreams[0].auth.name(), "static");
}

#[test]
fn token_exchange_mistakes_are_named() {
    let with = |edit: &dyn Fn(&str) -> String| match load_with_env(
        &edit(&format!("{MINIMAL}{EXCHANGE}")),
        &idp_env,
    ) {
        Ok(_) => panic!("valid"),
        Err(e) => e.to_string(),
    };
    let cases: Vec<(String, &str)> = vec![
        (
            with(&|t| t.replace("https://idp.example.com", "http://idp.example.com")),
            "upstream[0].token_exchange.token_endpoint: \"http://idp.example.com/oauth2/token\": the client's credentials go there; use https://",
        ),
        (
            with(&|t| t.replace("client_secret = { env = \"MCP_FIREWALL_IDP_SECRET\" }\n", "")),
            "upstream[0].token_exchange.client_secret: the firewall authenticates as its client",
        ),
        (
            with(&|t| t.replace("audience = \"tickets\"\n", "")),
            "upstream[0].token_exchange.audience: name the upstream's audience",
        ),
        (
            with(&|t| t.replace("client_secret = { env = \"MCP_FIREWALL_IDP_SECRET\" }", "client_secret = { env = \"NOPE\" }")),
            "upstream[0].token_exchange.client_secret: environment variable NOPE is not set",
        ),
        (
            with(&|t| t.replace("[upstream.token_exchange]", "[upstream.headers]\nAuthorization = { value = \"Bearer static\" }\n[upstream.token_exchange]")),
            "upstream[0].headers.Authorization: with auth = \"token_exchange\" the firewall sets Authorization",
        ),
        (
            with(&|t| t.replace("auth = \"token_exchange\"", "auth = \"static\"")),
            "upstream[0].token_exchange: only with auth = \"token_exchange\"",
        ),
        (
            with(&|t| t.replace("auth = \"token_exchange\"", "auth = \"oauth_user\"")),
            "upstream[0].token_exchange: only with auth = \"token_exchange\"",
        ),
        (
            with(&|t| t.replace("scope = \"tickets:read tickets:write\"", "scope = \"  \"")),
            "upstream[0].token_exchange.scope: must not be empty",
        ),
        (
            with(&|t| format!("{t}timeout_ms = 0\n")),
            "upstream[0].token_exchange.timeout_ms: must be 1-60000",
        ),
    ];
    for (e, want) in cases {
        assert!(e.contains(want), "{e}\n  wanted: {want}");
    }
    // A loopback endpoint may be plain http (nothing leaves the machine).
    let local =
        format!("{MINIMAL}{EXCHANGE}").replace("https://idp.example.com", "http://127.0.0.1:8081");
    assert!(load_with_env(&local, &idp_env).is_ok());
    // Without its section.
    let e = err(&format!("{MINIMAL}auth = \"token_exchange\"\n"));
    assert!(
        e.contains("needs an [upstream.token_exchange] section"),
        "{e}"
    );
}

const OAUTH_USER: &str = r#"auth = "oauth_user"
[upstream.oauth_user]
authorization_server = "https://github.example/login/oauth"
client_id = "fw"
client_secret = { env = "GH_SECRET" }
scopes = ["repo", "read:org"]
"#;

fn gh_env(k: &str) -> Option<String> {
    (k == "GH_SECRET").then(|| "gh-s3cr3t".to_owned())
}

/// A key file (mode `mode`) and the `[credentials]` naming it.
fn credentials_section(dir: &Path, mode: u32, extra: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let key = dir.join("credentials.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
    format!(
        "\n[credentials]\nkey_file = {:?}\ndir = {:?}\n{extra}",
        key.display().to_string(),
        dir.join("store").display().to_string()
    )
}

#[test]
fn oauth_user_is_read_with_its_key_and_secret_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{MINIMAL}{OAUTH_USER}{}",
        credentials_section(dir.path(), 0o600, "")
    );
    let c = load_with_env(&text, &gh_env).unwrap();
    let crate::config::UpstreamAuth::User(u) = &c.upstreams[0].auth else {
        panic!("not oauth_user: {:?}", c.upstreams[0].auth);
    };
    assert_eq!(c.upstreams[0].auth.name(), "user");
    assert_eq!(u.scope, "repo read:org");
    assert_eq!(
        u.resource, "http://127.0.0.1:9000/mcp",
        "the upstream's URL by default"
    );
    assert!(matches!(
        u.server,
        crate::config::AuthorizationServer::Issuer(_)
    ));
    let creds = c.credentials.as_ref().unwrap();
    assert_eq!(creds.key, [0xab; 32]);
    assert_eq!(
        creds.public_url, "http://127.0.0.1:9090",
        "the admin address by default"
    );
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("gh-s3cr3t") && !debug.contains("171, 171"),
        "{debug}"
    );
}

#[test]
fn oauth_user_mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = credentials_section(dir.path(), 0o600, "");
    let with = |text: String| match load_with_env(&text, &gh_env) {
        Ok(_) => panic!("valid:\n{text}"),
        Err(e) => e.to_string(),
    };
    let cases: Vec<(String, &str)> = vec![
        (
            with(format!("{MINIMAL}{OAUTH_USER}")),
            "upstream[0].auth: \"oauth_user\" keeps each user's token encrypted: add a [credentials] section",
        ),
        (
            with(format!("{MINIMAL}{OAUTH_USER}{}", credentials_section(dir.path(), 0o644, ""))),
            "is readable by others (mode 644): chmod 600 it",
        ),
        (
            with(format!("{MINIMAL}{}{good}", OAUTH_USER.replace("authorization_server = \"https://github.example/login/oauth\"", "authorization_server = \"http://github.example/login/oauth\""))),
            "upstream[0].oauth_user.authorization_server: \"http://github.example/login/oauth\": the client's credentials go there",
        ),
        (
            with(format!("{MINIMAL}{}{good}", OAUTH_USER.replace("client_id = \"fw\"", "client_id = \"fw\"\ntoken_endpoint = \"https://github.example/token\""))),
            "upstream[0].oauth_user.authorization_server: give the authorization server",
        ),
        (
            with(format!("{MINIMAL}{}{good}", OAUTH_USER.replace("authorization_server = \"https://github.example/login/oauth\"", "token_endpoint = \"https://github.example/token\""))),
            "upstream[0].oauth_user.authorization_endpoint: give both authorization_endpoint and token_endpoint",
        ),
        (
            with(format!("{MINIMAL}{}{good}", OAUTH_USER.replace("[\"repo\", \"read:org\"]", "[\"repo read\"]"))),
            "upstream[0].oauth_user.scopes: \"repo read\" is not a scope token",
        ),
        (
            with(format!("{MINIMAL}{OAUTH_USER}{}", credentials_section(dir.path(), 0o600, "store = \"postgres\"\n").replace("dir = ", "# dir = "))),
            "credentials.store: \"postgres\" keeps tokens in the approvals database",
        ),
        (
            with(format!("{MINIMAL}{OAUTH_USER}{}", credentials_section(dir.path(), 0o600, "link_ttl_s = 5\n"))),
            "credentials.link_ttl_s: must be 30-86400",
        ),
        (
            with(format!("{MINIMAL}{}{good}", OAUTH_USER.replace("[upstream.oauth_user]", "[upstream.headers]\nAuthorization = { value = \"Bearer x\" }\n[upstream.oauth_user]"))),
            "upstream[0].headers.Authorization: with auth = \"oauth_user\" the firewall sets Authorization",
        ),
    ];
    for (e, want) in cases {
        assert!(e.contains(want), "{e}\n  wanted: {want}");
    }
    // A key that is not 32 bytes.
    std::fs::write(dir.path().join("credentials.key"), "short").unwrap();
    let e = with(format!(
        "{MINIMAL}{OAUTH_USER}\n[credentials]\nkey_file = {:?}\n",
        dir.path().join("credentials.key").display().to_string()
    ));
    assert!(e.contains("is not a 32-byte key"), "{e}");
}
