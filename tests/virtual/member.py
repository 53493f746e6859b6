"""The Python SDK member of the virtual-server end-to-end check (run.sh).

A small MCP server on the Python SDK (PyPI `mcp`, pinned by run.sh), served
with streamable HTTP (sessions, 2025-11-25, and stateless 2026-07-28):

    python member.py PORT      # serves http://127.0.0.1:PORT/mcp

Tools:
  hello(name)          plain text, no server requests
  ask_model(prompt)    asks the client to sample (sampling/createMessage) and
                       returns "sampled: <the client's text>"
  grow(name, via)      registers a new tool NAME (which answers "grown: NAME")
                       and sends notifications/tools/list_changed, either on
                       the call's own response stream (via="request") or on
                       the session's GET stream (via="session")
"""

import sys
import warnings

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, SamplingMessage, TextContent, ToolListChangedNotification

warnings.simplefilter("ignore")

mcp = MCPServer(name="mcp-firewall-virtual-member", version="1.0.0")


def text(t: str, is_error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=t)], is_error=is_error)


@mcp.tool(description="Greets someone")
def hello(name: str) -> CallToolResult:
    return text(f"Hello, {name}! (from the Python member)")


@mcp.tool(description="Asks the client's model (sampling) and returns its answer")
async def ask_model(prompt: str, ctx: Context) -> CallToolResult:
    res = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
        max_tokens=64,
        related_request_id=ctx.request_id,
    )
    content = res.content
    out = content.text if isinstance(content, TextContent) else repr(content)
    return text(f"sampled: {out}")


@mcp.tool(description="Registers a new tool and announces it with notifications/tools/list_changed")
async def grow(name: str, ctx: Context, via: str = "request") -> CallToolResult:
    def grown() -> CallToolResult:
        return text(f"grown: {name}")

    if mcp._tool_manager.get_tool(name) is None:
        mcp.add_tool(grown, name=name, description=f"Added at run time by grow({name!r})")
    if via == "request":
        # On this call's own event stream, before its result.
        await ctx.session.send_notification(ToolListChangedNotification(), related_request_id=ctx.request_id)
    elif via == "session":
        # On the session's standalone (GET) stream.
        await ctx.session.send_tool_list_changed()
    else:
        return text(f"grow: unknown via {via!r}", is_error=True)
    return text(f"added {name}")


def main() -> None:
    port = int(sys.argv[1])
    app = mcp.streamable_http_app(
        host="127.0.0.1",
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        ),
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
