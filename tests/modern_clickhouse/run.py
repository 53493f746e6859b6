"""The audit schema and every query on a current ClickHouse (the engine chdb
embeds). Reads the fixture tests/integration/modern_clickhouse.rs wrote:
schema statements, rows encoded by the firewall itself (RowBinary), the
queries of the audit CLI, the auditor's guide (docs/auditors.md), the
dashboard, and the retention job;
and a table of an earlier release with the firewall's migration of it.
Fails on any statement the current engine refuses, and checks the answers.

    python run.py target/modern-clickhouse
"""
import json
import os
import sys
import tempfile

import chdb
from chdb import session

fixture = sys.argv[1]
with open(os.path.join(fixture, "schema.json")) as f:
    schema = json.load(f)
with open(os.path.join(fixture, "queries.json")) as f:
    queries = json.load(f)
with open(os.path.join(fixture, "columns.txt")) as f:
    columns = f.read().strip()
with open(os.path.join(fixture, "row_count")) as f:
    rows = int(f.read().strip())
with open(os.path.join(fixture, "event_count")) as f:
    events = int(f.read().strip())
with open(os.path.join(fixture, "drop_partition.sql")) as f:
    drop_template = f.read().strip()

work = tempfile.mkdtemp(prefix="mcpfw-chdb-")
s = session.Session(work)
version = s.query("SELECT version()", "TSV").bytes().decode().strip()
print(f"ClickHouse {version} (chdb {chdb.__version__})")
major = int(version.split(".")[0])
assert major >= 24, f"not a current ClickHouse: {version}"

for stmt in schema:
    s.query(stmt)
print(f"schema: {len(schema)} statements")

data = os.path.join(fixture, "rows.rowbinary")
# The table's own column types read the file: the same bytes the shipper
# sends in `INSERT ... FORMAT RowBinary`.
structure = s.query(
    "SELECT arrayStringConcat(groupArray(concat(name, ' ', type)), ', ') "
    "FROM (SELECT name, type FROM system.columns "
    "WHERE database = 'mcp_firewall' AND table = 'audit_events' ORDER BY position)",
    "TSV",
).bytes().decode().strip().replace("\\'", "'").replace("'", "\\'")
s.query(
    f"INSERT INTO mcp_firewall.audit_events ({columns}) "
    f"SELECT {columns} FROM file('{data}', 'RowBinary', '{structure}')"
)
# An intent row and its completion share an event_id; the table keeps the
# newest (merges may already have folded them).
n = int(s.query("SELECT count() FROM mcp_firewall.audit_events", "TSV").bytes().decode())
u = int(s.query("SELECT uniqExact(event_id) FROM mcp_firewall.audit_events", "TSV").bytes().decode())
assert u == events and events <= n <= rows, f"{n} rows, {u} events in ClickHouse; {rows} rows, {events} events written"
calls = s.query(
    "SELECT count() FROM mcp_firewall.audit_events FINAL WHERE method = 'tools/call' AND run_id = 'run-investigate-1'",
    "TSV",
).bytes().decode().strip()
print(f"rows: {n} inserted, {calls} calls of run-investigate-1 after FINAL")
assert int(calls) >= 3, calls

# `audit verify` hashes each row as `SELECT <columns> FORMAT RowBinary`
# returns it: every row read back is byte for byte a row the firewall wrote.
def split_rows(data, types):
    """Splits RowBinary bytes into rows of the given column types."""
    def leb(pos):
        value, shift = 0, 0
        while True:
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value, pos
            shift += 7
    fixed = {"UUID": 16, "UInt8": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8, "DateTime('UTC')": 4}
    rows, pos = [], 0
    while pos < len(data):
        start = pos
        for t in types:
            if t in fixed:
                pos += fixed[t]
            elif t.startswith("FixedString("):
                pos += int(t[len("FixedString("):-1])
            elif t in ("String", "LowCardinality(String)"):
                n, pos = leb(pos)
                pos += n
            elif t == "Array(String)":
                count, pos = leb(pos)
                for _ in range(count):
                    n, pos = leb(pos)
                    pos += n
            else:
                raise AssertionError(f"no RowBinary width for {t}")
        rows.append(data[start:pos])
    return rows


def types_of(table, cols):
    out = []
    for c in cols.split(", "):
        out.append(s.query(
            f"SELECT type FROM system.columns WHERE database = 'mcp_firewall' AND table = '{table}' AND name = '{c}'",
            "TSV").bytes().decode().strip().replace("\\'", "'"))
    return out


with open(data, "rb") as f:
    written = set(split_rows(f.read(), types_of("audit_events", columns)))
back = s.query(f"SELECT {columns} FROM mcp_firewall.audit_events", "RowBinary").bytes()
read = split_rows(back, types_of("audit_events", columns))
assert read and all(r in written for r in read), "a row read back differs from the bytes written"
print(f"readback: {len(read)} rows byte-identical to what the firewall wrote")

with open(os.path.join(fixture, "chain_columns.txt")) as f:
    chain_columns = f.read().strip()
chain_data = os.path.join(fixture, "chain.rowbinary")
chain_types = types_of("audit_events_chain", chain_columns)
chain_structure = ", ".join(f"{c} {t}" for c, t in zip(chain_columns.split(", "), chain_types)).replace("'", "\\'")
s.query(
    f"INSERT INTO mcp_firewall.audit_events_chain ({chain_columns}) "
    f"SELECT {chain_columns} FROM file('{chain_data}', 'RowBinary', '{chain_structure}')"
)
chain_back = s.query(
    f"SELECT {chain_columns} FROM mcp_firewall.audit_events_chain ORDER BY writer_id, seq", "RowBinary"
).bytes()
with open(chain_data, "rb") as f:
    assert chain_back == f.read(), "the chain read back differs from the entries written"
print(f"chain: {len(split_rows(chain_back, chain_types))} entries read back byte for byte")

answers = {}
for q in queries:
    # The verifier and the writer read hashes (binary) as RowBinary, as
    # they do; everything else is read as JSON and checked below.
    binary = q["name"].startswith(("verify: the", "verify: a window", "chain head lost"))
    try:
        out = s.query(q["sql"], "RowBinary" if binary else "JSONEachRow").bytes()
        if binary:
            answers[q["name"]] = out
            print(f"ok  {q['name']}: {len(out)} bytes")
            continue
        out = out.decode()
    except Exception as e:  # noqa: BLE001 - report which query
        print(f"FAILED {q['name']}:\n{q['sql']}\n{e}")
        sys.exit(1)
    answers[q["name"]] = [json.loads(l) for l in out.splitlines() if l.strip()]
    print(f"ok  {q['name']}: {len(answers[q['name']])} rows")

timeline = answers["cli run"]
assert any(r["tool"] == "get_incident" and r["stop_reason"] == "done" for r in timeline), timeline
assert any(r["tool"] == "restart_service" and r["decision"] == "hidden" for r in timeline), timeline
assert answers["cli denials"], "the hidden call is a denial"
assert any(r["tool"] == "get_incident" for r in answers["cli stats"]), answers["cli stats"]

assert answers["chain migration: columns"] == [{"same": 1}], answers["chain migration: columns"]
assert answers["verify: where links begin"][0]["writer_id"] == "fw-modern", answers["verify: where links begin"]
assert answers["verify: the chain"] == chain_back, "verify reads the chain as written"
print("chain: the verifier's and the writer's statements run; a chain table before links migrates to today's")

# The same statements on the same data (and a forged row_version = 2 copy
# of a call) answer here exactly as on the ClickHouse the tests ran: the
# chain byte for byte, the rows as sets. `verify` is a function of these
# answers, so its verdicts on every attack are the same on both.
with open(os.path.join(fixture, "verify.json")) as f:
    vfix = json.load(f)
s.query(vfix["forge"].replace("{database}", "mcp_firewall"))
s.query("OPTIMIZE TABLE mcp_firewall.audit_events FINAL")
for st in vfix["statements"]:
    here = s.query(st["sql"].replace("{database}", "mcp_firewall"), "RowBinary").bytes()
    with open(os.path.join(fixture, "verify-answers", st["file"]), "rb") as f:
        there = f.read()
    if st["rows"]:
        types = types_of("audit_events", columns)
        assert sorted(split_rows(here, types)) == sorted(split_rows(there, types)), st["name"]
    else:
        assert here == there, f"{st['name']}: {len(here)} bytes here, {len(there)} on 18.16"
    print(f"same answer as 18.16: {st['name']} ({len(here)} bytes)")

parts = answers["retention: partitions"]
assert parts, "day partitions"
for p in parts:
    if p["table"] == "audit_events_daily_stats":
        s.query(drop_template.replace(" 0", " " + str(p["partition"]).strip("'")))
left = int(s.query("SELECT count() FROM mcp_firewall.audit_events_daily_stats", "TSV").bytes().decode())
assert left == 0, f"{left} aggregate rows after dropping its partitions"
print("retention: dropped the aggregate's day partitions")

# A table the release before the approval, policy, pin and delegation
# columns created, holding a row, migrated as the firewall does at start
# (ADD COLUMN for each column it lacks), then given a row with those
# columns filled: it returns them, and the row's bytes, unchanged.
with open(os.path.join(fixture, "migration.json")) as f:
    mig = json.load(f)
db, table = mig["database"], mig["table"]
for stmt in mig["old_schema"]:
    s.query(stmt)
s.query(
    f"INSERT INTO {db}.{table} (event_id, time, time_ms, run_id, method) "
    "VALUES (generateUUIDv4(), now(), 1, 'before-migration', 'tools/call')"
)


def present(column):
    return int(s.query(
        f"SELECT count() FROM system.columns WHERE database = '{db}' AND table = '{table}' AND name = '{column}'",
        "TSV",
    ).bytes().decode())


added = 0
for column, alter in mig["alter"]:
    if present(column) == 0:
        s.query(alter)
        added += 1
assert added == len(mig["expect"]), f"{added} columns added"
names = s.query(
    f"SELECT name FROM system.columns WHERE database = '{db}' AND table = '{table}' ORDER BY position",
    "TSV",
).bytes().decode().split()
assert ", ".join(names) == columns, f"migrated columns {names}"
types = lambda d: s.query(
    f"SELECT groupArray(type) FROM (SELECT type FROM system.columns WHERE database = '{d}' AND table = '{table}' ORDER BY position)",
    "TSV",
).bytes().decode()
assert types(db) == types("mcp_firewall"), "migrated types differ from a new table's"
rows_file = os.path.join(fixture, "migration_rows.rowbinary")
s.query(
    f"INSERT INTO {db}.{table} ({columns}) "
    f"SELECT {columns} FROM file('{rows_file}', 'RowBinary', '{structure}')"
)


def row_of(run_id):
    out = s.query(
        f"SELECT {', '.join(mig['expect'])} FROM {db}.{table} FINAL WHERE run_id = '{run_id}'",
        "JSONEachRow",
    ).bytes().decode().splitlines()
    assert len(out) == 1, out
    return json.loads(out[0])


def same(got, want):
    # UInt64 may come quoted.
    return got == want or (isinstance(want, int) and str(got) == str(want))


for run_id, want in [(mig["run_id"], mig["expect"]), ("before-migration", mig["empty"])]:
    got = row_of(run_id)
    bad = {k: (got[k], v) for k, v in want.items() if not same(got[k], v)}
    assert not bad, f"{run_id}: {bad}"
with open(rows_file, "rb") as f:
    sent = f.read()
back = s.query(
    f"SELECT {columns} FROM {db}.{table} WHERE run_id = '{mig['run_id']}'", "RowBinary"
).bytes()
assert back == sent, "the row's RowBinary bytes do not round-trip"
print(f"migration: {added} columns added to a table of the release before; values and bytes round-trip")
print("ok")
