#!/usr/bin/env node
// Second server under test for the mcp-firewall conformance harness: an MCP
// server on the TypeScript SDK (npm @modelcontextprotocol/sdk, pinned by
// run.sh), shaped like the suite's own reference server
// (examples/servers/typescript/everything-server.ts in the conformance
// repository, which no npm package ships). It is written here from the
// scenarios' published requirements, like server.py, and keeps the
// reference server's transport behaviour, which is what makes it a second
// opinion on the firewall rather than a copy of server.py:
//
// - Stateful Streamable HTTP: one Server and one transport per session,
//   with an in-memory event store (resumable streams, priming events) and
//   a `retry` interval of 5 s; Express with the SDK's localhost Host check
//   (DNS-rebinding protection).
// - `test_sampling` and the `test_elicitation*` tools ask the client with
//   `server.request()` and no related request: the SDK sends such a request
//   on the session's standalone GET stream, not on the POST's SSE stream.
//   When no GET stream is open at that moment, the SDK keeps the request in
//   the event store and writes it nowhere: the call then hangs until the
//   client's request timeout. A client that opens its GET stream and sends
//   its next POST at once (the SDK client does, after `initialized`) races
//   that; see README.md.
// - subscribe, unsubscribe and logging/setLevel log a notification on the
//   GET stream too (dropped when none is open).
//
//   PORT=3000 node everything-server.mjs      # http://127.0.0.1:3000/mcp
//
// EVERYTHING_LOG=1 logs each POST, GET and message sent, with the session
// and whether the GET stream was open, to stdout.
import { randomUUID } from 'node:crypto';

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListResourcesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ErrorCode,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';

const PORT = Number(process.env.PORT || 3000);
const TRACE = process.env.EVERYTHING_LOG === '1';
const trace = (line) => {
  if (TRACE) console.log(`${new Date().toISOString()} ${line}`);
};

// A 1x1 PNG and a WAV of 80 silent samples, made here.
const PNG_B64 =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
function wavBase64() {
  const samples = 80;
  const rate = 8000;
  const data = Buffer.alloc(samples * 2);
  const h = Buffer.alloc(44);
  h.write('RIFF', 0);
  h.writeUInt32LE(36 + data.length, 4);
  h.write('WAVEfmt ', 8);
  h.writeUInt32LE(16, 16);
  h.writeUInt16LE(1, 20);
  h.writeUInt16LE(1, 22);
  h.writeUInt32LE(rate, 24);
  h.writeUInt32LE(rate * 2, 28);
  h.writeUInt16LE(2, 32);
  h.writeUInt16LE(16, 34);
  h.write('data', 36);
  h.writeUInt32LE(data.length, 40);
  return Buffer.concat([h, data]).toString('base64');
}
const WAV_B64 = wavBase64();

const text = (t) => ({ type: 'text', text: t });
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));
const noArgs = { type: 'object', properties: {} };

// The schema json-schema-2020-12 wants listed exactly as written.
const SCHEMA_2020_12 = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  type: 'object',
  $defs: {
    address: {
      type: 'object',
      properties: { street: { type: 'string' }, city: { type: 'string' } },
    },
  },
  properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
  additionalProperties: false,
};

const ELICIT_PLAIN = {
  type: 'object',
  properties: { response: { type: 'string', description: "User's response" } },
  required: ['response'],
};
const ELICIT_DEFAULTS = {
  type: 'object',
  properties: {
    name: { type: 'string', description: 'User name', default: 'John Doe' },
    age: { type: 'integer', description: 'User age', default: 30 },
    score: { type: 'number', description: 'User score', default: 95.5 },
    status: {
      type: 'string',
      description: 'User status',
      enum: ['active', 'inactive', 'pending'],
      default: 'active',
    },
    verified: { type: 'boolean', description: 'Verified', default: true },
  },
};
const choices = (prefix, titles) => titles.map((title, i) => ({ const: `${prefix}${i + 1}`, title }));
const ELICIT_ENUMS = {
  type: 'object',
  properties: {
    untitledSingle: { type: 'string', description: 'Pick one', enum: ['option1', 'option2', 'option3'] },
    titledSingle: {
      type: 'string',
      description: 'Pick one',
      oneOf: choices('value', ['First Option', 'Second Option', 'Third Option']),
    },
    legacyEnum: {
      type: 'string',
      description: 'Pick one',
      enum: ['opt1', 'opt2', 'opt3'],
      enumNames: ['Option One', 'Option Two', 'Option Three'],
    },
    untitledMulti: {
      type: 'array',
      description: 'Pick some',
      items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
    },
    titledMulti: {
      type: 'array',
      description: 'Pick some',
      items: { anyOf: choices('value', ['First Choice', 'Second Choice', 'Third Choice']) },
    },
  },
};

// name -> [description, inputSchema, handler(args, extra, server)]
const TOOLS = {
  test_simple_text: ['Returns a simple text response', noArgs, () => ({
    content: [text('This is a simple text response for testing.')],
  })],
  test_image_content: ['Returns an image', noArgs, () => ({
    content: [{ type: 'image', data: PNG_B64, mimeType: 'image/png' }],
  })],
  test_audio_content: ['Returns audio', noArgs, () => ({
    content: [{ type: 'audio', data: WAV_B64, mimeType: 'audio/wav' }],
  })],
  test_embedded_resource: ['Returns an embedded resource', noArgs, () => ({
    content: [{
      type: 'resource',
      resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
    }],
  })],
  test_multiple_content_types: ['Returns text, an image and a resource', noArgs, () => ({
    content: [
      text('Multiple content types test:'),
      { type: 'image', data: PNG_B64, mimeType: 'image/png' },
      {
        type: 'resource',
        resource: {
          uri: 'test://mixed-content-resource',
          mimeType: 'application/json',
          text: JSON.stringify({ test: 'data', value: 123 }),
        },
      },
    ],
  })],
  test_tool_with_logging: ['Sends three log notifications while it runs', noArgs, async (_a, extra) => {
    for (const [i, data] of ['Tool execution started', 'Tool processing data', 'Tool execution completed'].entries()) {
      if (i) await sleep(50);
      await extra.sendNotification({ method: 'notifications/message', params: { level: 'info', data } });
    }
    return { content: [text('Tool with logging executed successfully')] };
  }],
  test_tool_with_progress: ['Sends progress notifications while it runs', noArgs, async (_a, extra) => {
    const progressToken = extra._meta?.progressToken ?? 0;
    for (const progress of [0, 50, 100]) {
      if (progress) await sleep(50);
      await extra.sendNotification({
        method: 'notifications/progress',
        params: { progressToken, progress, total: 100, message: `Completed step ${progress} of 100` },
      });
    }
    return { content: [text(String(progressToken))] };
  }],
  test_error_handling: ['Always fails', noArgs, () => {
    throw new Error('This tool intentionally returns an error for testing');
  }],
  test_reconnection: ['Closes its SSE stream before answering (SSE polling)', noArgs, async (_a, extra) => {
    extra.closeSSEStream?.();
    await sleep(100);
    return { content: [text('Reconnection test completed successfully.')] };
  }],
  // The three below ask the client with no related request: on the GET stream.
  test_sampling: [
    'Asks the client to sample an LLM',
    { type: 'object', properties: { prompt: { type: 'string' } }, required: ['prompt'] },
    async (args, _extra, server) => {
      const res = await server.request(
        {
          method: 'sampling/createMessage',
          params: { messages: [{ role: 'user', content: text(String(args.prompt)) }], maxTokens: 100 },
        },
        CreateMessageResultSchema,
      );
      return { content: [text(`LLM response: ${res.content?.text ?? 'No response'}`)] };
    },
  ],
  test_elicitation: [
    'Asks the user for input',
    { type: 'object', properties: { message: { type: 'string' } }, required: ['message'] },
    async (args, _extra, server) => elicit(server, String(args.message), ELICIT_PLAIN, 'User response'),
  ],
  test_elicitation_sep1034_defaults: ['Elicitation with defaults for every primitive type', noArgs,
    (_a, _e, server) =>
      elicit(server, 'Please review and update the form fields with defaults', ELICIT_DEFAULTS, 'Elicitation completed'),
  ],
  test_elicitation_sep1330_enums: ['Elicitation with every enum variant', noArgs,
    (_a, _e, server) =>
      elicit(server, 'Please select options from the enum fields', ELICIT_ENUMS, 'Elicitation completed'),
  ],
  json_schema_2020_12_tool: ['Tool with JSON Schema 2020-12 features', SCHEMA_2020_12, (args) => ({
    content: [text(`JSON Schema 2020-12 tool called with: ${JSON.stringify(args)}`)],
  })],
};

async function elicit(server, message, requestedSchema, label) {
  const res = await server.request(
    { method: 'elicitation/create', params: { message, requestedSchema } },
    ElicitResultSchema,
  );
  return { content: [text(`${label}: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`)] };
}

const RESOURCES = [
  { uri: 'test://static-text', name: 'static-text', mimeType: 'text/plain', text: 'This is the content of the static text resource.' },
  { uri: 'test://static-binary', name: 'static-binary', mimeType: 'image/png', blob: PNG_B64 },
  { uri: 'test://watched-resource', name: 'watched-resource', mimeType: 'text/plain', text: 'Watched resource content' },
];
const TEMPLATE = /^test:\/\/template\/([^/]+)\/data$/;

const user = (content) => ({ role: 'user', content });
// name -> [description, argument names, messages(args)]
const PROMPTS = {
  test_simple_prompt: ['A simple prompt', [], () => [user(text('This is a simple prompt for testing.'))]],
  test_prompt_with_arguments: ['A prompt with arguments', ['arg1', 'arg2'], (a) => [
    user(text(`Prompt with arguments: arg1='${a.arg1}', arg2='${a.arg2}'`)),
  ]],
  test_prompt_with_embedded_resource: ['A prompt with an embedded resource', ['resourceUri'], (a) => [
    user({ type: 'resource', resource: { uri: a.resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } }),
    user(text('Please process the embedded resource above.')),
  ]],
  test_prompt_with_image: ['A prompt with an image', [], () => [
    user({ type: 'image', data: PNG_B64, mimeType: 'image/png' }),
    user(text('Please analyze the image above.')),
  ]],
};

function newServer() {
  const server = new Server(
    { name: 'mcp-firewall-conformance-everything', version: '1.0.0' },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  // A log line on the GET stream; dropped by the SDK when none is open.
  const log = (data) => server.notification({ method: 'notifications/message', params: { level: 'info', data } }).catch(() => {});

  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: Object.entries(TOOLS).map(([name, [description, inputSchema]]) => ({ name, description, inputSchema })),
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
    const tool = TOOLS[req.params.name];
    if (!tool) throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${req.params.name}`);
    try {
      return await tool[2](req.params.arguments ?? {}, extra, server);
    } catch (e) {
      return { content: [text(e instanceof Error ? e.message : String(e))], isError: true };
    }
  });
  server.setRequestHandler(ListResourcesRequestSchema, () => ({
    resources: RESOURCES.map(({ uri, name, mimeType }) => ({ uri, name, mimeType })),
  }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, () => ({
    resourceTemplates: [{ uriTemplate: 'test://template/{id}/data', name: 'template', mimeType: 'application/json' }],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, (req) => {
    const { uri } = req.params;
    const fixed = RESOURCES.find((r) => r.uri === uri);
    if (fixed) {
      const { name: _name, ...contents } = fixed;
      return { contents: [contents] };
    }
    const m = TEMPLATE.exec(uri);
    if (m) {
      const id = m[1];
      return {
        contents: [{ uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }],
      };
    }
    throw new McpError(-32002, `Resource not found: ${uri}`);
  });
  server.setRequestHandler(SubscribeRequestSchema, (req) => {
    log(`Subscribed to resource: ${req.params.uri}`);
    return {};
  });
  server.setRequestHandler(UnsubscribeRequestSchema, (req) => {
    log(`Unsubscribed from resource: ${req.params.uri}`);
    return {};
  });
  server.setRequestHandler(ListPromptsRequestSchema, () => ({
    prompts: Object.entries(PROMPTS).map(([name, [description, args]]) => ({
      name,
      description,
      arguments: args.map((a) => ({ name: a, required: true })),
    })),
  }));
  server.setRequestHandler(GetPromptRequestSchema, (req) => {
    const prompt = PROMPTS[req.params.name];
    if (!prompt) throw new McpError(ErrorCode.InvalidParams, `Unknown prompt: ${req.params.name}`);
    return { messages: prompt[2](req.params.arguments ?? {}) };
  });
  server.setRequestHandler(SetLevelRequestSchema, (req) => {
    log(`Log level set to: ${req.params.level}`);
    return {};
  });
  server.setRequestHandler(CompleteRequestSchema, () => ({ completion: { values: [], total: 0, hasMore: false } }));
  return server;
}

// Resumable streams: every event of every session, by stream.
function eventStore() {
  const events = new Map();
  let seq = 0;
  return {
    async storeEvent(streamId, message) {
      const id = `${streamId}::${String(++seq).padStart(12, '0')}`;
      events.set(id, { streamId, message });
      return id;
    },
    async replayEventsAfter(lastEventId, { send }) {
      const streamId = lastEventId.split('::')[0];
      for (const [id, e] of events) {
        if (e.streamId === streamId && id > lastEventId && Object.keys(e.message).length) await send(id, e.message);
      }
      return streamId;
    },
  };
}

const sessions = new Map(); // session id -> transport

function traced(transport) {
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    const get = transport._webStandardTransport?._streamMapping?.has('_GET_stream');
    const what = message.method ?? (message.error ? 'error' : 'result');
    trace(`[${transport.sessionId}] send ${what} id=${message.id ?? '-'} related=${options?.relatedRequestId ?? '-'} get_stream_open=${get}`);
    return send(message, options);
  };
}

const app = createMcpExpressApp();

app.post('/mcp', async (req, res) => {
  const sid = req.headers['mcp-session-id'];
  const body = req.body;
  trace(`[${sid ?? '-'}] POST ${JSON.stringify([].concat(body ?? []).map((m) => m?.method ?? (m?.error ? 'error' : 'result')))}`);
  try {
    let transport = sid ? sessions.get(sid) : undefined;
    if (!transport) {
      if (sid || body?.method !== 'initialize') {
        res.status(400).json({ jsonrpc: '2.0', error: { code: -32000, message: 'Invalid or missing session ID' }, id: null });
        return;
      }
      const server = newServer();
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: eventStore(),
        retryInterval: 5000,
        onsessioninitialized: (id) => sessions.set(id, transport),
      });
      transport.onclose = () => {
        if (transport.sessionId) sessions.delete(transport.sessionId);
        server.close().catch(() => {});
      };
      await server.connect(transport);
      if (TRACE) traced(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (e) {
    console.error('POST failed:', e);
    if (!res.headersSent) res.status(500).json({ jsonrpc: '2.0', error: { code: -32603, message: 'Internal server error' }, id: null });
  }
});

for (const method of ['get', 'delete']) {
  app[method]('/mcp', async (req, res) => {
    const sid = req.headers['mcp-session-id'];
    const transport = sid && sessions.get(sid);
    trace(`[${sid ?? '-'}] ${method.toUpperCase()} last-event-id=${req.headers['last-event-id'] ?? '-'}`);
    if (!transport) {
      res.status(400).send('Invalid or missing session ID');
      return;
    }
    try {
      await transport.handleRequest(req, res);
    } catch (e) {
      console.error(`${method.toUpperCase()} failed:`, e);
      if (!res.headersSent) res.status(500).send('Internal server error');
    }
  });
}

app.listen(PORT, '127.0.0.1', () => {
  console.log(`everything-server listening on http://127.0.0.1:${PORT}/mcp`);
});
