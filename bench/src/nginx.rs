//! nginx as the reference proxy: a plain keep-alive `proxy_pass` to the
//! canned upstream, the bar the firewall must reach.
//!
//! The config is written into the run's directory and nginx is started in
//! the foreground (`daemon off`) with `-p prefix -c conf`, and stopped by the
//! master's PID. `worker_processes auto` (one worker per core): the firewall
//! runs one tokio worker thread per core, so both proxies may use every core
//! and the comparison is like for like; `--nginx-workers 1` is available to
//! compare against a single worker.
//!
//! Listeners: plain HTTP/1.1, cleartext HTTP/2 (prior knowledge), and TLS
//! (ALPN `h2`, `http/1.1`) with the run's certificate. Upstream connections
//! are pooled (`keepalive`) and never closed by request count; SSE routes
//! are not buffered so events flow as they come; the access log is off (the
//! firewall's audit is measured separately). `worker_connections` is 8192
//! unless the run holds more idle client connections (the scale scenario):
//! then every worker may take all of them, since nothing spreads accepted
//! connections evenly over the workers.
//!
//! Invariant: nothing is written outside the prefix directory (temp paths,
//! pid file, error log all live there).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::probe;
use crate::procs::{self, Managed, Placement, ProcError};

/// Why nginx could not be started.
#[derive(Debug, thiserror::Error)]
pub enum NginxError {
    /// Not installed.
    #[error("nginx is not installed")]
    NotInstalled,
    /// Writing its config failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Starting failed.
    #[error(transparent)]
    Spawn(#[from] ProcError),
    /// It did not listen in time.
    #[error("nginx did not start; log tail:\n{log}")]
    NotReady {
        /// The end of its log.
        log: String,
    },
}

/// Listener ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// Plain HTTP/1.1.
    pub h1: u16,
    /// Cleartext HTTP/2.
    pub h2c: u16,
    /// TLS.
    pub tls: u16,
}

/// A running nginx.
pub struct Nginx {
    /// Listener ports (all on 127.0.0.1).
    pub ports: Ports,
    /// `worker_processes` value.
    pub workers: String,
    /// `nginx -v` output.
    pub version: String,
    process: Managed,
}

// === impl Nginx ===

impl Nginx {
    /// The nginx binary, if installed.
    pub fn binary() -> Option<PathBuf> {
        procs::find_program("nginx", &["/usr/sbin/nginx"])
    }

    /// Starts nginx in `prefix` in front of `upstream`, each worker taking
    /// up to `worker_connections` connections.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        prefix: &Path,
        upstream: SocketAddr,
        cert: &Path,
        key: &Path,
        workers: &str,
        worker_connections: usize,
        placement: &Placement,
    ) -> Result<Nginx, NginxError> {
        let bin = Nginx::binary().ok_or(NginxError::NotInstalled)?;
        let version = Command::new(&bin)
            .arg("-v")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
            .unwrap_or_default();
        for sub in ["logs", "tmp"] {
            let p = prefix.join(sub);
            std::fs::create_dir_all(&p).map_err(|source| NginxError::Write { path: p, source })?;
        }
        let mut last = None;
        for _ in 0..3 {
            let port = || {
                procs::free_port().map_err(|source| NginxError::Write {
                    path: prefix.to_owned(),
                    source,
                })
            };
            let ports = Ports {
                h1: port()?,
                h2c: port()?,
                tls: port()?,
            };
            if ports.h1 == ports.h2c || ports.h1 == ports.tls || ports.h2c == ports.tls {
                continue;
            }
            let conf = prefix.join("nginx.conf");
            std::fs::write(
                &conf,
                config_text(
                    prefix,
                    upstream,
                    ports,
                    cert,
                    key,
                    workers,
                    worker_connections,
                ),
            )
            .map_err(|source| NginxError::Write {
                path: conf.clone(),
                source,
            })?;
            let mut cmd = Command::new(&bin);
            cmd.arg("-p")
                .arg(prefix)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(prefix.join("logs/error.log"));
            let mut process =
                Managed::spawn("nginx", cmd, &prefix.join("logs/stderr.log"), placement)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], ports.h1));
            let up = probe::wait_listening(addr, Duration::from_secs(10), || process.running())
                && probe::wait_listening(
                    SocketAddr::from(([127, 0, 0, 1], ports.tls)),
                    Duration::from_secs(5),
                    || process.running(),
                );
            if up {
                return Ok(Nginx {
                    ports,
                    workers: workers.to_owned(),
                    version,
                    process,
                });
            }
            let log = format!(
                "{}\n{}",
                process.log_tail(20),
                procs::tail(&prefix.join("logs/error.log"), 20)
            );
            process.stop(Duration::from_secs(2));
            last = Some(NginxError::NotReady { log });
        }
        Err(last.unwrap_or(NginxError::NotReady { log: String::new() }))
    }

    /// The master and its workers.
    pub fn pids(&self) -> Vec<u32> {
        let master = self.process.pid();
        let mut v = vec![master];
        v.extend(procs::children(master));
        v
    }

    /// Stops nginx (SIGTERM: fast shutdown), SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        self.process.stop(grace);
    }
}

/// The nginx config.
#[allow(clippy::too_many_arguments)]
pub fn config_text(
    prefix: &Path,
    upstream: SocketAddr,
    ports: Ports,
    cert: &Path,
    key: &Path,
    workers: &str,
    worker_connections: usize,
) -> String {
    let p = prefix.display();
    let location = |path: &str, buffering: &str| {
        format!(
            "    location {path} {{\n      proxy_pass http://mcp_upstream;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering {buffering};\n      proxy_read_timeout 60s;\n    }}\n"
        )
    };
    format!(
        "# Generated by mcp-bench: a plain keep-alive reverse proxy.\n\
worker_processes {workers};\n\
daemon off;\n\
pid {p}/nginx.pid;\n\
error_log {p}/logs/error.log warn;\n\
events {{\n  worker_connections {worker_connections};\n}}\n\
http {{\n\
  access_log off;\n\
  client_body_temp_path {p}/tmp/body;\n\
  proxy_temp_path {p}/tmp/proxy;\n\
  fastcgi_temp_path {p}/tmp/fastcgi;\n\
  uwsgi_temp_path {p}/tmp/uwsgi;\n\
  scgi_temp_path {p}/tmp/scgi;\n\
  keepalive_requests 10000000;\n\
  keepalive_timeout 120s;\n\
  client_body_buffer_size 1m;\n\
  client_max_body_size 1m;\n\
  proxy_buffer_size 16k;\n\
  proxy_buffers 16 16k;\n\
  proxy_max_temp_file_size 0;\n\
  upstream mcp_upstream {{\n\
    server {upstream};\n\
    keepalive 1024;\n\
    keepalive_requests 10000000;\n\
    keepalive_timeout 120s;\n\
  }}\n\
  server {{\n\
    listen 127.0.0.1:{h1};\n\
    listen 127.0.0.1:{h2c} http2;\n\
    listen 127.0.0.1:{tls} ssl http2;\n\
    ssl_certificate {cert};\n\
    ssl_certificate_key {key};\n\
{json}{sse}{hold}  }}\n\
}}\n",
        h1 = ports.h1,
        h2c = ports.h2c,
        tls = ports.tls,
        cert = cert.display(),
        key = key.display(),
        json = location("/", "on"),
        sse = location("/mcp/bench-sse", "off"),
        hold = location("/mcp/bench-hold", "off"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_passes_nginx_own_check_when_installed() {
        let Some(bin) = Nginx::binary() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let tls = crate::tls::Material::generate(dir.path()).unwrap();
        for sub in ["logs", "tmp"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let ports = Ports {
            h1: 1,
            h2c: 2,
            tls: 3,
        };
        let conf = dir.path().join("nginx.conf");
        let text = config_text(
            dir.path(),
            "127.0.0.1:9".parse().unwrap(),
            ports,
            &tls.cert_file,
            &tls.key_file,
            "auto",
            8192,
        );
        std::fs::write(&conf, &text).unwrap();
        let out = Command::new(bin)
            .arg("-t")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("logs/error.log"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn config_keeps_upstream_connections_and_streams_sse() {
        let text = config_text(
            Path::new("/p"),
            "127.0.0.1:9".parse().unwrap(),
            Ports {
                h1: 1,
                h2c: 2,
                tls: 3,
            },
            Path::new("/c"),
            Path::new("/k"),
            "1",
            12_000,
        );
        assert!(text.contains("keepalive 1024;"));
        assert!(text.contains("proxy_set_header Connection \"\";"));
        assert!(text.contains("location /mcp/bench-sse {\n      proxy_pass http://mcp_upstream;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;"));
        assert!(text.contains("worker_processes 1;"));
        assert!(text.contains("worker_connections 12000;"));
    }
}
