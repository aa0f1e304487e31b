#!/usr/bin/env bash
# Chaos Mesh for the local e2e cluster: its controller-manager and chaos-daemon, built from its
# Go module (CHAOS_MESH_VERSION, hack/versions.env).
#
#   hack/cluster/chaos-mesh.sh build        build (once) the controller-manager (an image FROM scratch
#                                   in $CACHE/k8s/chaos-mesh-<version>/, cached by version) and
#                                   chaos-daemon (hack/cluster/chaos-daemon/build.sh, cached
#                                   by content); prints the two image tarballs, one a line
#   hack/cluster/chaos-mesh.sh up           apply Chaos Mesh's CRDs and run both in namespace chaos-mesh
#                                   (KUBECONFIG must point at the cluster; on the local cluster,
#                                   `hack/cluster/cluster.sh load-image TARBALL...` first)
#   hack/cluster/chaos-mesh.sh down         remove what `up` created (the CRDs too)
#   hack/cluster/chaos-mesh.sh image        print the controller-manager's image name
#
# What runs: the controller (PodChaos pod-kill and pod-failure it carries out through the API
# server) and chaos-daemon on every amd64 node (a privileged DaemonSet with the host's PID
# namespace, the cluster containerd's socket and the host's /sys): it carries out what needs
# the node, of which torbed uses PodChaos container-kill (SIGKILL through containerd) and
# StressChaos CPU stressors (stress-ng in the target container's cgroup and PID namespace),
# both exercised by tests/e2e/test_faults_k8s.py. Its image lacks the helpers of the other
# kinds (hack/cluster/chaos-daemon/Dockerfile says which); NetworkChaos delay and loss need
# sch_netem, which this kernel lacks. The controller reaches chaos-daemon over plain gRPC
# (no mTLS: no certificates for it are made here).
# The admission webhooks are not registered with the API server: the CRDs' OpenAPI schemas
# still validate objects server-side, and the controller's webhook server (it always starts
# one) gets a throwaway self-signed certificate.
#
# Environment: CHAOS_DAEMON_RUNTIME_SOCKET_DIR  the directory of the node's containerd socket
#              (containerd.sock) that chaos-daemon mounts (default: the local cluster's,
#              /run/torbed-k8s/containerd)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/cluster/common.sh
. "$HERE/common.sh"

# CHAOS_MESH_VERSION and CHAOS_MESH_API_VERSION: hack/versions.env (via common.sh).
SHORT=${CHAOS_MESH_VERSION##*-}
# IMAGE_REV: bump when the image's layout (not the versions) changes.
IMAGE_REV=1
DIR=$CACHE/k8s/chaos-mesh-$SHORT-api-${CHAOS_MESH_API_VERSION##*-}-r$IMAGE_REV
IMAGE=localhost/torbed/chaos-controller-manager:$SHORT
NS=chaos-mesh
DAEMON_BUILD=$HERE/chaos-daemon/build.sh
SOCKET_DIR=${CHAOS_DAEMON_RUNTIME_SOCKET_DIR:-/run/torbed-k8s/containerd}

LOG_TAG=chaos-mesh

cmd_build() {
  build_controller
  "$DAEMON_BUILD" build
}

build_controller() {
  command -v go >/dev/null || die "go is required"
  mkdir -p "$CACHE/k8s"
  exec 9>"$CACHE/k8s/.chaos-mesh.lock"
  flock 9
  if [ -f "$DIR/.done" ]; then
    log "present ($DIR)"
    echo "$DIR/chaos-controller-manager.tar"
    return
  fi
  local t0 src out
  t0=$(now)
  out=$DIR.tmp
  rm -rf "$out"
  # /tmp: the only writable place a FROM-scratch image would otherwise lack.
  mkdir -p "$out/rootfs/tmp"
  chmod 1777 "$out/rootfs/tmp"
  # The module cache is read-only and go.mod needs one edit: build from a copy.
  src=$out/src
  chaos_mesh_src "$src"
  log "building chaos-controller-manager $CHAOS_MESH_VERSION (api $CHAOS_MESH_API_VERSION)"
  # Static (CGO off): the image is FROM scratch.
  if ! (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
          -ldflags "-s -w -X github.com/chaos-mesh/chaos-mesh/pkg/version.gitVersion=$CHAOS_MESH_VERSION" \
          -o "$out/rootfs/chaos-controller-manager" ./cmd/chaos-controller-manager) >"$out/build.log" 2>&1; then
    mkdir -p "$CACHE/k8s/logs"
    cp "$out/build.log" "$CACHE/k8s/logs/build-chaos-mesh.log"
    die "go build ./cmd/chaos-controller-manager failed; see $CACHE/k8s/logs/build-chaos-mesh.log: $(tail -5 "$out/build.log")"
  fi
  rm -rf "$src"
  "$HERE/mkimage.sh" "$out/chaos-controller-manager.tar" "$IMAGE" "$out/rootfs" /chaos-controller-manager
  rm -rf "$DIR"
  mv "$out" "$DIR"
  touch "$DIR/.done"
  log "built in $(elapsed "$t0") s: $(du -h "$DIR/rootfs/chaos-controller-manager" | cut -f1) binary, image $IMAGE"
  echo "$DIR/chaos-controller-manager.tar"
}

kc() {
  local k=${KUBECTL:-}
  [ -n "$k" ] || { if [ -x "$K8S_BIN/kubectl" ]; then k=$K8S_BIN/kubectl; else k=kubectl; fi; }
  "$k" "$@"
}

manifests() {
  render chaos-mesh.yaml NS="$NS" IMAGE="$IMAGE" DAEMON_IMAGE="$("$DAEMON_BUILD" image)" SOCKET_DIR="$SOCKET_DIR"
}

cmd_up() {
  local mod t0 tmp
  t0=$(now)
  mod=$(chaos_mesh_moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
  # Every controller watches its kind: all CRDs, not only PodChaos. Server-side apply: some
  # CRDs exceed the client-side last-applied annotation's size limit.
  kc apply --server-side --force-conflicts -f "$mod/helm/chaos-mesh/crds/" >/dev/null
  kc wait --for=condition=Established --timeout=60s -f "$mod/helm/chaos-mesh/crds/" >/dev/null
  manifests | kc apply -f - >/dev/null
  if ! kc -n "$NS" get secret chaos-mesh-webhook-certs >/dev/null 2>&1; then
    tmp=$(mktemp -d)
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=chaos-mesh-controller-manager.$NS.svc" \
      -keyout "$tmp/tls.key" -out "$tmp/tls.crt" >/dev/null 2>&1 || { rm -rf "$tmp"; die "openssl failed"; }
    kc -n "$NS" create secret tls chaos-mesh-webhook-certs --cert "$tmp/tls.crt" --key "$tmp/tls.key" >/dev/null
    rm -rf "$tmp"
  fi
  if ! kc -n "$NS" rollout status deploy/chaos-controller-manager --timeout=180s >&2; then
    kc -n "$NS" get pods -o wide >&2 || true
    kc -n "$NS" logs deploy/chaos-controller-manager --tail=40 >&2 || true
    die "the controller-manager did not become available"
  fi
  if ! kc -n "$NS" rollout status ds/chaos-daemon --timeout=180s >&2; then
    kc -n "$NS" get pods -o wide >&2 || true
    kc -n "$NS" describe pods -l app.kubernetes.io/component=chaos-daemon | tail -15 >&2 || true
    kc -n "$NS" logs ds/chaos-daemon --tail=40 >&2 || true
    die "chaos-daemon did not become ready (its node's containerd socket: $SOCKET_DIR/containerd.sock; CHAOS_DAEMON_RUNTIME_SOCKET_DIR names another directory)"
  fi
  log "controller-manager and chaos-daemon running in namespace $NS ($(elapsed "$t0") s)"
}

cmd_down() {
  local mod kinds
  # Chaos objects carry the controller's finalizer: delete any left while it still runs, or
  # deleting the CRDs would wait for it forever.
  kinds=$(kc get crd -o name | sed -n 's#^customresourcedefinition.apiextensions.k8s.io/\(.*\.chaos-mesh\.org\)$#\1#p' | paste -sd, -)
  [ -z "$kinds" ] || kc delete "$kinds" --all -A --ignore-not-found --wait=true --timeout=60s >/dev/null \
    || log "some Chaos Mesh objects were not deleted within 60 s"
  kc delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
  kc delete clusterrolebinding,clusterrole torbed-chaos-controller-manager --ignore-not-found >/dev/null
  mod=$(chaos_mesh_moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
  kc delete --ignore-not-found -f "$mod/helm/chaos-mesh/crds/" >/dev/null
  log "removed"
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  image) echo "$IMAGE" ;;
  manifests) manifests ;;
  *) echo "usage: $0 build|up|down|image|manifests" >&2; exit 2 ;;
esac
