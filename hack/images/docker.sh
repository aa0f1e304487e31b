#!/usr/bin/env bash
# docker.sh - make a working Docker engine available (idempotent, quick when it already is).
#
# Usage:
#   hack/images/docker.sh            ensure a reachable daemon (install Debian's docker.io and start
#                             dockerd in the background when needed)
#   hack/images/docker.sh --client   the same, then print the path of a docker client that can run
#                             BuildKit builds against it (see "Clients" below)
#
# Environment:
#   DOCKER_HOST              another daemon: only checked, never started
#   TORBED_DOCKERD_LOG       dockerd's log (default /var/log/torbed-dockerd.log)
#   TORBED_DOCKERD_TIMEOUT   seconds to wait for a starting daemon (default 90)
#
# Clients: a machine may have a newer docker CLI in /usr/local/bin (28.x here) next to
# Debian's 20.10 client in /usr/bin. Both talk to the 20.10 daemon (API 1.41, negotiated),
# but the newer CLI does DOCKER_BUILDKIT=1 builds only through the buildx plugin, while the
# 20.10 client drives the daemon's built-in BuildKit itself. We never replace or shadow
# the existing client; we only pick one for builds.
#
# Exit codes: 0 daemon reachable; 1 it could not be installed, started or reached (the
# message says why and where the log is); 2 bad usage.
set -euo pipefail

SOCK=/var/run/docker.sock
LOG=${TORBED_DOCKERD_LOG:-/var/log/torbed-dockerd.log}
TIMEOUT=${TORBED_DOCKERD_TIMEOUT:-90}
LOCK=/run/lock/torbed-docker.lock

# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
LOG_TAG=docker

PRINT_CLIENT=0
case "${1:-}" in
  "") ;;
  --client) PRINT_CLIENT=1 ;;
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) printf 'unknown argument: %s\n' "$1" >&2; exit 2 ;;
esac

any_client() {
  command -v docker 2>/dev/null || { [ -x /usr/bin/docker ] && echo /usr/bin/docker; } || true
}

# A daemon that accepts connections but hangs must not hang us: bound every probe.
reachable() {
  local c
  c=$(any_client)
  [ -n "$c" ] && timeout 15 "$c" info >/dev/null 2>&1
}

# A client for `DOCKER_BUILDKIT=1 docker build`: one with a working buildx plugin, else
# Debian's 20.10 client (built-in BuildKit session).
build_client() {
  local c
  c=$(command -v docker 2>/dev/null || true)
  if [ -n "$c" ] && timeout 15 "$c" buildx version >/dev/null 2>&1; then echo "$c"; return; fi
  if [ -x /usr/bin/docker ] && /usr/bin/docker --version 2>/dev/null | grep -q 'version 20\.10'; then
    echo /usr/bin/docker; return
  fi
  [ -n "$c" ] || die "no docker client found"
  die "no docker client can do BuildKit builds: $c has no buildx plugin and /usr/bin/docker is not Debian's 20.10 client (apt-get install docker.io)"
}

finish() {
  if [ "$PRINT_CLIENT" -eq 1 ]; then build_client; fi
  exit 0
}

if reachable; then finish; fi

if [ -n "${DOCKER_HOST:-}" ] && [ "$DOCKER_HOST" != "unix://$SOCK" ]; then
  die "DOCKER_HOST=$DOCKER_HOST is not reachable (we only start a local daemon on $SOCK)"
fi
[ "$(id -u)" -eq 0 ] || die "no Docker daemon reachable on $SOCK; installing or starting one needs root"

# Two callers at once (make images + make test) must not start two daemons.
mkdir -p "$(dirname "$LOCK")"
exec 9>"$LOCK"
flock -w "$((TIMEOUT + 300))" 9 || die "timed out waiting for $LOCK"
if reachable; then finish; fi

if ! command -v dockerd >/dev/null 2>&1; then
  log "installing Debian's docker.io (daemon and 20.10 client in /usr/bin; /usr/local/bin/docker is left alone)"
  export DEBIAN_FRONTEND=noninteractive
  # Others may be running apt on this machine: wait for dpkg's lock instead of failing.
  apt=(apt-get -y -q -o DPkg::Lock::Timeout=600)
  if ! "${apt[@]}" install --no-install-recommends docker.io >&2; then
    "${apt[@]}" update >&2 || true
    "${apt[@]}" install --no-install-recommends docker.io >&2 || die "apt-get install docker.io failed"
  fi
fi

daemon_pid() {
  local pid
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = dockerd ]; then echo "$pid"; fi
}

pid=$(daemon_pid)
if [ -z "$pid" ]; then
  mkdir -p "$(dirname "$LOG")"
  log "starting dockerd (log: $LOG)"
  # setsid: the daemon outlives this script and the make that ran it, and a Ctrl-C in the
  # caller's terminal does not reach it.
  printf '\n--- %s hack/images/docker.sh starts dockerd\n' "$(date -u +%FT%TZ)" >>"$LOG"
  (cd / && exec setsid dockerd --host="unix://$SOCK" >>"$LOG" 2>&1 </dev/null) &
  pid=$!
else
  log "dockerd (pid $pid) is running but not answering yet; waiting"
fi

deadline=$((SECONDS + TIMEOUT))
while [ "$SECONDS" -lt "$deadline" ]; do
  if [ -S "$SOCK" ] && reachable; then
    log "daemon ready ($(timeout 15 "$(any_client)" version -f '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    finish
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -n 20 "$LOG" >&2 || true
    die "dockerd exited during start-up; see $LOG"
  fi
  sleep 0.5
done
tail -n 20 "$LOG" >&2 || true
die "dockerd (pid $pid) did not answer on $SOCK within ${TIMEOUT}s; see $LOG"
