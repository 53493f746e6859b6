//! The command line: every shipped config validates with `check`, and
//! `token mint`, `token inspect` and `explain` do what they say.

use std::path::Path;
use std::process::Command;

use crate::common;

fn firewall() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("run mcp-firewall");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A copy of a shipped config in a temp dir, with what it refers to
/// (certificates, secret files, the policies) created there.
fn staged(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(root.join("config").join(name)).unwrap();
    text = text
        .replace("{{LISTEN}}", "127.0.0.1:0")
        .replace("{{ADMIN}}", "127.0.0.1:0")
        .replace("{{SECRET}}", "0123456789abcdef0123456789abcdef")
        .replace("{{UPSTREAM_URL}}", "http://127.0.0.1:1/mcp")
        .replace("{{APPROVALS_DIR}}", "approvals");
    std::fs::create_dir_all(dir.path().join("config/certs")).unwrap();
    std::fs::create_dir_all(dir.path().join("config/secrets")).unwrap();
    std::fs::write(dir.path().join("config").join(name), text).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.path().join("config/certs/server.pem"), cert.cert.pem()).unwrap();
    std::fs::write(
        dir.path().join("config/certs/server.key"),
        cert.signing_key.serialize_pem(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config/certs/internal-ca.pem"),
        cert.cert.pem(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config/secrets/k8s-mcp-token"),
        "k8s-token\n",
    )
    .unwrap();
    common::copy_policies(&common::shipped_policies(), &dir.path().join("policies"));
    dir
}

#[test]
fn every_shipped_config_passes_check() {
    for name in ["example.toml", "demo.toml"] {
        let dir = staged(name);
        let (ok, out) = run(firewall()
            .args(["check", "--config"])
            .arg(dir.path().join("config").join(name))
            .env("INCIDENTS_TOKEN", "t")
            .env("GRAFANA_API_KEY", "g")
            .env("CLICKHOUSE_PASSWORD", "p")
            .env(
                "MCP_FIREWALL_SESSION_KEY",
                "a-session-key-of-at-least-32-bytes!",
            ));
        assert!(ok, "{name}: {out}");
        assert!(out.contains(": ok"), "{out}");
        assert!(out.contains("role incident-investigator"), "{out}");
    }
}

#[test]
fn check_summarizes_roles_and_gates() {
    let dir = staged("demo.toml");
    let (ok, out) = run(firewall()
        .args(["check", "--config"])
        .arg(dir.path().join("config/demo.toml")));
    assert!(ok, "{out}");
    let investigator = out
        .split("role incident-investigator")
        .nth(1)
        .unwrap()
        .split("\nrole ")
        .next()
        .unwrap();
    assert!(
        investigator.contains("get_incident (read, allow)"),
        "{investigator}"
    );
    assert!(
        !investigator.contains("rollback_deployment"),
        "{investigator}"
    );
    let lead = out
        .split("role sre-lead")
        .nth(1)
        .unwrap()
        .split("\nrole ")
        .next()
        .unwrap();
    assert!(
        lead.contains("rollback_deployment (destructive, approve)"),
        "{lead}"
    );
}

#[test]
fn check_reports_a_bad_config_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\nplaintext = true\nlisten_port = 1\n",
    )
    .unwrap();
    let (ok, out) = run(firewall().args(["check", "--config"]).arg(&path));
    assert!(!ok);
    assert!(
        out.contains("bad.toml") && out.contains("listen_port") && out.contains("line 4"),
        "{out}"
    );
}

#[test]
fn token_mint_inspect_and_explain() {
    let dir = staged("demo.toml");
    let cfg = dir.path().join("config/demo.toml");
    let (ok, token) = run(firewall()
        .args(["token", "mint", "--config"])
        .arg(&cfg)
        .args([
            "--agent",
            "incident-investigator",
            "--projects",
            "sre",
            "--lifetime-s",
            "600",
        ]));
    assert!(ok, "{token}");
    let token = token.trim().to_owned();
    assert_eq!(token.split('.').count(), 3);

    let (ok, out) = run(firewall()
        .args(["token", "inspect", "--config"])
        .arg(&cfg)
        .arg(&token));
    assert!(ok, "{out}");
    assert!(
        out.to_lowercase().contains("incident-investigator"),
        "{out}"
    );

    let (ok, out) = run(firewall().args(["explain", "--config"]).arg(&cfg).args([
        "--token",
        &token,
        "--upstream",
        "incidents",
        "--tool",
        "rollback_deployment",
    ]));
    assert!(ok, "{out}");
    assert!(
        out.contains("Unknown") && out.contains("may not use destructive"),
        "{out}"
    );

    let (ok, out) = run(firewall().args(["explain", "--config"]).arg(&cfg).args([
        "--token",
        &token,
        "--upstream",
        "incidents",
        "--tool",
        "get_deployment",
        "--arguments",
        r#"{"deployment_id":"x"}"#,
    ]));
    assert!(ok, "{out}");
    assert!(
        out.contains("Deny") && out.contains("dep-<number>"),
        "{out}"
    );
    // Which credential the call would reach its upstream with.
    assert!(out.contains("credential: static"), "{out}");

    // A forged token is explained as refused.
    let (ok, out) = run(firewall().args(["explain", "--config"]).arg(&cfg).args([
        "--token",
        &format!("{token}x"),
        "--upstream",
        "incidents",
        "--tool",
        "get_incident",
    ]));
    assert!(!ok);
    assert!(out.contains("would be refused"), "{out}");
}

/// A config with shared stores at `redis` and `postgres`, in `dir`.
fn shared_stores_config(dir: &Path, redis: &str, postgres: &str) -> std::path::PathBuf {
    let text = crate::common::TestConfig::new()
        .upstream("incidents", "http://127.0.0.1:1/mcp")
        .set("state.backend", "redis")
        .set("state.redis_url", redis)
        .set("approvals.store", "postgres")
        .set("approvals.postgres_url", postgres)
        .text();
    let path = dir.join("fleet.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn check_says_whether_the_shared_stores_answer_and_migrate_creates_the_schema() {
    use crate::common::postgres::Postgres;
    use crate::common::redis::Redis;
    let dir = tempfile::tempdir().unwrap();
    let db = Postgres::shared().await.create_random_database();
    let config = shared_stores_config(dir.path(), &Redis::shared().await.url, &db);

    let (ok, out) = run(firewall().args(["check", "--config"]).arg(&config));
    assert!(ok, "{out}");
    assert!(out.contains("budgets: redis redis://127.0.0.1:"), "{out}");
    assert!(out.contains(": reachable"), "{out}");
    assert!(
        out.contains("(schema version 0)"),
        "not migrated yet: {out}"
    );

    let (ok, out) = run(firewall().args(["migrate", "--config"]).arg(&config));
    assert!(ok, "{out}");
    assert!(out.contains("approvals schema at version 3"), "{out}");
    let (ok, out) = run(firewall().args(["migrate", "--config"]).arg(&config));
    assert!(ok, "migrating twice changes nothing: {out}");
    let (ok, out) = run(firewall().args(["check", "--config"]).arg(&config));
    assert!(ok && out.contains("(schema version 3)"), "{out}");

    // Nothing listens on port 1: both unreachable, exit status non-zero,
    // and no password is printed.
    let config = shared_stores_config(
        dir.path(),
        "redis://:hunter2@127.0.0.1:1",
        "postgres://mcpfw:hunter2@127.0.0.1:1/mcpfw",
    );
    let (ok, out) = run(firewall().args(["check", "--config"]).arg(&config));
    assert!(!ok, "{out}");
    assert!(
        out.contains("budgets: redis") && out.contains("UNREACHABLE"),
        "{out}"
    );
    assert!(out.contains("approvals: postgres"), "{out}");
    assert_eq!(out.matches("UNREACHABLE").count(), 2, "{out}");
    assert!(
        !out.contains("hunter2"),
        "passwords stay out of the output: {out}"
    );
}

#[test]
fn audit_keygen_writes_a_private_key_once_and_pubkey_prints_its_public_half() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("audit-signing.pem");
    let (ok, out) = run(firewall().args(["audit", "keygen", "--out"]).arg(&key));
    assert!(ok, "{out}");
    let published = out
        .lines()
        .find(|l| l.starts_with("ed25519:"))
        .unwrap_or_else(|| panic!("no public key in {out}"))
        .to_owned();
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only the firewall's user reads the key");
    assert!(std::fs::read_to_string(&key)
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY-----"));
    // Never overwritten.
    let before = std::fs::read(&key).unwrap();
    let (ok, out) = run(firewall().args(["audit", "keygen", "--out"]).arg(&key));
    assert!(!ok && out.contains("never overwritten"), "{out}");
    assert_eq!(std::fs::read(&key).unwrap(), before);
    let (ok, out) = run(firewall().args(["audit", "pubkey", "--key"]).arg(&key));
    assert!(ok, "{out}");
    assert_eq!(out.trim(), published);
    // Not a key: a clear error naming the file.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello").unwrap();
    let (ok, out) = run(firewall().args(["audit", "pubkey", "--key"]).arg(&junk));
    assert!(
        !ok && out.contains("junk.pem") && out.contains("PRIVATE KEY"),
        "{out}"
    );
}

#[test]
fn the_help_leads_with_what_people_run_and_hides_the_sandbox_launcher() {
    let (ok, help) = run(firewall().arg("--help"));
    assert!(ok, "{help}");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands[..8],
        [
            "serve",
            "demo",
            "check",
            "explain",
            "test",
            "audit",
            "approvals",
            "pins"
        ],
        "{help}"
    );
    // How the firewall starts a stdio server: not a command for people,
    // yet still there for the firewall.
    assert!(!commands.contains(&"sandbox-exec"), "{help}");
    assert!(!commands.contains(&"egress-forward"), "{help}");
    let (ok, launcher) = run(firewall().args(["sandbox-exec", "--help"]));
    assert!(ok && launcher.contains("--spec"), "{launcher}");
}
