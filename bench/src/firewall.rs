//! The firewall as a bench target: the real binary (`mcp-firewall serve`)
//! on a config and policy directory generated into the run's directory,
//! started and stopped by PID, with its audit counters read from `/metrics`.
//!
//! Invariants:
//! - the generated config is validated by the firewall's own loader in the
//!   unit tests, so a config change in the product breaks the bench's tests,
//!   not a measurement;
//! - the bench policies are compiled into this binary (`bench/policies/`) and
//!   written next to the config, so the harness runs from any directory;
//! - the four upstream routes (`bench`, `bench-sse`, `bench-hold`,
//!   `bench-fresh`) point at the canned upstream's paths of the same names;
//! - with [`Spec::virtual_servers`], three more upstreams (`bench-b` and
//!   `bench-c` at the canned upstream's `/mcp/bench`, `bench-slow` at a slow
//!   upstream) and the virtual servers `vs1`, `vs3` and `vs-slow` over them
//!   ([`VIRTUAL_SERVERS`]); the bench policies name `bench*`, so every
//!   member shows a reader the same tools as `bench`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::probe;
use crate::procs::{self, Managed, Placement, ProcError};
use crate::tokens;

/// The bench policy files, embedded.
pub const POLICIES: [(&str, &str); 4] = [
    ("00-gates.toml", include_str!("../policies/00-gates.toml")),
    ("10-tools.toml", include_str!("../policies/10-tools.toml")),
    ("20-agents.toml", include_str!("../policies/20-agents.toml")),
    (
        "30-conditions.toml",
        include_str!("../policies/30-conditions.toml"),
    ),
];

/// `state.key_prefix` of the `firewall-redis` target.
pub const REDIS_KEY_PREFIX: &str = "bench";

/// Upstream route names (`/mcp/<name>`) the config defines.
pub const ROUTES: [&str; 4] = ["bench", "bench-sse", "bench-hold", "bench-fresh"];

/// Upstreams added for the virtual servers: two more names for the canned
/// upstream's `/mcp/bench` (same tools, same policy).
pub const TWIN_ROUTES: [&str; 2] = ["bench-b", "bench-c"];

/// The upstream at the slow upstream's address (its `tools/list` answers
/// after seconds).
pub const SLOW_ROUTE: &str = "bench-slow";

/// `list_timeout_ms` of every bench virtual server: each member's deadline
/// in a merged list.
pub const VS_LIST_TIMEOUT_MS: u64 = 2_000;

/// The separator of prefixed names (`bench__get_service`).
pub const VS_SEPARATOR: &str = "__";

/// A virtual server of the generated config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtualDef {
    /// Its name: served at `/mcp/<name>`.
    pub name: &'static str,
    /// Its member upstreams, in priority order.
    pub members: &'static [&'static str],
}

/// One member (the `list` scenario through a virtual server, against the
/// plain route).
pub const VS_ONE: VirtualDef = VirtualDef {
    name: "vs1",
    members: &["bench"],
};

/// Three members, each the canned upstream (three times the tools).
pub const VS_THREE: VirtualDef = VirtualDef {
    name: "vs3",
    members: &["bench", "bench-b", "bench-c"],
};

/// The canned upstream and the slow one: a merged list must not wait for
/// the slow one past the deadline.
pub const VS_SLOW: VirtualDef = VirtualDef {
    name: "vs-slow",
    members: &["bench", SLOW_ROUTE],
};

/// Every virtual server of the generated config (`collisions = "prefix"`).
pub const VIRTUAL_SERVERS: [VirtualDef; 3] = [VS_ONE, VS_THREE, VS_SLOW];

/// The virtual servers and the upstreams they need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Virtuals {
    /// The slow upstream (`bench-slow`), plain HTTP.
    pub slow_upstream: SocketAddr,
}

/// How long the firewall gets to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the firewall could not be started.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    /// The binary is missing.
    #[error("firewall binary {0} not found: build it with `cargo build --profile dist -p mcp-firewall` (or pass --firewall-bin)")]
    NoBinary(PathBuf),
    /// Writing the config, key or policies failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Starting the process failed.
    #[error(transparent)]
    Spawn(#[from] ProcError),
    /// It did not report ready in time.
    #[error("mcp-firewall did not become ready; log tail:\n{log}")]
    NotReady {
        /// The end of its log.
        log: String,
    },
}

/// Where an audited firewall sends its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSink {
    /// ClickHouse HTTP URL (a closed port keeps rows in the spool).
    pub url: String,
    /// Database (created by the firewall).
    pub database: String,
    /// Rows linked into the hash chain and checkpoints signed (with a key
    /// made in the instance's directory); false: `audit.chain = false`.
    pub chain: bool,
}

/// Budgets and rate limits shared in a Redis (`[state] backend = "redis"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedState {
    /// `redis://127.0.0.1:PORT`.
    pub redis_url: String,
    /// `state.key_prefix`.
    pub key_prefix: String,
}

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Instance name (directory and log names).
    pub name: String,
    /// TLS certificate and key files, for a TLS listener.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Audit destination; `None` runs with audit disabled.
    pub audit: Option<AuditSink>,
    /// `log.level`.
    pub log_level: String,
    /// Speak HTTP/2 (h2c) to the canned upstream (`http2 = true`).
    pub upstream_http2: bool,
    /// Budgets and rate limits in Redis; `None` keeps them in the process
    /// (`[state]` absent: `backend = "memory"`).
    pub state: Option<SharedState>,
    /// Content screening as the product ships it; `false` turns every
    /// family `off` (the `firewall-unscreened` target).
    pub screening: bool,
    /// A shadow policy set beside the live one (`[policy] shadow_dir`: the
    /// shipped bench policies and one more rule no bench call meets), the
    /// `firewall-shadow` target.
    pub shadow: bool,
    /// The virtual servers ([`VIRTUAL_SERVERS`]) and their extra upstreams;
    /// `None` configures neither.
    pub virtual_servers: Option<Virtuals>,
    /// The canned upstream's stdio command: adds the stdio upstreams
    /// [`STDIO_ROUTE`] (a process per run) and [`STDIO_SHARED_ROUTE`] (one
    /// process); `None` adds neither.
    pub stdio: Option<Vec<String>>,
    /// A token endpoint ([`crate::token_endpoint`]): the bench upstreams
    /// take a token exchanged per run (`auth = "token_exchange"`) instead
    /// of no credential.
    pub token_exchange: Option<SocketAddr>,
}

/// The stdio upstream with a process per principal and run.
pub const STDIO_ROUTE: &str = "bench-stdio";

/// The stdio upstream with one shared process.
pub const STDIO_SHARED_ROUTE: &str = "bench-stdio-shared";

/// The policy file that turns content screening off.
pub const SCREEN_OFF: (&str, &str) = (
    "95-screen-off.toml",
    "[screen]\nsecrets = \"off\"\npii = \"off\"\ninjection = \"off\"\n",
);

/// The rule the shadow set adds: a condition on a tool no bench call
/// names, so every call is decided twice and both agree.
pub const SHADOW_CANDIDATE: (&str, &str) = (
    "96-candidate.toml",
    "[[conditions]]\nupstream = \"*\"\ntools = [\"never_called_by_the_bench\"]\nrequire = 'false'\nreason = \"candidate rule\"\n",
);

/// The paths and addresses a config refers to.
#[derive(Debug, Clone)]
pub struct Layout {
    /// MCP listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    /// The canned upstream (plain HTTP).
    pub upstream: SocketAddr,
    /// The public key PEM file.
    pub key_file: PathBuf,
    /// The policy directory.
    pub policy_dir: PathBuf,
    /// The shadow policy directory, if any.
    pub shadow_dir: Option<PathBuf>,
    /// The audit spool directory.
    pub spool_dir: PathBuf,
    /// The checkpoint signing key (written at start when audit chains).
    pub signing_key: PathBuf,
}

/// Audit counters scraped from `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AuditCounters {
    /// `mcp_firewall_audit_rows_queued_total`: rows written to the spool.
    pub spooled: f64,
    /// `mcp_firewall_audit_rows_sent_total`: rows acknowledged by ClickHouse.
    pub sent: f64,
    /// `mcp_firewall_audit_rows_lost_total`.
    pub lost: f64,
}

/// A running firewall.
pub struct Firewall {
    /// MCP listener.
    pub addr: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    /// What it was started with.
    pub spec: Spec,
    process: Managed,
}

// === impl Firewall ===

impl Firewall {
    /// Writes config and policies under `dir` and starts `bin` on them.
    pub fn start(
        bin: &Path,
        dir: &Path,
        spec: Spec,
        upstream: SocketAddr,
        public_key_pem: &str,
        placement: &Placement,
    ) -> Result<Firewall, FirewallError> {
        if !bin.is_file() {
            return Err(FirewallError::NoBinary(bin.to_owned()));
        }
        let write = |path: PathBuf, text: &str| {
            std::fs::write(&path, text).map_err(|source| FirewallError::Write { path, source })
        };
        let mkdir = |path: &Path| {
            std::fs::create_dir_all(path).map_err(|source| FirewallError::Write {
                path: path.to_owned(),
                source,
            })
        };
        let own = dir.join(&spec.name);
        let policy_dir = own.join("policies");
        mkdir(&policy_dir)?;
        write_policies(&policy_dir)?;
        if !spec.screening {
            write(policy_dir.join(SCREEN_OFF.0), SCREEN_OFF.1)?;
        }
        let shadow_dir = spec.shadow.then(|| own.join("policies-next"));
        if let Some(d) = &shadow_dir {
            mkdir(d)?;
            write_policies(d)?;
            write(d.join(SHADOW_CANDIDATE.0), SHADOW_CANDIDATE.1)?;
        }
        let key_file = own.join("idp-es256.pub.pem");
        write(key_file.clone(), public_key_pem)?;
        let mut last = None;
        for _ in 0..3 {
            let port = || {
                procs::free_port().map_err(|source| FirewallError::Write {
                    path: own.clone(),
                    source,
                })
            };
            let listen = SocketAddr::from(([127, 0, 0, 1], port()?));
            let admin = SocketAddr::from(([127, 0, 0, 1], port()?));
            if listen == admin {
                continue;
            }
            let layout = Layout {
                listen,
                admin,
                upstream,
                key_file: key_file.clone(),
                policy_dir: policy_dir.clone(),
                shadow_dir: shadow_dir.clone(),
                spool_dir: own.join("spool"),
                signing_key: own.join("audit.key"),
            };
            if spec.audit.as_ref().is_some_and(|a| a.chain) && !layout.signing_key.exists() {
                let pem = mcp_firewall::audit::chain::Signer::generate_pem().map_err(|e| {
                    FirewallError::Write {
                        path: layout.signing_key.clone(),
                        source: std::io::Error::other(e.to_string()),
                    }
                })?;
                write(layout.signing_key.clone(), &pem)?;
            }
            let config = own.join("firewall.toml");
            write(config.clone(), &config_text(&spec, &layout))?;
            let mut cmd = Command::new(bin);
            cmd.arg("serve").arg("--config").arg(&config);
            let mut process =
                Managed::spawn("mcp-firewall", cmd, &own.join("firewall.log"), placement)?;
            if probe::wait_ready(
                admin,
                "/readyz",
                START_TIMEOUT * placement.start_factor(),
                || process.running(),
            ) {
                return Ok(Firewall {
                    addr: listen,
                    admin,
                    spec,
                    process,
                });
            }
            let log = process.log_tail(30);
            process.stop(Duration::from_secs(2));
            last = Some(FirewallError::NotReady { log });
        }
        Err(last.unwrap_or(FirewallError::NotReady { log: String::new() }))
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.process.running()
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Current audit counters, if `/metrics` answers.
    pub fn audit_counters(&self) -> Option<AuditCounters> {
        let (status, text) =
            probe::http(self.admin, "GET", "/metrics", b"", Duration::from_secs(5)).ok()?;
        if status != 200 {
            return None;
        }
        Some(AuditCounters {
            spooled: probe::metric(&text, "mcp_firewall_audit_rows_queued_total").unwrap_or(0.0),
            sent: probe::metric(&text, "mcp_firewall_audit_rows_sent_total").unwrap_or(0.0),
            lost: probe::metric(&text, "mcp_firewall_audit_rows_lost_total").unwrap_or(0.0),
        })
    }

    /// SIGTERM (drain), SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        self.process.stop(grace);
    }
}

/// Writes the bench policies into `dir`.
pub fn write_policies(dir: &Path) -> Result<(), FirewallError> {
    for (name, text) in POLICIES {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| FirewallError::Write { path, source })?;
    }
    Ok(())
}

/// The firewall config for `spec` at `layout`.
pub fn config_text(spec: &Spec, l: &Layout) -> String {
    let mut s = format!(
        "# Generated by mcp-bench for one run.\n[server]\nlisten = \"{}\"\ndrain_timeout_ms = 2000\n",
        l.listen
    );
    match &spec.tls {
        Some((cert, key)) => s.push_str(&format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        )),
        None => s.push_str("plaintext = true\n"),
    }
    s.push_str(&format!(
        "\n[admin]\nlisten = \"{}\"\n\n[log]\nformat = \"text\"\nlevel = \"{}\"\n\n",
        l.admin, spec.log_level
    ));
    s.push_str(&format!(
        "[auth]\nmcp_audience = \"{}\"\nadmin_audience = \"mcp-firewall-bench-admin\"\nissuers = [\"{}\"]\nmax_lifetime_s = {}\n\n[[auth.keys]]\nkid = \"{}\"\nalg = \"ES256\"\npem_file = \"{}\"\n\n",
        tokens::AUDIENCE,
        tokens::ISSUER,
        tokens::MAX_LIFETIME.as_secs(),
        tokens::KID,
        l.key_file.display()
    ));
    s.push_str(&format!("[policy]\ndir = \"{}\"\n", l.policy_dir.display()));
    if let Some(d) = &l.shadow_dir {
        s.push_str(&format!("shadow_dir = \"{}\"\n", d.display()));
    }
    s.push('\n');
    // Every limiter stays on (its cost is part of the measurement) with
    // ceilings no bench load reaches; the step-capped scenario uses a role
    // with its own cap.
    s.push_str(
        "[limits]\nper_ip_per_s = 100000000\nper_tenant_per_s = 100000000\nper_run_per_s = 100000000\nper_run_tool_per_s = 100000000\ndefault_max_steps = 1000000000\n\n",
    );
    let upstream = |s: &mut String, name: &str, url: String| {
        s.push_str(&format!(
            "[[upstream]]\nname = \"{name}\"\nurl = \"{url}\"\nprojects = [\"{}\"]\ncategories = [\"bench\"]\nrequest_timeout_ms = 30000\nidle_timeout_ms = 60000\nhttp2 = {}\n",
            tokens::PROJECT,
            spec.upstream_http2
        ));
        if let Some(at) = spec.token_exchange {
            s.push_str(&format!(
                "auth = \"token_exchange\"\n[upstream.token_exchange]\ntoken_endpoint = \"http://{at}/token\"\nclient_id = \"mcp-firewall-bench\"\nclient_secret = {{ value = \"bench\" }}\naudience = \"{name}\"\n"
            ));
        }
        s.push('\n');
    };
    for route in ROUTES {
        upstream(&mut s, route, format!("http://{}/mcp/{route}", l.upstream));
    }
    if let Some(v) = &spec.virtual_servers {
        // Twins of `bench`: the same path of the canned upstream.
        for route in TWIN_ROUTES {
            upstream(&mut s, route, format!("http://{}/mcp/bench", l.upstream));
        }
        let slow = v.slow_upstream;
        upstream(
            &mut s,
            SLOW_ROUTE,
            format!("http://{slow}/mcp/{SLOW_ROUTE}"),
        );
    }
    match &spec.audit {
        Some(a) => s.push_str(&format!(
            "[audit]\nenabled = true\ninstance = \"mcp-bench-{}\"\n{}[audit.clickhouse]\nurl = \"{}\"\ndatabase = \"{}\"\n[audit.spool]\ndir = \"{}\"\n",
            spec.name,
            if a.chain {
                format!("signing_key_file = \"{}\"\n", l.signing_key.display())
            } else {
                "chain = false\n".to_owned()
            },
            a.url,
            a.database,
            l.spool_dir.display()
        )),
        None => s.push_str("[audit]\nenabled = false\n"),
    }
    // Every risk fails closed while Redis cannot be asked: a call admitted
    // by the memory fallback would be measured as a Redis call; refused
    // (-31006), it is counted as a failure instead.
    if let Some(st) = &spec.state {
        s.push_str(&format!(
            "\n[state]\nbackend = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"{}\"\non_store_unavailable = {{ read = \"closed\", write = \"closed\", destructive = \"closed\" }}\n",
            st.redis_url, st.key_prefix
        ));
    }
    if spec.virtual_servers.is_some() {
        s.push_str(&virtual_servers_text());
    }
    if let Some(command) = &spec.stdio {
        s.push_str(&stdio_text(command));
    }
    s
}

/// The stdio upstreams: the canned upstream's stdio mode, per run and
/// shared, in the default sandbox (no network, nothing beyond the runtime).
fn stdio_text(command: &[String]) -> String {
    let command = command
        .iter()
        .map(|c| format!("{c:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut s = String::new();
    for (name, instances) in [(STDIO_ROUTE, "per_session"), (STDIO_SHARED_ROUTE, "shared")] {
        s.push_str(&format!(
            "\n[[upstream]]\nname = \"{name}\"\ntransport = \"stdio\"\ncommand = [{command}]\ninstances = \"{instances}\"\nmax_instances = 1024\nidle_timeout_s = 5\nprojects = [\"{}\"]\ncategories = [\"bench\"]\nrequest_timeout_ms = 30000\nidle_timeout_ms = 60000\n",
            tokens::PROJECT
        ));
    }
    s
}

/// The `[[virtual_server]]` tables of [`VIRTUAL_SERVERS`].
fn virtual_servers_text() -> String {
    let mut s = String::new();
    for v in VIRTUAL_SERVERS {
        let members = v
            .members
            .iter()
            .map(|m| format!("\"{m}\""))
            .collect::<Vec<_>>()
            .join(", ");
        s.push_str(&format!(
            "\n[[virtual_server]]\nname = \"{}\"\nupstreams = [{members}]\ncollisions = \"prefix\"\nseparator = \"{VS_SEPARATOR}\"\nlist_timeout_ms = {VS_LIST_TIMEOUT_MS}\n",
            v.name
        ));
    }
    s
}

#[cfg(test)]
#[path = "firewall_tests.rs"]
mod tests;
