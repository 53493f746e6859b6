//! Confinement of a server process the firewall starts (issue 35, first
//! part): what it may read and write (Landlock), which system calls it may
//! make (a seccomp filter refusing what an MCP server never needs), that it
//! can gain no privileges (`no_new_privs`, and no root: a firewall running
//! as root runs the server as `nobody`), what it may use (rlimits: memory
//! (`RLIMIT_DATA`), CPU time, processes) and where it may connect (`network = "none"`:
//! a network namespace of its own and no TCP connect or bind; an allow-list
//! served by the firewall: a network namespace of its own whose only way out
//! is a forwarder to the firewall's egress proxy; an allow-list alone: TCP
//! connect only to the listed ports).
//!
//! The process confines **itself**, then executes the server
//! (`mcp-firewall sandbox-exec --spec JSON -- COMMAND...`): every layer is
//! applied by ordinary system calls in the launcher before `exec`, so no
//! code runs between `fork` and `exec` (no `unsafe` hook), and what the
//! server inherits is exactly what the launcher ended with.
//!
//! Each layer is reported (applied, or missing and why). With `required`
//! (the default) a missing layer refuses to start the server, naming it;
//! without, the server runs with what could be applied.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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

fn yes() -> bool {
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

    pub fn serialize<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("none")
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
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

/// One layer of confinement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// A network namespace of its own (`network = "none"`).
    NetNamespace,
    /// rlimits (memory, CPU, processes).
    Rlimits,
    /// Not root (`nobody` when the firewall is root).
    Unprivileged,
    /// `no_new_privs`.
    NoNewPrivs,
    /// Landlock: the filesystem.
    LandlockFs,
    /// Landlock: TCP connect and bind.
    LandlockNet,
    /// The seccomp filter.
    Seccomp,
    /// Landlock scopes: no signals to, and no abstract UNIX sockets of,
    /// processes outside its own sandbox (best effort: Linux 6.12+).
    LandlockScope,
}

/// What confinement was applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Applied, in order.
    pub applied: Vec<Layer>,
    /// Missing, with why.
    pub missing: Vec<(Layer, String)>,
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

/// The `nobody` user and group a root firewall runs servers as.
const NOBODY: u32 = 65534;

/// What a server needs to run at all: the system's programs and
/// libraries, `/proc` and `/sys`, and the devices every runtime opens.
const RUNTIME_READ: [&str; 7] = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/proc", "/sys"];

/// The system configuration runtimes read, and nothing else of `/etc`: the
/// firewall's own config, keys and policies (often under `/etc`) stay out
/// of reach, even of a server running as the firewall's user.
const ETC_READ: [&str; 20] = [
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
const RUNTIME_WRITE: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// The firewall's egress proxy of an allow-list, as `sandbox-exec` gets it.
#[derive(Debug, Clone, Copy)]
pub struct Egress<'a> {
    /// The proxy's UNIX socket.
    pub socket: &'a Path,
    /// Only bind the forwarder's port (a probe leaves nothing running).
    pub probe: bool,
}

/// The port of the egress forwarder inside a sandbox's own network
/// namespace (`127.0.0.1:3128`, named to the server as `HTTPS_PROXY`).
pub const EGRESS_PORT: u16 = 3128;

/// Confines the calling process as `spec` says; `command` is the program
/// it will execute (its install directory is readable).
///
/// With `egress` (an allow-list served by the firewall's egress proxy),
/// the process gets a network namespace of its own too, with only its
/// loopback up, and the forwarder on [`EGRESS_PORT`] to the proxy started
/// in it (before any other layer); TCP connect is then allowed to that port
/// only, so the proxy is the only way out. Every layer is attempted; a
/// missing one is an error when `spec.required` (scopes are best effort).
pub fn confine(
    spec: &Spec,
    command: &Path,
    egress: Option<Egress<'_>>,
) -> Result<Report, SandboxError> {
    let mut report = Report::default();
    let layer = |report: &mut Report, l: Layer, r: Result<(), String>| match r {
        Ok(()) => {
            report.applied.push(l);
            Ok(())
        }
        Err(why) if spec.required => Err(SandboxError::Missing { layer: l, why }),
        Err(why) => {
            report.missing.push((l, why));
            Ok(())
        }
    };
    match (&spec.network, egress) {
        (Network::None, _) => layer(&mut report, Layer::NetNamespace, net_namespace())?,
        (Network::Allow(_), Some(e)) => layer(
            &mut report,
            Layer::NetNamespace,
            net_namespace()
                .and_then(|()| loopback_up())
                .and_then(|()| start_forwarder(e.socket, e.probe)),
        )?,
        (Network::Allow(_), None) => {}
    }
    layer(&mut report, Layer::Rlimits, rlimits(spec))?;
    layer(&mut report, Layer::Unprivileged, unprivileged())?;
    layer(
        &mut report,
        Layer::NoNewPrivs,
        nix::sys::prctl::set_no_new_privs().map_err(|e| e.to_string()),
    )?;
    let (fs, net) = landlock(spec, command, egress.is_some());
    layer(&mut report, Layer::LandlockFs, fs)?;
    layer(&mut report, Layer::LandlockNet, net)?;
    match landlock_scope() {
        Ok(()) => report.applied.push(Layer::LandlockScope),
        Err(why) => report.missing.push((Layer::LandlockScope, why)),
    }
    layer(&mut report, Layer::Seccomp, seccomp())?;
    Ok(report)
}

fn net_namespace() -> Result<(), String> {
    use nix::sched::{unshare, CloneFlags};
    match unshare(CloneFlags::CLONE_NEWNET) {
        Ok(()) => Ok(()),
        // Without CAP_SYS_ADMIN: a user namespace of its own first.
        Err(_) => unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("unshare(CLONE_NEWNET): {e} (no user namespaces?)")),
    }
}

/// Starts the egress forwarder of a sandbox in its own network namespace:
/// binds `127.0.0.1:`[`EGRESS_PORT`] there and starts `mcp-firewall
/// egress-forward --to SOCKET` with that listener as its stdin, in the
/// server's process group (it ends with the server). With `probe`, only
/// binds (nothing is left running).
fn start_forwarder(socket: &Path, probe: bool) -> Result<(), String> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", EGRESS_PORT))
        .map_err(|e| format!("egress forwarder: binding 127.0.0.1:{EGRESS_PORT}: {e}"))?;
    if probe {
        return Ok(());
    }
    let me = std::env::current_exe().map_err(|e| format!("egress forwarder: {e}"))?;
    std::process::Command::new(me)
        .arg("egress-forward")
        .arg("--to")
        .arg(socket)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            listener,
        )))
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("egress forwarder: {e}"))?;
    Ok(())
}

/// `mcp-firewall egress-forward`: accepts on the listener it was given as
/// stdin (inside a sandbox's network namespace) and joins each connection
/// to the firewall's egress proxy at `socket`, until its parent (the
/// server) ends.
pub fn forward(socket: &Path) -> Result<(), String> {
    use std::os::fd::AsFd;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("egress forwarder: {e}"))?;
    if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
        return Err("egress forwarder: the server is gone".to_owned());
    }
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("egress forwarder: {e}"))?;
    let listener = std::net::TcpListener::from(fd);
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let socket = socket.to_path_buf();
        std::thread::spawn(move || {
            let Ok(up) = std::os::unix::net::UnixStream::connect(&socket) else {
                return;
            };
            let (Ok(mut c_in), Ok(mut u_out)) = (conn.try_clone(), up.try_clone()) else {
                return;
            };
            let there = std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut u_out);
                let _ = u_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut u_in, mut c_out) = (up, conn);
            let _ = std::io::copy(&mut u_in, &mut c_out);
            let _ = c_out.shutdown(std::net::Shutdown::Write);
            let _ = there.join();
        });
    }
    Ok(())
}

/// Brings up the loopback interface of a new network namespace (a
/// netlink `RTM_NEWLINK` setting `IFF_UP` on interface 1, `lo`).
fn loopback_up() -> Result<(), String> {
    use nix::sys::socket::{
        bind, recv, send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
        SockType,
    };
    use std::os::fd::AsRawFd;
    let err = |what: &str, e: nix::Error| format!("bringing up lo: {what}: {e}");
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(|e| err("socket", e))?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| err("bind", e))?;
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST_ACK: u16 = 0x1 | 0x4;
    const IFF_UP: u32 = 0x1;
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST_ACK.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
    msg.extend_from_slice(&[0u8, 0u8]); // ifi_family AF_UNSPEC, pad
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&1i32.to_ne_bytes()); // ifi_index: lo
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    send(fd.as_raw_fd(), &msg, MsgFlags::empty()).map_err(|e| err("send", e))?;
    let mut ack = [0u8; 256];
    let n = recv(fd.as_raw_fd(), &mut ack, MsgFlags::empty()).map_err(|e| err("recv", e))?;
    // NLMSG_ERROR (2) carries the result: 0 is success.
    let kind = ack.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let code = ack
        .get(16..20)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (n >= 20, kind, code) {
        (true, Some(2), Some(0)) => Ok(()),
        (true, Some(2), Some(c)) => Err(format!("bringing up lo: {}", nix::Error::from_raw(-c))),
        _ => Err("bringing up lo: no acknowledgement from the kernel".to_owned()),
    }
}

fn rlimits(spec: &Spec) -> Result<(), String> {
    use nix::sys::resource::{setrlimit, Resource};
    let set = |r: Resource, v: Option<u64>, what: &str| -> Result<(), String> {
        match v {
            Some(v) => setrlimit(r, v, v).map_err(|e| format!("{what}: {e}")),
            None => Ok(()),
        }
    };
    // The data limit (heap and private writable mappings), not the address
    // space: runtimes such as V8 reserve gigabytes they never use.
    set(
        Resource::RLIMIT_DATA,
        spec.memory_mb.map(|m| m.saturating_mul(1 << 20)),
        "memory_mb",
    )?;
    set(Resource::RLIMIT_CPU, spec.cpu_s, "cpu_s")?;
    set(Resource::RLIMIT_NPROC, spec.processes, "processes")?;
    // No core files of a server's memory.
    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(|e| format!("core: {e}"))
}

/// Root runs the server as `nobody` (root ignores the process limit and
/// file permissions).
fn unprivileged() -> Result<(), String> {
    use nix::unistd::{getuid, setgid, setgroups, setuid, Gid, Uid};
    if !getuid().is_root() {
        return Ok(());
    }
    setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    setgid(Gid::from_raw(NOBODY)).map_err(|e| format!("setgid: {e}"))?;
    setuid(Uid::from_raw(NOBODY)).map_err(|e| format!("setuid: {e}"))
}

/// Landlock rules: the filesystem (`read`, `write`, the runtime, the
/// command's own directory), and TCP connect/bind (none, or the listed
/// ports). Results per layer.
fn landlock(spec: &Spec, command: &Path, egress: bool) -> (Result<(), String>, Result<(), String>) {
    use landlock::{
        path_beneath_rules, Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, ABI,
    };
    let abi = ABI::V5;
    let mut read: Vec<PathBuf> = RUNTIME_READ
        .iter()
        .chain(ETC_READ.iter())
        .map(PathBuf::from)
        .collect();
    // Interpreters' own configuration (`/etc/python3.11`, …).
    if let Ok(entries) = std::fs::read_dir("/etc") {
        read.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                .map(|e| e.path()),
        );
    }
    read.extend(spec.read.iter().cloned());
    if let Some(dir) = command
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        read.push(dir);
    }
    let mut write: Vec<PathBuf> = RUNTIME_WRITE.iter().map(PathBuf::from).collect();
    write.extend(spec.write.iter().cloned());
    let ports: Vec<u16> = match (&spec.network, egress) {
        (Network::None, _) => Vec::new(),
        (Network::Allow(_), true) => vec![EGRESS_PORT],
        (Network::Allow(pairs), false) => pairs
            .iter()
            .filter_map(|p| p.rsplit_once(':').and_then(|(_, port)| port.parse().ok()))
            .collect(),
    };
    let built = (|| -> Result<RulesetStatus, landlock::RulesetError> {
        let existing =
            |v: &[PathBuf]| -> Vec<PathBuf> { v.iter().filter(|p| p.exists()).cloned().collect() };
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))?
            .handle_access(AccessNet::from_all(abi))?
            .create()?
            .add_rules(path_beneath_rules(
                existing(&read),
                AccessFs::from_read(abi),
            ))?
            .add_rules(path_beneath_rules(
                existing(&write),
                AccessFs::from_all(abi),
            ))?;
        for port in &ports {
            ruleset = ruleset.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
        }
        Ok(ruleset.restrict_self()?.ruleset)
    })();
    match built {
        Ok(RulesetStatus::FullyEnforced) => (Ok(()), Ok(())),
        Ok(RulesetStatus::PartiallyEnforced) => (
            Ok(()),
            Err("the kernel's Landlock has no network rules (ABI < 4)".to_owned()),
        ),
        Ok(RulesetStatus::NotEnforced) => (
            Err("Landlock is not enabled in this kernel".to_owned()),
            Err("Landlock is not enabled in this kernel".to_owned()),
        ),
        Err(e) => (Err(e.to_string()), Err(e.to_string())),
    }
}

/// A second Landlock layer: signals and abstract UNIX sockets stay inside
/// the server's own sandbox (another principal's server, running as the
/// same user, cannot be signalled).
fn landlock_scope() -> Result<(), String> {
    use landlock::{Ruleset, RulesetAttr, RulesetStatus, Scope};
    let status = Ruleset::default()
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self())
        .map_err(|e| e.to_string())?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        _ => Err("the kernel's Landlock has no scopes (ABI < 6, Linux < 6.12)".to_owned()),
    }
}

/// The system calls an MCP server never needs, refused with `EPERM`:
/// debugging other processes, mounting, kernel modules and keyrings,
/// loading BPF, rebooting, namespaces, raw or packet sockets, and leaving
/// its process group.
fn seccomp() -> Result<(), String> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    use std::collections::BTreeMap;
    let arch = match std::env::consts::ARCH {
        "x86_64" => TargetArch::x86_64,
        "aarch64" => TargetArch::aarch64,
        other => return Err(format!("no seccomp filter for {other}")),
    };
    let refused: &[i64] = &[
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_setns,
        libc::SYS_unshare,
        libc::SYS_userfaultfd,
        // Leaving its process group would outlive the close sequence.
        libc::SYS_setsid,
        libc::SYS_setpgid,
    ];
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        refused.iter().map(|s| (*s, Vec::new())).collect();
    // socket(AF_PACKET, …) and socket(…, SOCK_RAW, …).
    let raw = |arg: u8, value: u64| -> Result<SeccompRule, String> {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(|e| e.to_string())
    };
    let masked = |arg: u8, mask: u64, value: u64| -> Result<SeccompRule, String> {
        SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(mask),
            value,
        )
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(|e| e.to_string())
    };
    rules.insert(
        libc::SYS_socket,
        vec![
            raw(0, libc::AF_PACKET as u64)?,
            masked(1, 0xf, libc::SOCK_RAW as u64)?,
        ],
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

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
