#!/usr/bin/env bash
# Installs the Ferry sidecar on this VM (Debian/Ubuntu, systemd):
#   - the binary: the one given, or built here with `cargo build --release`
#   - a system user `ferry`, /etc/ferry/ferry.toml (from deploy/ferry.toml, kept if present),
#     /etc/ferry/ferry.env (mode 0600; a fresh FERRY_SECRET is generated if absent)
#   - the hardened unit, then enables and starts it and checks /readyz.
#
#   sudo deploy/install.sh [path/to/ferry-sidecar]
#   DESTDIR=/tmp/stage deploy/install.sh BIN   # stage the files only (no user, no systemctl)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${DESTDIR:-}
BIN=${1:-}

if [ -z "$BIN" ]; then
  cargo build --release -p ferry-sidecar
  BIN=${CARGO_TARGET_DIR:-target}/release/ferry-sidecar
fi
[ -x "$BIN" ] || { echo "no executable at $BIN" >&2; exit 1; }

if [ -z "$ROOT" ] && ! id ferry >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ferry
fi

install -D -m 0755 "$BIN" "$ROOT/usr/local/bin/ferry-sidecar"
install -d -m 0750 "$ROOT/etc/ferry"
if [ ! -f "$ROOT/etc/ferry/ferry.toml" ]; then
  install -m 0640 deploy/ferry.toml "$ROOT/etc/ferry/ferry.toml"
fi
if [ ! -f "$ROOT/etc/ferry/ferry.env" ]; then
  umask 077
  cat > "$ROOT/etc/ferry/ferry.env" <<ENV
# Secrets for the Ferry sidecar (read by systemd; never logged by Ferry).
FERRY_SECRET=$(openssl rand -hex 32)
# FERRY_LISTEN=0.0.0.0:8787
# FERRY_REDIS_URL=rediss://:password@redis.example.com:6380
# A least-privilege role (scripts/demo.sql shows one: ferry_app), never a superuser:
# --check-config warns when it is one. Remote URLs get verified TLS unless sslmode says otherwise.
# FERRY_DATABASE_URL=postgres://ferry_app:password@db.example.com:5432/app
# Ferry's own role, which keeps its books (scripts/demo.sql: ferry_owner, owning schema ferry);
# the sidecar refuses to start if the role above could touch them.
# FERRY_POSTGRES_OWNER_URL=postgres://ferry_owner:password@db.example.com:5432/app
ENV
  echo "wrote $ROOT/etc/ferry/ferry.env with a new FERRY_SECRET: give the same secret to the edge"
  echo "  (scripts/wrangler.sh secret put FERRY_SECRET) and set the Redis and Postgres URLs."
fi
install -D -m 0644 deploy/ferry-sidecar.service "$ROOT/etc/systemd/system/ferry-sidecar.service"

if [ -n "$ROOT" ]; then
  echo "staged under $ROOT (no user created, nothing started)"
  exit 0
fi
chown -R root:ferry /etc/ferry
# Checked as the service will run it: with ferry.env (its FERRY_SECRET and URLs) loaded, as
# systemd's EnvironmentFile loads it.
( set -a; . /etc/ferry/ferry.env; set +a
  "$ROOT/usr/local/bin/ferry-sidecar" --config /etc/ferry/ferry.toml --check-config ) \
  || { echo "fix /etc/ferry/ferry.toml or ferry.env, then run this again" >&2; exit 1; }
systemctl daemon-reload
systemctl enable --now ferry-sidecar
listen=$(grep -E '^FERRY_LISTEN=' /etc/ferry/ferry.env | cut -d= -f2 || true)
listen=${listen:-$(awk -F'"' '/^listen *=/{print $2; exit}' /etc/ferry/ferry.toml)}
for _ in $(seq 1 30); do
  if curl -sf "http://${listen/0.0.0.0/127.0.0.1}/readyz"; then echo; echo "ferry-sidecar is ready"; exit 0; fi
  sleep 1
done
echo "ferry-sidecar is not ready: journalctl -u ferry-sidecar" >&2
exit 1
