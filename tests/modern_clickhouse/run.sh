#!/usr/bin/env bash
# The audit schema and queries on a current ClickHouse (chdb from PyPI, in a
# cached venv), from the fixture `cargo test` wrote (tests/integration/
# modern_clickhouse.rs). Run by .ci/run after the tests.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CHDB_VERSION=4.4.0
CACHE=${MODERN_CH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-firewall-chdb}
VENV=$CACHE/venv-$CHDB_VERSION
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import chdb" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "chdb==$CHDB_VERSION"
fi
FIXTURE=$REPO/target/modern-clickhouse
if [ ! -f "$FIXTURE/schema.json" ] || [ ! -f "$FIXTURE/migration.json" ]; then
  (cd "$REPO" && cargo test --test integration modern_clickhouse -- --quiet)
fi
"$VENV/bin/python" "$HERE/run.py" "$FIXTURE"
