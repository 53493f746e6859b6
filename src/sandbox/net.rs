//! The network layer: a network namespace of its own, its loopback brought
//! up, and (for an allow-list) the forwarder on that loopback to the
//! firewall's egress proxy, the only way out.

use std::path::Path;

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

/// A network namespace of its own (the caller holds `CAP_SYS_ADMIN`, in
/// the initial user namespace or in its own).
pub fn namespace() -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare(CLONE_NEWNET): {e}"))
}

/// The namespace, its loopback up and, with `egress`, the forwarder to
/// the proxy started in it.
pub fn apply(egress: Option<Egress<'_>>) -> Result<(), String> {
    namespace()?;
    if let Some(e) = egress {
        loopback_up()?;
        start_forwarder(e.socket, e.probe)?;
    }
    Ok(())
}

/// Starts the egress forwarder of a sandbox in its own network namespace:
/// binds `127.0.0.1:`[`EGRESS_PORT`] there and starts `mcp-firewall
/// egress-forward --to SOCKET` with that listener as its stdin, in the
/// server's process group (it ends with the server). With `probe`, only
/// binds (nothing is left running).
pub(super) fn start_forwarder(socket: &Path, probe: bool) -> Result<(), String> {
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
pub(super) fn loopback_up() -> Result<(), String> {
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
