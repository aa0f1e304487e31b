#!/usr/bin/env bash
# Chaos Mesh's chaos-daemon image for the local e2e cluster, built from the pinned Go module
# (CHAOS_MESH_VERSION, hack/versions.env) and Debian packages; hack/cluster/chaos-mesh.sh
# build and up call this.
#
#   hack/cluster/chaos-daemon/build.sh build   build (once) into $CACHE/k8s/chaos-daemon-<key>/;
#                                              prints the image tarball (`docker save` format)
#   hack/cluster/chaos-daemon/build.sh image   print the image name
#
# Cached by content: <key> hashes the versions and this directory's files (this script, the
# Dockerfile, nsexec.c), so an edit to any of them builds a new image. The Go build needs cgo
# and a C compiler (the daemon's pkg/ptrace; its embedded fake-clock objects are compiled from
# the module's C sources first); the image needs Docker (hack/images/docker.sh starts it) and
# debian:bookworm-slim (hack/images/base-image.sh makes it), as torbed's own images do.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/cluster/common.sh
. "$HERE/../common.sh"
LOG_TAG=chaos-daemon

KEY=$( (echo "$CHAOS_MESH_VERSION $CHAOS_MESH_API_VERSION"; cat "$HERE/build.sh" "$HERE/Dockerfile" "$HERE/nsexec.c") \
  | sha256sum | cut -c1-12)
DIR=$CACHE/k8s/chaos-daemon-$KEY
IMAGE=localhost/torbed/chaos-daemon:$KEY

# binaries SRC DEST: chaos-daemon built from the module copy SRC, and its C helpers, into DEST
# (called in an `||` list, where set -e is off: each step returns on failure).
binaries() {
  local src=$1 dest=$2 f
  for f in fake_clock_gettime fake_gettimeofday; do
    cc -c "$src/pkg/time/fakeclock/$f.c" -fPIE -O2 -o "$src/pkg/time/fakeclock/$f.o" || return 1
  done
  (cd "$src" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath \
      -ldflags "-s -w -X github.com/chaos-mesh/chaos-mesh/pkg/version.gitVersion=$CHAOS_MESH_VERSION" \
      -o "$dest/chaos-daemon" ./cmd/chaos-daemon) || return 1
  cc -O2 -o "$dest/pause" "$src/hack/pause.c" || return 1
  cc -O2 -Wall -Werror -o "$dest/nsexec" "$HERE/nsexec.c"
}

cmd_build() {
  command -v go >/dev/null || die "go is required"
  command -v cc >/dev/null || die "a C compiler (cc) is required"
  mkdir -p "$CACHE/k8s/logs"
  exec 9>"$CACHE/k8s/.chaos-daemon.lock"
  flock 9
  if [ -f "$DIR/.done" ]; then
    log "present ($DIR)"
    echo "$DIR/chaos-daemon.tar"
    return
  fi
  local t0 out docker logf=$CACHE/k8s/logs/build-chaos-daemon.log
  t0=$(now)
  out=$DIR.tmp
  rm -rf "$out"
  mkdir -p "$out/context"
  chaos_mesh_src "$out/src"
  log "building chaos-daemon $CHAOS_MESH_VERSION (api $CHAOS_MESH_API_VERSION)"
  binaries "$out/src" "$out/context" >"$logf" 2>&1 \
    || die "building chaos-daemon's binaries failed; see $logf: $(tail -5 "$logf")"
  rm -rf "$out/src"
  cp "$HERE/Dockerfile" "$out/context/"
  docker=$("$HERE/../../images/docker.sh" --client)
  DOCKER=$docker "$HERE/../../images/base-image.sh" >/dev/null
  DOCKER_BUILDKIT=0 "$docker" build -t "$IMAGE" "$out/context" >>"$logf" 2>&1 \
    || die "docker build of $IMAGE failed; see $logf: $(tail -5 "$logf")"
  "$docker" save -o "$out/chaos-daemon.tar" "$IMAGE"
  rm -rf "$DIR"
  mv "$out" "$DIR"
  touch "$DIR/.done"
  log "built in $(elapsed "$t0") s: image $IMAGE, $(du -h "$DIR/chaos-daemon.tar" | cut -f1)"
  echo "$DIR/chaos-daemon.tar"
}

case "${1:-}" in
  build) cmd_build ;;
  image) echo "$IMAGE" ;;
  *) echo "usage: $0 build|image" >&2; exit 2 ;;
esac
