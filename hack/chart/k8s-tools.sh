#!/usr/bin/env bash
# Build the pinned Kubernetes chart tools (helm, helm-unittest, kubeconform) and the offline
# JSON schemas kubeconform validates against, all under ${TORBED_CACHE:-~/.cache/torbed}/tools.
# Only registries are reachable, so everything comes from the Go module proxy. Idempotent: a
# finished step leaves <dir>/.done and is skipped next time. Prints how long each step took.
#
#   hack/chart/k8s-tools.sh          build what is missing
#   hack/chart/k8s-tools.sh --env    print the environment for using them (PATH, HELM_PLUGINS, ...)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

# The pins (HELM_VERSION, UNITTEST_VERSION, KUBECONFORM_VERSION, K8S_SCHEMA_VERSION,
# PROM_OPERATOR_VERSION, CHAOS_MESH_VERSION) and now/elapsed.
# shellcheck source=hack/versions.env
. hack/versions.env
# shellcheck source=hack/lib.sh
. hack/lib.sh
LOG_TAG=k8s-tools
KUBE_MAJOR=1 KUBE_MINOR=33           # what helm reports as .Capabilities.KubeVersion (v1.33.0)

CACHE=${TORBED_CACHE:-$HOME/.cache/torbed}
TOOLS=$CACHE/tools
BIN=$TOOLS/bin
PLUGINS=$TOOLS/helm-plugins
HELM_DIR=$TOOLS/helm-$HELM_VERSION
UNITTEST_DIR=$TOOLS/helm-unittest-$UNITTEST_VERSION
KUBECONFORM_DIR=$TOOLS/kubeconform-$KUBECONFORM_VERSION
# Generated schemas are keyed by the converter's content too: a change to it regenerates them.
CONVERTER=$(sha256sum hack/chart/openapi2jsonschema.py | cut -c1-10)
K8S_SCHEMAS=$TOOLS/k8s-schemas-$K8S_SCHEMA_VERSION-$CONVERTER
CRD_SCHEMAS=$TOOLS/crd-schemas-prom$PROM_OPERATOR_VERSION-chaos${CHAOS_MESH_VERSION##*-}-$CONVERTER

if [ "${1:-}" = "--env" ]; then
  # What a test runner exports; tests/chart reads the same locations.
  cat <<EOF
export PATH="$BIN:\$PATH"
export HELM_PLUGINS="$PLUGINS"
export TORBED_KUBE_VERSION="${K8S_SCHEMA_VERSION#v}"
export TORBED_K8S_SCHEMAS="$K8S_SCHEMAS"
export TORBED_CRD_SCHEMAS="$CRD_SCHEMAS"
EOF
  exit 0
fi

# The pinned modules declare go 1.26; an older go (1.21+) fetches that toolchain through the
# module proxy itself (GOTOOLCHAIN=auto, the default).
command -v go >/dev/null || { echo "k8s-tools: go is required (1.26, or 1.21+ to fetch it)" >&2; exit 1; }
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
"$PYTHON" -c 'import yaml' 2>/dev/null || { echo "k8s-tools: $PYTHON lacks PyYAML (make venv)" >&2; exit 1; }

mkdir -p "$BIN" "$PLUGINS"
# One build at a time per cache (CI and a developer may share it).
exec 9>"$TOOLS/.lock"
flock 9
# Static binaries: nothing links against the host's libc, so the cache survives upgrades.
export CGO_ENABLED=0
GOARCH_HOST=$(go env GOARCH)
GOOS_HOST=$(go env GOOS)



link() { ln -sfn "$1" "$BIN/$(basename "$1")"; }

# Module directory of MODULE@VERSION in the Go module cache (downloaded and checksum-verified
# against the sum database by the go command).
moddir() {
  go mod download -json "$1" | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
if d.get("Error"):
    sys.exit("k8s-tools: " + d["Error"])
print(d["Dir"])'
}

# A throwaway chart printing .Capabilities.KubeVersion, with one unit test, to check the tools.
probe_chart() {
  local c=$1
  mkdir -p "$c/templates" "$c/tests"
  printf 'apiVersion: v2\nname: probe\nversion: 0.1.0\n' >"$c/Chart.yaml"
  printf 'x: 1\n' >"$c/values.yaml"
  cat >"$c/templates/cm.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: probe
data:
  kube: {{ .Capabilities.KubeVersion.Version | quote }}
  x: {{ .Values.x | quote }}
EOF
  cat >"$c/tests/cm_test.yaml" <<'EOF'
suite: probe
templates: [templates/cm.yaml]
tests:
  - it: renders x
    set: {x: 2}
    asserts:
      - equal: {path: data.x, value: "2"}
EOF
}

build_helm() {
  local out=$1 ldflags
  # No git commit: the module proxy does not say which one the tag was (helm prints it empty).
  # The chartutil/lint variables are what `helm template` and `helm lint` report as the
  # cluster version without a cluster; helm's own Makefile sets them from its go.mod.
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/chartutil pkg/lint/rules; do
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$KUBE_MAJOR"
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$KUBE_MINOR"
  done
  GOBIN=$out go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  local v kv probe
  v=$("$out/helm" version --template '{{.Version}}')
  [ "$v" = "$HELM_VERSION" ] || { echo "k8s-tools: helm reports version $v, not $HELM_VERSION" >&2; return 1; }
  probe=$(mktemp -d /tmp/torbed-helm-probe.XXXXXX)
  probe_chart "$probe/probe"
  kv=$("$out/helm" template t "$probe/probe" | sed -n 's/^ *kube: "\(.*\)"$/\1/p')
  rm -rf "$probe"
  case "$kv" in
    "v$KUBE_MAJOR.$KUBE_MINOR."*) echo "k8s-tools: helm $v, .Capabilities.KubeVersion $kv" ;;
    *) echo "k8s-tools: helm template renders .Capabilities.KubeVersion as '$kv', not v$KUBE_MAJOR.$KUBE_MINOR.x" >&2; return 1 ;;
  esac
}

build_unittest() {
  local out=$1 final=$2 src ldflags
  src=$(moddir "github.com/helm-unittest/helm-unittest@$UNITTEST_VERSION")
  mkdir -p "$out/unittest"
  # helm-unittest links helm's chartutil too: give it the same cluster version as helm.
  ldflags="-s -w -X github.com/helm-unittest/helm-unittest/internal/build.version=${UNITTEST_VERSION#v}"
  ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$KUBE_MAJOR"
  ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$KUBE_MINOR"
  # Built in the (read-only) module directory; the binary gets the name plugin.yaml runs on
  # this platform (untt-linux-amd64, ...).
  local os=$GOOS_HOST; [ "$os" = darwin ] && os=macos
  (cd "$src" && go build -trimpath -ldflags "$ldflags" -o "$out/unittest/untt-$os-$GOARCH_HOST" ./cmd/helm-unittest)
  # Its plugin.yaml and install hook, unchanged; the hook would download a release binary, and
  # SKIP_BIN_INSTALL=1 (below) makes it keep ours.
  install -m 0644 "$src/plugin.yaml" "$out/unittest/plugin.yaml"
  install -m 0755 "$src/install-binary.sh" "$out/unittest/install-binary.sh"
  # helm plugin install from a local directory links it into HELM_PLUGINS (offline) under
  # the directory's name, hence "unittest"; the link points at the final directory, which
  # exists once step() has moved this one.
  echo "$final/unittest" >"$out/plugin.path"
}

install_unittest_plugin() {
  # Outside step(): HELM_PLUGINS may have been emptied while the build stayed.
  local target link
  target=$(cat "$UNITTEST_DIR/plugin.path")
  link=$PLUGINS/unittest
  if [ -L "$link" ] && [ "$(readlink -f "$link")" = "$(readlink -f "$target")" ]; then
    echo "k8s-tools: helm-unittest plugin: present ($link)"
    return
  fi
  rm -rf "$link"
  HELM_PLUGINS=$PLUGINS SKIP_BIN_INSTALL=1 "$BIN/helm" plugin install "$target" >/dev/null
  local probe out
  probe=$(mktemp -d /tmp/torbed-unittest-probe.XXXXXX)
  probe_chart "$probe/probe"
  if ! out=$(HELM_PLUGINS=$PLUGINS "$BIN/helm" unittest "$probe/probe" 2>&1); then
    echo "$out" >&2
    rm -rf "$probe"
    echo "k8s-tools: helm unittest failed on a probe chart" >&2
    return 1
  fi
  rm -rf "$probe"
  echo "k8s-tools: helm-unittest plugin installed in $PLUGINS ($(HELM_PLUGINS=$PLUGINS "$BIN/helm" plugin list | awk '$1 == "unittest" {print $2}'))"
}

build_kubeconform() {
  local out=$1
  GOBIN=$out go install -trimpath -ldflags "-s -w -X main.version=$KUBECONFORM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
  "$out/kubeconform" -v
}

build_k8s_schemas() {
  local out=$1 zip member
  # Only api/openapi-spec/swagger.json is needed; the go command fetches the module through
  # the proxy and checks it against the sum database, and we read that one member of its zip
  # (the extracted module stays in the module cache, where the e2e cluster build reuses it).
  zip=$(go mod download -json "k8s.io/kubernetes@$K8S_SCHEMA_VERSION" | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
if d.get("Error"):
    sys.exit("k8s-tools: " + d["Error"])
print(d["Zip"])')
  member="k8s.io/kubernetes@$K8S_SCHEMA_VERSION/api/openapi-spec/swagger.json"
  "$PYTHON" - "$zip" "$member" "$out/swagger.json" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  "$PYTHON" "$REPO/hack/chart/openapi2jsonschema.py" k8s "$out/swagger.json" \
    --out "$out" --version "$K8S_SCHEMA_VERSION"
}

build_crd_schemas() {
  local out=$1 prom chaos
  prom=$(moddir "github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION")
  chaos=$(moddir "github.com/chaos-mesh/chaos-mesh@$CHAOS_MESH_VERSION")
  "$PYTHON" "$REPO/hack/chart/openapi2jsonschema.py" crd --out "$out" \
    "$prom/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" \
    "$prom/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
    "$chaos"/helm/chaos-mesh/crds/*.yaml
  printf 'prometheus-operator %s\nchaos-mesh %s\n' "$PROM_OPERATOR_VERSION" "$CHAOS_MESH_VERSION" >"$out/SOURCES"
}

T0=$(now)
step "helm $HELM_VERSION" "$HELM_DIR" build_helm
link "$HELM_DIR/helm"
step "helm-unittest $UNITTEST_VERSION" "$UNITTEST_DIR" build_unittest
install_unittest_plugin
step "kubeconform $KUBECONFORM_VERSION" "$KUBECONFORM_DIR" build_kubeconform
link "$KUBECONFORM_DIR/kubeconform"
step "kubernetes $K8S_SCHEMA_VERSION schemas" "$K8S_SCHEMAS" build_k8s_schemas
step "CRD schemas" "$CRD_SCHEMAS" build_crd_schemas
echo "k8s-tools: all present after $(elapsed "$T0") s; environment: hack/chart/k8s-tools.sh --env"
