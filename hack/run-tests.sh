#!/usr/bin/env bash
# The test command behind `make test` (and so .ci/run): ruff, linkemu's cargo tests, unit tests,
# chart tests (helm lint/template/unittest, kubeconform), then integration tests with real
# tor processes and network namespaces. pytest's exit 5
# ("no tests ran") fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
# Lint first: it takes a second and its findings are real errors (unused or undefined names).
if ! "$bin/ruff" check .; then
  echo "run-tests: ruff found problems (configuration: pyproject.toml [tool.ruff])" >&2
  exit 1
fi
# linkemu's scheduling logic (Rust unit tests, fake clock).
cargo=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
if ! "$cargo" test --quiet --locked --manifest-path torbed/linkemu/Cargo.toml; then
  echo "run-tests: linkemu's cargo tests failed (or cargo is missing: install Rust, https://rustup.rs)" >&2
  exit 1
fi
# The chart's tools (helm, helm-unittest, kubeconform, offline schemas): built once from the
# Go module proxy, cached; tests/chart uses them.
if ! hack/k8s-tools.sh; then
  echo "run-tests: building the chart tools failed (hack/k8s-tools.sh)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "run-tests: integration tests need root (network namespaces); running as $(id -un)" >&2
fi
# tests/e2e needs a Kubernetes cluster: `make e2e` (which .ci/run also calls).
"$bin/pytest" -ra tests --ignore=tests/e2e "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "run-tests: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
