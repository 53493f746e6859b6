"""Conformance server-under-test for the mcp-firewall conformance harness.

A small MCP server on the Python SDK (PyPI `mcp`, pinned by run.sh) that
implements the tools, resources and prompts the conformance suite's server
scenarios name (`test_*`, `test://...`), written from the scenarios'
published requirements. The SDK serves both protocol eras: 2025-11-25
(initialize, sessions) and 2026-07-28 (stateless).

    python server.py PORT      # serves http://127.0.0.1:PORT/mcp

Not implemented (those checks fail directly and through the firewall alike):
the tasks extension, input-required (MRTR) tools, x-mcp-header tools and the
scenarios' other diagnostic tools (test_streaming_elicitation, ...).
"""

import asyncio
import base64
import json
import sys
import warnings

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import (
    AudioContent,
    CallToolResult,
    Completion,
    EmbeddedResource,
    EmptyResult,
    SetLevelRequestParams,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
    ImageContent,
    PromptReference,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)

warnings.simplefilter("ignore")

# 1x1 red PNG and a tiny silent WAV, generated here.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
PNG_B64 = base64.b64encode(PNG).decode()


def _wav() -> bytes:
    rate, samples = 8000, 80
    data = b"\x00\x00" * samples
    hdr = b"RIFF" + (36 + len(data)).to_bytes(4, "little") + b"WAVEfmt "
    hdr += (16).to_bytes(4, "little") + (1).to_bytes(2, "little") + (1).to_bytes(2, "little")
    hdr += rate.to_bytes(4, "little") + (rate * 2).to_bytes(4, "little")
    hdr += (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    return hdr + b"data" + len(data).to_bytes(4, "little") + data


WAV_B64 = base64.b64encode(_wav()).decode()

mcp = MCPServer(name="mcp-firewall-conformance-sut", version="1.0.0")


def text(t: str, is_error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=t)], is_error=is_error)


@mcp.tool(description="Returns a simple text response")
def test_simple_text() -> CallToolResult:
    return text("This is a simple text response for testing.")


@mcp.tool(description="Returns an image")
def test_image_content() -> CallToolResult:
    return CallToolResult(content=[ImageContent(type="image", data=PNG_B64, mime_type="image/png")])


@mcp.tool(description="Returns audio")
def test_audio_content() -> CallToolResult:
    return CallToolResult(content=[AudioContent(type="audio", data=WAV_B64, mime_type="audio/wav")])


@mcp.tool(description="Returns an embedded resource")
def test_embedded_resource() -> CallToolResult:
    return CallToolResult(
        content=[
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="test://embedded-resource",
                    mime_type="text/plain",
                    text="This is an embedded resource content.",
                ),
            )
        ]
    )


@mcp.tool(description="Returns text, an image and a resource")
def test_multiple_content_types() -> CallToolResult:
    return CallToolResult(
        content=[
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG_B64, mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text=json.dumps({"test": "data", "value": 123}, separators=(",", ":")),
                ),
            ),
        ]
    )


@mcp.tool(description="Sends three log notifications while it runs")
async def test_tool_with_logging(ctx: Context) -> CallToolResult:
    await ctx.info("Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.info("Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return text("Tool with logging executed successfully")


@mcp.tool(description="Sends progress notifications while it runs")
async def test_tool_with_progress(ctx: Context) -> CallToolResult:
    await ctx.report_progress(0, 100)
    await asyncio.sleep(0.05)
    await ctx.report_progress(50, 100)
    await asyncio.sleep(0.05)
    await ctx.report_progress(100, 100)
    return text("Tool with progress executed successfully")


@mcp.tool(description="Always returns a tool error")
def test_error_handling() -> CallToolResult:
    return text("This tool intentionally returns an error for testing", is_error=True)


@mcp.tool(description="Asks the client to sample an LLM")
async def test_sampling(prompt: str, ctx: Context) -> CallToolResult:
    res = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
        max_tokens=100,
        related_request_id=ctx.request_id,
    )
    content = res.content
    out = content.text if isinstance(content, TextContent) else str(content)
    return text(f"LLM response: {out}")


async def _elicit(ctx: Context, message: str, schema: dict):
    return await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)


@mcp.tool(description="Asks the user for input")
async def test_elicitation(message: str, ctx: Context) -> CallToolResult:
    res = await _elicit(
        ctx,
        message,
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    return text(f"User response: action={res.action}, content={json.dumps(res.content)}")


@mcp.tool(description="Elicitation with defaults for every primitive type")
async def test_elicitation_sep1034_defaults(ctx: Context) -> CallToolResult:
    res = await _elicit(
        ctx,
        "Please review and update the form fields with defaults",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verified", "default": True},
            },
        },
    )
    return text(f"Elicitation completed: action={res.action}, content={json.dumps(res.content)}")


@mcp.tool(description="Elicitation with every enum variant")
async def test_elicitation_sep1330_enums(ctx: Context) -> CallToolResult:
    res = await _elicit(
        ctx,
        "Please select options from the enum fields",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "description": "Pick one", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {
                    "type": "string",
                    "description": "Pick one",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Pick one",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Pick some",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Pick some",
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
        },
    )
    return text(f"Elicitation completed: action={res.action}, content={json.dumps(res.content)}")


@mcp.tool(description="Closes its SSE stream before answering (SSE polling)")
async def test_reconnection(ctx: Context) -> CallToolResult:
    try:
        await ctx.close_sse_stream()
    except Exception:
        pass
    await asyncio.sleep(0.2)
    return text("Reconnection test completed")


# Plain stand-ins for diagnostic tools some 2026-07-28 scenarios call. This
# server has no tasks extension, so slow_compute answers at once (the
# scenarios ask for up to 60 s) with an ordinary result.
@mcp.tool(description="Greets someone")
def greet(name: str) -> CallToolResult:
    return text(f"Hello, {name}!")


@mcp.tool(description="Computes (at once: this server has no tasks extension)")
def slow_compute(seconds: float = 0, label: str = "") -> CallToolResult:
    return text(f"Computed {label}")


@mcp.tool(description="Sends a log notification while it runs")
async def test_logging_tool(ctx: Context) -> CallToolResult:
    await ctx.info("test_logging_tool ran")
    return text("Logged")


@mcp.resource("test://static-text", name="static-text", description="A static text resource", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@mcp.resource("test://static-binary", name="static-binary", description="A static binary resource", mime_type="image/png")
def static_binary() -> bytes:
    return PNG


@mcp.resource("test://watched-resource", name="watched-resource", description="A resource to subscribe to", mime_type="text/plain")
def watched() -> str:
    return "Watched resource content."


@mcp.resource(
    "test://template/{id}/data", name="template-data", description="A resource template", mime_type="application/json"
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"}, separators=(",", ":"))


@mcp.prompt(description="A simple prompt")
def test_simple_prompt() -> list:
    return [{"role": "user", "content": {"type": "text", "text": "This is a simple prompt for testing."}}]


@mcp.prompt(description="A prompt with arguments")
def test_prompt_with_arguments(arg1: str, arg2: str) -> list:
    return [{"role": "user", "content": {"type": "text", "text": f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"}}]


@mcp.prompt(description="A prompt with an embedded resource")
def test_prompt_with_embedded_resource(resourceUri: str) -> list:
    return [
        {
            "role": "user",
            "content": {
                "type": "resource",
                "resource": {"uri": resourceUri, "mimeType": "text/plain", "text": "Embedded resource content for testing."},
            },
        },
        {"role": "user", "content": {"type": "text", "text": "Please process the embedded resource above."}},
    ]


@mcp.prompt(description="A prompt with an image")
def test_prompt_with_image() -> list:
    return [
        {"role": "user", "content": {"type": "image", "data": PNG_B64, "mimeType": "image/png"}},
        {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}},
    ]


@mcp.completion()
async def complete(ref, argument, context):
    values = ["paris", "park", "party"] if isinstance(ref, PromptReference) else []
    return Completion(values=[v for v in values if v.startswith(argument.value or "")], total=None, has_more=False)


# The schema the json-schema-2020-12 scenario requires to be served verbatim.
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


@mcp.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
def json_schema_tool() -> CallToolResult:
    return text("ok")


# MCPServer derives inputSchema from the signature; serve the scenario's
# schema instead (private attributes: fine for the pinned SDK version).
mcp._tool_manager.get_tool("json_schema_2020_12_tool").parameters = SCHEMA_2020_12

SUBSCRIPTIONS: set[str] = set()


async def on_set_level(ctx, params) -> EmptyResult:
    return EmptyResult()


async def on_subscribe(ctx, params) -> EmptyResult:
    SUBSCRIPTIONS.add(str(params.uri))
    return EmptyResult()


async def on_unsubscribe(ctx, params) -> EmptyResult:
    SUBSCRIPTIONS.discard(str(params.uri))
    return EmptyResult()


_low = mcp._lowlevel_server
_low.add_request_handler("logging/setLevel", SetLevelRequestParams, on_set_level)
_low.add_request_handler("resources/subscribe", SubscribeRequestParams, on_subscribe)
_low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, on_unsubscribe)


def main() -> None:
    port = int(sys.argv[1])
    app = mcp.streamable_http_app(
        host="127.0.0.1",
        retry_interval=1000,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        ),
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
