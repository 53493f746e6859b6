#!/usr/bin/env bash
# MCP conformance, direct vs through the firewall.
#
#   tests/conformance/run.sh [FIREWALL_BINARY] [WORK_DIR]
#
# Runs the server scenarios of the official MCP conformance suite
# (@modelcontextprotocol/conformance, pinned below) twice against an MCP
# server: directly, and through mcp-firewall (with a bearer shim in front of
# the firewall, since the suite cannot send a header). Fails when a check's
# verdict differs between the two, unless expected-differences.txt lists it.
# Two servers: server.py (Python SDK) and everything-server.mjs (TypeScript
# SDK, shaped like the suite's own reference server); each set names one.
#
# FIREWALL_BINARY  default: target/debug/mcp-firewall under the repo root
# WORK_DIR         default: a fresh mktemp dir (config, logs, results)
# CONFORMANCE_CACHE  installs (Node 22, the suites, the server's venv); default
#                  ${XDG_CACHE_HOME:-~/.cache}/mcp-firewall-conformance
# CONFORMANCE_SETS   which sets to run (default: all four),
#                  e.g. "a12-2026" or "v016 v016-everything"
# CONFORMANCE_SCENARIOS  run only these scenarios (space-separated), one
#                  `--scenario` run each, instead of the set's runner arguments
# CONFORMANCE_EVERYTHING_CMD  a command that starts another server in place of
#                  everything-server.mjs, listening on $PORT at /mcp (e.g. the
#                  suite's examples/servers/typescript/everything-server.ts
#                  from a checkout: "cd DIR && npx tsx everything-server.ts")
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

FW_BIN=${1:-$REPO/target/debug/mcp-firewall}
case $FW_BIN in /*) ;; *) FW_BIN=$PWD/$FW_BIN ;; esac
WORK=${2:-$(mktemp -d "${TMPDIR:-/tmp}/mcp-conformance.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
CACHE=${CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-firewall-conformance}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

# --- pinned versions --------------------------------------------------------
NODE22_VERSION=22.23.5                       # npm package node-linux-<arch>
CONF_STABLE=0.1.16                           # @modelcontextprotocol/conformance
CONF_ALPHA=0.2.0-alpha.12
SUT_PYPI="mcp==2.3.0"                        # the Python SDK; server.py is ours
# The TypeScript SDK (and the zod it is used with) for everything-server.mjs
# (ours): the versions the suite's reference server is locked to at v0.1.16.
TS_SDK="@modelcontextprotocol/sdk@1.27.1 zod@4.3.6"

# name | suite version | runner arguments | server (python: server.py,
# everything: everything-server.mjs)
ALL_SETS=(
  "v016|$CONF_STABLE|--suite all|python"
  "a12-2025|$CONF_ALPHA|--requirements 2025-11-25|python"
  "a12-2026|$CONF_ALPHA|--requirements 2026-07-28|python"
  "v016-everything|$CONF_STABLE|--suite all|everything"
  "a12-2025-virtual|$CONF_ALPHA|--requirements 2025-11-25|virtual"
  "a12-2026-virtual|$CONF_ALPHA|--requirements 2026-07-28|virtual"
)
# v016-everything is not in the default yet: through the firewall it loses a
# server request to a race until the firewall orders a session's GET stream
# before its POSTs (README.md, "everything-server.mjs"); add it here with
# that fix.
SETS=${CONFORMANCE_SETS:-v016 v016-everything a12-2025 a12-2026 a12-2025-virtual a12-2026-virtual}
SCENARIOS=${CONFORMANCE_SCENARIOS:-}

# The servers the chosen sets need.
NEED_PYTHON=0
NEED_EVERYTHING=0
for entry in "${ALL_SETS[@]}"; do
  IFS='|' read -r name _ _ kind <<<"$entry"
  case " $SETS " in *" $name "*) ;; *) continue ;; esac
  case $kind in
    python | virtual) NEED_PYTHON=1 ;;
    everything) NEED_EVERYTHING=1 ;;
  esac
done

LOGS=$WORK/logs
RESULTS=$WORK/results
rm -rf "$RESULTS"
mkdir -p "$LOGS" "$RESULTS"
T0=$(date +%s)

[ -x "$FW_BIN" ] || { echo "conformance: no firewall binary at $FW_BIN" >&2; exit 1; }

# --- processes, ports, Node 22 and the Python venv (tests/lib/peers.sh) ------
PEERS_WHO=conformance
# shellcheck source=../lib/peers.sh
. "$HERE/../lib/peers.sh"

# --- Node 22 and the npm packages, cached -----------------------------------
use_node22

npm_install "$CACHE/conformance-$CONF_STABLE" "@modelcontextprotocol/conformance@$CONF_STABLE"
npm_install "$CACHE/conformance-$CONF_ALPHA" "@modelcontextprotocol/conformance@$CONF_ALPHA"

# The servers under test: server.py on the Python SDK, in a venv of its own;
# everything-server.mjs on the TypeScript SDK, its packages in the cache.
PYDIR=$CACHE/py-${SUT_PYPI//[^A-Za-z0-9.]/-}
if [ $NEED_PYTHON = 1 ]; then
  python_venv "$PYDIR" "$SUT_PYPI"
fi
TSDIR=$CACHE/ts-${TS_SDK//[^A-Za-z0-9.]/-}
if [ $NEED_EVERYTHING = 1 ] && [ -z "${CONFORMANCE_EVERYTHING_CMD:-}" ]; then
  npm_install "$TSDIR" "$TS_SDK"
fi

# --- ports ------------------------------------------------------------------
read -r SUT_PORT EV_PORT FW_PORT ADMIN_PORT < <(free_ports 4)

# --- the servers under test ---------------------------------------------------
# An upstream each: `conformance` is server.py, `everything` the TypeScript one.
UPSTREAMS=""
if [ $NEED_PYTHON = 1 ]; then
  start server "$PYDIR/bin/python" "$HERE/server.py" "$SUT_PORT"
  wait_port server "$LAST_PID" "$SUT_PORT"
  UPSTREAMS+="conformance|$SUT_PORT "
fi
if [ $NEED_EVERYTHING = 1 ]; then
  if [ -n "${CONFORMANCE_EVERYTHING_CMD:-}" ]; then
    start everything-server env PORT="$EV_PORT" bash -c "$CONFORMANCE_EVERYTHING_CMD"
  else
    # ESM resolves bare imports from the file's own directory: a copy of the
    # server beside a link to the cached node_modules.
    mkdir -p "$WORK/everything"
    cp "$HERE/everything-server.mjs" "$WORK/everything/"
    ln -sfn "$TSDIR/node_modules" "$WORK/everything/node_modules"
    start everything-server env PORT="$EV_PORT" EVERYTHING_LOG=1 "$NODE" "$WORK/everything/everything-server.mjs"
  fi
  wait_port everything-server "$LAST_PID" "$EV_PORT"
  UPSTREAMS+="everything|$EV_PORT "
fi

# --- the firewall -------------------------------------------------------------
firewall_config "$WORK" "$FW_PORT" "$ADMIN_PORT" conformance conformance everything
for u in $UPSTREAMS; do
  upstream_config "$WORK" "${u%|*}" "${u#*|}" conformance
done
if [ $NEED_PYTHON = 1 ]; then
  # server.py again, as the only member of a virtual server: the same
  # verdicts as direct are expected.
  cat >>"$WORK/firewall.toml" <<EOF

[[virtual_server]]
name = "conformance-vs"
upstreams = ["conformance"]
EOF
fi
"$FW_BIN" check --config "$WORK/firewall.toml" >"$LOGS/firewall-check.log" 2>&1 || {
  cat "$LOGS/firewall-check.log" >&2
  exit 1
}

RUN_ID=conformance-$(date +%s)-$$
if "$FW_BIN" token --help >/dev/null 2>&1; then
  TOKEN=$("$FW_BIN" token mint --config "$WORK/firewall.toml" --agent conformance \
    --projects conformance --sub conformance --tenant conformance --run "$RUN_ID" --lifetime-s 900)
else
  TOKEN=$("$NODE" "$HERE/mint-token.mjs" "conformance-secret-that-is-long-enough!!" "$RUN_ID")
fi

start firewall "$FW_BIN" serve --config "$WORK/firewall.toml"
wait_port firewall "$LAST_PID" "$FW_PORT"

# --- the bearer shim in front of the firewall ---------------------------------
rm -f "$WORK/shim.port"
start shim env SHIM_PORT=0 SHIM_TARGET="http://127.0.0.1:$FW_PORT" SHIM_TOKEN="$TOKEN" \
  SHIM_PORT_FILE="$WORK/shim.port" SHIM_LOG="$LOGS/shim-requests.log" "$NODE" "$HERE/shim.mjs"
SHIM_PID=$LAST_PID
for _ in $(seq 1 100); do [ -s "$WORK/shim.port" ] && break; sleep 0.05; done
[ -s "$WORK/shim.port" ] || { echo "conformance: the shim did not start" >&2; cat "$LOGS/shim.log" >&2; exit 1; }
SHIM_PORT=$(cat "$WORK/shim.port")
wait_port shim "$SHIM_PID" "$SHIM_PORT"

# The runner must be given a localhost URL (dns-rebinding-protection refuses
# anything else).
direct_url() { # KIND
  case $1 in
    python | virtual) echo "http://localhost:$SUT_PORT/mcp" ;;
    everything) echo "http://localhost:$EV_PORT/mcp" ;;
  esac
}
through_url() { # KIND
  case $1 in
    python) echo "http://localhost:$SHIM_PORT/mcp/conformance" ;;
    everything) echo "http://localhost:$SHIM_PORT/mcp/everything" ;;
    virtual) echo "http://localhost:$SHIM_PORT/mcp/conformance-vs" ;;
  esac
}

# --- run and compare -----------------------------------------------------------
run_suite() { # VERSION URL OUT ARGS...
  local version=$1 url=$2 out=$3 rc=0 s
  shift 3
  if [ -n "$SCENARIOS" ]; then
    : >"$out.log"
    for s in $SCENARIOS; do
      rc=0
      (cd "$CACHE/conformance-$version" &&
        timeout 300 "$NODE" node_modules/.bin/conformance server --url "$url" -o "$out" \
          --scenario "$s") >>"$out.log" 2>&1 || rc=$?
      if [ "$rc" = 124 ]; then echo "conformance: the runner timed out ($out.log)" >&2; fi
    done
    return 0
  fi
  (cd "$CACHE/conformance-$version" &&
    timeout 300 "$NODE" node_modules/.bin/conformance server --url "$url" -o "$out" "$@") \
    >"$out.log" 2>&1 || rc=$?
  if [ "$rc" = 124 ]; then echo "conformance: the runner timed out ($out.log)" >&2; fi
  return 0
}

SUMMARY=$WORK/summary.tsv
: >"$SUMMARY"
STATUS=0
for entry in "${ALL_SETS[@]}"; do
  IFS='|' read -r name version runargs kind <<<"$entry"
  case " $SETS " in *" $name "*) ;; *) continue ;; esac
  echo "== $name: conformance $version ${SCENARIOS:+--scenario }${SCENARIOS:-$runargs} ($kind server)"
  # shellcheck disable=SC2086  # runargs is a word list
  run_suite "$version" "$(direct_url "$kind")" "$RESULTS/$name-direct" $runargs
  # shellcheck disable=SC2086
  run_suite "$version" "$(through_url "$kind")" "$RESULTS/$name-through" $runargs
  "$NODE" "$HERE/compare.mjs" --set "$name" --direct "$RESULTS/$name-direct" \
    --through "$RESULTS/$name-through" --expected "$HERE/expected-differences.txt" \
    --summary "$SUMMARY" || STATUS=1
done

echo
printf '%-16s %16s %16s %12s\n' "set" "direct p/f/w" "through p/f/w" "diff (exp.)"
while IFS=$'\t' read -r name dp df dw tp tf tw unexp exp; do
  printf '%-16s %16s %16s %12s\n' "$name" "$dp/$df/$dw" "$tp/$tf/$tw" "$unexp ($exp)"
done <"$SUMMARY"
echo "(p/f/w = checks passed/failed/warned; diff = unexpected differences, expected ones in parentheses)"
echo "work dir: $WORK ($(($(date +%s) - T0)) s)"
if [ "$STATUS" != 0 ]; then
  echo "conformance: FAILED: results differ through the firewall (logs in $LOGS, results in $RESULTS)"
  exit 1
fi
echo "conformance: ok"
