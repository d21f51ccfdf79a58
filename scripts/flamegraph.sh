#!/usr/bin/env bash
# Flame graph of the sidecar under the bench's throughput scenario (perf from Debian's packages,
# inferno from crates.io; both installed when missing). Samples the sidecar process alone, so the
# load generator's own work is not in the picture.
#
#   scripts/flamegraph.sh OUT.svg                    the sidecar built from this checkout
#   scripts/flamegraph.sh OUT.svg path/to/sidecar    another build (e.g. an older commit's)
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"
out=${1:?usage: scripts/flamegraph.sh OUT.svg [SIDECAR_BIN]}
bin=${2:-$CARGO_TARGET_DIR/release/ferry-sidecar}

step "tools (perf, inferno) and release builds"
ensure_services
ensure_profiling_tools
command -v webdis >/dev/null || apt_install webdis
command -v redis-benchmark >/dev/null || apt_install redis-tools
cargo build -q --release -p ferry-bench
[ -n "${2:-}" ] || cargo build -q --release -p ferry-sidecar
bin=$(realpath "$bin")

step "throughput scenario under perf ($bin)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FERRY_SIDECAR_BIN=$bin FERRY_PG_BIN=$(pg_bindir) \
  "$CARGO_TARGET_DIR/release/ferry-bench" --out "$work" throughput > "$work/bench.log" 2>&1 &
bench=$!
# The bench starts its main sidecar first: the oldest process running this binary.
pid=""
for _ in $(seq 100); do
  pid=$(pgrep -o -f -x "$bin" || true)
  [ -n "$pid" ] && break
  sleep 0.1
done
[ -n "$pid" ] || die "the bench did not start $bin"
# DWARF call graphs: release builds keep no frame pointers. 199 Hz keeps the data small.
perf record -q -F 199 --call-graph dwarf,16384 -p "$pid" -o "$work/perf.data" &
perf_pid=$!
wait "$bench" || { tail -20 "$work/bench.log"; die "the bench failed"; }
kill -INT "$perf_pid" 2>/dev/null || true
wait "$perf_pid" 2>/dev/null || true

step "folding and drawing"
perf script -i "$work/perf.data" 2>/dev/null \
  | "$FERRY_TOOLS/bin/inferno-collapse-perf" > "$work/folded"
"$FERRY_TOOLS/bin/inferno-flamegraph" --title "ferry-sidecar, bench throughput scenario" \
  < "$work/folded" > "$out"
grep -E '^\| (cache GET|query|floor)' "$work/bench.log" || true
echo "wrote $out"
