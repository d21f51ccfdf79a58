#!/usr/bin/env bash
# The test command: installs what is missing, then runs format and lint checks, builds the edge
# to wasm, runs every test (they start their own private Redis, Postgres, sidecar and
# `wrangler dev`), and checks that the Worker bundle deploys (`wrangler deploy --dry-run`).
#
#   scripts/test.sh                          everything
#   FERRY_WASM_FALLBACK=1 scripts/test.sh    force the Debian rustc-web path for wasm
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

step "1/6 packages and tools (redis-server, postgresql, wasm toolchain, worker-build, wrangler)"
ensure_services
ensure_wasm_toolchain
ensure_edge_tools
echo "redis $(redis-server --version | awk '{print $3}'); $("$(pg_bindir)/postgres" --version); wasm via $WASM_MODE"

step "2/6 cargo fmt --check"
cargo fmt --all -- --check

step "3/6 cargo clippy -D warnings (native, and the edge for wasm32)"
cargo clippy --workspace --all-targets -q -- -D warnings
if [ "$WASM_MODE" = rustup ]; then
  cargo clippy -p ferry-edge --target wasm32-unknown-unknown -q -- -D warnings
fi

step "4/6 wasm builds: ferry-shared, and the edge Worker (worker-build)"
wasm_cargo build -q -p ferry-shared --target wasm32-unknown-unknown
bash scripts/build-edge.sh

step "5/6 cargo test (real Redis, Postgres and workerd, private instances)"
FERRY_PG_BIN=$(pg_bindir) cargo test --workspace

step "6/6 wrangler deploy --dry-run (the bundle deploys)"
out=$(mktemp -d)
bash scripts/wrangler.sh deploy --dry-run --outdir "$out" 2>&1 | tail -5
ls -l "$out"
rm -rf "$out"

step "all checks passed"
