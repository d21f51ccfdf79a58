#!/usr/bin/env bash
# Sends one signed request to a Ferry sidecar, for trying the API by hand (bash + openssl + curl).
#
#   FERRY_SECRET=... scripts/ferry-curl.sh POST /v1/query '{"sql": "SELECT 1 AS one"}'
#   FERRY_URL=http://127.0.0.1:8787 (default) ; extra curl arguments may follow the body.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: FERRY_SECRET=... $0 METHOD PATH [BODY] [curl args...]" >&2; exit 2; }
: "${FERRY_SECRET:?set FERRY_SECRET to the shared secret of the sidecar}"
method=$(echo "$1" | tr '[:lower:]' '[:upper:]'); path=$2; body=${3:-}; shift $(( $# >= 3 ? 3 : 2 ))
url=${FERRY_URL:-http://127.0.0.1:8787}
ts=$(date +%s)
nonce=$(openssl rand -hex 16)
digest=$(printf '%s' "$body" | openssl dgst -sha256 -r | cut -d' ' -f1)
sig=$(printf '%s\n%s\n%s\n%s\n%s' "$ts" "$nonce" "$method" "$path" "$digest" \
  | openssl dgst -sha256 -hmac "$FERRY_SECRET" -r | cut -d' ' -f1)
exec curl -sS -X "$method" "$url$path" \
  -H 'content-type: application/json' \
  -H "x-ferry-timestamp: $ts" -H "x-ferry-nonce: $nonce" -H "x-ferry-signature: v1=$sig" \
  ${body:+--data-binary "$body"} "$@"
