//! The seccomp layer: which system calls a confined server may make.
//!
//! Two filters, both installed before the server is executed:
//!
//! 1. **Default deny** ([`ALLOWED`]): the system calls the runtimes MCP
//!    servers are written for need (Node.js, Python, a shell and what they
//!    start). Anything else fails with `ENOSYS`, as on a kernel that lacks
//!    it, so a libc falls back where it can (`clone3` to `clone`,
//!    `io_uring` to threads), and an x32 or unknown call never runs.
//! 2. **The refusals** ([`REFUSED`], one table): namespaces (`unshare`,
//!    `setns`, `clone` with any `CLONE_NEW*` flag), `io_uring`,
//!    `personality` changes, raw and packet sockets and every socket family
//!    but UNIX, IP and netlink's routing, mounting, modules, keyrings, BPF,
//!    `perf`, `ptrace` and other processes' memory, the clock, reboot and
//!    swap, file handles, leaving its process group. Each fails with
//!    `EPERM` and carries why; the tests make each one from inside a
//!    sandbox.
//!
//! Where the filters overlap, the later one's answer wins (the kernel runs
//! every filter and, among errors, returns the newest filter's), so a
//! refused call is `EPERM` whether or not the allow-list names it.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// A condition on one argument of a refused call (all of an entry's
/// conditions hold for it to be refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// `arg & mask == mask`: the flags are set.
    Has(u8, u64),
    /// `arg == value`.
    Is(u8, u64),
    /// `arg != value`.
    Not(u8, u64),
    /// `arg & mask == value`.
    Masked(u8, u64, u64),
}

/// One refused system call (or one refused use of it).
#[derive(Debug, Clone, Copy)]
pub struct Refusal {
    /// What is refused, as the tests name it.
    pub name: &'static str,
    /// The system call.
    pub nr: i64,
    /// When it is refused (every call when empty).
    pub when: &'static [Cond],
    /// Arguments that make the refused call (the tests make it with them).
    pub probe: [u64; 4],
    /// Why an MCP server is refused it.
    pub why: &'static str,
}

const fn r(name: &'static str, nr: i64, probe: [u64; 4], why: &'static str) -> Refusal {
    Refusal {
        name,
        nr,
        when: &[],
        probe,
        why,
    }
}

const fn when(
    name: &'static str,
    nr: i64,
    when: &'static [Cond],
    probe: [u64; 4],
    why: &'static str,
) -> Refusal {
    Refusal {
        name,
        nr,
        when,
        probe,
        why,
    }
}

const SIGCHLD: u64 = libc::SIGCHLD as u64;
const NS: &str = "a namespace of its own is kernel surface a server never needs (and a user namespace gives every capability in it)";
const CLONE_NEW: [(&str, u64); 7] = [
    ("clone(CLONE_NEWUSER)", libc::CLONE_NEWUSER as u64),
    ("clone(CLONE_NEWNET)", libc::CLONE_NEWNET as u64),
    ("clone(CLONE_NEWNS)", libc::CLONE_NEWNS as u64),
    ("clone(CLONE_NEWPID)", libc::CLONE_NEWPID as u64),
    ("clone(CLONE_NEWIPC)", libc::CLONE_NEWIPC as u64),
    ("clone(CLONE_NEWUTS)", libc::CLONE_NEWUTS as u64),
    ("clone(CLONE_NEWCGROUP)", libc::CLONE_NEWCGROUP as u64),
];

/// Every flag of [`CLONE_NEW`]: `clone` is allowed only without them.
pub const CLONE_NEW_ANY: u64 = {
    let mut all = 0;
    let mut i = 0;
    while i < CLONE_NEW.len() {
        all |= CLONE_NEW[i].1;
        i += 1;
    }
    all
};

macro_rules! clone_new {
    ($i:expr) => {
        when(
            CLONE_NEW[$i].0,
            libc::SYS_clone,
            &[Cond::Has(0, CLONE_NEW[$i].1)],
            [CLONE_NEW[$i].1 | SIGCHLD, 0, 0, 0],
            NS,
        )
    };
}

const AF_UNIX: u64 = libc::AF_UNIX as u64;
const AF_INET: u64 = libc::AF_INET as u64;
const AF_INET6: u64 = libc::AF_INET6 as u64;
const AF_NETLINK: u64 = libc::AF_NETLINK as u64;
const SOCK_RAW: u64 = libc::SOCK_RAW as u64;
const SOCK_DGRAM: u64 = libc::SOCK_DGRAM as u64;

const IO_URING: &str = "io_uring runs socket and file operations this filter cannot see";
const PERSONALITY: &str =
    "an execution domain changes how the kernel reads system calls and lays out memory";
/// `personality` with anything but the query and the default.
const PERSONALITY_CHANGE: &[Cond] = &[Cond::Not(0, 0), Cond::Not(0, 0xffff_ffff)];
const OTHER_FAMILY: &str =
    "a socket family an MCP server never needs (packet, Bluetooth, vsock, crypto, XDP, …)";
/// A socket family but UNIX, IPv4, IPv6 and netlink.
const NOT_A_KNOWN_FAMILY: &[Cond] = &[
    Cond::Not(0, AF_UNIX),
    Cond::Not(0, AF_INET),
    Cond::Not(0, AF_INET6),
    Cond::Not(0, AF_NETLINK),
];
const NETLINK: &str = "netlink beyond routing reaches nf_tables, audit, crypto and kernel events";
/// Netlink but routing.
const NETLINK_NOT_ROUTE: &[Cond] = &[
    Cond::Is(0, AF_NETLINK),
    Cond::Not(2, libc::NETLINK_ROUTE as u64),
];

/// The refusals: one entry per refused call or use, each made by the tests.
pub const REFUSED: &[Refusal] = &[
    // Namespaces.
    r(
        "unshare",
        libc::SYS_unshare,
        [libc::CLONE_NEWUSER as u64, 0, 0, 0],
        NS,
    ),
    r("setns", libc::SYS_setns, [0, 0, 0, 0], NS),
    clone_new!(0),
    clone_new!(1),
    clone_new!(2),
    clone_new!(3),
    clone_new!(4),
    clone_new!(5),
    clone_new!(6),
    // io_uring: its operations (sockets, files) bypass this filter.
    r(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        [8, 0, 0, 0],
        IO_URING,
    ),
    r(
        "io_uring_enter",
        libc::SYS_io_uring_enter,
        [0, 0, 0, 0],
        IO_URING,
    ),
    r(
        "io_uring_register",
        libc::SYS_io_uring_register,
        [0, 0, 0, 0],
        IO_URING,
    ),
    // Execution domains: only the query and the default.
    when(
        "personality(PER_LINUX32)",
        libc::SYS_personality,
        PERSONALITY_CHANGE,
        [0x0008, 0, 0, 0],
        PERSONALITY,
    ),
    when(
        "personality(READ_IMPLIES_EXEC)",
        libc::SYS_personality,
        PERSONALITY_CHANGE,
        [0x0040_0000, 0, 0, 0],
        PERSONALITY,
    ),
    // Sockets: UNIX, IPv4, IPv6 and netlink's routing only; no raw sockets.
    when(
        "socket(AF_PACKET)",
        libc::SYS_socket,
        NOT_A_KNOWN_FAMILY,
        [libc::AF_PACKET as u64, SOCK_RAW, 0, 0],
        OTHER_FAMILY,
    ),
    when(
        "socket(AF_VSOCK)",
        libc::SYS_socket,
        NOT_A_KNOWN_FAMILY,
        [libc::AF_VSOCK as u64, libc::SOCK_STREAM as u64, 0, 0],
        OTHER_FAMILY,
    ),
    when(
        "socket(AF_ALG)",
        libc::SYS_socket,
        NOT_A_KNOWN_FAMILY,
        [libc::AF_ALG as u64, libc::SOCK_SEQPACKET as u64, 0, 0],
        OTHER_FAMILY,
    ),
    when(
        "socket(AF_INET, SOCK_RAW)",
        libc::SYS_socket,
        &[Cond::Not(0, AF_NETLINK), Cond::Masked(1, 0xf, SOCK_RAW)],
        [AF_INET, SOCK_RAW, libc::IPPROTO_ICMP as u64, 0],
        "raw sockets forge packets",
    ),
    when(
        "socket(AF_NETLINK, NETLINK_NETFILTER)",
        libc::SYS_socket,
        NETLINK_NOT_ROUTE,
        [AF_NETLINK, SOCK_RAW, libc::NETLINK_NETFILTER as u64, 0],
        NETLINK,
    ),
    when(
        "socket(AF_NETLINK, NETLINK_AUDIT)",
        libc::SYS_socket,
        NETLINK_NOT_ROUTE,
        [AF_NETLINK, SOCK_DGRAM, libc::NETLINK_AUDIT as u64, 0],
        NETLINK,
    ),
    when(
        "socketpair(AF_INET)",
        libc::SYS_socketpair,
        &[Cond::Not(0, AF_UNIX)],
        [AF_INET, libc::SOCK_STREAM as u64, 0, 0],
        "only UNIX socket pairs exist",
    ),
    // Filesystems and mounts.
    r(
        "mount",
        libc::SYS_mount,
        [0, 0, 0, 0],
        "mounting changes what the server sees",
    ),
    r(
        "umount2",
        libc::SYS_umount2,
        [0, 0, 0, 0],
        "unmounting uncovers what the sandbox hides",
    ),
    r(
        "pivot_root",
        libc::SYS_pivot_root,
        [0, 0, 0, 0],
        "changing the root leaves the sandbox's view",
    ),
    r(
        "chroot",
        libc::SYS_chroot,
        [0, 0, 0, 0],
        "changing the root leaves the sandbox's view",
    ),
    r(
        "open_tree",
        libc::SYS_open_tree,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "move_mount",
        libc::SYS_move_mount,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "fsopen",
        libc::SYS_fsopen,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "fsconfig",
        libc::SYS_fsconfig,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "fsmount",
        libc::SYS_fsmount,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "fspick",
        libc::SYS_fspick,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "mount_setattr",
        libc::SYS_mount_setattr,
        [0, 0, 0, 0],
        "the new mount API",
    ),
    r(
        "name_to_handle_at",
        libc::SYS_name_to_handle_at,
        [0, 0, 0, 0],
        "file handles open files by number, past every path check",
    ),
    r(
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        [0, 0, 0, 0],
        "file handles open files by number, past every path check",
    ),
    r(
        "quotactl",
        libc::SYS_quotactl,
        [0, 0, 0, 0],
        "disk quotas are the host's",
    ),
    r(
        "swapon",
        libc::SYS_swapon,
        [0, 0, 0, 0],
        "swap is the host's",
    ),
    r(
        "swapoff",
        libc::SYS_swapoff,
        [0, 0, 0, 0],
        "swap is the host's",
    ),
    r(
        "acct",
        libc::SYS_acct,
        [0, 0, 0, 0],
        "process accounting is the host's",
    ),
    r(
        "fanotify_init",
        libc::SYS_fanotify_init,
        [0, 0, 0, 0],
        "watching the whole filesystem",
    ),
    // Kernel code and state.
    r(
        "init_module",
        libc::SYS_init_module,
        [0, 0, 0, 0],
        "loading kernel code",
    ),
    r(
        "finit_module",
        libc::SYS_finit_module,
        [0, 0, 0, 0],
        "loading kernel code",
    ),
    r(
        "delete_module",
        libc::SYS_delete_module,
        [0, 0, 0, 0],
        "unloading kernel code",
    ),
    r(
        "kexec_load",
        libc::SYS_kexec_load,
        [0, 0, 0, 0],
        "replacing the kernel",
    ),
    r(
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        [0, 0, 0, 0],
        "replacing the kernel",
    ),
    r("bpf", libc::SYS_bpf, [0, 0, 0, 0], "kernel programs"),
    r(
        "perf_event_open",
        libc::SYS_perf_event_open,
        [0, 0, 0, 0],
        "kernel and hardware observation, a common exploit path",
    ),
    r(
        "userfaultfd",
        libc::SYS_userfaultfd,
        [0, 0, 0, 0],
        "stalls the kernel mid-copy, a common exploit path",
    ),
    r(
        "keyctl",
        libc::SYS_keyctl,
        [0, 0, 0, 0],
        "kernel keyrings are not namespaced",
    ),
    r(
        "add_key",
        libc::SYS_add_key,
        [0, 0, 0, 0],
        "kernel keyrings are not namespaced",
    ),
    r(
        "request_key",
        libc::SYS_request_key,
        [0, 0, 0, 0],
        "kernel keyrings are not namespaced",
    ),
    r(
        "syslog",
        libc::SYS_syslog,
        [0, 0, 0, 0],
        "the kernel log is the host's",
    ),
    r("reboot", libc::SYS_reboot, [0, 0, 0, 0], "the host's"),
    r(
        "settimeofday",
        libc::SYS_settimeofday,
        [0, 0, 0, 0],
        "the clock is the host's",
    ),
    r(
        "clock_settime",
        libc::SYS_clock_settime,
        [0, 0, 0, 0],
        "the clock is the host's",
    ),
    r(
        "clock_adjtime",
        libc::SYS_clock_adjtime,
        [0, 0, 0, 0],
        "the clock is the host's",
    ),
    r(
        "adjtimex",
        libc::SYS_adjtimex,
        [0, 0, 0, 0],
        "the clock is the host's",
    ),
    r(
        "sethostname",
        libc::SYS_sethostname,
        [0, 0, 0, 0],
        "the host's name",
    ),
    r(
        "setdomainname",
        libc::SYS_setdomainname,
        [0, 0, 0, 0],
        "the host's name",
    ),
    r(
        "vhangup",
        libc::SYS_vhangup,
        [0, 0, 0, 0],
        "terminals are the host's",
    ),
    // Other processes.
    r(
        "ptrace",
        libc::SYS_ptrace,
        [libc::PTRACE_TRACEME as u64, 0, 0, 0],
        "debugging reads and writes another process",
    ),
    r(
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        [0, 0, 0, 0],
        "reads another process's memory",
    ),
    r(
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        [0, 0, 0, 0],
        "writes another process's memory",
    ),
    r(
        "pidfd_getfd",
        libc::SYS_pidfd_getfd,
        [0, 0, 0, 0],
        "takes another process's files",
    ),
    r(
        "kcmp",
        libc::SYS_kcmp,
        [0, 0, 0, 0],
        "compares another process's kernel objects",
    ),
    r(
        "process_madvise",
        libc::SYS_process_madvise,
        [0, 0, 0, 0],
        "advises on another process's memory",
    ),
    r(
        "move_pages",
        libc::SYS_move_pages,
        [0, 0, 0, 0],
        "moves another process's memory",
    ),
    r(
        "migrate_pages",
        libc::SYS_migrate_pages,
        [0, 0, 0, 0],
        "moves another process's memory",
    ),
    r(
        "mbind",
        libc::SYS_mbind,
        [0, 0, 0, 0],
        "memory placement is the host's",
    ),
    r(
        "set_mempolicy",
        libc::SYS_set_mempolicy,
        [0, 0, 0, 0],
        "memory placement is the host's",
    ),
    // Leaving its process group would outlive the close sequence.
    r(
        "setsid",
        libc::SYS_setsid,
        [0, 0, 0, 0],
        "leaving its process group would outlive the close sequence",
    ),
    r(
        "setpgid",
        libc::SYS_setpgid,
        [0, 0, 0, 0],
        "leaving its process group would outlive the close sequence",
    ),
];

/// What the runtimes use, on every architecture (default deny: a call not
/// here fails with `ENOSYS`).
const ALLOWED: &[i64] = &[
    // Files and descriptors.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_lseek,
    libc::SYS_ioctl,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync,
    libc::SYS_syncfs,
    libc::SYS_sync_file_range,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_unlinkat,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_readlinkat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_umask,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_utimensat,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    libc::SYS_sendfile,
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_vmsplice,
    libc::SYS_copy_file_range,
    libc::SYS_pipe2,
    libc::SYS_memfd_create,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_io_setup,
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    libc::SYS_io_submit,
    libc::SYS_io_cancel,
    // Memory.
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_membarrier,
    libc::SYS_pkey_mprotect,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_get_mempolicy,
    libc::SYS_mseal,
    // Processes, threads and signals (`clone` and `personality` are
    // narrowed by the refusals).
    libc::SYS_clone,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_kill,
    libc::SYS_tkill,
    libc::SYS_tgkill,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getpgid,
    libc::SYS_getsid,
    libc::SYS_set_tid_address,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_futex,
    libc::SYS_futex_waitv,
    libc::SYS_rseq,
    libc::SYS_restart_syscall,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_rt_sigsuspend,
    libc::SYS_sigaltstack,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_prctl,
    libc::SYS_personality,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_getattr,
    libc::SYS_sched_setattr,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_getcpu,
    // Credentials (without capabilities, only ever dropping).
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_capget,
    libc::SYS_capset,
    // Limits, time and the system.
    libc::SYS_prlimit64,
    libc::SYS_getrusage,
    libc::SYS_sysinfo,
    libc::SYS_times,
    libc::SYS_uname,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getitimer,
    libc::SYS_setitimer,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // Waiting.
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_signalfd4,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    // Sockets (families narrowed by the refusals).
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    // System V IPC (in its own IPC namespace).
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    // A server may confine itself further.
    libc::SYS_seccomp,
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_restrict_self,
];

/// `map_shadow_stack` (x86_64, Linux 6.6; glibc's shadow stacks).
#[cfg(target_arch = "x86_64")]
const SYS_MAP_SHADOW_STACK: i64 = 453;

/// The calls only x86_64 has (older forms the runtimes still use there).
#[cfg(target_arch = "x86_64")]
const ALLOWED_ARCH: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_poll,
    libc::SYS_access,
    libc::SYS_pipe,
    libc::SYS_select,
    libc::SYS_dup2,
    libc::SYS_pause,
    libc::SYS_alarm,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_getdents,
    libc::SYS_rename,
    libc::SYS_mkdir,
    libc::SYS_rmdir,
    libc::SYS_creat,
    libc::SYS_link,
    libc::SYS_unlink,
    libc::SYS_symlink,
    libc::SYS_readlink,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_lchown,
    libc::SYS_getpgrp,
    libc::SYS_utime,
    libc::SYS_utimes,
    libc::SYS_futimesat,
    libc::SYS_mknod,
    libc::SYS_epoll_create,
    libc::SYS_epoll_wait,
    libc::SYS_inotify_init,
    libc::SYS_eventfd,
    libc::SYS_signalfd,
    libc::SYS_time,
    libc::SYS_arch_prctl,
    libc::SYS_getrlimit,
    libc::SYS_setrlimit,
    SYS_MAP_SHADOW_STACK,
];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_ARCH: &[i64] = &[];

/// Every system call the allow-list admits.
pub fn allowed() -> impl Iterator<Item = i64> {
    ALLOWED.iter().chain(ALLOWED_ARCH).copied()
}

fn condition(c: Cond) -> Result<SeccompCondition, String> {
    let (arg, op, value) = match c {
        Cond::Has(arg, mask) => (arg, SeccompCmpOp::MaskedEq(mask), mask),
        Cond::Is(arg, v) => (arg, SeccompCmpOp::Eq, v),
        Cond::Not(arg, v) => (arg, SeccompCmpOp::Ne, v),
        Cond::Masked(arg, mask, v) => (arg, SeccompCmpOp::MaskedEq(mask), v),
    };
    // The flags and families compared are 32-bit values (`clone`'s flags
    // are read by the kernel as their low 32 bits).
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

/// The refusals as seccomp rules: per system call, the rules of its
/// entries (any matching refuses it; no rules refuses every call).
fn refusal_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let mut rules: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    let mut seen: Vec<(i64, &[Cond])> = Vec::new();
    for entry in REFUSED {
        let slot = rules.entry(entry.nr).or_insert_with(|| Some(Vec::new()));
        if entry.when.is_empty() {
            // Refused whatever its arguments.
            *slot = None;
            continue;
        }
        // Several entries may probe one rule (three families, one
        // condition): it is compiled once.
        if seen.contains(&(entry.nr, entry.when)) {
            continue;
        }
        seen.push((entry.nr, entry.when));
        if let Some(list) = slot {
            let conditions = entry
                .when
                .iter()
                .map(|c| condition(*c))
                .collect::<Result<Vec<_>, _>>()?;
            list.push(SeccompRule::new(conditions).map_err(|e| e.to_string())?);
        }
    }
    Ok(rules
        .into_iter()
        .map(|(nr, r)| (nr, r.unwrap_or_default()))
        .collect())
}

fn arch() -> Result<TargetArch, String> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        other => Err(format!("no seccomp filter for {other}")),
    }
}

/// Both filters, compiled: the allow-list, then the refusals.
pub fn programs() -> Result<[BpfProgram; 2], String> {
    let arch = arch()?;
    let compile = |f: SeccompFilter| -> Result<BpfProgram, String> {
        f.try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())
    };
    let allow = SeccompFilter::new(
        allowed().map(|nr| (nr, Vec::new())).collect(),
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| e.to_string())?;
    let refuse = SeccompFilter::new(
        refusal_rules()?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    Ok([compile(allow)?, compile(refuse)?])
}

/// Installs both filters on the calling thread (inherited by everything
/// it starts).
pub fn apply() -> Result<(), String> {
    for p in programs()? {
        seccompiler::apply_filter(&p).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_filters_compile_and_the_tables_agree() {
        assert!(programs().is_ok());
        let allowed: std::collections::BTreeSet<i64> = allowed().collect();
        assert_eq!(
            allowed.len(),
            ALLOWED.len() + ALLOWED_ARCH.len(),
            "no call listed twice"
        );
        for e in REFUSED {
            // A call refused whatever its arguments is not on the
            // allow-list; a narrowed one is (the refusal narrows it).
            assert_eq!(
                allowed.contains(&e.nr),
                !e.when.is_empty(),
                "{}: refused outright and allowed, or narrowed and not allowed",
                e.name
            );
        }
        // What the runtimes cannot do without.
        for nr in [
            libc::SYS_clone,
            libc::SYS_execve,
            libc::SYS_futex,
            libc::SYS_socket,
        ] {
            assert!(allowed.contains(&nr));
        }
        // Unknown and newer calls fall back: io_uring and clone3 are not
        // allowed.
        for nr in [
            libc::SYS_clone3,
            libc::SYS_io_uring_setup,
            libc::SYS_unshare,
        ] {
            assert!(!allowed.contains(&nr));
        }
        assert_eq!(
            CLONE_NEW_ANY & libc::CLONE_NEWUSER as u64,
            libc::CLONE_NEWUSER as u64
        );
    }
}
