#!/usr/bin/env bash
# build.sh - build (once) what the local Kubernetes cluster runs, into the torbed cache:
#
#   $CACHE/k8s/<k8s version>/bin/     kube-apiserver kube-controller-manager kube-scheduler
#                                     kubelet kube-proxy kubectl   (from the Go module proxy)
#   $CACHE/k8s/coredns-<version>/     coredns + coredns.tar (image FROM scratch)
#   $CACHE/k8s/pause-<src hash>/      pause + pause.tar (image FROM scratch, hack/cluster/pause/pause.c)
#   $CACHE/k8s/toolbox-<src hash>/    toolbox.tar (FROM scratch: Debian's static busybox and
#                                     hack/cluster/netcheck; the DNS check and smoke test use it)
#
# Only registries are reachable here, so Kubernetes is built from the k8s.io/kubernetes module
# rather than a release tarball. A finished step leaves .done and is skipped next time; an
# interrupted one never looks finished (it builds into DIR.tmp). Prints each step's time.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/cluster/common.sh
. "$HERE/common.sh"

LOG_TAG=cluster-build

command -v go >/dev/null || die "go is required (Go 1.24+ for Kubernetes $K8S_VERSION)"
mkdir -p "$CACHE/k8s"
# One build at a time per cache (CI and a developer may share it).
exec 9>"$CACHE/k8s/.build.lock"
flock 9

# Static binaries: nothing links against the host's libc, so the cache survives upgrades.
export CGO_ENABLED=0
LOGDIR=$CACHE/k8s/logs
mkdir -p "$LOGDIR"


build_kubernetes() {
  local out=$1 src modinfo moddir commit_time t0 ldflags c
  # Sources live outside the final dir: only bin/ is kept.
  src=$CACHE/k8s/src-$K8S_VERSION
  t0=$(now)
  modinfo=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION") \
    || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed (is the Go module proxy reachable?)"
  moddir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$modinfo")
  commit_time=$(sed -n 's/^[[:space:]]*"Time": "\(.*\)",$/\1/p' <<<"$modinfo")
  [ -d "$moddir" ] || die "no module directory for k8s.io/kubernetes@$K8S_VERSION"
  rm -rf "$src"
  cp -a "$moddir" "$src"
  chmod -R u+w "$src"   # the module cache is read-only
  # The module's vendor/ and go.work point the build at staging/ and a vendored tree that the
  # module zip does not carry completely; build against the published staging modules instead.
  rm -rf "$src/vendor" "$src/go.work" "$src/go.work.sum"
  sed -i -E \
    -e "s#^([[:space:]]*)k8s.io/sample-apiserver => \./staging/src/k8s.io/sample-apiserver\$#\1k8s.io/sample-apiserver => k8s.io/sample-apiserver $K8S_SAMPLE_APISERVER_VERSION#" \
    -e "s#^([[:space:]]*)(k8s.io/[a-z0-9-]+) => \./staging/src/k8s.io/[a-z0-9-]+\$#\1\2 => \2 $K8S_STAGING_VERSION#" \
    "$src/go.mod"
  if grep -q '=> \./staging' "$src/go.mod"; then die "go.mod still has staging replaces: $src/go.mod"; fi
  log "kubernetes: source ready in $(elapsed "$t0") s"

  # What `make` would stamp in (hack/lib/version.sh): kubectl version and /version report these.
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitCommit=module-$K8S_VERSION -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.buildDate=${commit_time:-1970-01-01T00:00:00Z}"
  done
  mkdir -p "$out/bin"
  # One binary at a time: the first pays for the shared packages, the rest reuse the Go build
  # cache, and each gets its own timing and log.
  for c in $K8S_COMPONENTS; do
    t0=$(now)
    (cd "$src" && GOFLAGS=-mod=mod go build -trimpath -tags notest -ldflags "$ldflags" \
        -o "$out/bin/$c" "./cmd/$c") >"$LOGDIR/build-$c.log" 2>&1 \
      || die "building $c failed; see $LOGDIR/build-$c.log"
    log "kubernetes: $c built in $(elapsed "$t0") s"
  done
  # Captured first: `grep -q` closing the pipe early would fail the pipeline under pipefail.
  local reported
  reported=$("$out/bin/kubectl" version --client 2>&1 || true)
  grep -q "Client Version: $K8S_VERSION" <<<"$reported" \
    || die "built kubectl does not report $K8S_VERSION: $reported"
  rm -rf "$src"
}

build_coredns() {
  local out=$1
  GOBIN=$out GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$COREDNS_VERSION" >"$LOGDIR/build-coredns.log" 2>&1 \
    || die "go install coredns@$COREDNS_VERSION failed; see $LOGDIR/build-coredns.log"
  mkdir "$out/rootfs"
  cp "$out/coredns" "$out/rootfs/coredns"
  "$HERE/mkimage.sh" "$out/coredns.tar" "$COREDNS_IMAGE" "$out/rootfs" /coredns
  rm -rf "$out/rootfs"
}

build_pause() {
  local out=$1
  command -v gcc >/dev/null || die "gcc is required for the pause image (apt-get install gcc libc6-dev)"
  gcc -static -Os -Wall -Wextra -o "$out/pause" "$HERE/pause/pause.c" >"$LOGDIR/build-pause.log" 2>&1 \
    || die "compiling hack/cluster/pause/pause.c failed; see $LOGDIR/build-pause.log"
  strip "$out/pause"
  mkdir "$out/rootfs"
  cp "$out/pause" "$out/rootfs/pause"
  "$HERE/mkimage.sh" "$out/pause.tar" "$PAUSE_IMAGE" "$out/rootfs" /pause
  rm -rf "$out/rootfs"
}

build_toolbox() {
  local out=$1 deb a
  # Debian's busybox-static is a static binary: downloaded, not installed (it would replace
  # the host's busybox). Its networking applets crash on name lookups in an image without
  # glibc's NSS modules; netcheck (Go, static) does the network probing instead.
  (cd "$out" && apt-get download busybox-static) >"$LOGDIR/build-toolbox.log" 2>&1 \
    || die "apt-get download busybox-static failed; see $LOGDIR/build-toolbox.log"
  deb=$(ls "$out"/busybox-static_*.deb)
  dpkg-deb -x "$deb" "$out/x"
  mkdir -p "$out/rootfs/bin" "$out/rootfs/tmp" "$out/rootfs/etc"
  cp "$out/x/bin/busybox" "$out/rootfs/bin/busybox"
  for a in sh cat echo env hostname ls mkdir sleep true false; do
    ln -s busybox "$out/rootfs/bin/$a"
  done
  (cd "$HERE/netcheck" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/rootfs/bin/netcheck" .) \
    >>"$LOGDIR/build-toolbox.log" 2>&1 || die "building hack/cluster/netcheck failed; see $LOGDIR/build-toolbox.log"
  echo 'root:x:0:0:root:/:/bin/sh' >"$out/rootfs/etc/passwd"
  echo 'root:x:0:' >"$out/rootfs/etc/group"
  basename "$deb" .deb >"$out/VERSION"
  "$HERE/mkimage.sh" "$out/toolbox.tar" "$TOOLBOX_IMAGE" "$out/rootfs" /bin/sh
  rm -rf "$out/x" "$out/rootfs" "$deb"
}

# All in a function: bash then reads the whole file before building, so editing the script
# (or a checkout) during a long build cannot derail the running one.
main() {
  T0=$(now)
  case "${1:-all}" in
    all)
      step pause "$PAUSE_DIR" build_pause
      step toolbox "$TOOLBOX_DIR" build_toolbox
      step "kubernetes $K8S_VERSION" "$K8S_DIR" build_kubernetes
      step "coredns $COREDNS_VERSION" "$COREDNS_DIR" build_coredns
      ;;
    kubernetes) step "kubernetes $K8S_VERSION" "$K8S_DIR" build_kubernetes ;;
    coredns) step "coredns $COREDNS_VERSION" "$COREDNS_DIR" build_coredns ;;
    pause) step pause "$PAUSE_DIR" build_pause ;;
    toolbox) step toolbox "$TOOLBOX_DIR" build_toolbox ;;
    *) die "unknown target $1 (all, kubernetes, coredns, pause, toolbox)" ;;
  esac
  log "all present in $(elapsed "$T0") s"
}

main "$@"
