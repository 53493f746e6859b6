#!/usr/bin/env bash
# Stdio upstreams end to end, with real peers.
#
#   tests/stdio/run.sh [FIREWALL_BINARY] [WORK_DIR]
#
# Three real MCP servers that speak stdio, each started, confined and
# supervised by mcp-firewall (transport = "stdio", a process per client
# session): the official server-everything (npm) as `everything`;
# py_server.py (Python SDK) as `py`; the official server-filesystem (npm) as
# `docs`, given srv/docs and srv/other in its arguments but only srv/docs
# readable in its sandbox. client.py, the Python SDK's own client, checks
# each over streamable HTTP (docs/operators.md, "Stdio servers";
# tests/stdio/client.py). Fails (exit
# 1) on any check that does not hold.
#
# FIREWALL_BINARY  default: target/debug/mcp-firewall under the repo root
# WORK_DIR         default: a fresh mktemp dir (config, logs, srv/)
# STDIO_PEERS      installs (Node 22, the npm servers, a venv of Debian's
#                  /usr/bin/python3 with the Python SDK); default
#                  /var/tmp/mcp-firewall-stdio-peers. It must be readable by
#                  every user: a firewall running as root runs each server
#                  as a uid of its own, which cannot enter /root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

FW_BIN=${1:-$REPO/target/debug/mcp-firewall}
case $FW_BIN in /*) ;; *) FW_BIN=$PWD/$FW_BIN ;; esac
WORK=${2:-$(mktemp -d "${TMPDIR:-/tmp}/mcp-stdio.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
chmod 755 "$WORK"
CACHE=${STDIO_PEERS:-/var/tmp/mcp-firewall-stdio-peers}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
chmod 755 "$CACHE"

# --- pinned versions --------------------------------------------------------
NODE22_VERSION=22.23.5
EVERYTHING="@modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/sdk@1.32.2"
FILESYSTEM="@modelcontextprotocol/server-filesystem@2026.8.31"
SDK_PYPI="mcp==2.3.0"

LOGS=$WORK/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
T0=$(date +%s)

say() { echo "stdio: $*"; }
fail() { echo "stdio: FAILED: $*" >&2; exit 1; }

[ -x "$FW_BIN" ] || fail "no firewall binary at $FW_BIN"

PEERS_WHO=stdio
# shellcheck source=../lib/peers.sh
. "$HERE/../lib/peers.sh"
use_node22

EVDIR=$CACHE/everything
npm_install "$EVDIR" "$EVERYTHING"
EV_MAIN=$EVDIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js
[ -f "$EV_MAIN" ] || fail "server-everything is not at $EV_MAIN"
FSDIR=$CACHE/filesystem
npm_install "$FSDIR" "$FILESYSTEM"
FS_MAIN=$FSDIR/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js
[ -f "$FS_MAIN" ] || fail "server-filesystem is not at $FS_MAIN"
# Debian's interpreter: each server runs as a uid of its own when the firewall is root.
PYDIR=$CACHE/py-${SDK_PYPI//[^A-Za-z0-9.]/-}
python_venv "$PYDIR" "$SDK_PYPI" /usr/bin/python3
PY=$PYDIR/bin/python
chmod -R a+rX "$CACHE"

# --- what the servers are given ----------------------------------------------
mkdir -p "$WORK/srv/docs" "$WORK/srv/other" "$WORK/server"
echo "the docs" >"$WORK/srv/docs/readme.txt"
echo "not for the server" >"$WORK/srv/other/secret.txt"
cp "$HERE/py_server.py" "$WORK/server/"
chmod -R a+rX "$WORK/srv" "$WORK/server"
DOCS=$WORK/srv/docs
OTHER=$WORK/srv/other

read -r FW_PORT ADMIN_PORT < <(free_ports 2)
firewall_config "$WORK" "$FW_PORT" "$ADMIN_PORT" stdio everything py docs
cat >>"$WORK/firewall.toml" <<CONF

[[upstream]]
name = "everything"
transport = "stdio"
command = ["$NODE", "$EV_MAIN", "stdio"]
projects = ["stdio"]

[upstream.sandbox]
memory_mb = 1024
processes = 512

[[upstream]]
name = "py"
transport = "stdio"
command = ["$PY", "$WORK/server/py_server.py"]
projects = ["stdio"]

[upstream.sandbox]
read = ["$PYDIR"]
memory_mb = 512
processes = 512

[[upstream]]
name = "docs"
transport = "stdio"
command = ["$NODE", "$FS_MAIN", "$DOCS", "$OTHER"]
projects = ["stdio"]

[upstream.sandbox]
read = ["$DOCS"]
memory_mb = 1024
processes = 512
CONF
"$FW_BIN" check --config "$WORK/firewall.toml" >"$LOGS/firewall-check.log" 2>&1 || {
  cat "$LOGS/firewall-check.log" >&2
  fail "mcp-firewall check refused the config ($WORK/firewall.toml)"
}
grep '^sandbox ' "$LOGS/firewall-check.log" | sed 's/^/stdio: check: /'

TOKEN=$("$FW_BIN" token mint --config "$WORK/firewall.toml" --agent stdio \
  --projects stdio --sub stdio-e2e --tenant stdio --run "stdio-$(date +%s)-$$" --lifetime-s 900)

start firewall env NO_COLOR=1 "$FW_BIN" serve --config "$WORK/firewall.toml"
FW_PID=$LAST_PID
wait_port firewall "$FW_PID" "$FW_PORT"

say "client -> http://127.0.0.1:$FW_PORT/mcp/{everything,py,docs} (stdio servers started by the firewall)"
RC=0
timeout 120 "$PY" "$HERE/client.py" "http://127.0.0.1:$FW_PORT" "$TOKEN" "$DOCS" "$OTHER" \
  2>"$LOGS/client.stderr.log" | tee "$LOGS/client.log" || RC=$?
if ! grep -q '^all checks passed' "$LOGS/client.log"; then RC=1; fi

# The firewall stops: its servers go with it (the close sequence), no orphan.
kill -TERM "$FW_PID" 2>/dev/null || true
for _ in $(seq 1 100); do kill -0 "$FW_PID" 2>/dev/null || break; sleep 0.1; done
LEFT=$(pgrep -f "$EV_MAIN|$FS_MAIN|$WORK/server/py_server.py" || true)
if [ -n "$LEFT" ]; then
  echo "stdio: processes left after the firewall stopped: $LEFT" >&2
  RC=1
fi

ELAPSED=$(($(date +%s) - T0))
if [ "$RC" != 0 ]; then
  echo "--- client stderr (last lines)" >&2
  tail -n 20 "$LOGS/client.stderr.log" >&2 || true
  echo "--- firewall log (last lines)" >&2
  tail -n 40 "$LOGS/firewall.log" >&2 || true
  fail "stdio servers through the firewall: see above; logs in $LOGS (${ELAPSED} s)"
fi
PASSED=$(grep -c '^ok: ' "$LOGS/client.log" || true)
say "ok: $PASSED checks (server-everything, a Python SDK server and server-filesystem over stdio, each in its sandbox; none left running) (${ELAPSED} s; work dir $WORK)"
