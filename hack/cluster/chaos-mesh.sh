#!/usr/bin/env bash
# Chaos Mesh's controller-manager, built from its Go module, for the local e2e cluster.
#
#   hack/cluster/chaos-mesh.sh build        build (once) the binary and an image FROM scratch into
#                                   $CACHE/k8s/chaos-mesh-<version>/; prints the image tarball
#   hack/cluster/chaos-mesh.sh up           apply Chaos Mesh's CRDs and run the controller-manager in
#                                   namespace chaos-mesh (KUBECONFIG must point at the cluster;
#                                   on the local cluster, `hack/cluster/cluster.sh load-image TARBALL` first)
#   hack/cluster/chaos-mesh.sh down         remove what `up` created (the CRDs too)
#   hack/cluster/chaos-mesh.sh image        print the image name
#
# Only the controller runs: it carries out PodChaos pod-kill (and pod-failure) through the
# API server. chaos-daemon, which container-kill and every network/stress/IO fault need, is
# not built or run (its network faults need sch_netem, which this kernel lacks).
# The admission webhooks are not registered with the API server: the CRDs' OpenAPI schemas
# still validate objects server-side, and the controller's webhook server (it always starts
# one) gets a throwaway self-signed certificate.
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

LOG_TAG=chaos-mesh

moddir() {
  local info
  info=$(go mod download -json "$1") || die "go mod download $1 failed: $info"
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$info"
}

cmd_build() {
  command -v go >/dev/null || die "go is required"
  mkdir -p "$CACHE/k8s"
  exec 9>"$CACHE/k8s/.chaos-mesh.lock"
  flock 9
  if [ -f "$DIR/.done" ]; then
    log "present ($DIR)"
    echo "$DIR/chaos-controller-manager.tar"
    return
  fi
  local t0 mod src out
  t0=$(now)
  mod=$(moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
  [ -d "$mod/cmd/chaos-controller-manager" ] || die "no cmd/chaos-controller-manager in $mod"
  out=$DIR.tmp
  rm -rf "$out"
  # /tmp: the only writable place a FROM-scratch image would otherwise lack.
  mkdir -p "$out/rootfs/tmp"
  chmod 1777 "$out/rootfs/tmp"
  # The module cache is read-only and go.mod needs one edit: build from a copy.
  src=$out/src
  cp -r "$mod" "$src"
  chmod -R u+w "$src"
  (cd "$src" && go mod edit -dropreplace github.com/chaos-mesh/chaos-mesh/api \
      -require "github.com/chaos-mesh/chaos-mesh/api@$CHAOS_MESH_API_VERSION")
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
  render chaos-mesh.yaml NS="$NS" IMAGE="$IMAGE"
}

cmd_up() {
  local mod t0 tmp
  t0=$(now)
  mod=$(moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
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
  log "controller-manager running in namespace $NS ($(elapsed "$t0") s)"
}

cmd_down() {
  local mod
  kc delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
  kc delete clusterrolebinding,clusterrole torbed-chaos-controller-manager --ignore-not-found >/dev/null
  mod=$(moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
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
