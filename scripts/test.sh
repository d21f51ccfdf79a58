#!/usr/bin/env bash
# The test command: installs what is missing, then runs format and lint checks, builds the edge
# to wasm, runs every test (they start their own private Redis, Postgres, sidecar and
# `wrangler dev`), checks that the Worker bundle deploys (`wrangler deploy --dry-run`), and
# smoke-runs the benchmarks (--quick: that they complete and write their files, not timing).
#
#   scripts/test.sh                          everything
#   FERRY_WASM_FALLBACK=1 scripts/test.sh    force the Debian rustc-web path for wasm
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

# A build that runs out of disk fails deep in the linker (SIGBUS): say so up front instead.
free_mb=$(df -Pm "$(dirname "$CARGO_TARGET_DIR")" | awk 'NR==2 {print $4}')
echo "disk: $free_mb MB free beside $CARGO_TARGET_DIR"
[ -d "$CARGO_TARGET_DIR/debug" ] || [ "$free_mb" -ge 8000 ] ||
  die "only $free_mb MB free: a first build of every test needs about 8 GB"

step "1/9 packages and tools (redis-server, postgresql, nginx, wasm toolchain, worker-build, wrangler, protocol clients)"
ensure_services
ensure_wasm_toolchain
ensure_edge_tools
ensure_clients
ensure_balancer
echo "redis $(redis-server --version | awk '{print $3}'); $("$(pg_bindir)/postgres" --version); wasm via $WASM_MODE"

step "2/9 cargo fmt --check, and no import cycles in the sidecar"
cargo fmt --all -- --check
python3 scripts/check-imports.py

step "3/9 cargo clippy -D warnings (native, and the edge for wasm32)"
cargo clippy --workspace --all-targets -q -- -D warnings
if [ "$WASM_MODE" = rustup ]; then
  cargo clippy -p ferry-edge -p ferry-edge-demo --target wasm32-unknown-unknown -q -- -D warnings
fi

step "4/9 wasm builds: ferry-shared, the README's example Worker, and the edge Worker (worker-build)"
wasm_cargo build -q -p ferry-shared --target wasm32-unknown-unknown
wasm_cargo build -q -p ferry-example-worker --target wasm32-unknown-unknown
bash scripts/build-edge.sh

step "5/9 cargo test (real Redis, Postgres and workerd, private instances)"
FERRY_PG_BIN=$(pg_bindir) cargo test --workspace

step "6/9 wrangler deploy --dry-run (the bundle deploys)"
for env in "" staging production; do
  out=$(mktemp -d)
  echo "--- environment: ${env:-top level (dev)}"
  bash scripts/wrangler.sh deploy --dry-run ${env:+--env "$env"} --outdir "$out" 2>&1 | grep -E "FERRY_SIDECAR_URL|dry-run"
  [ -s "$out/index.js" ] || die "wrangler deploy --dry-run ${env:+--env $env} wrote no bundle"
  rm -rf "$out"
done

step "7/9 benchmark smoke run (scripts/bench.sh --quick: it completes and writes its files)"
out=$(mktemp -d)
bash scripts/bench.sh --quick --out "$out" > "$out/bench.log" 2>&1 || { tail -40 "$out/bench.log"; die "the benchmark smoke run failed"; }
for f in latest-quick.md latest-quick.json latency-quick.svg; do
  [ -s "$out/$f" ] || die "the benchmark did not write $f"
done
grep -A12 '^## targets' "$out/latest-quick.md" || true
rm -rf "$out"

step "8/9 fuzz smoke run (scripts/fuzz.sh 10: request decoding and signature verification, 10 s each)"
bash scripts/fuzz.sh 10

step "9/9 deploy: the systemd unit verifies, the install script stages a working config"
if command -v systemd-analyze >/dev/null; then
  unit=$(mktemp -d)
  sed "s|/usr/local/bin/ferry-sidecar|$CARGO_TARGET_DIR/release/ferry-sidecar|" \
    deploy/ferry-sidecar.service > "$unit/ferry-sidecar.service"
  # verify exits 0 even on unknown keys: any output is a failure.
  verdict=$(systemd-analyze verify "$unit/ferry-sidecar.service" 2>&1 || true)
  [ -z "$verdict" ] || die "systemd-analyze verify: $verdict"
  echo "systemd-analyze verify: ok"
  rm -rf "$unit"
else
  echo "systemd-analyze is not on this machine: unit not verified"
fi
stage=$(mktemp -d)
DESTDIR="$stage" bash deploy/install.sh "$CARGO_TARGET_DIR/release/ferry-sidecar"
( set -a; source "$stage/etc/ferry/ferry.env"; set +a
  "$stage/usr/local/bin/ferry-sidecar" --config "$stage/etc/ferry/ferry.toml" --check-config )
rm -rf "$stage"

step "all checks passed"
