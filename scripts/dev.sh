#!/usr/bin/env bash
# Usage: scripts/dev.sh [--with replica,cluster,pooler,js-worker | --with all]
#
# The dev command: runs Ferry locally: private Redis and Postgres (demo data loaded), the
# sidecars (two, behind nginx), and the edge Worker in the real Workers runtime (`wrangler dev`,
# workerd). Prints what to try; Ctrl-C stops everything it started. The rest of the tour
# (docs/tour.md) is behind --with: replica (a streaming replica, read-your-writes), cluster (a
# Redis Cluster and a sidecar on it), pooler (a transaction-mode PgBouncer, refused), js-worker
# (a plain JavaScript Worker using @upstash/redis and @neondatabase/serverless); or all.
# State (data dirs, logs in .run/*.log, the dev secrets) lives in .run/ (git-ignored); a second
# run reuses it and reloads the demo data (rm -rf .run starts afresh).
#
# Ports, each overridable: FERRY_DEV_REDIS_PORT=6390 (the cache) FERRY_DEV_DOOR_REDIS_PORT=6389
# (the Upstash door's own) FERRY_DEV_PG_PORT=5440 FERRY_DEV_SIDECAR_PORT=8787 (nginx, in front
# of the sidecars on FERRY_DEV_FIRST_SIDECAR_PORT=8790, 8791...; FERRY_DEV_SIDECARS=1 for one;
# their metrics on FERRY_DEV_METRICS_PORT=9187, 9188...) FERRY_DEV_EDGE_PORT=8788; with --with:
# FERRY_DEV_REPLICA_PORT=5441 FERRY_DEV_POOLER_PORT=5442 FERRY_DEV_CLUSTER_PORT=6391 (and the
# next five) FERRY_DEV_CLUSTER_SIDECAR_PORT=8795 (metrics on FERRY_DEV_CLUSTER_METRICS_PORT=9195)
# FERRY_DEV_JS_PORT=8789.
# FERRY_DEV_PROFILE=release builds an optimized sidecar (for measuring).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$FERRY_ROOT"

# --with replica,cluster,pooler,js-worker (or all): the rest of the tour (docs/tour.md).
WITH=","
while [ $# -gt 0 ]; do
  case "$1" in
    --with) WITH=",${2:-},"; shift 2 || die "--with needs a list: replica,cluster,pooler,js-worker or all" ;;
    --with=*) WITH=",${1#--with=},"; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (scripts/dev.sh [--with replica,cluster,pooler,js-worker|all])" ;;
  esac
done
case "$WITH" in *,all,*) WITH=",replica,cluster,pooler,js-worker," ;; esac
for w in $(echo "$WITH" | tr ',' ' '); do
  case "$w" in replica|cluster|pooler|js-worker) ;; *) die "--with: unknown part $w (replica, cluster, pooler, js-worker, all)" ;; esac
done
with() { case "$WITH" in *,"$1",*) return 0 ;; *) return 1 ;; esac; }

REDIS_PORT=${FERRY_DEV_REDIS_PORT:-6390}
DOOR_REDIS_PORT=${FERRY_DEV_DOOR_REDIS_PORT:-6389}
PG_PORT=${FERRY_DEV_PG_PORT:-5440}
REPLICA_PORT=${FERRY_DEV_REPLICA_PORT:-5441}
POOLER_PORT=${FERRY_DEV_POOLER_PORT:-5442}
CLUSTER_PORT=${FERRY_DEV_CLUSTER_PORT:-6391}
CLUSTER_SIDECAR_PORT=${FERRY_DEV_CLUSTER_SIDECAR_PORT:-8795}
METRICS_PORT=${FERRY_DEV_METRICS_PORT:-9187}
CLUSTER_METRICS_PORT=${FERRY_DEV_CLUSTER_METRICS_PORT:-9195}
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

# What this run started, so that stopping it (or a failed start) never stops another run's.
STARTED_PG=""; STARTED_REPLICA=""; STARTED_BOUNCER=""; PORTS_CHECKED=""
cleanup() {
  trap - INT TERM EXIT
  # Stop everything even when stdout is gone (a `| tee` that Ctrl-C ended first): a write to
  # the dead pipe must fail, not kill the shell (SIGPIPE) before Postgres is stopped.
  trap '' PIPE
  set +e
  # A run stopped by a taken port started nothing: nothing to say.
  [ -z "$PORTS_CHECKED" ] && return
  { echo; echo "stopping..."; } 2>/dev/null
  # wrangler stops its workerd children on SIGINT; the others on SIGTERM.
  [ -n "${WRANGLER_PID:-}" ] && kill -INT "$WRANGLER_PID" 2>/dev/null || true
  [ -n "${JS_PID:-}" ] && kill -INT "$JS_PID" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  [ -n "$STARTED_BOUNCER" ] && [ -f "$RUN/pgbouncer.pid" ] && kill -TERM "$(cat "$RUN/pgbouncer.pid")" 2>/dev/null
  [ -n "$STARTED_REPLICA" ] && as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg-replica" -m fast -w stop >/dev/null 2>&1
  [ -n "$STARTED_PG" ] && as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg" -m fast -w stop >/dev/null 2>&1
  wait 2>/dev/null
  echo "stopped." 2>/dev/null
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

# Every port first: a second run (or another program) on one of them stops this one before it
# starts anything, and it never touches what the other run started.
for p in "$REDIS_PORT" "$DOOR_REDIS_PORT" "$PG_PORT" "$SIDECAR_PORT" "$EDGE_PORT" \
    $(seq "$FIRST_SIDECAR_PORT" $((FIRST_SIDECAR_PORT + SIDECARS - 1))) $(seq "$METRICS_PORT" $((METRICS_PORT + SIDECARS - 1))) \
    $(with replica && echo "$REPLICA_PORT") $(with pooler && echo "$POOLER_PORT") \
    $(with cluster && seq "$CLUSTER_PORT" $((CLUSTER_PORT + 5)) && echo "$CLUSTER_SIDECAR_PORT $CLUSTER_METRICS_PORT") \
    $(with js-worker && echo "$JS_PORT"); do
  port_free "$p" || die "port $p is taken: is another scripts/dev.sh running (stop it with Ctrl-C; a run whose Postgres outlived it: runuser -u postgres -- pg_ctl -D .run/pg stop), or set the FERRY_DEV_*_PORT variables (scripts/dev.sh --help)"
done
PORTS_CHECKED=1

step "packages, tools and builds (the first run installs and compiles for a few minutes)"
ensure_services
command -v openssl >/dev/null || apt_install openssl
command -v curl >/dev/null || apt_install curl
ensure_wasm_toolchain
ensure_edge_tools
with js-worker && ensure_clients
ensure_balancer
cargo build -q -p ferry-sidecar "${PROFILE_FLAG[@]}"
bash scripts/build-edge.sh > "$RUN/build-edge.log" 2>&1 || { cat "$RUN/build-edge.log"; die "the edge did not build"; }
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

step "Redis on 127.0.0.1:$REDIS_PORT (the cache) and $DOOR_REDIS_PORT (the Upstash door's own)"
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
# The dev token owns the door's whole database; its scripts (@upstash/ratelimit's) run as this
# ACL user: every key, one database, no reaching the server (deploy/ferry.toml).
redis-cli -p "$DOOR_REDIS_PORT" ACL SETUSER dev-scripts on ">$(cat "$RUN/upstash-token")" resetkeys '~*' \
  +@all -@dangerous -select -copy -move -memory -georadius -georadiusbymember -@pubsub >/dev/null
if with cluster; then
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
fi

step "Postgres on 127.0.0.1:$PG_PORT with the demo schema (scripts/demo.sql)"
port_free "$PG_PORT" || die "port $PG_PORT is taken (set FERRY_DEV_PG_PORT)"
if [ ! -f "$RUN/pg/PG_VERSION" ]; then
  mkdir -p "$RUN/pg"; [ "$(id -u)" = 0 ] && chown postgres: "$RUN" "$RUN/pg"
  as_pg "$(pg_bindir)/initdb" -D "$RUN/pg" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
fi
[ "$(id -u)" = 0 ] && chown postgres: "$RUN"
as_pg "$(pg_bindir)/pg_ctl" -D "$RUN/pg" -l "$RUN/postgres.log" -w \
  -o "-p $PG_PORT -k $RUN -c listen_addresses=127.0.0.1 -c wal_level=logical" start >/dev/null
STARTED_PG=1
PGOPTIONS="-c client_min_messages=warning" psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -f scripts/demo.sql
if with replica; then
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
  STARTED_REPLICA=1
fi
if with pooler; then
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
  STARTED_BOUNCER=1
fi

step "$SIDECARS sidecars on 127.0.0.1:$FIRST_SIDECAR_PORT.. behind nginx on 127.0.0.1:$SIDECAR_PORT (config: deploy/ferry.toml)"
# As the least-privilege role ferry_app (scripts/demo.sql), Ferry's books kept by ferry_owner, the
# Neon token as ferry_neon; the change stream as ferry_changes
# (REPLICATION, SELECT on items), so writes from psql reach the cache too (one sidecar leads the
# stream, the others take over if it goes). Raw SQL is on here, and only here, so the examples
# printed below can send their own SELECTs; deploy/ferry.toml keeps it off. Every sidecar shares
# Redis and Postgres: replays, invalidations, single flights and rate limits hold across them.
port_free "$SIDECAR_PORT" || die "port $SIDECAR_PORT is taken (set FERRY_DEV_SIDECAR_PORT)"
UPSTREAMS=""
REPLICA_ENV=()
with replica && REPLICA_ENV=("FERRY_REPLICAS_URLS=postgres://ferry_app@127.0.0.1:$REPLICA_PORT/postgres" \
  "FERRY_REPLICAS_MAX_LAG_MS=3000")
for i in $(seq 0 $((SIDECARS - 1))); do
  port=$((FIRST_SIDECAR_PORT + i))
  port_free "$port" || die "port $port is taken (set FERRY_DEV_FIRST_SIDECAR_PORT)"
  port_free "$((METRICS_PORT + i))" || die "admin port $((METRICS_PORT + i)) is taken"
  FERRY_CONFIG=$FERRY_ROOT/deploy/ferry.toml \
  FERRY_LISTEN=127.0.0.1:$port \
  FERRY_SERVER_ADMIN_LISTEN=127.0.0.1:$((METRICS_PORT + i)) \
  FERRY_REDIS_URL=redis://127.0.0.1:$REDIS_PORT \
  FERRY_DATABASE_URL=postgres://ferry_app@127.0.0.1:$PG_PORT/postgres \
  FERRY_POSTGRES_OWNER_URL=postgres://ferry_owner@127.0.0.1:$PG_PORT/postgres \
  FERRY_AUTH_ALLOW_RAW_SQL=true \
  FERRY_CHANGES_ENABLED=true \
  FERRY_CHANGES_TABLES=notes \
  FERRY_UPSTASH_ENABLED=true \
  FERRY_UPSTASH_REDIS_URL=redis://127.0.0.1:$DOOR_REDIS_PORT \
  FERRY_UPSTASH_TOKEN=$(cat "$RUN/upstash-token") \
  FERRY_UPSTASH_TOKEN_PREFIX= \
  FERRY_UPSTASH_TOKEN_SCRIPT_USER=dev-scripts \
  FERRY_UPSTASH_TOKEN_SCRIPT_PASSWORD=$(cat "$RUN/upstash-token") \
  FERRY_NEON_ENABLED=true \
  FERRY_NEON_TOKEN=$(cat "$RUN/neon-token") \
  FERRY_NEON_POSTGRES_URL=postgres://ferry_neon@127.0.0.1:$PG_PORT/postgres \
  FERRY_NEON_CACHE_TTL_S=60 \
  FERRY_CHANGES_URL=postgres://ferry_changes@127.0.0.1:$PG_PORT/postgres \
  FERRY_SECRET=$SECRET \
  FERRY_LOG=${FERRY_LOG:-info} \
    env "${REPLICA_ENV[@]}" "$CARGO_TARGET_DIR/$PROFILE/ferry-sidecar" > "$RUN/sidecar-$i.log" 2>&1 &
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
if with cluster; then
  # One more sidecar, on the Redis Cluster (its seed nodes comma-separated).
  port_free "$CLUSTER_SIDECAR_PORT" || die "port $CLUSTER_SIDECAR_PORT is taken (set FERRY_DEV_CLUSTER_SIDECAR_PORT)"
  FERRY_CONFIG=$FERRY_ROOT/deploy/ferry.toml \
  FERRY_LISTEN=127.0.0.1:$CLUSTER_SIDECAR_PORT \
  FERRY_SERVER_ADMIN_LISTEN=127.0.0.1:$CLUSTER_METRICS_PORT \
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
fi

step "edge Worker in workerd (wrangler dev) on 127.0.0.1:$EDGE_PORT"
port_free "$EDGE_PORT" || die "port $EDGE_PORT is taken (set FERRY_DEV_EDGE_PORT)"
bash scripts/wrangler.sh dev --local --ip 127.0.0.1 --port "$EDGE_PORT" \
  --var "FERRY_SIDECAR_URL:http://127.0.0.1:$SIDECAR_PORT" --show-interactive-dev-session=false \
  > "$RUN/wrangler.log" 2>&1 &
WRANGLER_PID=$!
wait_for "wrangler dev" curl -sf "http://127.0.0.1:$EDGE_PORT/health"

if with js-worker; then
  step "a plain JS Worker (examples/js-worker: @neondatabase/serverless, @upstash/redis) on 127.0.0.1:$JS_PORT"
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
fi

cat <<MSG

Ferry is running (logs in .run/). Through the edge Worker (workerd):
  curl -s http://127.0.0.1:$EDGE_PORT/items/1             # a miss; again: a hit
  export KEY="authorization: Bearer \$(cat .run/api-key)"
  curl -s -X PUT -H "\$KEY" http://127.0.0.1:$EDGE_PORT/items/1 -d '{"name":"lamp","price":"12.50"}'
  curl -s http://127.0.0.1:$EDGE_PORT/items/1             # fresh after the write
  curl -s -H "authorization: Bearer \$(cat .run/alice.jwt)" http://127.0.0.1:$EDGE_PORT/me/notes   # alice's notes only
A writer that bypasses Ferry is seen too (Postgres's change stream):
  psql -h 127.0.0.1 -p $PG_PORT -U postgres -c "UPDATE items SET name = 'from psql' WHERE id = 1"
  curl -s http://127.0.0.1:$EDGE_PORT/items/1             # "from psql"
Existing Upstash code, unchanged (the token owns the door's own Redis):
  export UPSTASH_REDIS_REST_URL=http://127.0.0.1:$SIDECAR_PORT UPSTASH_REDIS_REST_TOKEN=\$(cat .run/upstash-token)
  curl -s \$UPSTASH_REDIS_REST_URL/set/hello/world -H "authorization: Bearer \$UPSTASH_REDIS_REST_TOKEN"
Existing Neon code, unchanged (and neonConfig.fetchEndpoint = 'http://127.0.0.1:$SIDECAR_PORT/sql'),
cached with no code change on what Postgres says it reads (run it twice: a hit; after a psql UPDATE
of row 1, say SET name = 'again': fresh):
  export DATABASE_URL=postgresql://app:\$(cat .run/neon-token)@db.ferry.invalid/app
  curl -si http://127.0.0.1:$SIDECAR_PORT/sql -H "Neon-Connection-String: \$DATABASE_URL" -d '{"query":"SELECT name FROM items WHERE id = 1"}' | grep -iE 'ferry-cache|rows'
The sidecar itself (signed requests):
  export FERRY_SECRET=\$(cat .run/secret) FERRY_URL=http://127.0.0.1:$SIDECAR_PORT
  scripts/ferry-curl.sh POST /v1/query '{"query":"item","params":[2]}'
More: docs/tour.md (transactions, rate limits, sessions; --with replica,cluster,pooler,js-worker).
Ctrl-C stops everything started here.
MSG
wait "${PIDS[@]}" "$WRANGLER_PID" ${JS_PID:+"$JS_PID"}
