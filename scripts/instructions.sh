#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind: repeatable where requests/s on this
# shared 2-core machine are not (two runs of one build differ by under 0.1%; requests/s by 10-20%).
# For hot-path changes too small to see through the noise of the throughput scenario.
#
#   scripts/instructions.sh                      the sidecar built from this checkout
#   scripts/instructions.sh OLD_BIN [NEW_BIN]    side by side (e.g. a copy of an older build)
#
# Each sidecar serves `ferry-bench one-client` (a fixed mix: 505 each of signed cache GET,
# /v1/query hit, uncached read, miss and write, plus one fill) under callgrind. Printed: the
# instructions inside actix's HTTP dispatcher (every request's work, none of startup's) per
# request. Under valgrind SHA-256 runs in software (no SHA extensions), so hashing weighs more
# here than on the metal; compare builds with each other, not with requests/s.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"
command -v valgrind >/dev/null || apt_install valgrind
command -v webdis >/dev/null || apt_install webdis
cargo build -q --release -p ferry-bench
[ $# -gt 0 ] || cargo build -q --release -p ferry-sidecar
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=("$CARGO_TARGET_DIR/release/ferry-sidecar")
REQUESTS=2526

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in "${!bins[@]}"; do
  bin=$(realpath "${bins[$i]}")
  # The bench clears the sidecar's environment, so the wrapper names everything in full.
  printf '#!/bin/bash\nexec %s --tool=callgrind --callgrind-out-file=%s/cg-%s.%%p %s "$@"\n' \
    "$(command -v valgrind)" "$work" "$i" "$bin" > "$work/wrap-$i.sh"
  chmod +x "$work/wrap-$i.sh"
  step "one-client under callgrind: $bin"
  FERRY_SIDECAR_BIN="$work/wrap-$i.sh" FERRY_PG_BIN=$(pg_bindir) \
    "$CARGO_TARGET_DIR/release/ferry-bench" --out "$work/out-$i" one-client > "$work/bench-$i.log" 2>&1 \
    || { tail -20 "$work/bench-$i.log"; die "the bench failed"; }
  # The bench starts several sidecars; the one that served the scenario ran the most.
  main=$(ls -S "$work"/cg-"$i".* | sed -n 1p)
  callgrind_annotate --inclusive=yes "$main" > "$work/annotated-$i.txt" 2>/dev/null
  dispatcher=$(awk '/h1::dispatcher::Dispatcher<.*as core::future::future::Future>::poll/ {
    gsub(",", "", $1); print $1; exit }' "$work/annotated-$i.txt")
  [ -n "$dispatcher" ] || die "no dispatcher figure in $main (a build without symbols?)"
  echo "$bin: $((dispatcher / REQUESTS)) instructions per request ($dispatcher in all)"
done
