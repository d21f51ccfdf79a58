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
  if [ -z "$_apt_updated" ]; then
    $SUDO apt-get update -q >/dev/null
    _apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
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
  [ -n "$(pg_bindir)" ] || apt_install postgresql
  command -v runuser >/dev/null || apt_install util-linux
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
