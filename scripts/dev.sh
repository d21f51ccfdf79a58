#!/usr/bin/env bash
# The dev command: runs all of Ferry locally: private Redis and Postgres (demo data loaded), the
# sidecars (two, behind nginx), and the edge Worker in the real Workers runtime (`wrangler dev`,
# workerd). Prints what to curl; Ctrl-C stops everything it started.
# State (data dirs, logs, the dev secret) lives in .run/ (git-ignored); a second run reuses it.
#
# Ports (override by env): FERRY_DEV_REDIS_PORT=6390 FERRY_DEV_PG_PORT=5440
# FERRY_DEV_REPLICA_PORT=5441 (a streaming replica of it, replaying each commit 1 s late)
# FERRY_DEV_POOLER_PORT=5442 (a transaction-mode PgBouncer in front of it, which Ferry refuses)
# FERRY_DEV_CLUSTER_PORT=6391 (a Redis Cluster on it and the next five ports: 3 masters, 3
# replicas) FERRY_DEV_CLUSTER_SIDECAR_PORT=8795 (a sidecar on that cluster)
# FERRY_DEV_SIDECAR_PORT=8787 (nginx, in front of the sidecars on 8790, 8791, ...: set
# FERRY_DEV_SIDECARS=1 for one) FERRY_DEV_EDGE_PORT=8788 FERRY_DEV_JS_PORT=8789 (the plain JS
# Worker of examples/js-worker); FERRY_DEV_PROFILE=release builds an
# optimized sidecar (for measuring; the default debug build compiles faster).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

REDIS_PORT=${FERRY_DEV_REDIS_PORT:-6390}
DOOR_REDIS_PORT=${FERRY_DEV_DOOR_REDIS_PORT:-6389}
PG_PORT=${FERRY_DEV_PG_PORT:-5440}
REPLICA_PORT=${FERRY_DEV_REPLICA_PORT:-5441}
POOLER_PORT=${FERRY_DEV_POOLER_PORT:-5442}
CLUSTER_PORT=${FERRY_DEV_CLUSTER_PORT:-6391}
CLUSTER_SIDECAR_PORT=${FERRY_DEV_CLUSTER_SIDECAR_PORT:-8795}
SIDECAR_PORT=${FERRY_DEV_SIDECAR_PORT:-8787}
SIDECARS=${FERRY_DEV_SIDECARS:-2}
FIRST_SIDECAR_PORT=${FERRY_DEV_FIRST_SIDECAR_PORT:-8790}
case "$SIDECARS" in [1-9]) ;; *) die "FERRY_DEV_SIDECARS must be 1 to 9" ;; esac
EDGE_PORT=${FERRY_DEV_EDGE_PORT:-8788}
JS_PORT=${FERRY_DEV_JS_PORT:-8789}
PROFILE=${FERRY_DEV_PROFILE:-debug}
case "$PROFILE" in debug) PROFILE_FLAG=() ;; release) PROFILE_FLAG=(--release) ;; *) die "FERRY_DEV_PROFILE must be debug or release" ;; esac
RUN=$FERRY_ROOT/.run
mkdir -p "$RUN"
PIDS=()

cleanup() {
  trap - INT TERM EXIT
  echo; echo "stopping..."
  # wrangler stops its workerd children on SIGINT; the others on SIGTERM.
  [ -n "${WRANGLER_PID:-}" ] && kill -INT "$WRANGLER_PID" 2>/dev/null || true
  [ -n "${JS_PID:-}" ] && kill -INT "$JS_PID" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  [ -f "$RUN/pgbouncer.pid" ] && kill -TERM "$(cat "$RUN/pgbouncer.pid")" 2>/dev/null || true
  [ -f "$RUN/pg-replica/postmaster.pid" ] && as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg-replica" -m fast -w stop >/dev/null 2>&1 || true
  [ -f "$RUN/pg/postmaster.pid" ] && as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg" -m fast -w stop >/dev/null 2>&1 || true
  wait 2>/dev/null || true
  echo "stopped."
}
trap cleanup INT TERM EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() { # wait_for WHAT CMD...
  local what=$1; shift
  for _ in $(seq 1 120); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "$what did not come up; logs are in $RUN"
}
# Postgres will not run as root: run its programs as the postgres user then.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

step "1/6 packages, tools and builds (the first run installs and compiles for a few minutes)"
ensure_services
command -v openssl >/dev/null || apt_install openssl
command -v curl >/dev/null || apt_install curl
ensure_wasm_toolchain
ensure_edge_tools
ensure_clients
ensure_balancer
cargo build -q -p ferry-sidecar "${PROFILE_FLAG[@]}"
bash scripts/build-edge.sh
[ -f "$RUN/secret" ] || openssl rand -hex 32 > "$RUN/secret"
[ -f "$RUN/api-key" ] || openssl rand -hex 24 > "$RUN/api-key"
[ -f "$RUN/upstash-token" ] || openssl rand -hex 32 > "$RUN/upstash-token"
[ -f "$RUN/neon-token" ] || openssl rand -hex 32 > "$RUN/neon-token"
[ -f "$RUN/jwt-secret" ] || openssl rand -hex 32 > "$RUN/jwt-secret"
SECRET=$(cat "$RUN/secret")
# wrangler dev reads the Worker's secrets from .dev.vars (git-ignored): the edge-sidecar secret,
# the API key that writes and the cache routes need (anonymous callers may only read), and the
# key end users' JWTs are signed with (the per-user routes, /me/...).
printf 'FERRY_SECRET=%s\nFERRY_API_KEY=%s\nFERRY_JWT_SECRET=%s\n' "$SECRET" "$(cat "$RUN/api-key")" \
  "$(cat "$RUN/jwt-secret")" > .dev.vars
# Demo sign-ins: HS256 JWTs for alice and bob, valid for a day, as an auth provider would issue.
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
demo_jwt() { # demo_jwt SUB
  local h p
  h=$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)
  p=$(printf '{"sub":"%s","role":"authenticated","exp":%d}' "$1" $(( $(date +%s) + 86400 )) | b64url)
  printf '%s.%s.%s' "$h" "$p" \
    "$(printf '%s.%s' "$h" "$p" | openssl dgst -sha256 -hmac "$(cat "$RUN/jwt-secret")" -binary | b64url)"
}
demo_jwt alice > "$RUN/alice.jwt"
demo_jwt bob > "$RUN/bob.jwt"

step "2/6 Redis on 127.0.0.1:$REDIS_PORT, and a Redis Cluster on 127.0.0.1:$CLUSTER_PORT-$((CLUSTER_PORT + 5))"
port_free "$REDIS_PORT" || die "port $REDIS_PORT is taken (set FERRY_DEV_REDIS_PORT)"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$RUN" --logfile "$RUN/redis.log" &
PIDS+=($!)
wait_for "redis" redis-cli -p "$REDIS_PORT" ping
# The Upstash door's own Redis: what its tokens do there never reaches the cache's.
port_free "$DOOR_REDIS_PORT" || die "port $DOOR_REDIS_PORT is taken (set FERRY_DEV_DOOR_REDIS_PORT)"
redis-server --port "$DOOR_REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --client-output-buffer-limit "normal 64mb 32mb 10" --maxmemory 256mb \
  --dir "$RUN" --logfile "$RUN/redis-door.log" &
PIDS+=($!)
wait_for "the Upstash door's redis" redis-cli -p "$DOOR_REDIS_PORT" ping
# A Redis Cluster (3 masters with a replica each), made afresh each run (nothing is persisted).
CLUSTER_NODES=()
for i in 0 1 2 3 4 5; do
  port=$((CLUSTER_PORT + i))
  port_free "$port" || die "port $port is taken (set FERRY_DEV_CLUSTER_PORT)"
  rm -rf "$RUN/redis-cluster/$port"; mkdir -p "$RUN/redis-cluster/$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000 \
    --dir "$RUN/redis-cluster/$port" --logfile "$RUN/redis-cluster/$port/redis.log" &
  PIDS+=($!)
  wait_for "redis cluster node $port" redis-cli -p "$port" ping
  CLUSTER_NODES+=("127.0.0.1:$port")
done
redis-cli --cluster create "${CLUSTER_NODES[@]}" --cluster-replicas 1 --cluster-yes > "$RUN/redis-cluster/create.log"
wait_for "the Redis Cluster" sh -c "redis-cli -p $CLUSTER_PORT cluster info | grep -q cluster_state:ok"

step "3/6 Postgres on 127.0.0.1:$PG_PORT with the demo schema (scripts/demo.sql)"
port_free "$PG_PORT" || die "port $PG_PORT is taken (set FERRY_DEV_PG_PORT)"
if [ ! -f "$RUN/pg/PG_VERSION" ]; then
  mkdir -p "$RUN/pg"; [ "$(id -u)" = 0 ] && chown postgres: "$RUN" "$RUN/pg"
  as_pg "$(pg_bindir)/initdb" -D "$RUN/pg" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
fi
[ "$(id -u)" = 0 ] && chown postgres: "$RUN"
as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg" -l "$RUN/postgres.log" -w \
  -o "-p $PG_PORT -k $RUN -c listen_addresses=127.0.0.1 -c wal_level=logical" start >/dev/null
PGOPTIONS="-c client_min_messages=warning" psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -f scripts/demo.sql
# A hot standby streaming from it (pg_basebackup -R), holding each commit back 1 s
# (recovery_min_apply_delay) so that read-your-writes has something to show.
port_free "$REPLICA_PORT" || die "port $REPLICA_PORT is taken (set FERRY_DEV_REPLICA_PORT)"
if [ ! -f "$RUN/pg-replica/PG_VERSION" ]; then
  as_pg "$(pg_bindir)/pg_basebackup" -D "$RUN/pg-replica" -h 127.0.0.1 -p "$PG_PORT" -U postgres \
    -R -X stream --checkpoint=fast
fi
as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg-replica" -l "$RUN/postgres-replica.log" -w \
  -o "-p $REPLICA_PORT -k $RUN -c listen_addresses=127.0.0.1 -c recovery_min_apply_delay=1s" \
  start >/dev/null
# A transaction-mode PgBouncer in front of it, as behind a hosted plan's "pooled" URL, passing
# the `options` startup parameter over as its own error message advises: Ferry refuses it.
port_free "$POOLER_PORT" || die "port $POOLER_PORT is taken (set FERRY_DEV_POOLER_PORT)"
printf '"ferry_app" ""\n' > "$RUN/pgbouncer-users.txt"
cat > "$RUN/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $POOLER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $RUN/pgbouncer-users.txt
pool_mode = transaction
ignore_startup_parameters = extra_float_digits,options
logfile = $RUN/pgbouncer.log
pidfile = $RUN/pgbouncer.pid
INI
[ "$(id -u)" = 0 ] && chown postgres: "$RUN"/pgbouncer*
as_pg /usr/sbin/pgbouncer -d -q "$RUN/pgbouncer.ini"

step "4/6 $SIDECARS sidecars on 127.0.0.1:$FIRST_SIDECAR_PORT.. behind nginx on 127.0.0.1:$SIDECAR_PORT (config: deploy/ferry.toml)"
# As the least-privilege role ferry_app (scripts/demo.sql), Ferry's books kept by ferry_owner, the
# Neon token as ferry_neon; the change stream as ferry_changes
# (REPLICATION, SELECT on items), so writes from psql reach the cache too (one sidecar leads the
# stream, the others take over if it goes). Raw SQL is on here, and only here, so the examples
# printed below can send their own SELECTs; deploy/ferry.toml keeps it off. Every sidecar shares
# Redis and Postgres: replays, invalidations, single flights and rate limits hold across them.
port_free "$SIDECAR_PORT" || die "port $SIDECAR_PORT is taken (set FERRY_DEV_SIDECAR_PORT)"
UPSTREAMS=""
for i in $(seq 0 $((SIDECARS - 1))); do
  port=$((FIRST_SIDECAR_PORT + i))
  port_free "$port" || die "port $port is taken (set FERRY_DEV_FIRST_SIDECAR_PORT)"
  port_free "$((9187 + i))" || die "admin port $((9187 + i)) is taken"
  FERRY_CONFIG=$FERRY_ROOT/deploy/ferry.toml \
  FERRY_LISTEN=127.0.0.1:$port \
  FERRY_SERVER_ADMIN_LISTEN=127.0.0.1:$((9187 + i)) \
  FERRY_REDIS_URL=redis://127.0.0.1:$REDIS_PORT \
  FERRY_DATABASE_URL=postgres://ferry_app@127.0.0.1:$PG_PORT/postgres \
  FERRY_POSTGRES_OWNER_URL=postgres://ferry_owner@127.0.0.1:$PG_PORT/postgres \
  FERRY_AUTH_ALLOW_RAW_SQL=true \
  FERRY_CHANGES_ENABLED=true \
  FERRY_UPSTASH_ENABLED=true \
  FERRY_UPSTASH_REDIS_URL=redis://127.0.0.1:$DOOR_REDIS_PORT \
  FERRY_UPSTASH_TOKEN=$(cat "$RUN/upstash-token") \
  FERRY_UPSTASH_TOKEN_PREFIX= \
  FERRY_NEON_ENABLED=true \
  FERRY_NEON_TOKEN=$(cat "$RUN/neon-token") \
  FERRY_NEON_POSTGRES_URL=postgres://ferry_neon@127.0.0.1:$PG_PORT/postgres \
  FERRY_CHANGES_URL=postgres://ferry_changes@127.0.0.1:$PG_PORT/postgres \
  FERRY_REPLICAS_URLS=postgres://ferry_app@127.0.0.1:$REPLICA_PORT/postgres \
  FERRY_REPLICAS_MAX_LAG_MS=3000 \
  FERRY_SECRET=$SECRET \
  FERRY_LOG=${FERRY_LOG:-info} \
    "$CARGO_TARGET_DIR/$PROFILE/ferry-sidecar" > "$RUN/sidecar-$i.log" 2>&1 &
  PIDS+=($!)
  echo $! > "$RUN/sidecar-$i.pid"
  wait_for "sidecar $i" curl -sf "http://127.0.0.1:$port/readyz"
  UPSTREAMS="$UPSTREAMS    server 127.0.0.1:$port max_fails=1 fail_timeout=2s;
"
done
# The balancer (deploy/nginx/ferry-balancer.conf: round robin; a sidecar that refuses
# connections is skipped; a request in flight when one dies is answered 502, never resent).
mkdir -p "$RUN/nginx"
UPSTREAMS=$UPSTREAMS awk -v dir="$RUN/nginx" -v listen="127.0.0.1:$SIDECAR_PORT" '
  /@UPSTREAMS@/ { printf "%s", ENVIRON["UPSTREAMS"]; next }
  { gsub(/@DIR@/, dir); gsub(/@LISTEN@/, listen); print }' deploy/nginx/ferry-balancer.conf \
  > "$RUN/nginx/nginx.conf"
nginx -p "$RUN/nginx" -c "$RUN/nginx/nginx.conf" -e "$RUN/nginx/error.log" &
PIDS+=($!)
wait_for "nginx" curl -sf "http://127.0.0.1:$SIDECAR_PORT/readyz"
# One more sidecar, on the Redis Cluster (its seed nodes comma-separated).
port_free "$CLUSTER_SIDECAR_PORT" || die "port $CLUSTER_SIDECAR_PORT is taken (set FERRY_DEV_CLUSTER_SIDECAR_PORT)"
FERRY_CONFIG=$FERRY_ROOT/deploy/ferry.toml \
FERRY_LISTEN=127.0.0.1:$CLUSTER_SIDECAR_PORT \
FERRY_SERVER_ADMIN_LISTEN=127.0.0.1:9195 \
FERRY_REDIS_URL=$(printf 'redis://%s,' "${CLUSTER_NODES[@]}" | sed 's/,$//') \
FERRY_REDIS_CLUSTER=true \
FERRY_UPSTASH_ENABLED=true \
FERRY_UPSTASH_SHARE_CACHE_REDIS=true \
FERRY_UPSTASH_TOKEN=$(cat "$RUN/upstash-token") \
FERRY_DATABASE_URL=postgres://ferry_app@127.0.0.1:$PG_PORT/postgres \
FERRY_POSTGRES_OWNER_URL=postgres://ferry_owner@127.0.0.1:$PG_PORT/postgres \
FERRY_AUTH_ALLOW_RAW_SQL=true \
FERRY_SECRET=$SECRET \
FERRY_LOG=${FERRY_LOG:-info} \
  "$CARGO_TARGET_DIR/$PROFILE/ferry-sidecar" > "$RUN/sidecar-cluster.log" 2>&1 &
PIDS+=($!)
wait_for "the sidecar on the Redis Cluster" curl -sf "http://127.0.0.1:$CLUSTER_SIDECAR_PORT/readyz"

step "5/6 edge Worker in workerd (wrangler dev) on 127.0.0.1:$EDGE_PORT"
port_free "$EDGE_PORT" || die "port $EDGE_PORT is taken (set FERRY_DEV_EDGE_PORT)"
bash scripts/wrangler.sh dev --local --ip 127.0.0.1 --port "$EDGE_PORT" \
  --var "FERRY_SIDECAR_URL:http://127.0.0.1:$SIDECAR_PORT" --show-interactive-dev-session=false \
  > "$RUN/wrangler.log" 2>&1 &
WRANGLER_PID=$!
wait_for "wrangler dev" curl -sf "http://127.0.0.1:$EDGE_PORT/health"

step "6/6 a plain JS Worker (examples/js-worker: @neondatabase/serverless, @upstash/redis) on 127.0.0.1:$JS_PORT"
port_free "$JS_PORT" || die "port $JS_PORT is taken (set FERRY_DEV_JS_PORT)"
# Its npm imports resolve in the pinned protocol clients (ensure_clients).
ln -sfn "$CLIENTS_DIR/node_modules" examples/js-worker/node_modules
DATABASE_URL="postgresql://app:$(cat "$RUN/neon-token")@ferry.invalid/app"
bash scripts/wrangler.sh dev --config examples/js-worker/wrangler.toml --local --ip 127.0.0.1 \
  --port "$JS_PORT" \
  --var "FERRY_SQL_ENDPOINT:http://127.0.0.1:$SIDECAR_PORT/sql" --var "DATABASE_URL:$DATABASE_URL" \
  --var "UPSTASH_REDIS_REST_URL:http://127.0.0.1:$SIDECAR_PORT" \
  --var "UPSTASH_REDIS_REST_TOKEN:$(cat "$RUN/upstash-token")" \
  --show-interactive-dev-session=false > "$RUN/js-worker.log" 2>&1 &
JS_PID=$!
wait_for "the JS Worker" curl -sf "http://127.0.0.1:$JS_PORT/item?id=1"

cat <<MSG

Ferry is running (logs in .run/). Through the edge (the real Workers runtime):

  curl -s http://127.0.0.1:$EDGE_PORT/health
  curl -s http://127.0.0.1:$EDGE_PORT/items/1            # a miss, then run it again: a hit
  curl -s 'http://127.0.0.1:$EDGE_PORT/items?ids=1,2,3'  # many in one call
  curl -s -X PUT http://127.0.0.1:$EDGE_PORT/items/1 -d '{"name":"lamp","price":"12.50"}'
                                                         # 401: anonymous callers only read
  export KEY="authorization: Bearer \$(cat .run/api-key)"   # the edge's API key (FERRY_API_KEY)
  curl -s -X PUT -H "\$KEY" http://127.0.0.1:$EDGE_PORT/items/1 -d '{"name":"lamp","price":"12.50"}'
  curl -s http://127.0.0.1:$EDGE_PORT/items/1            # fresh after the write
  curl -s -X PUT -H "\$KEY" http://127.0.0.1:$EDGE_PORT/items -d '{"items":[{"id":2,"name":"desk","price":80},{"id":3,"name":"chair","price":"40.00"}]}'
                                                         # both in one transaction, or neither
  curl -s -X POST -H "\$KEY" http://127.0.0.1:$EDGE_PORT/items/2/reprice -d '{"percent":10}'
                                                         # read, compute in the Worker, write: one interactive transaction
  curl -s 'http://127.0.0.1:$EDGE_PORT/page?ids=1,2,3,4,5,6,7,8,9,10'   # ten reads at once: "sidecar_calls":1
  curl -s -X PUT -H "\$KEY" http://127.0.0.1:$EDGE_PORT/cache/greeting -d '{"value":"hello","ttl_s":60}'
  curl -s -H "\$KEY" http://127.0.0.1:$EDGE_PORT/cache/greeting

Per-user data: the edge verifies each user's JWT and the sidecar runs their statements as them,
so Postgres's row-level security decides what they see, and their cache entries are theirs alone:

  export ALICE="authorization: Bearer \$(cat .run/alice.jwt)" BOB="authorization: Bearer \$(cat .run/bob.jwt)"
  curl -s -H "\$ALICE" http://127.0.0.1:$EDGE_PORT/me/notes   # alice's two notes (run it twice: a hit)
  curl -s -H "\$BOB" http://127.0.0.1:$EDGE_PORT/me/notes     # bob's one note, never alice's
  curl -s -X POST -H "\$ALICE" http://127.0.0.1:$EDGE_PORT/me/notes -d '{"body":"written at the edge"}'
  curl -s -H "\$ALICE" http://127.0.0.1:$EDGE_PORT/me/notes   # fresh: three notes
  curl -s http://127.0.0.1:$EDGE_PORT/me/notes                # 401: no token
  seq 100 | xargs -P 20 -I{} curl -s -o /dev/null -w '%{http_code}\n' -H "\$BOB" http://127.0.0.1:$EDGE_PORT/me/notes | sort | uniq -c
                                                         # some 429s: bob is past his burst (identity.rate_per_s)

A write that bypasses Ferry (psql) reaches the edge fresh: the sidecar reads Postgres's change
stream and drops the entries that depend on the row, within changes.max_lag_ms (1 s) at most:

  curl -s http://127.0.0.1:$EDGE_PORT/items/2            # run it twice: a hit
  psql -h 127.0.0.1 -p $PG_PORT -U postgres -c "UPDATE items SET name = 'changed in psql' WHERE id = 2"
  curl -s http://127.0.0.1:$EDGE_PORT/items/2            # the new name, read from Postgres
  curl -s http://127.0.0.1:$SIDECAR_PORT/readyz | grep -o '"changes":{[^}]*}'   # caught_up, leader

A transaction-mode PgBouncer in front of that Postgres (127.0.0.1:$POOLER_PORT), as a hosted plan's "pooled"
URL: Ferry pools sessions itself, and refuses one whose sessions it would share with others:

  FERRY_SECRET=\$(cat .run/secret) FERRY_DATABASE_URL=postgres://ferry_app@127.0.0.1:$POOLER_PORT/postgres $CARGO_TARGET_DIR/$PROFILE/ferry-sidecar --config deploy/ferry.toml --check-config
                                                         # names what it found, and exits 2 (the sidecar itself will not start)

Read-your-writes with a streaming replica (127.0.0.1:$REPLICA_PORT, replaying each commit 1 s late).
A write answers its position; a read that carries it (after) is served by the replica once it has
replayed that far, else by the primary. The edge carries it to the next request in a cookie:

  curl -s -c .run/cookies -X PUT -H "\$KEY" http://127.0.0.1:$EDGE_PORT/items/4 -d '{"name":"chair","price":"40.00"}'
                                                         # "position", and a ferry_position cookie
  curl -s -b .run/cookies http://127.0.0.1:$EDGE_PORT/items/4   # the chair, read after its position
  export FERRY_SECRET=\$(cat .run/secret) FERRY_URL=http://127.0.0.1:$SIDECAR_PORT
  P=\$(scripts/ferry-curl.sh POST /v1/execute '{"sql":"UPDATE items SET name = \$1 WHERE id = 3","params":["desk"]}' | grep -o '[0-9A-F]*/[0-9A-F]*'); echo \$P
  scripts/ferry-curl.sh POST /v1/query '{"sql":"SELECT name FROM items WHERE id = 3","after":"'\$P'"}'   # desk (the primary)
  psql -h 127.0.0.1 -p $REPLICA_PORT -U postgres -Atc "SELECT name FROM items WHERE id = 3"   # the replica: still the old name
  sleep 2; scripts/ferry-curl.sh POST /v1/query '{"sql":"SELECT name FROM items WHERE id = 3","after":"'\$P'"}'   # desk (the replica)
  curl -s http://127.0.0.1:9187/metrics http://127.0.0.1:9188/metrics | grep -E '^ferry_replica_(in_use|lag_seconds|reads_total)'

The sidecar directly (signed requests):

  export FERRY_SECRET=\$(cat .run/secret) FERRY_URL=http://127.0.0.1:$SIDECAR_PORT
  scripts/ferry-curl.sh POST /v1/query '{"sql":"SELECT id, name FROM items WHERE id = \$1","params":[1],"cache":{"ttl_s":60,"key":"item:1"}}'
  scripts/ferry-curl.sh POST /v1/query '{"query":"item","params":[2],"cache":{"mode":"no-cache"}}'
  psql -h 127.0.0.1 -p $PG_PORT -U postgres -Atc "SELECT state, query FROM pg_stat_activity WHERE application_name = 'ferry-sidecar'"
                                                         # [queries.item] has skip_reset: its session ran no DISCARD ALL after it,
                                                         # and keeps it prepared (its next run: Bind/Execute only)
  scripts/ferry-curl.sh POST /v1/execute '{"sql":"BEGIN"}'      # 400: sessions are never left open
  scripts/ferry-curl.sh POST /v1/query '{"sql":"DELETE FROM items"}' # 400: reads cannot write
  scripts/ferry-curl.sh POST /v1/outcome '{"nonce":"0123456789abcdef0123456789abcdef"}'
                                                         # did the write signed with that nonce commit? (final: now it never can)
  A="x-ferry-affinity: demo"   # an interactive transaction lives on one sidecar: nginx routes on this header
  T=\$(scripts/ferry-curl.sh POST /v1/transaction/begin '{}' -H "\$A" | grep -o '[0-9a-f]\{32\}'); echo \$T
  scripts/ferry-curl.sh POST /v1/transaction/query '{"id":"'\$T'","sql":"UPDATE items SET price = price + 1 WHERE id = 7"}' -H "\$A"
  scripts/ferry-curl.sh POST /v1/transaction/query '{"id":"'\$T'","sql":"SELECT 1 / 0"}' -H "\$A"   # 400: Postgres aborts the transaction
  scripts/ferry-curl.sh POST /v1/transaction/commit '{"id":"'\$T'"}' -H "\$A"   # 409 transaction_aborted: nothing committed, never a 200
  curl -s http://127.0.0.1:$SIDECAR_PORT/readyz    # from a background snapshot, never the pools

$SIDECARS sidecars behind nginx (127.0.0.1:$SIDECAR_PORT; each answer names its sidecar in x-ferry-upstream):

  for i in 1 2 3 4; do curl -s -o /dev/null -D - http://127.0.0.1:$SIDECAR_PORT/readyz | grep -i x-ferry-upstream; done
  for i in 1 2 3 4; do curl -s http://127.0.0.1:$EDGE_PORT/items/5 | grep -o '"cache":"[a-z]*"'; done
                                                         # one miss, then hits, whichever sidecar answers
  kill \$(cat .run/sidecar-0.pid); curl -s http://127.0.0.1:$EDGE_PORT/items/6   # one sidecar gone: still served

A sidecar on a Redis Cluster (127.0.0.1:$CLUSTER_PORT-$((CLUSTER_PORT + 5)): 3 masters, a replica each) on 127.0.0.1:$CLUSTER_SIDECAR_PORT.
Entries spread over the masters by slot; a batch's lookups go out as one pipeline per master:

  export FERRY_SECRET=\$(cat .run/secret) FERRY_URL=http://127.0.0.1:$CLUSTER_SIDECAR_PORT
  B='{"reads":[{"sql":"SELECT name FROM items WHERE id = \$1","params":[1],"cache":{"ttl_s":300,"key":"item:1"}},{"sql":"SELECT name FROM items WHERE id = \$1","params":[2],"cache":{"ttl_s":300,"key":"item:2"}},{"sql":"SELECT name FROM items WHERE id = \$1","params":[3],"cache":{"ttl_s":300,"key":"item:3"}}]}'
  scripts/ferry-curl.sh POST /v1/batch "\$B" | grep -o '"cache":"[a-z]*"'   # misses, then run it again: hits
  for p in $CLUSTER_PORT $((CLUSTER_PORT + 1)) $((CLUSTER_PORT + 2)); do redis-cli -p \$p --scan --pattern 'ferry:*q:*'; done
  scripts/ferry-curl.sh POST /v1/execute '{"sql":"UPDATE items SET name = \$1 WHERE id = 2","params":["stool"],"invalidate":{"keys":["item:2"]}}'
                                                         # "invalidation":"done" once a replica holds it (WAIT)
  redis-cli -p $CLUSTER_PORT shutdown nosave             # a master dies: reads go to Postgres meanwhile
  scripts/ferry-curl.sh POST /v1/batch "\$B" | grep -o '"cache":"[a-z]*"'   # bypass while its replica takes over
  sleep 5; for i in 1 2; do scripts/ferry-curl.sh POST /v1/batch "\$B" | grep -o '"cache":"[a-z]*"'; sleep 0.5; done
                                                         # hits again (item:2 once a miss: it was invalidated)
  redis-cli -p $((CLUSTER_PORT + 1)) cluster nodes | grep master   # its replica took over
  curl -s http://127.0.0.1:$CLUSTER_SIDECAR_PORT/pipeline -H "authorization: Bearer \$(cat .run/upstash-token)" \
    -d '[["SET","a","1"],["SET","b","2"],["GET","a"],["MGET","a","b"],["MGET","{t}:a","{t}:b"]]'
                                                         # Upstash REST on the cluster: split by slot; an MGET across slots: CROSSSLOT

Existing @upstash/redis (or upstash-redis) code, unchanged, pointed at the sidecar:

  export UPSTASH_REDIS_REST_URL=http://127.0.0.1:$SIDECAR_PORT UPSTASH_REDIS_REST_TOKEN=\$(cat .run/upstash-token)
  curl -s \$UPSTASH_REDIS_REST_URL -H "authorization: Bearer \$UPSTASH_REDIS_REST_TOKEN" -d '["SET","hello","world"]'
  curl -s \$UPSTASH_REDIS_REST_URL/pipeline -H "authorization: Bearer \$UPSTASH_REDIS_REST_TOKEN" -d '[["GET","hello"],["INCR","visits"]]'
  curl -s \$UPSTASH_REDIS_REST_URL/get/hello -H "authorization: Bearer \$UPSTASH_REDIS_REST_TOKEN"   # a command in the path
  curl -s \$UPSTASH_REDIS_REST_URL -H "authorization: Bearer \$UPSTASH_REDIS_REST_TOKEN" -d '["CONFIG","GET","*"]'   # refused
                                       # the token owns the door's own Redis (port $DOOR_REDIS_PORT): scripts,
                                       # SCAN, FLUSHDB and @upstash/ratelimit work unchanged

Existing @neondatabase/serverless (or Drizzle neon-http) code, pointed at the sidecar: the
connection string's password is the token, its host is never contacted, and one line of code
sets the endpoint (neonConfig.fetchEndpoint = 'http://127.0.0.1:$SIDECAR_PORT/sql'):

  export DATABASE_URL=postgresql://app:\$(cat .run/neon-token)@ferry.invalid/app
  export FERRY_SQL_ENDPOINT=http://127.0.0.1:$SIDECAR_PORT/sql    # set neonConfig.fetchEndpoint to this
  curl -s \$FERRY_SQL_ENDPOINT -H "Neon-Connection-String: \$DATABASE_URL" -d '{"query":"SELECT id, name FROM items WHERE id = \$1","params":["1"]}'
  curl -s \$FERRY_SQL_ENDPOINT -H "Neon-Connection-String: \$DATABASE_URL" -d '{"queries":[{"query":"UPDATE items SET price = price + 1 WHERE id = 1"},{"query":"SELECT price FROM items WHERE id = 1"}]}'
  curl -si \$FERRY_SQL_ENDPOINT -H "Neon-Connection-String: \$DATABASE_URL?ferry_cache_ttl=60&ferry_cache_tables=items" -d '{"query":"SELECT name FROM items WHERE id = 2"}' | grep -i ferry-cache
                                                         # cached (run it twice: hit), kept fresh by the change stream

A plain JavaScript Worker (examples/js-worker) using both clients unchanged, in workerd:

  curl -s 'http://127.0.0.1:$JS_PORT/both?id=3'          # a row via @neondatabase/serverless, a counter via @upstash/redis
  curl -s 'http://127.0.0.1:$JS_PORT/cached?id=2'

Ctrl-C stops everything started here.
MSG
wait "${PIDS[@]}" "$WRANGLER_PID" "$JS_PID"
