"""The client of the virtual-server end-to-end check (run.sh).

The Python SDK's own client (PyPI `mcp`, pinned by run.sh), over streamable
HTTP with a session (2025-11-25), against one virtual server of the firewall
whose members are server-everything (`everything`) and member.py (`py`),
with collisions = "prefix":

    python client.py URL TOKEN

Checks, in order (each prints `ok: ...`; the first failure prints
`FAILED: ...` and exits 1):
  1. initialize: a session, tools and resources offered
  2. tools/list (every page): both members' tools, each under its prefix
  3. tools/call of each member: everything__echo, py__hello
  4. resources/list and resources/read of a server-everything resource
     (a listed URI, and one only its resource template matches)
  5. sampling: py__ask_model makes member.py ask the client to sample; the
     client answers with a marker text, and the tool result carries it
  6. tools/list_changed: py__grow registers a tool and announces it, on the
     call's own response stream and then on the session's GET stream; each
     time the client gets the notification and the next tools/list has the
     new tool under its prefix (and it can be called)
"""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

OVERALL_TIMEOUT_S = 45
REQUEST_TIMEOUT_S = 15
NOTIFY_TIMEOUT_S = 5
SAMPLED_MARKER = "the-sampled-answer-4242"


class Failure(Exception):
    pass


STEP = "connect"  # the check under way, named when something fails


def step(name: str) -> None:
    global STEP
    STEP = name


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def texts(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


class Observed:
    """What the client's callbacks saw."""

    def __init__(self) -> None:
        self.list_changed = 0
        self.changed = anyio.Event()
        self.sampling: list[types.CreateMessageRequestParams] = []
        self.sampling_ids: list[Any] = []
        self.transport_errors: list[Exception] = []
        self.other: list[str] = []

    async def message_handler(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.transport_errors.append(message)
            print(f"note: transport error reported to the client: {message!r}", flush=True)
            return
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed += 1
            self.changed.set()
            return
        self.other.append(type(message).__name__)

    async def sampling_callback(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        self.sampling.append(params)
        self.sampling_ids.append(context.request_id)
        prompt = " ".join(
            m.content.text for m in params.messages if isinstance(m.content, types.TextContent)
        )
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=f"{SAMPLED_MARKER} (prompt was: {prompt})"),
            model="virtual-e2e-model",
            stop_reason="endTurn",
        )

    async def wait_list_changed(self, before: int, what: str) -> None:
        with anyio.move_on_after(NOTIFY_TIMEOUT_S):
            while self.list_changed <= before:
                self.changed = anyio.Event()
                if self.list_changed > before:
                    break
                await self.changed.wait()
        check(
            self.list_changed > before,
            f"{what}: no notifications/tools/list_changed reached the client within {NOTIFY_TIMEOUT_S} s",
        )


async def all_tools(s: ClientSession) -> dict[str, types.Tool]:
    out: dict[str, types.Tool] = {}
    cursor: str | None = None
    for _ in range(50):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await s.list_tools(params=params)
        for t in page.tools:
            check(t.name not in out, f"tools/list: {t.name!r} listed twice")
            out[t.name] = t
        cursor = page.next_cursor
        if not cursor:
            return out
    raise Failure("tools/list: more than 50 pages")


async def all_resources(s: ClientSession) -> list[types.Resource]:
    out: list[types.Resource] = []
    cursor: str | None = None
    for _ in range(50):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await s.list_resources(params=params)
        out.extend(page.resources)
        cursor = page.next_cursor
        if not cursor:
            return out
    raise Failure("resources/list: more than 50 pages")


async def call(s: ClientSession, name: str, args: dict[str, Any]) -> str:
    r = await s.call_tool(name, args)
    check(isinstance(r, types.CallToolResult), f"tools/call {name}: not a tool result: {r!r}")
    body = texts(r)
    check(not r.is_error, f"tools/call {name}: isError, content: {body!r}")
    return body


async def grow_and_see(s: ClientSession, seen: Observed, new_tool: str, via: str) -> None:
    what = f"py__grow(via={via})"
    before = seen.list_changed
    body = await call(s, "py__grow", {"name": new_tool, "via": via})
    check(f"added {new_tool}" in body, f"{what}: unexpected result {body!r}")
    await seen.wait_list_changed(before, what)
    tools = await all_tools(s)
    exposed = f"py__{new_tool}"
    check(exposed in tools, f"{what}: tools/list after list_changed lacks {exposed!r}: {sorted(tools)}")
    check(new_tool not in tools, f"{what}: {new_tool!r} is listed without its prefix")
    body = await call(s, exposed, {})
    check(f"grown: {new_tool}" in body, f"tools/call {exposed}: unexpected result {body!r}")
    stream = "the call's own response stream" if via == "request" else "the session's GET stream"
    ok(f"tools/list_changed on {stream} reached the client; tools/list then has {exposed} and it answers")


async def run(url: str, token: str) -> None:
    seen = Observed()
    http = create_mcp_http_client(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(REQUEST_TIMEOUT_S, read=OVERALL_TIMEOUT_S + 15),
    )
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=REQUEST_TIMEOUT_S,
                sampling_callback=seen.sampling_callback,
                message_handler=seen.message_handler,
                client_info=types.Implementation(name="mcp-firewall-virtual-e2e", version="1.0.0"),
            ) as s:
                # 1. the session
                step("1 initialize")
                init = await s.initialize()
                caps = init.capabilities
                check(caps.tools is not None, f"initialize: no tools capability: {caps!r}")
                check(caps.resources is not None, f"initialize: no resources capability: {caps!r}")
                ok(f"initialize: protocol {init.protocol_version}, server {init.server_info.name!r}")

                # 2. both members' tools, prefixed
                step("2 tools/list")
                tools = await all_tools(s)
                names = sorted(tools)
                for want in ("everything__echo", "everything__get-sum", "py__hello", "py__ask_model", "py__grow"):
                    check(want in tools, f"tools/list lacks {want!r}; listed: {names}")
                strays = [n for n in names if not n.startswith(("everything__", "py__"))]
                check(not strays, f"tools/list: names without a member prefix: {strays}")
                n_ev = sum(1 for n in names if n.startswith("everything__"))
                n_py = sum(1 for n in names if n.startswith("py__"))
                ok(f"tools/list: {len(names)} tools ({n_ev} everything__*, {n_py} py__*)")

                # 3. a tool of each member
                step("3 tools/call of each member")
                body = await call(s, "everything__echo", {"message": "through the virtual server"})
                check("Echo: through the virtual server" in body, f"everything__echo: unexpected result {body!r}")
                body = await call(s, "everything__get-sum", {"a": 20, "b": 22})
                check("42" in body, f"everything__get-sum: unexpected result {body!r}")
                body = await call(s, "py__hello", {"name": "firewall"})
                check("Hello, firewall!" in body, f"py__hello: unexpected result {body!r}")
                ok("tools/call: everything__echo, everything__get-sum and py__hello answered by their members")

                # 4. a server-everything resource
                step("4 resources/read")
                resources = await all_resources(s)
                demo = [r for r in resources if str(r.uri).startswith("demo://")]
                check(bool(demo), f"resources/list: no demo:// resource of server-everything: {resources!r}")
                texts_ = [r for r in demo if (r.mime_type or "").startswith("text/")] or demo
                uri = str(texts_[0].uri)
                rr = await s.read_resource(uri)
                check(bool(rr.contents), f"resources/read {uri}: no contents")
                c0 = rr.contents[0]
                check(str(c0.uri) == uri, f"resources/read {uri}: contents are of {c0.uri}")
                got = getattr(c0, "text", None) or getattr(c0, "blob", None)
                check(bool(got), f"resources/read {uri}: empty contents {c0!r}")
                tmpl_uri = "demo://resource/dynamic/text/7"
                rr = await s.read_resource(tmpl_uri)
                check(bool(rr.contents), f"resources/read {tmpl_uri}: no contents")
                check(
                    str(rr.contents[0].uri) == tmpl_uri and "Resource 7:" in (getattr(rr.contents[0], "text", "") or ""),
                    f"resources/read {tmpl_uri}: unexpected contents {rr.contents[0]!r}",
                )
                ok(f"resources/read: {uri} (listed) and {tmpl_uri} (by template), from server-everything")

                # 5. sampling through the virtual server
                step("5 sampling (py__ask_model)")
                body = await call(s, "py__ask_model", {"prompt": "What is six times seven?"})
                check(len(seen.sampling) == 1, f"sampling: the client got {len(seen.sampling)} requests, not 1")
                asked = seen.sampling[0]
                first = asked.messages[0].content if asked.messages else None
                check(
                    isinstance(first, types.TextContent) and first.text == "What is six times seven?",
                    f"sampling: the request did not carry the member's prompt: {asked!r}",
                )
                check(SAMPLED_MARKER in body, f"py__ask_model: the result lacks the client's sampled text: {body!r}")
                ok(
                    "sampling: py__ask_model's request reached the client "
                    f"(as id {seen.sampling_ids[0]!r}) and the client's answer reached the member"
                )

                # 6. tools/list_changed, on the call's stream and on the GET stream
                step("6 tools/list_changed on the call's stream (py__grow via=request)")
                await grow_and_see(s, seen, "grown", "request")
                step("6 tools/list_changed on the GET stream (py__grow via=session)")
                await grow_and_see(s, seen, "grown_late", "session")
                step("close")

                print(f"note: notifications/tools/list_changed received: {seen.list_changed}", flush=True)
                if seen.other:
                    print(f"note: other notifications seen: {sorted(set(seen.other))}", flush=True)


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: client.py URL TOKEN", file=sys.stderr)
        return 2
    url, token = sys.argv[1], sys.argv[2]
    t0 = time.monotonic()

    async def bounded() -> None:
        with anyio.fail_after(OVERALL_TIMEOUT_S):
            await run(url, token)

    try:
        anyio.run(bounded)
    except BaseException as e:  # noqa: BLE001 - report whatever stopped the run
        print(f"FAILED (step {STEP}): {describe(e)}", flush=True)
        return 1
    print(f"all checks passed ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


def describe(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) >= 1:
        fails = [x for x in e.exceptions if isinstance(x, Failure)]
        e = fails[0] if fails else e.exceptions[0]
    if isinstance(e, Failure):
        return str(e)
    if isinstance(e, TimeoutError):
        return f"timed out (the whole run may take {OVERALL_TIMEOUT_S} s; a request {REQUEST_TIMEOUT_S} s)"
    return f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    sys.exit(main())
