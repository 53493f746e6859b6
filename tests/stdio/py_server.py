"""The Python SDK stdio server of the stdio end-to-end check (run.sh).

A small MCP server on the Python SDK (PyPI `mcp`, pinned by run.sh), served
over stdio: the firewall starts it, confined, for each client session.

    python py_server.py

Tools:
  hello(name)        plain text
  pid()              its process id and token (two sessions, two processes)
  ask_model(prompt)  asks the client to sample (sampling/createMessage) and
                     returns "sampled: <the client's text>"
  grow(name)         registers a tool NAME and sends
                     notifications/tools/list_changed
"""

import os
import warnings

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, SamplingMessage, TextContent

warnings.simplefilter("ignore")

mcp = MCPServer(name="mcp-firewall-stdio-py", version="1.0.0")


def text(t: str, is_error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=t)], is_error=is_error)


@mcp.tool(description="Greets someone")
def hello(name: str) -> CallToolResult:
    return text(f"Hello, {name}! (from the Python stdio server)")


# Every server is pid 2 of its own PID namespace: the process also names
# itself with a random token.
PROCESS = os.urandom(4).hex()


@mcp.tool(description="This server's process id")
def pid() -> CallToolResult:
    return text(f"{os.getpid()}:{PROCESS}")


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
async def grow(name: str, ctx: Context) -> CallToolResult:
    def grown() -> CallToolResult:
        return text(f"grown: {name}")

    if mcp._tool_manager.get_tool(name) is None:
        mcp.add_tool(grown, name=name, description=f"Added at run time by grow({name!r})")
    await ctx.session.send_tool_list_changed()
    return text(f"added {name}")


if __name__ == "__main__":
    mcp.run("stdio")
