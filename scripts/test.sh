#!/usr/bin/env bash
# The test command: installs what is missing, then runs format and lint checks, every test
# (the tests start their own private Redis and Postgres), and the wasm build of ferry-shared.
#
#   scripts/test.sh                  everything
#   FERRY_WASM_FALLBACK=1 scripts/test.sh   force the Debian rustc-web path for wasm
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

step "1/5 system packages (redis-server, postgresql, wasm toolchain)"
ensure_services
ensure_wasm_toolchain
echo "redis: $(redis-server --version | awk '{print $3}'), postgres: $("$(pg_bindir)/postgres" --version), wasm: $WASM_MODE"

step "2/5 cargo fmt --check"
cargo fmt --all -- --check

step "3/5 cargo clippy -D warnings"
cargo clippy --workspace --all-targets -q -- -D warnings

step "4/5 cargo test (real Redis and Postgres, private instances)"
FERRY_PG_BIN=$(pg_bindir) cargo test --workspace

step "5/5 ferry-shared builds for wasm32-unknown-unknown ($WASM_MODE)"
wasm_cargo build -q -p ferry-shared --target wasm32-unknown-unknown
ls -l "$CARGO_TARGET_DIR"/wasm32-unknown-unknown/debug/libferry_shared.rlib

step "all checks passed"
