"""A stdio MCP server (standard library only) whose tools try what a
compromised server would: read and write files, connect out, fork without
end, hog memory, ptrace its parent, crash mid-call, break the transport.
Each tool reports what happened (the error the sandbox caused, or success)
so the tests can assert the sandbox stopped it. Run by the firewall under
`mcp-firewall sandbox-exec`, in PID, mount and user namespaces of its own.

Its process id inside its PID namespace says nothing to the tests (every
server is pid 2 there), so each process names itself: a random token set as
its command name (`/proc/<pid>/comm`, readable from the host), which `pid`
and `spawn_child` return and the tests map to the host's pid.
"""

import ctypes
import json
import os
import signal
import socket
import sys
import time

TOOLS = [
    "pid", "ppid", "echo", "read_file", "write_file", "connect", "connect_via_proxy",
    "fork_bomb", "hog", "ptrace", "crash", "garbage", "progress", "env",
    "spawn_child", "stubborn", "forbidden", "received", "processes", "connect_unix",
    "hold_processes", "list_dir",
]

LIBC = ctypes.CDLL(None, use_errno=True)


def name_me(token):
    """Sets this process's command name (PR_SET_NAME) to `token`."""
    LIBC.prctl(15, token.encode(), 0, 0, 0)


TOKEN = "bx" + os.urandom(5).hex()
name_me(TOKEN)

RECEIVED = []  # every tools/call name this process was sent, in order

STUBBORN = False


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def text(s, error=False):
    return {"content": [{"type": "text", "text": s}], "isError": error}


def call(name, args, meta):
    if name == "pid":
        return text(TOKEN)
    if name == "processes":
        # Every process this server can see, with its command line.
        seen = []
        for p in sorted(os.listdir("/proc")):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        seen.append([int(p), f.read().replace(b"\0", b" ").decode(errors="replace").strip()])
                except OSError as e:
                    seen.append([int(p), f"error: {e.strerror}"])
        return text(json.dumps(seen))
    if name == "list_dir":
        try:
            return text(json.dumps(sorted(os.listdir(args["path"]))))
        except OSError as e:
            return text(f"error: {e.strerror} ({e.errno})", True)
    if name == "connect_unix":
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect(args["path"])
            s.sendall(args.get("send", "hello from the sandbox\n").encode())
            reply = s.recv(200).decode(errors="replace")
            s.close()
            return text(f"connected: {reply}")
        except OSError as e:
            return text(f"error: {e.strerror or e} ({e.errno})", True)
    if name == "hold_processes":
        # Forks sleeping children up to the limit and keeps them.
        n = 0
        try:
            while n < int(args.get("max", 1000)):
                pid = os.fork()
                if pid == 0:
                    time.sleep(120)
                    os._exit(0)
                n += 1
        except OSError as e:
            return text(f"holding {n}: {e.strerror} ({e.errno})")
        return text(f"holding {n}")
    if name == "received":
        return text(json.dumps(RECEIVED))
    if name == "forbidden":
        return text("ran")
    if name == "ppid":
        return text(str(os.getppid()))
    if name == "echo":
        return text(args.get("text", ""))
    if name == "env":
        return text(json.dumps(sorted(os.environ.keys())))
    if name == "read_file":
        try:
            with open(args["path"]) as f:
                return text(f.read())
        except OSError as e:
            return text(f"error: {e.strerror} ({e.errno})", True)
    if name == "write_file":
        try:
            with open(args["path"], "w") as f:
                f.write(args.get("text", "x"))
            return text("written")
        except OSError as e:
            return text(f"error: {e.strerror} ({e.errno})", True)
    if name == "connect":
        try:
            s = socket.create_connection((args["host"], int(args["port"])), timeout=3)
            s.sendall(b"hello from the sandbox\n")
            s.close()
            return text("connected")
        except OSError as e:
            return text(f"error: {e.strerror or e} ({e.errno})", True)
    if name == "connect_via_proxy":
        proxy = os.environ.get("HTTPS_PROXY", "")
        if not proxy:
            return text("error: no HTTPS_PROXY", True)
        host, port = proxy.rsplit("/", 1)[-1].rsplit(":", 1)
        try:
            s = socket.create_connection((host, int(port)), timeout=3)
            target = f"{args['host']}:{args['port']}"
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            status = s.recv(200).split(b"\r\n", 1)[0].decode()
            if " 200 " in status:
                s.sendall(b"hello through the proxy\n")
            s.close()
            return text(status)
        except OSError as e:
            return text(f"error: {e.strerror or e} ({e.errno})", True)
    if name == "fork_bomb":
        n = 0
        try:
            while n < 1000:
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
        except OSError as e:
            return text(f"stopped after {n}: {e.strerror} ({e.errno})", True)
        return text(f"forked {n}")
    if name == "hog":
        try:
            blocks = [bytearray(64 << 20) for _ in range(int(args.get("mb", 4096)) // 64)]
            return text(f"allocated {len(blocks) * 64} MiB")
        except MemoryError:
            return text("error: MemoryError", True)
    if name == "ptrace":
        rc = LIBC.ptrace(16, os.getppid(), 0, 0)  # PTRACE_ATTACH
        return text(f"ptrace rc={rc} errno={ctypes.get_errno()}", rc != 0)
    if name == "spawn_child":
        child = TOKEN + "c"
        pid = os.fork()
        if pid == 0:
            name_me(child)
            time.sleep(600)
            os._exit(0)
        # The child has named itself before the answer leaves.
        time.sleep(0.2)
        return text(child)
    if name == "stubborn":
        # Ignores SIGTERM, and outlives its stdin: only SIGKILL ends it.
        global STUBBORN
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        STUBBORN = True
        return text("stubborn")
    if name == "crash":
        os._exit(3)
    if name == "garbage":
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
        time.sleep(5)
        return text("still here")
    if name == "progress":
        token = meta.get("progressToken")
        if token is not None:
            for i in (1, 2):
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": i, "total": 2}})
        return text("done")
    return None


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None or method is None:
            continue
        params = msg.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "box", "version": "1"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": [{"name": t, "inputSchema": {"type": "object"}} for t in TOOLS]}
        elif method == "tools/call":
            RECEIVED.append(params.get("name"))
            result = call(params.get("name"), params.get("arguments") or {}, params.get("_meta") or {})
            if result is None:
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "unknown tool"}})
                continue
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found"}})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": result})
    while STUBBORN:
        time.sleep(1)


if __name__ == "__main__":
    main()
