#!/usr/bin/env bash
# Install the benchmark's peers (issue 23) under the bench cache, never into settled's environment:
#   <cache>/peers/venv  Python venv with dbos, restate-sdk and hypercorn (pinned);
#   <cache>/peers/node  npm folder with @restatedev/restate-server and @restatedev/restate (pinned), installed with
#                       --ignore-scripts (skips a telemetry post-install).
# The cache is $SETTLED_BENCH_CACHE_DIR, else ~/.cache/settled/bench. Idempotent: a completed install is kept (a
# marker file records the pins; changing a pin reinstalls). Prints every version at the end.
set -euo pipefail

DBOS_VERSION=3.4.0
RESTATE_SDK_VERSION=1.3.0
HYPERCORN_VERSION=0.18.0
RESTATE_VERSION=1.7.12

cache=${SETTLED_BENCH_CACHE_DIR:-$HOME/.cache/settled/bench}
peers="$cache/peers"
venv="$peers/venv"
node_dir="$peers/node"
python=${PYTHON:-python3}
pins="dbos==$DBOS_VERSION restate-sdk==$RESTATE_SDK_VERSION hypercorn==$HYPERCORN_VERSION"
npm_pins="@restatedev/restate-server@$RESTATE_VERSION @restatedev/restate@$RESTATE_VERSION"
mkdir -p "$peers"

command -v "$python" >/dev/null || { echo "install.sh: $python not found (set PYTHON)" >&2; exit 1; }
command -v npm >/dev/null || { echo "install.sh: npm not found (install Node.js 18+ with npm)" >&2; exit 1; }
command -v node >/dev/null || { echo "install.sh: node not found (install Node.js 18+)" >&2; exit 1; }

if [ "$(cat "$venv/.complete" 2>/dev/null || true)" != "$pins" ]; then
  echo "[peers] Python venv $venv: $pins"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $pins
  echo "$pins" >"$venv/.complete"
fi

if [ "$(cat "$node_dir/.complete" 2>/dev/null || true)" != "$npm_pins" ]; then
  echo "[peers] npm folder $node_dir: $npm_pins (--ignore-scripts)"
  rm -rf "$node_dir"
  mkdir -p "$node_dir"
  (cd "$node_dir" && echo '{"name": "settled-bench-peers", "private": true}' >package.json \
    && npm install --no-audit --no-fund --ignore-scripts --loglevel=error $npm_pins >/dev/null)
  echo "$npm_pins" >"$node_dir/.complete"
fi

arch=$(uname -m)
case "$arch" in x86_64) npm_arch=x64 ;; aarch64) npm_arch=arm64 ;; *) npm_arch=$arch ;; esac
server="$node_dir/node_modules/@restatedev/restate-server-linux-$npm_arch/bin/restate-server"
[ -x "$server" ] || { echo "install.sh: restate-server binary missing at $server" >&2; exit 1; }

echo "[peers] installed under $peers:"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
for name in ("dbos", "restate-sdk", "hypercorn"):
    print(f"  {name} {version(name)}")
PY
echo "  restate-server $("$server" --version 2>&1 | head -1)"
echo "  node $(node --version)"
