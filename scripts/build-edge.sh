#!/usr/bin/env bash
# Builds the demo Worker (edge/demo, on the ferry-edge library) into edge/demo/build/ (index.js
# + wasm) with worker-build. wrangler's [build]
# runs this before `wrangler dev` and `wrangler deploy`; nothing is rebuilt when nothing changed.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

out=edge/demo/build/index.js
if [ -f "$out" ] && [ -z "$(find edge/src edge/demo/src shared/src edge/Cargo.toml edge/demo/Cargo.toml shared/Cargo.toml Cargo.lock -newer "$out" -print -quit)" ]; then
  echo "edge build is up to date ($out)"
  exit 0
fi
ensure_wasm_toolchain
ensure_edge_tools
edge_build_env
cd edge/demo
worker-build --release
ls -l build/
