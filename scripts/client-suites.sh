#!/usr/bin/env bash
# Runs an Upstash client's own test suite against a running sidecar and sorts every failure by
# its reason (docs/client-suites.md has the figures and the reasons):
#
#   scripts/client-suites.sh redis-js PATH   # PATH: a checkout of github.com/upstash/redis-js
#   scripts/client-suites.sh redis-py PATH   # PATH: a checkout of github.com/upstash/redis-py
#
# Against UPSTASH_REDIS_REST_URL with UPSTASH_REDIS_REST_TOKEN (default: the dev command's
# sidecar and token, whose token owns the door's whole Redis). The suites FLUSHDB: use a token
# whose keys you can lose. The checkout is the only thing fetched by hand; the runners (bun
# from npm, pytest from PyPI) are installed here, pinned, into the tools directory.
set -euo pipefail
source "$(dirname "$0")/common.sh"

BUN_VERSION=1.3.6   # npm bun: what redis-js's package.json runs its tests with
SUITES=$FERRY_TOOLS/client-suites
suite=${1:-}; src=${2:-}
[ -n "$suite" ] && [ -d "$src" ] || die "usage: scripts/client-suites.sh redis-js|redis-py PATH-TO-CHECKOUT"
export UPSTASH_REDIS_REST_URL=${UPSTASH_REDIS_REST_URL:-http://127.0.0.1:${FERRY_DEV_SIDECAR_PORT:-8787}}
if [ -z "${UPSTASH_REDIS_REST_TOKEN:-}" ]; then
  [ -f "$FERRY_ROOT/.run/upstash-token" ] || die "set UPSTASH_REDIS_REST_TOKEN, or start scripts/dev.sh"
  UPSTASH_REDIS_REST_TOKEN=$(cat "$FERRY_ROOT/.run/upstash-token")
fi
export UPSTASH_REDIS_REST_TOKEN
curl -sf -o /dev/null "$UPSTASH_REDIS_REST_URL/" -H "authorization: Bearer $UPSTASH_REDIS_REST_TOKEN" \
  -d '["PING"]' || die "no Upstash door answers at $UPSTASH_REDIS_REST_URL with that token"
log=$(mktemp /tmp/ferry-suite-XXXXXX.log)

case "$suite" in
  redis-js)
    [ -d "$src/packages/redis/pkg" ] || die "$src is not a checkout of upstash/redis-js"
    command -v npm >/dev/null || apt_install nodejs npm
    if [ "$("$SUITES/js/node_modules/.bin/bun" --version 2>/dev/null)" != "$BUN_VERSION" ]; then
      mkdir -p "$SUITES/js"
      echo '{"name":"ferry-client-suites","private":true}' > "$SUITES/js/package.json"
      (cd "$SUITES/js" && npm install --no-audit --no-fund --loglevel=error "bun@$BUN_VERSION" "uncrypto@0.1.3")
    fi
    work=$(mktemp -d)
    cp -r "$src/packages/redis/." "$work/"
    echo '{"name":"redis-js-suite","private":true}' > "$work/package.json"
    ln -s "$SUITES/js/node_modules" "$work/node_modules"
    echo "running redis-js's suite ($(git -C "$src" log -1 --format=%h 2>/dev/null || echo '?')) against $UPSTASH_REDIS_REST_URL (about 2 minutes)"
    (cd "$work" && "$SUITES/js/node_modules/.bin/bun" test pkg --timeout 20000 >"$log" 2>&1) || true
    python3 "$FERRY_ROOT/scripts/suites/classify_js.py" "$log"
    rm -rf "$work"
    ;;
  redis-py)
    [ -d "$src/tests" ] && [ -d "$src/upstash_redis" ] || die "$src is not a checkout of upstash/redis-py"
    command -v pip3 >/dev/null || apt_install python3-pip
    if [ ! -d "$SUITES/py/pytest_asyncio" ]; then
      python3 -m pip install --quiet --disable-pip-version-check --target "$SUITES/py" \
        "httpx>=0.23,<1" "pytest>=8.3.4,<9" "pytest-asyncio>=0.24,<0.25" "python-dotenv>=1.0.1"
    fi
    echo "running redis-py's suite ($(git -C "$src" log -1 --format=%h 2>/dev/null || echo '?')) against $UPSTASH_REDIS_REST_URL (about a minute)"
    (cd "$src" && PYTHONPATH="$SUITES/py:$src" python3 -m pytest tests -q -p no:cacheprovider -rfE \
      --tb=line >"$log" 2>&1) || true
    python3 "$FERRY_ROOT/scripts/suites/classify_py.py" "$log"
    ;;
  *) die "unknown suite $suite (redis-js or redis-py)" ;;
esac
echo "full output: $log"
