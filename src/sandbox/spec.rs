//! What a sandbox is asked for (`Spec`), the layers it can apply, the report of
//! what was applied, and the paths a runtime needs.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The confinement of one server (`[upstream.sandbox]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Paths it may read (besides the runtime: `/usr`, `/lib`, `/etc`…).
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// Paths it may write (and read).
    #[serde(default)]
    pub write: Vec<PathBuf>,
    /// Where it may connect.
    #[serde(default)]
    pub network: Network,
    /// Memory (heap and private writable mappings: `RLIMIT_DATA`), MiB.
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// CPU time, seconds.
    #[serde(default)]
    pub cpu_s: Option<u64>,
    /// Processes (and threads) of its user.
    #[serde(default)]
    pub processes: Option<u64>,
    /// Refuse to start when a layer cannot be applied.
    #[serde(default = "yes")]
    pub required: bool,
}

pub(super) fn yes() -> bool {
    true
}

impl Default for Spec {
    /// No network, nothing beyond the runtime, no limits, required.
    fn default() -> Spec {
        Spec {
            read: Vec::new(),
            write: Vec::new(),
            network: Network::None,
            memory_mb: None,
            cpu_s: None,
            processes: None,
            required: true,
        }
    }
}

/// Where a confined server may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(untagged)]
pub enum Network {
    /// Nowhere (`"none"`).
    #[default]
    #[serde(with = "none")]
    None,
    /// TCP to these `host:port` pairs only (ports enforced by Landlock).
    Allow(Vec<String>),
}

mod none {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("none")
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
        let s = String::deserialize(d)?;
        if s == "none" {
            Ok(())
        } else {
            Err(serde::de::Error::custom(
                "network is \"none\" or a list of \"host:port\"",
            ))
        }
    }
}

/// One layer of confinement, in the order they are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// A network namespace of its own (`network = "none"`, or an
    /// allow-list served by the egress proxy).
    NetNamespace,
    /// A PID namespace of its own, with its own `/proc`.
    PidNamespace,
    /// A mount namespace with a private root.
    MountNamespace,
    /// An IPC (and UTS) namespace of its own.
    IpcNamespace,
    /// rlimits (memory, CPU, processes).
    Rlimits,
    /// Not root, and not another server's user: a uid of its own (a root
    /// firewall), or a user namespace of its own.
    Unprivileged,
    /// `no_new_privs`.
    NoNewPrivs,
    /// Landlock: the filesystem.
    LandlockFs,
    /// Landlock: TCP connect and bind.
    LandlockNet,
    /// Landlock scopes: no signals to, and no abstract UNIX sockets of,
    /// processes outside its own sandbox (best effort: Linux 6.12+).
    LandlockScope,
    /// The seccomp filters.
    Seccomp,
}

impl Layer {
    /// Every layer, in the order they are applied.
    pub const ALL: [Layer; 11] = [
        Layer::NetNamespace,
        Layer::PidNamespace,
        Layer::MountNamespace,
        Layer::IpcNamespace,
        Layer::Rlimits,
        Layer::Unprivileged,
        Layer::NoNewPrivs,
        Layer::LandlockFs,
        Layer::LandlockNet,
        Layer::LandlockScope,
        Layer::Seccomp,
    ];

    /// Its name as the config, the report and metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            Layer::NetNamespace => "net_namespace",
            Layer::PidNamespace => "pid_namespace",
            Layer::MountNamespace => "mount_namespace",
            Layer::IpcNamespace => "ipc_namespace",
            Layer::Rlimits => "rlimits",
            Layer::Unprivileged => "unprivileged",
            Layer::NoNewPrivs => "no_new_privs",
            Layer::LandlockFs => "landlock_fs",
            Layer::LandlockNet => "landlock_net",
            Layer::LandlockScope => "landlock_scope",
            Layer::Seccomp => "seccomp",
        }
    }

    /// Best effort: reported when missing, never a refusal.
    pub fn best_effort(self) -> bool {
        self == Layer::LandlockScope
    }
}

/// What confinement was applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Applied, in order.
    pub applied: Vec<Layer>,
    /// Missing, with why.
    pub missing: Vec<(Layer, String)>,
}

impl Report {
    /// Records the outcome of one layer: applied, missing (reported), or,
    /// when the layer is required, the error that refuses the start.
    pub fn layer(
        &mut self,
        spec: &Spec,
        layer: Layer,
        outcome: Result<(), String>,
    ) -> Result<bool, SandboxError> {
        match outcome {
            Ok(()) => {
                self.applied.push(layer);
                Ok(true)
            }
            Err(why) if spec.required && !layer.best_effort() => {
                Err(SandboxError::Missing { layer, why })
            }
            Err(why) => {
                self.missing.push((layer, why));
                Ok(false)
            }
        }
    }
}

/// Why a server was not started.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A required layer could not be applied.
    #[error("sandbox layer {layer:?} is unavailable ({why}) and the sandbox is required; set `required = false` to run without it")]
    Missing {
        /// Which.
        layer: Layer,
        /// Why.
        why: String,
    },
    /// The spec is unusable.
    #[error("sandbox: {0}")]
    Invalid(String),
}

/// The user and group a root firewall runs a server as when it names none
/// (`sandbox-exec` run by hand): `nobody`.
pub const NOBODY: u32 = 65534;

/// What a server needs to run at all: the system's programs and
/// libraries, `/proc` and `/sys`, and the devices every runtime opens.
pub(super) const RUNTIME_READ: [&str; 7] =
    ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/proc", "/sys"];

/// What a server reads besides `read`: the runtime, the system
/// configuration runtimes read (`/etc/python3.11`, …), and its program's
/// package (`program_dir`).
pub fn runtime_read(program_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut read: Vec<PathBuf> = RUNTIME_READ
        .iter()
        .chain(ETC_READ.iter())
        .map(PathBuf::from)
        .collect();
    if let Ok(entries) = std::fs::read_dir("/etc") {
        read.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                .map(|e| e.path()),
        );
    }
    read.extend(program_dir.map(Path::to_path_buf));
    read
}

/// `program` as found on `PATH` (or as given when it names a path): an
/// executable file, or `None`.
pub fn which(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// The directory of the program a server runs (readable, so its own
/// libraries load).
pub fn program_dir(command: &Path) -> Option<PathBuf> {
    command
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

/// The system configuration runtimes read, and nothing else of `/etc`: the
/// firewall's own config, keys and policies (often under `/etc`) stay out
/// of reach, even of a server running as the firewall's user.
pub(super) const ETC_READ: [&str; 20] = [
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/crypto-policies",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/alternatives",
    "/etc/mime.types",
    "/etc/os-release",
    "/etc/environment",
];
pub const RUNTIME_WRITE: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_reads_as_the_config_writes_it() {
        let s: Spec = serde_json::from_str(
            r#"{"read":["/srv/docs"],"network":"none","memory_mb":512,"processes":64}"#,
        )
        .unwrap();
        assert_eq!(s.network, Network::None);
        assert!(s.required, "required by default");
        let s: Spec = serde_json::from_str(r#"{"network":["api.example.com:443"]}"#).unwrap();
        assert_eq!(
            s.network,
            Network::Allow(vec!["api.example.com:443".into()])
        );
        assert!(serde_json::from_str::<Spec>(r#"{"network":"all"}"#).is_err());
        assert!(serde_json::from_str::<Spec>(r#"{"nework":"none"}"#).is_err());
        let back: Spec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
