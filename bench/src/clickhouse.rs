//! A throwaway ClickHouse for audited runs: a real `clickhouse-server`
//! (Debian's 18.16 `/usr/sbin/clickhouse-server`, a current `clickhouse
//! server`, or `$MCPFW_CLICKHOUSE_BIN`) in a directory of the run, listening
//! on 127.0.0.1 only, on ports picked at start, with a passwordless
//! `default` user. The same recipe as the integration tests' harness
//! (`tests/integration/common/clickhouse.rs`), returning errors instead of
//! panicking.
//!
//! Invariant: the server is a [`Managed`] child, so it is stopped by PID when
//! the handle drops and killed by its watchdog if the harness dies.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::probe;
use crate::procs::{self, Managed, Placement, ProcError};

/// How long the server gets to answer `/ping`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why ClickHouse could not be started or queried.
#[derive(Debug, thiserror::Error)]
pub enum ClickHouseError {
    /// No server binary was found.
    #[error("no clickhouse-server binary (install Debian's clickhouse-server or set MCPFW_CLICKHOUSE_BIN)")]
    NotInstalled,
    /// Writing its config failed.
    #[error("writing the ClickHouse config into {dir}: {source}")]
    Config {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Starting the process failed.
    #[error(transparent)]
    Spawn(#[from] ProcError),
    /// It did not answer `/ping` in time.
    #[error("clickhouse-server did not become ready; log tail:\n{log}")]
    NotReady {
        /// The end of its logs.
        log: String,
    },
    /// A query failed.
    #[error("query {sql:?} failed with HTTP {status}: {body}")]
    Query {
        /// The statement.
        sql: String,
        /// HTTP status.
        status: u16,
        /// ClickHouse's error text.
        body: String,
    },
    /// The HTTP exchange failed.
    #[error(transparent)]
    Probe(#[from] probe::ProbeError),
    /// A numeric answer was not a number.
    #[error("query {sql:?} returned {answer:?}, not a number")]
    NotANumber {
        /// The statement.
        sql: String,
        /// What came back.
        answer: String,
    },
}

/// A running throwaway server.
pub struct ClickHouse {
    /// HTTP interface.
    pub http: SocketAddr,
    dir: PathBuf,
    process: Managed,
}

// === impl ClickHouse ===

impl ClickHouse {
    /// Whether a server binary is available.
    pub fn available() -> bool {
        server_command().is_some()
    }

    /// Starts a server with its data under `dir`.
    pub fn start(dir: &Path, placement: &Placement) -> Result<ClickHouse, ClickHouseError> {
        let (program, args) = server_command().ok_or(ClickHouseError::NotInstalled)?;
        let mut last = None;
        // Ports are probed then released: retry with fresh ones on a clash.
        for _ in 0..3 {
            let http_port = procs::free_port().map_err(|source| ClickHouseError::Config {
                dir: dir.to_owned(),
                source,
            })?;
            let tcp_port = loop {
                let p = procs::free_port().map_err(|source| ClickHouseError::Config {
                    dir: dir.to_owned(),
                    source,
                })?;
                if p != http_port {
                    break p;
                }
            };
            write_config(dir, http_port, tcp_port)?;
            let mut cmd = Command::new(&program);
            cmd.args(&args)
                .arg(format!(
                    "--config-file={}",
                    dir.join("config.xml").display()
                ))
                .current_dir(dir);
            let mut process =
                Managed::spawn("clickhouse", cmd, &dir.join("log/stderr.log"), placement)?;
            let http = SocketAddr::from(([127, 0, 0, 1], http_port));
            if probe::wait_ready(http, "/ping", START_TIMEOUT, || process.running()) {
                return Ok(ClickHouse {
                    http,
                    dir: dir.to_owned(),
                    process,
                });
            }
            let log = format!(
                "{}\n{}",
                process.log_tail(20),
                procs::tail(&dir.join("log/err.log"), 20)
            );
            process.stop(Duration::from_secs(5));
            last = Some(ClickHouseError::NotReady { log });
        }
        Err(last.unwrap_or(ClickHouseError::NotReady { log: String::new() }))
    }

    /// The base URL for the firewall's `audit.clickhouse.url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Runs `sql` and returns the body.
    pub fn query(&self, sql: &str) -> Result<String, ClickHouseError> {
        match probe::http(
            self.http,
            "POST",
            "/",
            sql.as_bytes(),
            Duration::from_secs(60),
        )? {
            (200, body) => Ok(body),
            (status, body) => Err(ClickHouseError::Query {
                sql: sql.to_owned(),
                status,
                body,
            }),
        }
    }

    /// Runs `sql` and parses its single number.
    pub fn query_u64(&self, sql: &str) -> Result<u64, ClickHouseError> {
        let answer = self.query(sql)?;
        answer
            .trim()
            .parse()
            .map_err(|_| ClickHouseError::NotANumber {
                sql: sql.to_owned(),
                answer,
            })
    }

    /// Stops the server (SIGTERM, SIGKILL after 10 s).
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The server binary and leading arguments.
fn server_command() -> Option<(PathBuf, Vec<String>)> {
    if let Some(bin) = std::env::var_os("MCPFW_CLICKHOUSE_BIN") {
        return Some((PathBuf::from(bin), Vec::new()));
    }
    if let Some(p) = procs::find_program(
        "clickhouse-server",
        &["/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"],
    ) {
        return Some((p, Vec::new()));
    }
    procs::find_program("clickhouse", &[]).map(|p| (p, vec!["server".to_owned()]))
}

fn write_config(dir: &Path, http_port: u16, tcp_port: u16) -> Result<(), ClickHouseError> {
    let err = |source| ClickHouseError::Config {
        dir: dir.to_owned(),
        source,
    };
    for sub in ["data", "tmp", "log", "user_files", "format_schemas"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(err)?;
    }
    let config = include_str!("../../config/clickhouse/throwaway-server.xml")
        .replace("@DIR@", &dir.display().to_string())
        .replace("@HTTP_PORT@", &http_port.to_string())
        .replace("@TCP_PORT@", &tcp_port.to_string());
    let users = include_str!("../../config/clickhouse/throwaway-users.xml");
    std::fs::write(dir.join("config.xml"), config).map_err(err)?;
    std::fs::write(dir.join("users.xml"), users).map_err(err)?;
    Ok(())
}
