#!/usr/bin/env bash
# Virtual server end to end, with real peers.
#
#   tests/virtual/run.sh [FIREWALL_BINARY] [WORK_DIR]
#
# Two real MCP servers behind one [[virtual_server]] of mcp-firewall
# (collisions = "prefix"): the official server-everything (npm, streamable
# HTTP) as `everything`, and member.py (Python SDK) as `py`. client.py, the
# Python SDK's own client, talks to /mcp/mix only: lists tools, calls a tool
# of each member, reads server-everything resources, answers member.py's
# sampling request, and gets member.py's tools/list_changed (then lists the
# new tool). Fails (exit 1) on any check that does not hold; see
# tests/virtual/README.md.
#
# FIREWALL_BINARY  default: target/debug/mcp-firewall under the repo root
# WORK_DIR         default: a fresh mktemp dir (config, logs)
# VIRTUAL_CACHE    installs (Node 22, server-everything, the Python venv);
#                  default: $CONFORMANCE_CACHE, else
#                  ${XDG_CACHE_HOME:-~/.cache}/mcp-firewall-conformance
#                  (shared with tests/conformance/run.sh: same pins)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

FW_BIN=${1:-$REPO/target/debug/mcp-firewall}
case $FW_BIN in /*) ;; *) FW_BIN=$PWD/$FW_BIN ;; esac
WORK=${2:-$(mktemp -d "${TMPDIR:-/tmp}/mcp-virtual.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
CACHE=${VIRTUAL_CACHE:-${CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-firewall-conformance}}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

# --- pinned versions --------------------------------------------------------
NODE22_VERSION=22.23.5                       # npm package node-linux-<arch>
# server-everything, and the TypeScript SDK it runs on (its dependency is
# ^1.30.0: pinned here so the run does not move under us).
EVERYTHING_VERSION=2026.8.31
EVERYTHING_TS_SDK=1.32.2
EVERYTHING="@modelcontextprotocol/server-everything@$EVERYTHING_VERSION @modelcontextprotocol/sdk@$EVERYTHING_TS_SDK"
SDK_PYPI="mcp==2.3.0"                        # the Python SDK (member.py, client.py)

LOGS=$WORK/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
T0=$(date +%s)

say() { echo "virtual: $*"; }
fail() { echo "virtual: FAILED: $*" >&2; exit 1; }

[ -x "$FW_BIN" ] || fail "no firewall binary at $FW_BIN"

# --- processes, ports, Node 22 and the Python venv (tests/lib/peers.sh) ------
PEERS_WHO=virtual
# shellcheck source=../lib/peers.sh
. "$HERE/../lib/peers.sh"
use_node22

EVDIR=$CACHE/everything-${EVERYTHING//[^A-Za-z0-9.]/-}
npm_install "$EVDIR" "$EVERYTHING"
EV_MAIN=$EVDIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js
[ -f "$EV_MAIN" ] || fail "server-everything is not at $EV_MAIN"

# The same venv as tests/conformance/run.sh (same pin, same directory).
PYDIR=$CACHE/py-${SDK_PYPI//[^A-Za-z0-9.]/-}
python_venv "$PYDIR" "$SDK_PYPI"
PY=$PYDIR/bin/python

# --- ports ------------------------------------------------------------------
read -r EV_PORT PY_PORT FW_PORT ADMIN_PORT < <(free_ports 4)

# --- the members ----------------------------------------------------------------
# server-everything's streamable HTTP transport: POST/GET/DELETE /mcp on $PORT
# (it listens on every interface; it has no option for the address).
start everything env PORT="$EV_PORT" "$NODE" "$EV_MAIN" streamableHttp
EV_PID=$LAST_PID
start member "$PY" "$HERE/member.py" "$PY_PORT"
PY_PID=$LAST_PID
wait_port everything "$EV_PID" "$EV_PORT"
wait_port member "$PY_PID" "$PY_PORT"

# --- the firewall -------------------------------------------------------------
firewall_config "$WORK" "$FW_PORT" "$ADMIN_PORT" virtual everything py
upstream_config "$WORK" everything "$EV_PORT" virtual
upstream_config "$WORK" py "$PY_PORT" virtual
cat >>"$WORK/firewall.toml" <<EOF

[[virtual_server]]
name = "mix"
upstreams = ["everything", "py"]
collisions = "prefix"
EOF
"$FW_BIN" check --config "$WORK/firewall.toml" >"$LOGS/firewall-check.log" 2>&1 || {
  cat "$LOGS/firewall-check.log" >&2
  fail "mcp-firewall check refused the config ($WORK/firewall.toml)"
}

TOKEN=$("$FW_BIN" token mint --config "$WORK/firewall.toml" --agent virtual \
  --projects virtual --sub virtual-e2e --tenant virtual --run "virtual-$(date +%s)-$$" --lifetime-s 900)

start firewall env NO_COLOR=1 "$FW_BIN" serve --config "$WORK/firewall.toml"
wait_port firewall "$LAST_PID" "$FW_PORT"

# --- the client -------------------------------------------------------------------
URL="http://127.0.0.1:$FW_PORT/mcp/mix"
say "client -> $URL (members: everything = server-everything $EVERYTHING_VERSION, py = member.py on $SDK_PYPI)"
RC=0
# pipefail: RC is the client's status (124 when `timeout` ended it).
timeout 90 "$PY" "$HERE/client.py" "$URL" "$TOKEN" 2>"$LOGS/client.stderr.log" | tee "$LOGS/client.log" || RC=$?
if ! grep -q '^all checks passed' "$LOGS/client.log"; then RC=1; fi

ELAPSED=$(($(date +%s) - T0))
if [ "$RC" != 0 ]; then
  echo "--- client stderr (last lines)" >&2
  tail -n 20 "$LOGS/client.stderr.log" >&2 || true
  echo "--- firewall log (last lines)" >&2
  tail -n 30 "$LOGS/firewall.log" >&2 || true
  fail "virtual server mix (server-everything + Python SDK member): see above; logs in $LOGS (${ELAPSED} s)"
fi
PASSED=$(grep -c '^ok: ' "$LOGS/client.log" || true)
say "ok: $PASSED checks through /mcp/mix (server-everything + Python SDK member, prefix): tools, calls, resources, sampling, list_changed x2 (${ELAPSED} s; work dir $WORK)"
