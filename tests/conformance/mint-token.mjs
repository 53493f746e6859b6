#!/usr/bin/env node
// Fallback for firewall builds without `mcp-firewall token mint`: prints an
// HS256 tool token for the conformance run.
//   node mint-token.mjs SECRET RUN_ID
import crypto from 'node:crypto';

const [secret, runId] = process.argv.slice(2);
if (!secret || !runId) {
  console.error('usage: node mint-token.mjs SECRET RUN_ID');
  process.exit(2);
}
const b64 = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');
const now = Math.floor(Date.now() / 1000);
const head = b64({ alg: 'HS256', typ: 'JWT' });
const body = b64({
  iss: 'https://conformance.test',
  aud: 'mcp-firewall',
  sub: 'conformance',
  tenant_id: 'conformance',
  agent: 'conformance',
  run_id: runId,
  mode: 'caller',
  projects: ['conformance'],
  scope: 'mcp:tools',
  jti: crypto.randomUUID(),
  iat: now,
  exp: now + 900,
});
const sig = crypto.createHmac('sha256', secret).update(`${head}.${body}`).digest('base64url');
console.log(`${head}.${body}.${sig}`);
