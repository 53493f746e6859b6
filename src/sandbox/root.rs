//! The mount layer: a filesystem view of the server's own. In a mount
//! namespace of its own, a private root (a small tmpfs) holds read-only
//! binds of the runtime and `read`, read-write binds of `write` and the
//! server's home, a private `/tmp` and `/dev/shm`, a `/dev` of the four
//! devices every runtime opens, and a `/proc` of its own PID namespace;
//! then the root is pivoted and the old one detached. What is not bound
//! does not exist for the server: host sockets (`/run`, `/var/run`), other
//! servers' directories, the firewall's config, keys, state and egress
//! sockets, `/sys`, and every other process.
//!
//! Built by the sandbox's init (the first process of its PID namespace),
//! which holds the capabilities of its namespaces until it starts the
//! server.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// What the view holds.
pub(crate) struct View<'a> {
    /// Bound read-only (the runtime, `read`, the program's package).
    pub read: Vec<PathBuf>,
    /// Bound read-write (`write`, the home).
    pub write: Vec<PathBuf>,
    /// An empty directory the private root is mounted on.
    pub root: &'a Path,
}

/// Built, and whether `/proc` of its own PID namespace could be mounted.
pub(crate) struct Built {
    /// `Err` names why there is no `/proc`.
    pub proc: Result<(), String>,
}

const NONE: Option<&str> = None;

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Makes the mount namespace and the view, and pivots into it.
pub(crate) fn build(view: &View<'_>) -> Result<Built, String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    // Nothing mounted here propagates to the host, nor back.
    mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE)
        .map_err(|e| err("making private", Path::new("/"), e))?;
    let root = view.root;
    tmpfs(root, "mode=0755,size=8m")?;
    let at = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    tmpfs(&mkdir(&at(Path::new("/tmp")))?, "mode=1777,size=64m")?;
    devices(&at(Path::new("/dev")))?;
    let mut binds: Vec<(PathBuf, bool)> = Vec::new();
    for (list, write) in [(&view.read, false), (&view.write, true)] {
        for p in list {
            let skip = ["/proc", "/sys", "/dev", "/tmp"];
            if skip.iter().any(|s| p == Path::new(s)) {
                continue;
            }
            if let Ok(c) = p.canonicalize() {
                binds.push((c, write));
            }
        }
    }
    // Ancestors first; a path listed twice is bound once, writable if
    // either says so.
    binds.sort_by(|a, b| {
        (a.0.components().count(), &a.0, !a.1).cmp(&(b.0.components().count(), &b.0, !b.1))
    });
    binds.dedup_by(|later, first| later.0 == first.0);
    let mut done: Vec<(PathBuf, bool)> = Vec::new();
    for (source, write) in binds {
        let covered = done
            .iter()
            .any(|(d, w)| source.starts_with(d) && (*w || !write));
        if covered {
            continue;
        }
        bind(&source, &at(&source), write)?;
        done.push((source, write));
    }
    // The listed paths as they were written: a symbolic link on the way
    // (`/bin` → `usr/bin`, `/etc/resolv.conf` → `../run/…`) is made again.
    for p in view.read.iter().chain(&view.write) {
        let mut prefix = PathBuf::from("/");
        for c in p.components().skip(1) {
            prefix.push(c);
            let Ok(target) = std::fs::read_link(&prefix) else {
                continue;
            };
            let inside = at(&prefix);
            if inside.symlink_metadata().is_err() {
                if let Some(parent) = inside.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| err("creating", parent, e))?;
                }
                std::os::unix::fs::symlink(&target, &inside)
                    .map_err(|e| err("linking", &inside, e))?;
            }
        }
    }
    let proc_dir = mkdir(&at(Path::new("/proc")))?;
    let proc = mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        NONE,
    )
    .map_err(|e| {
        format!("mounting /proc of its own PID namespace: {e} (a container runtime that masks /proc refuses it)")
    });
    std::env::set_current_dir(root).map_err(|e| err("entering", root, e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| err("pivot_root to", root, e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| err("detaching the old root", root, e))?;
    std::env::set_current_dir("/").map_err(|e| err("entering", Path::new("/"), e))?;
    mount(
        NONE,
        "/",
        NONE,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        NONE,
    )
    .map_err(|e| err("making read-only", Path::new("/"), e))?;
    Ok(Built { proc })
}

fn mkdir(p: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(p).map_err(|e| err("creating", p, e))?;
    Ok(p.to_path_buf())
}

fn tmpfs(at: &Path, options: &str) -> Result<(), String> {
    mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options),
    )
    .map_err(|e| err("mounting a tmpfs on", at, e))
}

/// `/dev`: the four devices, the standard descriptors, a private shm.
fn devices(dev: &Path) -> Result<(), String> {
    mkdir(dev)?;
    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| err("mounting a tmpfs on", dev, e))?;
    for d in super::RUNTIME_WRITE {
        let source = Path::new(d);
        let target = dev.join(source.file_name().unwrap_or_default());
        std::fs::write(&target, b"").map_err(|e| err("creating", &target, e))?;
        mount(Some(source), &target, NONE, MsFlags::MS_BIND, NONE)
            .map_err(|e| err("binding", source, e))?;
        let flags =
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
        mount(NONE, &target, NONE, flags | locked(source), NONE)
            .map_err(|e| err("restricting", &target, e))?;
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let link = dev.join(name);
        std::os::unix::fs::symlink(to, &link).map_err(|e| err("linking", &link, e))?;
    }
    tmpfs(&mkdir(&dev.join("shm"))?, "mode=1777,size=16m")
}

/// Binds `source` at `target` (created as its kind), read-only unless
/// `write`, never set-user-ID nor devices.
fn bind(source: &Path, target: &Path, write: bool) -> Result<(), String> {
    if target.symlink_metadata().is_err() {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| err("creating", parent, e))?;
        }
        if source.is_dir() {
            mkdir(target)?;
        } else {
            std::fs::write(target, b"").map_err(|e| err("creating", target, e))?;
        }
    }
    mount(
        Some(source),
        target,
        NONE,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        NONE,
    )
    .map_err(|e| err("binding", source, e))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if !write {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(NONE, target, NONE, flags | locked(source), NONE)
        .map_err(|e| err("restricting", target, e))
}

/// The flags of the mount `p` is on that a remount must keep (in a user
/// namespace they are locked: clearing one is refused).
fn locked(p: &Path) -> MsFlags {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let Ok(st) = statvfs(p) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut out = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs) {
            out |= ms;
        }
    }
    if !f.intersects(FsFlags::ST_NOATIME | FsFlags::ST_RELATIME) {
        out |= MsFlags::MS_STRICTATIME;
    }
    out
}
