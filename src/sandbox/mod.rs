//! Confinement of a server process the firewall starts: a process tree of
//! its own that reaches neither the kernel's attack surface, the host, nor
//! another server. Each layer and what it stops:
//!
//! | layer | stops |
//! |---|---|
//! | `net_namespace` | every network but its own loopback (`network = "none"`), or all but the forwarder to the firewall's egress proxy (an allow-list) |
//! | `pid_namespace` | seeing or signalling any process but its own; `/proc` shows only them |
//! | `mount_namespace` | every file but the runtime and `read`/`write`: a private root of read-only binds, a private `/tmp` and home, no host sockets, no other server's directories, none of the firewall's files |
//! | `ipc_namespace` | System V IPC and POSIX message queues of the host and other servers |
//! | `rlimits` | memory, CPU time and processes beyond the limits (counted per server) |
//! | `unprivileged` | root and another server's processes: a uid of its own per server (a root firewall), or a user namespace of its own (a firewall that is not root) |
//! | `no_new_privs` | gaining privileges through set-user-ID programs |
//! | `landlock_fs`, `landlock_net` | files outside the lists and TCP to unlisted ports, again, inside the view |
//! | `landlock_scope` | signals and abstract UNIX sockets outside its sandbox (Linux 6.12+, best effort) |
//! | `seccomp` | every system call not on an allow-list; namespaces, io_uring, mounting, BPF, keyrings, `ptrace`, raw sockets, … refused ([`seccomp::REFUSED`]) |
//!
//! How it is applied ([`launch`]): `mcp-firewall sandbox-exec` (the
//! launcher) makes the namespaces and starts itself again as the first
//! process of the new PID namespace (`--init-of`), which builds the private
//! root ([`root`]), applies every other layer to itself, and only then
//! starts the server, with the environment the firewall gave it and
//! nothing else, and stays as its init: it reaps what the server leaves,
//! and when it ends, everything in the namespace ends. Every layer is
//! applied by ordinary system calls before a program runs, so no code runs
//! between `fork` and `exec` (no `unsafe` hook).
//!
//! Each layer is reported (applied, or missing and why). With `required`
//! (the default) a missing layer refuses to start the server, naming it;
//! without, the server runs with what could be applied.

pub(crate) mod access;
pub mod launch;
pub mod net;
pub(crate) mod root;
pub mod seccomp;
mod spec;
pub use self::spec::*;
