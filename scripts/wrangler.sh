#!/usr/bin/env bash
# Runs the project's pinned wrangler (node 22, no telemetry, no prompts, and no fetch of the
# request.cf object from workers.cloudflare.com: `wrangler dev` stays on this machine), installing
# it first if needed: scripts/wrangler.sh dev | deploy [--dry-run --outdir DIR] | secret put ...
set -euo pipefail
source "$(dirname "$0")/common.sh"
[ -x "$NPM_BIN/wrangler" ] || ensure_edge_tools
CI=${CI:-true} WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false XDG_CONFIG_HOME="$FERRY_TOOLS/xdg" \
  PATH="$NPM_BIN:$PATH" exec "$NPM_BIN/wrangler" "$@"
