#!/usr/bin/env bash
# registry.sh - a local OCI registry for torbed's images and chart (Debian's docker-registry).
#
# Usage:
#   hack/images/registry.sh up       install docker-registry if missing and serve on $ADDR (idempotent)
#   hack/images/registry.sh down     stop it (the stored images stay in $STATE/data)
#   hack/images/registry.sh status   print whether it answers, exit 0 if so
#   hack/images/registry.sh purge    stop it and delete everything stored
#
# It listens on loopback only and speaks plain HTTP: the Docker daemon and the local
# cluster's containerd (hack/cluster/cluster.sh) treat 127.0.0.1:5000 as an HTTP registry. Push with
# `make images-push` (multi-arch tags + the chart as an OCI artifact).
#
# Environment:
#   TORBED_REGISTRY_ADDR    host:port to listen on (default 127.0.0.1:5000)
#   TORBED_REGISTRY_STATE   config, data, pid and log (default /var/lib/torbed-registry)
#
# Exit codes: 0 ok; 1 could not install, start or reach it (the message says why); 2 usage.
set -euo pipefail

ADDR=${TORBED_REGISTRY_ADDR:-127.0.0.1:5000}
STATE=${TORBED_REGISTRY_STATE:-/var/lib/torbed-registry}
PID=$STATE/registry.pid
LOG=$STATE/registry.log

# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
LOG_TAG=registry

answers() { curl -fsS --max-time 3 "http://$ADDR/v2/" >/dev/null 2>&1; }

running() { [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null; }

binary() {
  local b
  for b in docker-registry /usr/bin/docker-registry; do
    command -v "$b" >/dev/null 2>&1 && { command -v "$b"; return; }
  done
  log "installing Debian's docker-registry"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-registry >/dev/null \
    || die "apt-get install docker-registry failed"
  # The package may have started its own service on :5000 (all interfaces); ours replaces it.
  pkill -f '^/usr/bin/docker-registry serve /etc/docker/registry/config.yml' 2>/dev/null || true
  command -v docker-registry || die "docker-registry not found after installing it"
}

up() {
  if running && answers; then log "already serving on $ADDR"; return; fi
  answers && die "something else answers on $ADDR (not ours: no live $PID); stop it or set TORBED_REGISTRY_ADDR"
  local bin
  bin=$(binary)
  mkdir -p "$STATE/data"
  cat >"$STATE/config.yml" <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/data
  delete:
    enabled: true
http:
  addr: $ADDR
CONF
  nohup "$bin" serve "$STATE/config.yml" >>"$LOG" 2>&1 &
  echo $! >"$PID"
  for _ in $(seq 1 40); do
    answers && { log "serving on http://$ADDR (data $STATE/data, log $LOG)"; return; }
    running || die "docker-registry exited; see $LOG: $(tail -3 "$LOG" 2>/dev/null)"
    sleep 0.25
  done
  die "docker-registry does not answer on $ADDR after 10 s; see $LOG"
}

down() {
  if running; then
    kill "$(cat "$PID")" 2>/dev/null || true
    for _ in $(seq 1 40); do running || break; sleep 0.25; done
    running && kill -9 "$(cat "$PID")" 2>/dev/null || true
    log "stopped"
  fi
  rm -f "$PID"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) if answers; then echo "serving on http://$ADDR"; else echo "not serving on $ADDR"; exit 1; fi ;;
  purge) down; rm -rf "$STATE"; log "removed $STATE" ;;
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" ;;
  *) printf 'usage: %s up|down|status|purge\n' "$0" >&2; exit 2 ;;
esac
