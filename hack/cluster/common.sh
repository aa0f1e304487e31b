# shellcheck shell=bash disable=SC2034  # variables for the scripts that source this
# Shared settings of hack/cluster/cluster.sh and hack/cluster/build.sh (sourced, not run).
# The versions come from hack/versions.env; a bump there is a new cache key here.

# shellcheck source=hack/versions.env
. "$(dirname "${BASH_SOURCE[0]}")/../versions.env"
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"

CACHE=${TORBED_CACHE:-$HOME/.cache/torbed}
K8S_DIR=$CACHE/k8s/$K8S_VERSION
K8S_BIN=$K8S_DIR/bin
COREDNS_DIR=$CACHE/k8s/coredns-$COREDNS_VERSION
# The pause image is keyed by its source so an edit rebuilds it.
PAUSE_KEY=$(sha256sum "$(dirname "${BASH_SOURCE[0]}")/pause/pause.c" | cut -c1-12)
PAUSE_DIR=$CACHE/k8s/pause-$PAUSE_KEY
# The toolbox image (static busybox + hack/cluster/netcheck) is keyed by netcheck's source.
TOOLBOX_KEY=$(cat "$(dirname "${BASH_SOURCE[0]}")"/netcheck/* | sha256sum | cut -c1-12)
TOOLBOX_DIR=$CACHE/k8s/toolbox-$TOOLBOX_KEY

# Image names inside the cluster's containerd. "localhost/" keeps them from ever looking like
# something pullable; pods use imagePullPolicy: Never/IfNotPresent anyway.
PAUSE_IMAGE=localhost/torbed/pause:1.0
COREDNS_IMAGE=localhost/torbed/coredns:$COREDNS_VERSION
TOOLBOX_IMAGE=localhost/torbed/toolbox:1

# Chaos Mesh (hack/cluster/chaos-mesh.sh, hack/cluster/chaos-daemon/build.sh).
# chaos_mesh_moddir MODULE@VERSION: the module's directory in the Go module cache (downloaded
# when missing).
chaos_mesh_moddir() {
  local info
  info=$(go mod download -json "$1") || die "go mod download $1 failed: $info"
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$info"
}

# chaos_mesh_src DEST: a writable copy of the pinned chaos-mesh module whose go.mod requires the
# pinned api module instead of replacing it with ./api (hack/versions.env says why).
chaos_mesh_src() {
  local mod
  mod=$(chaos_mesh_moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
  cp -r "$mod" "$1"
  chmod -R u+w "$1"
  (cd "$1" && go mod edit -dropreplace github.com/chaos-mesh/chaos-mesh/api \
      -require "github.com/chaos-mesh/chaos-mesh/api@$CHAOS_MESH_API_VERSION")
}

# render FILE NAME=VALUE...: hack/cluster/config/FILE on stdout, each __NAME__ replaced by VALUE
# (any characters, newlines included).
render() {
  local file=$CLUSTER_DIR/config/$1 kv val args=(-e '')
  shift
  for kv in "$@"; do
    val=${kv#*=}
    val=${val//\\/\\\\}
    val=${val//\#/\\#}
    val=${val//&/\\&}
    val=${val//$'\n'/\\$'\n'}   # a value of several lines
    args+=(-e "s#__${kv%%=*}__#${val}#g")
  done
  sed "${args[@]}" "$file"
}
