//! The layers a process applies to itself last, just before the server
//! starts: its limits (rlimits), its identity (a uid of its own, or a user
//! namespace of its own), and Landlock (files, TCP ports, scopes).

use std::path::PathBuf;

use super::{Network, Spec};

/// The limits of `spec`, and no core files.
pub(crate) fn rlimits(spec: &Spec) -> Result<(), String> {
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
    // Counted per user (per user namespace): every server has a user of
    // its own, so one server's processes never count against another's.
    set(Resource::RLIMIT_NPROC, spec.processes, "processes")?;
    // No core files of a server's memory.
    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(|e| format!("core: {e}"))
}

/// Who the process becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// Real root: become this uid and gid, with no other groups.
    Uid(u32, u32),
    /// Root of a user namespace made for this server (a firewall that is
    /// not root, whose uid is the one given): a nested user namespace in
    /// which the server is that uid, not root, and holds no capability.
    Nested(u32),
    /// Not root already: nothing to drop (no namespaces here).
    AsIs,
}

/// Becomes the server's own user.
pub(crate) fn unprivileged(identity: Identity) -> Result<(), String> {
    use nix::unistd::{setgid, setgroups, setuid, Gid, Uid};
    match identity {
        Identity::Uid(uid, gid) => {
            setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
            setgid(Gid::from_raw(gid)).map_err(|e| format!("setgid({gid}): {e}"))?;
            setuid(Uid::from_raw(uid)).map_err(|e| format!("setuid({uid}): {e}"))
        }
        Identity::Nested(outer) => {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)
                .map_err(|e| format!("unshare(CLONE_NEWUSER): {e}"))?;
            // Root of the enclosing namespace (the firewall's uid outside)
            // is `outer` inside, and nothing else is mapped.
            write_id_maps(&format!("{outer} 0 1"), &format!("{outer} 0 1"))
        }
        Identity::AsIs => Ok(()),
    }
}

/// Writes this process's uid and gid maps (after denying `setgroups`).
pub(crate) fn write_id_maps(uid_map: &str, gid_map: &str) -> Result<(), String> {
    let write = |file: &str, text: &str| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| format!("writing /proc/self/{file}: {e}"))
    };
    write("setgroups", "deny")?;
    write("uid_map", uid_map)?;
    write("gid_map", gid_map)
}

/// Landlock rules: the filesystem (`read`, `write`), and TCP connect/bind
/// (none, or the listed ports). Results per layer.
pub(crate) fn landlock(
    read: &[PathBuf],
    write: &[PathBuf],
    ports: &[u16],
) -> (Result<(), String>, Result<(), String>) {
    use landlock::{
        path_beneath_rules, Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, ABI,
    };
    let abi = ABI::V5;
    let built = (|| -> Result<RulesetStatus, landlock::RulesetError> {
        let existing =
            |v: &[PathBuf]| -> Vec<PathBuf> { v.iter().filter(|p| p.exists()).cloned().collect() };
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))?
            .handle_access(AccessNet::from_all(abi))?
            .create()?
            .add_rules(path_beneath_rules(existing(read), AccessFs::from_read(abi)))?
            .add_rules(path_beneath_rules(existing(write), AccessFs::from_all(abi)))?;
        for port in ports {
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

/// The TCP ports a server may connect to: none, the egress forwarder's,
/// or (an allow-list without the proxy) the listed ones.
pub(crate) fn ports(spec: &Spec, egress: bool) -> Vec<u16> {
    match (&spec.network, egress) {
        (Network::None, _) => Vec::new(),
        (Network::Allow(_), true) => vec![super::net::EGRESS_PORT],
        (Network::Allow(pairs), false) => pairs
            .iter()
            .filter_map(|p| p.rsplit_once(':').and_then(|(_, port)| port.parse().ok()))
            .collect(),
    }
}

/// A second Landlock layer: signals and abstract UNIX sockets stay inside
/// the server's own sandbox.
pub(crate) fn landlock_scope() -> Result<(), String> {
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
