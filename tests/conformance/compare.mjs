#!/usr/bin/env node
// Compares two conformance result dirs (made by `conformance server ... -o DIR`)
// check by check, and judges the differences against expected-differences.txt.
//
//   node compare.mjs --set NAME --direct DIR --through DIR \
//        [--expected FILE] [--summary FILE]
//
// Each DIR holds server-<scenario>-<timestamp>/checks.json. A check is keyed
// by scenario and check id (a check id repeated within a scenario gets #2,
// #3, ...). INFO checks are ignored. Prints every difference, marked
// "expected" when a line of the expected-differences file covers it, and
// appends one tab-separated summary line to --summary:
//   set  direct_pass  direct_fail  direct_warn  through_pass  through_fail
//   through_warn  unexpected  expected
// Exit status: 0 no unexpected difference, 1 some, 2 bad usage or input.
import fs from 'node:fs';
import path from 'node:path';

function args(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || argv[i + 1] === undefined) usage(`bad argument ${argv[i]}`);
    out[argv[i].slice(2)] = argv[i + 1];
  }
  if (!out.set || !out.direct || !out.through) usage('--set, --direct and --through are required');
  return out;
}
function usage(msg) {
  console.error(`compare.mjs: ${msg}`);
  console.error('usage: node compare.mjs --set NAME --direct DIR --through DIR [--expected FILE] [--summary FILE]');
  process.exit(2);
}

// scenario dir names end in an ISO timestamp with ':' and '.' replaced by '-'
const DIR_RE = /^server-(.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d+Z$/;

function load(dir) {
  const checks = new Map();
  const scenarios = new Set();
  if (!fs.existsSync(dir)) return { checks, scenarios };
  for (const ent of fs.readdirSync(dir).sort()) {
    const m = ent.match(DIR_RE);
    if (!m) continue;
    const scenario = m[1];
    scenarios.add(scenario);
    const f = path.join(dir, ent, 'checks.json');
    if (!fs.existsSync(f)) {
      checks.set(`${scenario} (no checks.json)`, { scenario, id: '(none)', status: 'MISSING' });
      continue;
    }
    let list;
    try {
      list = JSON.parse(fs.readFileSync(f, 'utf8'));
    } catch (e) {
      console.error(`compare.mjs: cannot parse ${f}: ${e.message}`);
      process.exit(2);
    }
    const seen = new Map();
    for (const c of list) {
      if (c.status === 'INFO') continue;
      const n = (seen.get(c.id) ?? 0) + 1;
      seen.set(c.id, n);
      const id = n > 1 ? `${c.id}#${n}` : c.id;
      checks.set(`${scenario} ${id}`, { scenario, id, status: c.status, msg: c.errorMessage, details: c.details });
    }
  }
  return { checks, scenarios };
}

// expected-differences.txt: one difference a line,
//   SET SCENARIO CHECK DIRECT->THROUGH  reason (required)
// SET, SCENARIO, CHECK and either status may be `*`. `#` starts a comment line.
function loadExpected(file) {
  if (!file || !fs.existsSync(file)) return [];
  const rules = [];
  fs.readFileSync(file, 'utf8').split('\n').forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) return;
    const m = line.match(/^(\S+)\s+(\S+)\s+(\S+)\s+(\S+)->(\S+)\s+(.*\S)$/);
    if (!m) {
      console.error(`compare.mjs: ${file}:${i + 1}: expected "SET SCENARIO CHECK DIRECT->THROUGH reason"`);
      process.exit(2);
    }
    const [, set, scenario, check, from, to, reason] = m;
    rules.push({ set, scenario, check, from, to, reason, line: i + 1, used: false });
  });
  return rules;
}
const matches = (pat, v) => pat === '*' || pat === v;

const opt = args(process.argv.slice(2));
const A = load(opt.direct);
const B = load(opt.through);
const rules = loadExpected(opt.expected);

if (A.checks.size === 0) {
  console.error(`compare.mjs: ${opt.set}: the direct run produced no checks (${opt.direct})`);
  process.exit(2);
}

let unexpected = 0;
let expected = 0;
const keys = [...new Set([...A.checks.keys(), ...B.checks.keys()])].sort();
for (const k of keys) {
  const a = A.checks.get(k);
  const b = B.checks.get(k);
  const x = a?.status ?? 'ABSENT';
  const y = b?.status ?? 'ABSENT';
  if (x === y) continue;
  const { scenario, id } = a ?? b;
  const rule = rules.find(
    (r) => matches(r.set, opt.set) && matches(r.scenario, scenario) && matches(r.check, id) && matches(r.from, x) && matches(r.to, y),
  );
  const why = (c) => (c?.msg ? String(c.msg).replace(/\s+/g, ' ').slice(0, 300) : '');
  if (rule) {
    rule.used = true;
    expected++;
    console.log(`  expected   ${opt.set} ${scenario} ${id} ${x}->${y}  (${rule.reason})`);
  } else {
    unexpected++;
    console.log(`  DIFFERENT  ${opt.set} ${scenario} ${id} ${x}->${y}`);
    if (why(a)) console.log(`             direct:  ${why(a)}`);
    if (why(b)) console.log(`             through: ${why(b)}`);
  }
}
for (const s of A.scenarios) {
  if (!B.scenarios.has(s)) console.log(`  note: scenario ${s} has no result through the firewall`);
}
for (const r of rules) {
  if (!r.used && r.set === opt.set) {
    console.log(`  note: expected-differences line ${r.line} (${r.set} ${r.scenario} ${r.check}) did not occur`);
  }
}

const count = (M, s) => [...M.values()].filter((v) => v.status === s).length;
const row = [
  opt.set,
  count(A.checks, 'SUCCESS'), count(A.checks, 'FAILURE'), count(A.checks, 'WARNING'),
  count(B.checks, 'SUCCESS'), count(B.checks, 'FAILURE'), count(B.checks, 'WARNING'),
  unexpected, expected,
];
if (opt.summary) fs.appendFileSync(opt.summary, `${row.join('\t')}\n`);
process.exit(unexpected ? 1 : 0);
