#!/usr/bin/env bash
# The command behind `make e2e` (and so .ci/run): end-to-end tests on a real Kubernetes
# cluster, in stages (hack/stage.sh: wall time beside budget, per-test durations and junit
# XML under $TORBED_TEST_REPORTS):
#
#   cluster-build  Kubernetes, CoreDNS, pause, toolbox (hack/cluster/cluster.sh build; cached by version)
#   chaos-build    Chaos Mesh's controller-manager (cached by version) and chaos-daemon (cached by
#                  content): hack/cluster/chaos-mesh.sh build
#   e2e-images     the images the tests install (torbed.images; cached by content), and
#                  the arm64 relay image the emulated Pi node runs
#   e2e            tests/e2e (-m "e2e and not experiment"); the session fixture brings the
#                  local cluster up (unless KUBECONFIG reaches one) and loads the images into
#                  it (skipped where the same content is already there)
#
#   hack/run-e2e.sh [PYTEST-ARGS...]   all of it
#   hack/run-e2e.sh --prepare          the build stages only (.ci/run runs them in the
#                                      background while the fast tiers of `make test` run)
set -uo pipefail
cd "$(dirname "$0")/.."
. hack/stage.sh
bin=.venv/bin
E2E_IMAGES=dirauth,client,locust,relay,prometheus,nightly

prepare() {
  stage cluster-build hack/cluster/cluster.sh build || return 1
  stage chaos-build hack/cluster/chaos-mesh.sh build || return 1
  stage e2e-images "$bin/python" -m torbed.images --images "$E2E_IMAGES" || return 1
  # The emulated Pi's relay (tests/e2e/test_pi_k8s.py): tor cross-compiled, the rest under qemu.
  stage e2e-images-arm64 "$bin/python" -m torbed.images --platform linux/arm64 --images relay --variants vanilla \
    || return 1
}

if [ "${1:-}" = --prepare ]; then
  prepare
  exit $?
fi
prepare || exit 1
rc=0
stage e2e "$bin/pytest" -ra -p no:cacheprovider --durations=25 --durations-min=1 \
  --junitxml="$TORBED_TEST_REPORTS/e2e.xml" -m "e2e and not experiment" tests/e2e "$@" || rc=$?
[ $rc -ne 5 ] || { echo "run-e2e: pytest collected no tests; that is a failure" >&2; exit 1; }
exit $rc
