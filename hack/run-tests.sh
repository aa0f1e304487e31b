#!/usr/bin/env bash
# The test command behind `make test` (and so .ci/run), in tiers, fastest first, so a typo
# fails in a minute and a cold machine's builds are timed apart from the tests:
#
#   lint         ruff
#   unit         tests/unit
#   chart-tools  helm, helm-unittest, kubeconform and offline schemas (built once, cached)
#   chart        tests/chart
#   linkemu      linkemu's cargo tests (Rust, fake clock)
#   tor-builds   every variant's tor and the --check builds (tests/integration/prebuild.py)
#   images       the container images for this machine (torbed.images, cached by content)
#   integration  tests/integration and tests/images: real tor in network namespaces, Docker
#
# Each tier is a stage (hack/stage.sh): its wall time is printed beside its budget
# (hack/stage-budgets.tsv) and pytest writes per-test durations and junit XML under
# $TORBED_TEST_REPORTS (build/test-reports). Tests marked `experiment` (effect sizes, ratios
# between variants) are not run here: `make experiments` runs them (docs/testing.md).
# Arguments are passed to every pytest stage. pytest's exit 5 ("no tests ran") fails.
#
# TORBED_BACKGROUND_RC: a file another job (.ci/run's e2e preparation) writes its exit code
# to; the tiers that use the whole machine (images, integration) wait for it first, so
# nothing measured shares the CPU with a build (the tor builds run beside it: builds both).
set -uo pipefail
cd "$(dirname "$0")/.."
. hack/stage.sh
bin=.venv/bin
cargo=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")

pytest_stage() {   # pytest_stage NAME PYTEST-ARGS...
  local name=$1 rc
  shift
  rc=0
  "$bin/pytest" -ra -p no:cacheprovider --durations=25 --durations-min=1 \
    --junitxml="$TORBED_TEST_REPORTS/$name.xml" "$@" || rc=$?
  if [ $rc -eq 5 ]; then
    echo "run-tests: pytest collected no tests in stage $name; that is a failure" >&2
    return 1
  fi
  return $rc
}

linkemu_tests() {
  # linkemu's build directory is outside the source tree, keyed by the crate's lock file and
  # the toolchain, so a fresh clone reuses it (cargo rebuilds what changed).
  CARGO_TARGET_DIR=$(hack/linkemu-target.sh) "$cargo" test --quiet --locked --manifest-path linkemu/Cargo.toml
}

wait_background() {
  local f=${TORBED_BACKGROUND_RC:-}
  [ -n "$f" ] || return 0
  echo "run-tests: waiting for the background job ($f)"
  while [ ! -s "$f" ]; do sleep 2; done
  [ "$(cat "$f")" = 0 ] || { echo "run-tests: the background job failed (exit $(cat "$f"))" >&2; return 1; }
}

if [ "$(id -u)" -ne 0 ]; then
  echo "run-tests: integration tests need root (network namespaces); running as $(id -un)" >&2
fi
stage lint "$bin/ruff" check . || exit 1
# Unit and chart tests are CPU-bound and independent: one worker per core (pytest-xdist).
stage unit pytest_stage unit -n 2 tests/unit "$@" || exit 1
stage chart-tools hack/chart/k8s-tools.sh || exit 1
stage chart pytest_stage chart -n 2 tests/chart "$@" || exit 1
command -v "$cargo" >/dev/null || { echo "run-tests: cargo is missing: install Rust (https://rustup.rs)" >&2; exit 1; }
stage linkemu linkemu_tests || exit 1
# The tor builds overlap the wait for the background e2e builds: both are builds, nothing is
# measured, and the background's downloads, image exports and link steps leave a core idle
# for long stretches. On a cold machine that is ~10 minutes of tor builds off the critical
# path; warm, both take no time.
stage tor-builds "$bin/python" -m tests.integration.prebuild &
tor_builds=$!
stage wait-background wait_background || { kill "$tor_builds" 2>/dev/null; exit 1; }
wait "$tor_builds" || exit 1
stage images "$bin/python" -m torbed.images || exit 1
# tests/e2e needs a Kubernetes cluster: `make e2e` (which .ci/run also calls).
# Two at a time: each test runs its own network and checks only its own run's leftovers, so
# two can share the machine; a module stays on one worker (--dist loadfile: a module's shared
# run is made once). Tests whose bounds another network's load could break are marked
# `serial` and run alone afterwards (docs/testing.md).
integration_tests() {   # both parts run (every failure reported); either failing fails the stage
  local rc=0
  pytest_stage integration -n 2 --dist loadfile -m "not experiment and not serial" tests/integration tests/images \
    "$@" || rc=1
  pytest_stage integration-serial -m "serial and not experiment" tests/integration "$@" || rc=1
  return $rc
}
stage integration integration_tests "$@" || exit 1
