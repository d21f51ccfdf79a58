#!/usr/bin/env bash
# The benchmark command: installs what it needs (webdis, wrk, redis-tools, postgresql, openssl), builds
# the release sidecar and bench, and runs ferry-bench. Everything runs on private instances on
# 127.0.0.1; nothing touches the machine's own Redis or Postgres.
#
#   scripts/bench.sh                 all scenarios (a few minutes); results in bench/results/
#   scripts/bench.sh --quick         smoke run, under a minute
#   scripts/bench.sh keys            one scenario (redis, postgres, keys, connections, throughput, pinned,
#                                    one-client, replay, staleness, scale, blog)
#   scripts/bench.sh --out DIR ...   write the result files elsewhere
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

step "packages (webdis, wrk, redis-tools, postgresql) and release builds"
ensure_services
command -v webdis >/dev/null || apt_install webdis
command -v wrk >/dev/null || apt_install wrk
command -v redis-benchmark >/dev/null || apt_install redis-tools
command -v openssl >/dev/null || apt_install openssl   # the TLS baselines' throwaway CA
cargo build -q --release -p ferry-sidecar -p ferry-bench

step "ferry-bench $*"
FERRY_PG_BIN=$(pg_bindir) "$CARGO_TARGET_DIR/release/ferry-bench" "$@"
