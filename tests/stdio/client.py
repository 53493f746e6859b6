"""The client of the stdio end-to-end check (run.sh).

The Python SDK's own client (PyPI `mcp`, pinned by run.sh), over streamable
HTTP with sessions (2025-11-25), against three stdio upstreams the firewall
starts and confines itself:

    python client.py BASE_URL TOKEN DOCS_DIR OTHER_DIR

  everything  the official server-everything, `node index.js stdio`
  py          py_server.py, the Python SDK over stdio
  docs        the official server-filesystem, given DOCS_DIR and OTHER_DIR
              in its arguments, but only DOCS_DIR readable in its sandbox

Checks (each prints `ok: ...`; the first failure prints `FAILED: ...` and
exits 1):
  1. everything: tools listed; echo and get-sum answer; a resource read
  2. py: hello answers; ask_model's sampling request reaches this client
     and its answer reaches the server; grow's tools/list_changed reaches
     this client; a second session runs in another process
  3. docs: a file in DOCS_DIR is read; a file in OTHER_DIR fails with the
     server's own error (the sandbox refused the open); a path outside both
     fails with the server's refusal
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TIMEOUT_S = 30
SAMPLED_MARKER = "the-sampled-answer-4242"


class Failure(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def texts(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


class Observed:
    def __init__(self) -> None:
        self.list_changed = 0
        self.sampling: list[types.CreateMessageRequestParams] = []

    async def message_handler(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed += 1

    async def sampling_callback(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        self.sampling.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=SAMPLED_MARKER),
            model="stdio-e2e-model",
            stop_reason="endTurn",
        )


async def session(url: str, token: str, seen: Observed, body) -> None:
    http = create_mcp_http_client(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(TIMEOUT_S, read=TIMEOUT_S + 15),
    )
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=TIMEOUT_S,
                sampling_callback=seen.sampling_callback,
                message_handler=seen.message_handler,
                client_info=types.Implementation(name="mcp-firewall-stdio-e2e", version="1.0.0"),
            ) as s:
                await s.initialize()
                await body(s)


async def call(s: ClientSession, name: str, args: dict[str, Any], error: bool = False) -> str:
    r = await s.call_tool(name, args)
    body = texts(r)
    check(bool(r.is_error) == error, f"tools/call {name}: isError={r.is_error}, content: {body!r}")
    return body


async def everything(s: ClientSession) -> None:
    tools = {t.name for t in (await s.list_tools()).tools}
    for want in ("echo", "get-sum"):
        check(want in tools, f"everything: tools/list lacks {want!r}: {sorted(tools)}")
    body = await call(s, "echo", {"message": "over stdio"})
    check("Echo: over stdio" in body, f"everything echo: {body!r}")
    body = await call(s, "get-sum", {"a": 20, "b": 22})
    check("42" in body, f"everything get-sum: {body!r}")
    uri = "demo://resource/dynamic/text/7"
    rr = await s.read_resource(uri)
    check(bool(rr.contents) and "Resource 7:" in (getattr(rr.contents[0], "text", "") or ""), f"read {uri}: {rr!r}")
    ok(f"everything (server-everything over stdio): {len(tools)} tools, echo, get-sum, {uri}")


async def run(base: str, token: str, docs: str, other: str) -> None:
    seen = Observed()
    await session(f"{base}/mcp/everything", token, seen, everything)

    pids: list[str] = []

    async def py(s: ClientSession) -> None:
        body = await call(s, "hello", {"name": "firewall"})
        check("Hello, firewall!" in body, f"py hello: {body!r}")
        pids.append(await call(s, "pid", {}))
        body = await call(s, "ask_model", {"prompt": "six times seven?"})
        check(len(seen.sampling) == 1, f"sampling: the client got {len(seen.sampling)} requests")
        check(SAMPLED_MARKER in body, f"py ask_model: {body!r}")
        before = seen.list_changed
        body = await call(s, "grow", {"name": "grown"})
        with anyio.move_on_after(5):
            while seen.list_changed <= before:
                await anyio.sleep(0.05)
        check(seen.list_changed > before, "grow: no tools/list_changed reached the client")
        tools = {t.name for t in (await s.list_tools()).tools}
        check("grown" in tools, f"tools/list after grow: {sorted(tools)}")
        ok("py (Python SDK over stdio): hello, sampling answered by this client, tools/list_changed and the new tool")

    await session(f"{base}/mcp/py", token, seen, py)

    async def py_again(s: ClientSession) -> None:
        pids.append(await call(s, "pid", {}))

    await session(f"{base}/mcp/py", token, seen, py_again)
    check(len(pids) == 2 and pids[0] != pids[1], f"two sessions, two processes: pids {pids}")
    ok(f"py: two sessions ran in two processes (pids {pids[0]} and {pids[1]})")

    async def fs(s: ClientSession) -> None:
        tools = {t.name for t in (await s.list_tools()).tools}
        read = "read_text_file" if "read_text_file" in tools else "read_file"
        body = await call(s, read, {"path": f"{docs}/readme.txt"})
        check("the docs" in body, f"docs: read in docs: {body!r}")
        # `other` is not in the server's view: at start it said it cannot
        # access it and left it out, so the read is refused.
        refused = await call(s, read, {"path": f"{other}/secret.txt"}, error=True)
        check(any(w in refused for w in ("denied", "outside", "ENOENT", "EACCES")),
              f"docs: read in other: {refused!r}")
        check("not for the server" not in refused, f"docs: other's content leaked: {refused!r}")
        body = await call(s, read, {"path": "/etc/hostname"}, error=True)
        check("denied" in body.lower() or "outside" in body.lower(), f"docs: read outside: {body!r}")
        ok(f"docs (server-filesystem over stdio): {read} in docs works; in other it was refused, not in the sandbox's view (the server said {refused[:60]!r}); outside both the server refused")

    await session(f"{base}/mcp/docs", token, seen, fs)


def main() -> None:
    base, token, docs, other = sys.argv[1:5]
    try:
        anyio.run(run, base, token, docs, other)
    except Failure as e:
        print(f"FAILED: {e}", flush=True)
        sys.exit(1)
    except BaseException as e:  # noqa: BLE001
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
