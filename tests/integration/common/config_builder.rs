//! Test configs built as TOML documents: every value typed and every table
//! where it belongs, so a path with a quote in it, or a setting a test
//! changes, is never formatted or patched into text. `text()` renders the
//! document for `config::load_str` and the CLI.

use std::path::Path;

use toml::{Table, Value};

use super::{shipped_policies, AUDIENCE, ISSUER, SECRET};

/// A firewall config under construction.
#[derive(Debug, Clone)]
pub struct TestConfig {
    doc: Table,
}

/// A TOML table from `(key, value)` pairs.
pub fn table<const N: usize>(pairs: [(&str, Value); N]) -> Table {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A path as a TOML string.
pub fn path(p: &Path) -> Value {
    Value::from(p.display().to_string())
}

impl Default for TestConfig {
    fn default() -> TestConfig {
        TestConfig::new()
    }
}

impl TestConfig {
    /// A plaintext firewall on free ports, the test key (HS256) and issuer,
    /// the shipped policies re-read every 100 ms, no upstream yet.
    pub fn new() -> TestConfig {
        let doc = table([
            (
                "server",
                Value::Table(table([
                    ("listen", "127.0.0.1:0".into()),
                    ("plaintext", true.into()),
                    ("drain_timeout_ms", 2000.into()),
                ])),
            ),
            (
                "admin",
                Value::Table(table([("listen", "127.0.0.1:0".into())])),
            ),
            ("auth", Value::Table(auth())),
            (
                "policy",
                Value::Table(table([
                    ("dir", path(&shipped_policies())),
                    ("reload_interval_ms", 100.into()),
                ])),
            ),
        ]);
        TestConfig { doc }
    }

    /// Policies from `dir` instead of the shipped ones.
    pub fn policies(self, dir: &Path) -> TestConfig {
        self.set("policy.dir", path(dir))
    }

    /// Adds upstream `name` at `url`: project `sre`, connect 1 s, request
    /// and idle 5 s.
    pub fn upstream(mut self, name: &str, url: &str) -> TestConfig {
        let up = table([
            ("name", name.into()),
            ("url", url.into()),
            ("projects", Value::Array(vec!["sre".into()])),
            ("connect_timeout_ms", 1000.into()),
            ("request_timeout_ms", 5000.into()),
            ("idle_timeout_ms", 5000.into()),
        ]);
        self.upstreams().push(Value::Table(up));
        self
    }

    /// Adds stdio upstream `name` started as `command`: project `sre`,
    /// request and idle 10 s.
    pub fn stdio_upstream(mut self, name: &str, command: &[&str]) -> TestConfig {
        let up = table([
            ("name", name.into()),
            ("transport", "stdio".into()),
            (
                "command",
                Value::Array(command.iter().map(|c| (*c).into()).collect()),
            ),
            ("projects", Value::Array(vec!["sre".into()])),
            ("request_timeout_ms", 10000.into()),
            ("idle_timeout_ms", 10000.into()),
        ]);
        self.upstreams().push(Value::Table(up));
        self
    }

    /// Adds `[[virtual_server]]` `name` over `members` with `collisions`.
    pub fn virtual_server(mut self, name: &str, members: &[&str], collisions: &str) -> TestConfig {
        let vs = table([
            ("name", name.into()),
            (
                "upstreams",
                Value::Array(members.iter().map(|m| (*m).into()).collect()),
            ),
            ("collisions", collisions.into()),
        ]);
        match self
            .doc
            .entry("virtual_server")
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(a) => a.push(Value::Table(vs)),
            other => panic!("`virtual_server` is not an array: {other:?}"),
        }
        self
    }

    /// Sets `key` of the virtual server `name` (the last one added).
    pub fn virtual_server_set(mut self, key: &str, value: impl Into<Value>) -> TestConfig {
        if let Some(Value::Array(a)) = self.doc.get_mut("virtual_server") {
            if let Some(Value::Table(t)) = a.last_mut() {
                t.insert(key.to_owned(), value.into());
            }
        }
        self
    }

    /// Sets `key` (dotted, `limits.per_run_tool_per_s`), creating the tables
    /// on its way.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> TestConfig {
        set_in(&mut self.doc, key, value.into());
        self
    }

    /// Removes `key` (dotted), if present.
    pub fn unset(mut self, key: &str) -> TestConfig {
        let (parent, last) = match key.rsplit_once('.') {
            Some((p, l)) => (Some(p), l),
            None => (None, key),
        };
        let mut t = &mut self.doc;
        if let Some(p) = parent {
            for part in p.split('.') {
                match t.get_mut(part) {
                    Some(Value::Table(next)) => t = next,
                    _ => return self,
                }
            }
        }
        t.remove(last);
        self
    }

    /// Sets `key` (dotted, within the upstream's table) of upstream `name`.
    pub fn upstream_set(mut self, name: &str, key: &str, value: impl Into<Value>) -> TestConfig {
        let value = value.into();
        let up = self
            .upstreams()
            .iter_mut()
            .filter_map(Value::as_table_mut)
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            .unwrap_or_else(|| panic!("no upstream {name:?} in the test config"));
        set_in(up, key, value);
        self
    }

    /// Audits into ClickHouse at `url`, database `database`, through a spool
    /// in `spool`, with the short batch and retry times tests wait on.
    pub fn audit(self, instance: &str, url: &str, database: &str, spool: &Path) -> TestConfig {
        self.set("audit.enabled", true)
            .set("audit.instance", instance)
            .set("audit.clickhouse.url", url)
            .set("audit.clickhouse.database", database)
            .set("audit.spool.dir", path(spool))
            .set("audit.spool.fsync_interval_ms", 20)
            .set("audit.batch.max_rows", 1000)
            .set("audit.batch.max_age_ms", 50)
            .set("audit.batch.retry_min_ms", 50)
            .set("audit.batch.retry_max_ms", 400)
    }

    /// The config as TOML text.
    pub fn text(&self) -> String {
        toml::to_string(&self.doc).expect("a TOML table renders")
    }

    fn upstreams(&mut self) -> &mut Vec<Value> {
        match self
            .doc
            .entry("upstream")
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(a) => a,
            other => panic!("`upstream` is not an array: {other:?}"),
        }
    }
}

/// The `[auth]` table of every test config (and of `sign`).
pub fn auth() -> Table {
    table([
        ("mcp_audience", AUDIENCE.into()),
        ("admin_audience", "mcp-firewall-admin".into()),
        ("issuers", Value::Array(vec![ISSUER.into()])),
        ("service_account_issuer", ISSUER.into()),
        (
            "keys",
            Value::Array(vec![Value::Table(table([
                ("alg", "HS256".into()),
                ("secret", SECRET.into()),
            ]))]),
        ),
    ])
}

fn set_in(doc: &mut Table, key: &str, value: Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("a non-empty key");
    let mut t = doc;
    for part in parts {
        let next = t.entry(part).or_insert_with(|| Value::Table(Table::new()));
        t = match next {
            Value::Table(next) => next,
            other => panic!("{key}: {part} is not a table: {other:?}"),
        };
    }
    t.insert(last.to_owned(), value);
}
