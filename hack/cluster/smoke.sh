#!/usr/bin/env bash
# smoke.sh - check the running local cluster end to end: a client pod resolves a Service by
# name (short name via the pod's search list, and the FQDN) and fetches a page from a server
# pod through the Service's ClusterIP. Cleans up after itself. Exit 0 when all of it works.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/cluster/common.sh
. "$HERE/common.sh"

STATE=${TORBED_K8S_STATE:-/var/lib/torbed-k8s}
TIMEOUT=${TORBED_K8S_TIMEOUT:-180}
NS=torbed-smoke
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$STATE/kubeconfig")
kc() { "${KUBECTL[@]}" "$@"; }
LOG_TAG=smoke
# A failed check, not a broken script: says FAILED rather than lib.sh's ERROR.
die() { printf '[smoke] FAILED: %s\n' "$*" >&2; exit 1; }

[ -x "$K8S_BIN/kubectl" ] && [ -f "$STATE/kubeconfig" ] || die "no cluster (hack/cluster/cluster.sh up)"
t0=$(now)
cleanup() { [ -n "${TORBED_SMOKE_KEEP:-}" ] || kc delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT
# A namespace left by an interrupted run is still terminating: wait until it is gone.
kc delete namespace "$NS" --ignore-not-found --timeout="${TIMEOUT}s" >/dev/null

render smoke-server.yaml NS="$NS" TOOLBOX_IMAGE="$TOOLBOX_IMAGE" | kc apply -f - >/dev/null
kc -n "$NS" wait --for=condition=Ready pod/web --timeout="${TIMEOUT}s" >/dev/null \
  || die "server pod not ready; kubectl -n $NS describe pod web"
cluster_ip=$(kc -n "$NS" get service web -o 'jsonpath={.spec.clusterIP}')

render smoke-client.yaml NS="$NS" TOOLBOX_IMAGE="$TOOLBOX_IMAGE" | kc apply -f - >/dev/null
deadline=$(($(date +%s) + TIMEOUT))
while :; do
  phase=$(kc -n "$NS" get pod client -o 'jsonpath={.status.phase}' 2>/dev/null || true)
  case $phase in
    Succeeded) break ;;
    Failed) die "client pod failed: $(kc -n "$NS" logs client 2>&1 | tail -5)" ;;
  esac
  [ "$(date +%s)" -lt "$deadline" ] || die "client pod did not finish in ${TIMEOUT}s (phase ${phase:-none})"
  sleep 0.5
done
out=$(kc -n "$NS" logs client)
grep "^web $cluster_ip\$" <<<"$out" >/dev/null || die "web did not resolve to its ClusterIP $cluster_ip: $out"
grep '^netcheck web$' <<<"$out" >/dev/null || die "unexpected answer through the Service: $out"
printf '%s\n' "$out" | sed 's/^/[smoke]   /' >&2
log "pod -> Service name -> ClusterIP $cluster_ip -> pod works ($(elapsed "$t0") s)"
