//! How a stdio server is started: the launch line, the host's uid and gid
//! ranges, and the sandbox probe run before the first instance.

use super::*;
use crate::sandbox::Spec;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// The header the request path sets on every request to a stdio upstream:
/// a digest of the verified principal and run, which picks the process of
/// a request without a session (2026-07-28). Clients cannot send it: the
/// upstream client forwards only MCP's own headers.
pub(crate) const INSTANCE_HEADER: &str = "x-mcp-firewall-instance";

/// How many processes serve a stdio upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instances {
    /// One process per client session (and per principal and run without
    /// sessions): a server's memory never carries one principal's data to
    /// another.
    #[default]
    PerSession,
    /// One process for every session (the config says so explicitly).
    Shared,
}

/// A validated stdio upstream: what to start and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The command; its program resolved to an absolute path.
    pub command: Vec<String>,
    /// The environment it gets (besides `PATH`, `HOME`, `TMPDIR`).
    pub env: Vec<(String, String)>,
    /// Names passed through from the firewall's own environment.
    pub env_from: Vec<String>,
    /// Processes per session or one shared.
    pub instances: Instances,
    /// Most processes at once.
    pub max_instances: usize,
    /// A process unused this long is stopped.
    pub idle_timeout: Duration,
    /// Its confinement.
    pub sandbox: Spec,
    /// What every stdio upstream shares (`[stdio]`).
    pub host: HostConfig,
}

/// `[stdio]`: what every stdio upstream of the firewall shares.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// The uids a root firewall runs servers as, one per running server
    /// (`[first, last]`, inclusive).
    #[serde(default = "default_uid_range")]
    pub uid_range: [u32; 2],
    /// The group every server of a root firewall runs as: make a `write`
    /// directory group-writable by it (signals, `/proc` and process
    /// counts go by uid, which no two servers share).
    #[serde(default = "default_gid")]
    pub gid: u32,
    /// Where the firewall makes its runtime directories (egress sockets,
    /// private homes): a directory of a name nobody can guess, mode 0700,
    /// per upstream (default: the system's temporary directory).
    #[serde(default)]
    pub runtime_dir: Option<PathBuf>,
}

/// The default `uid_range`: above the uids of people and of the systemd
/// and container ranges usually handed out, below 2^31.
pub(crate) const DEFAULT_UID_RANGE: [u32; 2] = [1_700_000_000, 1_700_065_535];

pub(super) fn default_uid_range() -> [u32; 2] {
    DEFAULT_UID_RANGE
}

/// The default `gid`: the first uid of the default range.
pub(crate) const DEFAULT_GID: u32 = DEFAULT_UID_RANGE[0];

pub(super) fn default_gid() -> u32 {
    DEFAULT_GID
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            uid_range: DEFAULT_UID_RANGE,
            gid: DEFAULT_GID,
            runtime_dir: None,
        }
    }
}

impl HostConfig {
    /// Checks the range (`Err` names the key and why).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let [first, last] = self.uid_range;
        if first == 0 || first > last || last == u32::MAX {
            return Err((
                "stdio.uid_range".to_owned(),
                "[first, last] with 0 < first <= last < 4294967295".to_owned(),
            ));
        }
        if self.gid == 0 || self.gid == u32::MAX {
            return Err((
                "stdio.gid".to_owned(),
                "a group other than root (0 < gid < 4294967295)".to_owned(),
            ));
        }
        Ok(())
    }

    /// Makes this upstream's runtime directory: a new directory of a name
    /// nobody can guess, mode 0700, its owner and mode checked, under a
    /// base that only its owner (or root, with the sticky bit) can change.
    pub fn runtime_dir_for(&self, upstream: &str) -> Result<PathBuf, String> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let base = self.runtime_dir.clone().unwrap_or_else(std::env::temp_dir);
        let me = nix::unistd::geteuid().as_raw();
        let meta = std::fs::metadata(&base)
            .map_err(|e| format!("stdio runtime_dir {}: {e}", base.display()))?;
        let mode = meta.permissions().mode();
        let shared_unsafely = mode & 0o022 != 0 && mode & 0o1000 == 0;
        if !meta.is_dir() || (meta.uid() != me && meta.uid() != 0) || shared_unsafely {
            return Err(format!(
                "stdio runtime_dir {} must be a directory owned by this user or root, not writable by others unless sticky",
                base.display()
            ));
        }
        let dir = base.join(format!(
            "mcp-firewall-{upstream}-{}",
            hex::encode(rand::random::<[u8; 12]>())
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let made =
            std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !made.is_dir() || made.uid() != me || made.permissions().mode() & 0o777 != 0o700 {
            return Err(format!(
                "{} is not the private directory just made (owner {}, mode {:o})",
                dir.display(),
                made.uid(),
                made.permissions().mode() & 0o7777
            ));
        }
        Ok(dir)
    }
}

/// A layer's name as the config and metrics spell it.
pub(crate) fn layer_name(l: crate::sandbox::Layer) -> String {
    l.name().to_owned()
}

/// Applies the sandbox of `launch` to a child that exits at once, and
/// reads what it could apply; `Err` names the missing layer of a required
/// sandbox.
pub(crate) fn probe(launch: &Launch) -> Result<crate::sandbox::Report, String> {
    let spec = serde_json::to_string(&launch.sandbox).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(process::launcher());
    cmd.arg("sandbox-exec")
        .arg("--spec")
        .arg(spec)
        .arg("--probe");
    if matches!(launch.sandbox.network, crate::sandbox::Network::Allow(_)) {
        // The probe binds the forwarder's port and starts nothing.
        cmd.arg("--egress-socket").arg("/nonexistent/egress.sock");
    }
    cmd.arg("--").args(launch.command.first());
    let out = cmd
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", process::launcher().display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err.lines().last().unwrap_or("").trim();
        let line = line
            .strip_prefix("mcp-firewall sandbox-exec: ")
            .unwrap_or(line);
        return Err(if line.is_empty() {
            format!("the sandbox probe failed ({})", out.status)
        } else {
            line.to_owned()
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("unreadable sandbox report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn runtime_directories_are_private_unguessable_and_only_under_a_safe_base() {
        let base = tempfile::tempdir().unwrap();
        let host = HostConfig {
            runtime_dir: Some(base.path().to_path_buf()),
            ..HostConfig::default()
        };
        let a = host.runtime_dir_for("docs").unwrap();
        let b = host.runtime_dir_for("docs").unwrap();
        assert_ne!(a, b, "a name nobody can guess, new each time");
        assert!(a.starts_with(base.path()));
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("mcp-firewall-docs-") && name.len() == 18 + 24,
            "{name}"
        );
        assert_eq!(
            std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // A base others may write to without the sticky bit is refused:
        // they could swap what the firewall makes there.
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = host.runtime_dir_for("docs").unwrap_err();
        assert!(
            err.contains("not writable by others unless sticky"),
            "{err}"
        );
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(host.runtime_dir_for("docs").is_ok());
        let missing = HostConfig {
            runtime_dir: Some(base.path().join("nope")),
            ..HostConfig::default()
        };
        assert!(missing.runtime_dir_for("docs").is_err());
    }

    #[test]
    fn the_uid_range_and_group_are_checked() {
        assert!(HostConfig::default().validate().is_ok());
        for (range, gid, key) in [
            ([10, 5], 7, "stdio.uid_range"),
            ([0, 5], 7, "stdio.uid_range"),
            ([10, u32::MAX], 7, "stdio.uid_range"),
            ([10, 20], 0, "stdio.gid"),
        ] {
            let h = HostConfig {
                uid_range: range,
                gid,
                runtime_dir: None,
            };
            assert_eq!(h.validate().unwrap_err().0, key);
        }
    }
}
