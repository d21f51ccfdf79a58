#!/usr/bin/env bash
# Fuzzes ferry-shared's request decoding and signature verification with libFuzzer (cargo-fuzz).
#
#   scripts/fuzz.sh                 both targets, 60 s each
#   scripts/fuzz.sh 600             both targets, 600 s each
#   scripts/fuzz.sh 30 verify_signature
# Crashes land in shared/fuzz/artifacts/<target>/ with the input that caused them.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"
SECONDS_EACH=${1:-60}
TARGETS=${2:-"decode_requests verify_signature"}

if ! "$FERRY_TOOLS/bin/cargo-fuzz" --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (once, about a minute)"
  cargo install -q --root "$FERRY_TOOLS" cargo-fuzz
fi
command -v g++ >/dev/null || apt_install g++   # libFuzzer is C++

cd shared/fuzz
for t in $TARGETS; do
  step "fuzzing $t for ${SECONDS_EACH}s"
  mkdir -p "corpus/$t"
  # cargo-fuzz wants nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain take them.
  # AddressSanitizer: the target is safe Rust, so coverage guidance is what matters.
  RUSTC_BOOTSTRAP=1 "$FERRY_TOOLS/bin/cargo-fuzz" run "$t" --sanitizer none \
    --target-dir "$CARGO_TARGET_DIR/fuzz" -- -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    2>&1 | grep -E "Done|stat::number_of_executed_runs|stat::new_units_added|crash|panicked|ERROR" || true
  if ls "artifacts/$t"/crash-* >/dev/null 2>&1; then
    die "$t found a crash: see shared/fuzz/artifacts/$t/"
  fi
done
step "fuzzing done: no crash"
