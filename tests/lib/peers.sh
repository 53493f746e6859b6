# Shared by tests/conformance/run.sh and tests/virtual/run.sh (sourced):
# the real MCP peers they start, each in its own process group and all ended
# on exit; ports waited for; Node 22, npm packages and a Python venv
# installed once into a cache.
#
# The caller sets before sourcing: LOGS (log directory), CACHE (install
# cache), PEERS_WHO (the prefix of messages), NODE22_VERSION.

PGIDS=()
peers_cleanup() {
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
trap peers_cleanup EXIT
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
  echo "$PEERS_WHO: $1 did not start listening on port $3; its log:" >&2
  tail -n 40 "$LOGS/$1.log" >&2 || true
  exit 1
}

npm_install() { # DIR SPEC (one or more name@version, space-separated)
  local dir=$1 spec=$2
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$spec" ]; then return 0; fi
  echo "== installing $spec"
  rm -rf "$dir"
  mkdir -p "$dir"
  printf '{"name":"peers-cache","private":true}\n' >"$dir/package.json"
  # shellcheck disable=SC2086  # spec is a word list
  if ! (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact $spec) \
    >"$LOGS/npm-$(basename "$dir").log" 2>&1; then
    cat "$LOGS/npm-$(basename "$dir").log" >&2
    exit 1
  fi
  echo "$spec" >"$dir/.installed"
}

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

use_node22() { # sets NODE and puts it first on PATH (npm from Debian when missing)
  if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "== installing nodejs and npm (Debian)"
      apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
    else
      echo "$PEERS_WHO: needs npm" >&2
      exit 1
    fi
  fi
  if command -v node >/dev/null 2>&1 && [ "$(node_major node)" -ge 22 ]; then
    NODE=$(command -v node)
  else
    local arch
    case $(uname -m) in
      x86_64) arch=x64 ;;
      aarch64 | arm64) arch=arm64 ;;
      *) echo "$PEERS_WHO: no Node 22 package for $(uname -m)" >&2; exit 1 ;;
    esac
    npm_install "$CACHE/node22" "node-linux-$arch@$NODE22_VERSION"
    NODE=$CACHE/node22/node_modules/node-linux-$arch/bin/node
  fi
  [ "$(node_major "$NODE")" -ge 22 ] || { echo "$PEERS_WHO: $NODE is not Node >= 22" >&2; exit 1; }
  export PATH="$(dirname "$NODE"):$PATH"
}

python_venv() { # DIR SPEC [PYTHON]: a venv of PYTHON (default python3) with SPEC (pip) installed, once
  local dir=$1 spec=$2 python=${3:-python3}
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$spec" ]; then return 0; fi
  echo "== installing $spec"
  rm -rf "$dir"
  "$python" -m venv "$dir" >"$LOGS/venv.log" 2>&1 || { cat "$LOGS/venv.log" >&2; exit 1; }
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$spec" \
    >"$LOGS/pip.log" 2>&1 || { cat "$LOGS/pip.log" >&2; exit 1; }
  echo "$spec" >"$dir/.installed"
}

free_ports() { # N: N free TCP ports on 127.0.0.1, space-separated (needs NODE)
  "$NODE" -e '
  const net = require("net"); const socks = []; const n = Number(process.argv[1]);
  (async () => {
    for (let i = 0; i < n; i++) socks.push(await new Promise((ok) => {
      const s = net.createServer(); s.listen(0, "127.0.0.1", () => ok(s)); }));
    console.log(socks.map((s) => s.address().port).join(" "));
    socks.forEach((s) => s.close());
  })();' "$1"
}

# The firewall these scripts run: everything allowed (they check the proxy,
# not the policy), one role, rate limits and step caps out of the way.
firewall_config() { # WORK FW_PORT ADMIN_PORT NAME UPSTREAM... ; writes WORK/firewall.toml, WORK/policies/NAME.toml
  local work=$1 fw_port=$2 admin_port=$3 name=$4 u
  shift 4
  mkdir -p "$work/policies"
  {
    printf '# Everything allowed: this run checks the proxy, not the policy.\n'
    printf '[gates]\nread = "allow"\nwrite = "allow"\ndestructive = "allow"\n\n'
    printf '[server_requests]\nsampling = true\nelicitation = true\nroots = true\n'
    for u in "$@"; do
      printf '\n[[tools]]\nupstream = "%s"\nmatch = ["*"]\nrisk = "read"\n' "$u"
    done
    printf '\n[[agents]]\nname = "%s"\nprojects = ["%s"]\n' "$name" "$name"
    printf 'risks = ["read", "write", "destructive"]\nallow = [{}]\nmax_steps = 100000\n'
  } >"$work/policies/$name.toml"
  cat >"$work/firewall.toml" <<CONF
[server]
listen = "127.0.0.1:$fw_port"
plaintext = true

[admin]
listen = "127.0.0.1:$admin_port"

[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://$name.test"]

[[auth.keys]]
alg = "HS256"
secret = "$name-secret-that-is-long-enough!!"

[policy]
dir = "$work/policies"

# Bursts of calls under one run: rate limits and step caps are policy, not
# protocol, so they are out of the way here.
[limits]
per_ip_per_s = 100000
per_tenant_per_s = 100000
per_run_per_s = 100000
per_run_tool_per_s = 100000
default_max_steps = 100000
CONF
}

upstream_config() { # WORK NAME PORT PROJECT ; appends an [[upstream]] at http://127.0.0.1:PORT/mcp
  printf '\n[[upstream]]\nname = "%s"\nurl = "http://127.0.0.1:%s/mcp"\nprojects = ["%s"]\n' \
    "$2" "$3" "$4" >>"$1/firewall.toml"
}
