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
# new tool). Fails (exit 1) on any check that does not hold; README.md.
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

# --- processes we start: each in its own process group, all ended on exit ----
PGIDS=()
cleanup() {
  local p
  for p in "${PGIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local alive=0
    for p in "${PGIDS[@]}"; do kill -0 -- "-$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  for p in "${PGIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() { # NAME CMD... ; stdout+stderr to $LOGS/NAME.log
  local name=$1
  shift
  setsid "$@" >"$LOGS/$name.log" 2>&1 &
  PGIDS+=("$!")
  LAST_PID=$!
}

wait_port() { # NAME PID PORT
  local i
  for i in $(seq 1 150); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "virtual: $1 did not start listening on port $3; its log:" >&2
  tail -n 40 "$LOGS/$1.log" >&2 || true
  exit 1
}

# --- Node 22, server-everything and the Python SDK, cached --------------------
npm_install() { # DIR SPEC (one or more name@version, space-separated)
  local dir=$1 spec=$2
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$spec" ]; then return 0; fi
  echo "== installing $spec"
  rm -rf "$dir"
  mkdir -p "$dir"
  printf '{"name":"virtual-cache","private":true}\n' >"$dir/package.json"
  # shellcheck disable=SC2086  # spec is a word list
  if ! (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact $spec) \
    >"$LOGS/npm-$(basename "$dir").log" 2>&1; then
    cat "$LOGS/npm-$(basename "$dir").log" >&2
    exit 1
  fi
  echo "$spec" >"$dir/.installed"
}

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing nodejs and npm (Debian)"
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  else
    fail "needs npm"
  fi
fi
if command -v node >/dev/null 2>&1 && [ "$(node_major node)" -ge 22 ]; then
  NODE=$(command -v node)
else
  case $(uname -m) in
    x86_64) NODE_ARCH=x64 ;;
    aarch64 | arm64) NODE_ARCH=arm64 ;;
    *) fail "no Node 22 package for $(uname -m)" ;;
  esac
  npm_install "$CACHE/node22" "node-linux-$NODE_ARCH@$NODE22_VERSION"
  NODE=$CACHE/node22/node_modules/node-linux-$NODE_ARCH/bin/node
fi
[ "$(node_major "$NODE")" -ge 22 ] || fail "$NODE is not Node >= 22"
export PATH="$(dirname "$NODE"):$PATH"

EVDIR=$CACHE/everything-${EVERYTHING//[^A-Za-z0-9.]/-}
npm_install "$EVDIR" "$EVERYTHING"
EV_MAIN=$EVDIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js
[ -f "$EV_MAIN" ] || fail "server-everything is not at $EV_MAIN"

# The same venv as tests/conformance/run.sh (same pin, same directory).
PYDIR=$CACHE/py-${SDK_PYPI//[^A-Za-z0-9.]/-}
if [ ! -f "$PYDIR/.installed" ]; then
  echo "== installing $SDK_PYPI"
  rm -rf "$PYDIR"
  python3 -m venv "$PYDIR" >"$LOGS/venv.log" 2>&1 || { cat "$LOGS/venv.log" >&2; exit 1; }
  "$PYDIR/bin/python" -m pip install -q --disable-pip-version-check "$SDK_PYPI" \
    >"$LOGS/pip.log" 2>&1 || { cat "$LOGS/pip.log" >&2; exit 1; }
  echo "$SDK_PYPI" >"$PYDIR/.installed"
fi
PY=$PYDIR/bin/python

# --- ports ------------------------------------------------------------------
read -r EV_PORT PY_PORT FW_PORT ADMIN_PORT < <("$NODE" -e '
  const net = require("net"); const socks = [];
  (async () => {
    for (let i = 0; i < 4; i++) socks.push(await new Promise((ok) => {
      const s = net.createServer(); s.listen(0, "127.0.0.1", () => ok(s)); }));
    console.log(socks.map((s) => s.address().port).join(" "));
    socks.forEach((s) => s.close());
  })();')

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
mkdir -p "$WORK/policies"
cat >"$WORK/policies/virtual.toml" <<'EOF'
# Everything allowed: this run checks the virtual server's plumbing, not policy.
[gates]
read = "allow"
write = "allow"
destructive = "allow"

[server_requests]
sampling = true
elicitation = true
roots = true

[[tools]]
upstream = "everything"
match = ["*"]
risk = "read"

[[tools]]
upstream = "py"
match = ["*"]
risk = "read"

[[agents]]
name = "virtual-e2e"
projects = ["virtual"]
risks = ["read", "write", "destructive"]
allow = [{}]
max_steps = 100000
EOF
cat >"$WORK/firewall.toml" <<EOF
[server]
listen = "127.0.0.1:$FW_PORT"
plaintext = true

[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://virtual.test"]

[[auth.keys]]
alg = "HS256"
secret = "virtual-e2e-secret-that-is-long-enough!!"

[policy]
dir = "$WORK/policies"

[[upstream]]
name = "everything"
url = "http://127.0.0.1:$EV_PORT/mcp"
projects = ["virtual"]

[[upstream]]
name = "py"
url = "http://127.0.0.1:$PY_PORT/mcp"
projects = ["virtual"]

[[virtual_server]]
name = "mix"
upstreams = ["everything", "py"]
collisions = "prefix"
EOF
"$FW_BIN" check --config "$WORK/firewall.toml" >"$LOGS/firewall-check.log" 2>&1 || {
  cat "$LOGS/firewall-check.log" >&2
  fail "mcp-firewall check refused the config ($WORK/firewall.toml)"
}

TOKEN=$("$FW_BIN" token mint --config "$WORK/firewall.toml" --agent virtual-e2e \
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
