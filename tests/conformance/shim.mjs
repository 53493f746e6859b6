#!/usr/bin/env node
// Bearer shim for the conformance harness: a streaming HTTP forwarder that
// adds `Authorization: Bearer <token>` to every request, because the
// conformance runner has no option to send a header of its own.
//
//   SHIM_PORT=0 SHIM_TARGET=http://127.0.0.1:8080 SHIM_TOKEN=... \
//   SHIM_PORT_FILE=/tmp/port node shim.mjs
//
// - Bodies are streamed both ways (SSE is never buffered); every method,
//   status, header (Mcp-Session-Id, Last-Event-ID, ...) passes through.
// - Host and Origin are rewritten to the target's authority only when they
//   name the shim itself (localhost / 127.0.0.1 / [::1] with the shim's
//   port). Any other value (the dns-rebinding scenario sends
//   evil.example.com) is forwarded untouched, so the firewall's own Host and
//   Origin checks are what the scenario sees.
// - When the client goes away, the upstream request is torn down too.
// - SHIM_LOG=FILE appends one line per request when its answer starts:
//   method, path, status, when the request arrived and how long the answer
//   took, the end of its Mcp-Session-Id, the client's port (which requests
//   shared a connection) and, for a POST, the JSON-RPC methods (or "answer")
//   seen in the first 4 KiB of its body: so the order in which a session's
//   GET and POSTs reached the shim can be read back.
import fs from 'node:fs';
import http from 'node:http';

const target = new URL(process.env.SHIM_TARGET || 'http://127.0.0.1:8080');
const token = process.env.SHIM_TOKEN || '';
const portFile = process.env.SHIM_PORT_FILE;
const logFile = process.env.SHIM_LOG;
let selfPort = Number(process.env.SHIM_PORT || 0);

const log = (line) => {
  if (logFile) fs.appendFileSync(logFile, `${new Date().toISOString()} ${line}\n`);
};

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);
function namesSelf(authority) {
  try {
    const u = new URL(`http://${authority}`);
    return LOOPBACK.has(u.hostname) && Number(u.port || 80) === selfPort;
  } catch {
    return false;
  }
}

// Hop-by-hop headers a proxy must not forward (RFC 9110 7.6.1).
const HOP = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer'];

// What a log line says about the request besides method and path.
function describe(req, arrived, head) {
  const sid = String(req.headers['mcp-session-id'] || '-').slice(-8);
  let what = '';
  if (head.length) {
    const text = Buffer.concat(head).toString('utf8', 0, 4096);
    const methods = [...text.matchAll(/"method"\s*:\s*"([^"]{1,80})"/g)].map((m) => m[1]);
    what = methods.length ? ` ${methods.join(',')}` : /"(result|error)"\s*:/.test(text) ? ' answer' : '';
  }
  return `sid=${sid}${what} conn=${req.socket.remotePort} in=${new Date(arrived).toISOString().slice(11)} +${Date.now() - arrived}ms`;
}

let seq = 0;
const server = http.createServer((req, res) => {
  const n = ++seq;
  const arrived = Date.now();
  const head = [];
  let headBytes = 0;
  req.on('data', (chunk) => {
    if (headBytes < 4096) {
      head.push(chunk);
      headBytes += chunk.length;
    }
  });
  const headers = { ...req.headers };
  for (const h of HOP) delete headers[h];
  if (headers.host && namesSelf(headers.host)) headers.host = target.host;
  if (headers.origin) {
    try {
      if (namesSelf(new URL(headers.origin).host)) headers.origin = target.origin;
    } catch {
      // not a URL: leave it for the firewall to judge
    }
  }
  if (token) headers.authorization = `Bearer ${token}`;

  const up = http.request(
    {
      hostname: target.hostname,
      port: target.port,
      method: req.method,
      path: req.url,
      headers,
      setHost: false,
    },
    (upRes) => {
      log(
        `#${n} ${req.method} ${req.url} host=${headers.host} -> ${upRes.statusCode} ` +
          `${upRes.headers['content-type'] || '-'} ${describe(req, arrived, head)}`,
      );
      const out = { ...upRes.headers };
      for (const h of HOP) delete out[h];
      res.writeHead(upRes.statusCode, upRes.statusMessage, out);
      res.flushHeaders();
      upRes.pipe(res);
      upRes.on('error', () => res.destroy());
    },
  );
  let clientGone = false;
  up.on('error', (e) => {
    if (clientGone) {
      log(`#${n} ${req.method} ${req.url} client closed before the answer ended`);
      return;
    }
    log(`#${n} ${req.method} ${req.url} upstream error ${e.message}`);
    if (!res.headersSent) {
      res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(`shim: upstream error: ${e.message}`);
    } else {
      res.destroy();
    }
  });
  res.on('close', () => {
    if (!res.writableFinished) {
      clientGone = true;
      up.destroy();
    }
  });
  req.pipe(up);
});

server.listen(selfPort, '127.0.0.1', () => {
  selfPort = server.address().port;
  if (portFile) fs.writeFileSync(portFile, `${selfPort}\n`);
  console.log(`shim listening on 127.0.0.1:${selfPort} -> ${target.origin}`);
});
