# torbed developer entry points. `make demo` and `make test` work on a fresh Debian machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := .stamp
PYTEST_ARGS ?=
IMAGES_ARGS ?=

.PHONY: setup deps venv lock test unit integration experiments lint demo schema docs docs-ref clean bench reproduce tor-sample tools chart-test images images-arm64 images-test registry-up registry-down images-push

setup: deps venv  ## install system packages and the virtualenv

deps: $(STAMP)/deps
$(STAMP)/deps: hack/install-deps.sh
	hack/install-deps.sh
	@mkdir -p $(STAMP) && touch $@

venv: $(BIN)/.installed
# Outside the checkout, `pip install .` installs torbed with its chart, variants and scenarios (torbed/resources.py).
# hack/constraints.txt pins every Python dependency (the client image uses it too).
$(BIN)/.installed: pyproject.toml setup.py hack/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c hack/constraints.txt -e ".[test,docs]"
	@touch $@

lock: venv  ## re-pin hack/constraints.txt to the newest versions pyproject.toml allows
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip && .lock-venv/bin/pip install -q ".[test,docs]"
	{ sed -n '/^#/p' hack/constraints.txt; .lock-venv/bin/pip freeze --exclude-editable | grep -vi '^torbed[= ]'; } > hack/constraints.txt.new
	mv hack/constraints.txt.new hack/constraints.txt && rm -rf .lock-venv

test: setup  ## unit and integration tests (integration: real tor in network namespaces, needs root)
	hack/run-tests.sh $(PYTEST_ARGS)

unit: setup
	$(BIN)/pytest -q tests/unit $(PYTEST_ARGS)

# Two tests at a time (each in a network of its own; a module stays on one worker, its shared
# run with it), then the `serial` ones alone (docs/testing.md).
integration: setup
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not experiment and not serial" tests/integration $(PYTEST_ARGS)
	$(BIN)/pytest -q -m "serial and not experiment" tests/integration $(PYTEST_ARGS)

experiments: setup  ## tests that measure an effect (a ratio between arms, a delay added); part of make bench, not of CI
	$(BIN)/pytest -ra -m experiment tests/integration tests/e2e $(PYTEST_ARGS)

lint: venv  ## ruff (configured in pyproject.toml); part of `make test`
	$(BIN)/ruff check .

demo: setup  ## run scenarios/quickstart.yaml (3 short paired blocks per variant, about 4 min warm) and write its report
	hack/demo.sh

tools: venv  ## helm, helm-unittest, kubeconform + offline Kubernetes/CRD schemas, cached in ~/.cache/torbed/tools
	hack/chart/k8s-tools.sh

chart-test: tools  ## lint, render and validate charts/torbed for every scenario x variant; its unit tests
	$(BIN)/pytest -q tests/chart $(PYTEST_ARGS)

docs-ref: venv  ## regenerate the docs' reference pages (docs/reference/scenario.md, cli.md) from the scenario model and the CLI's parsers
	$(BIN)/torbed docs-ref

# The site: docs/ with mkdocs.yml's nav, into build/site. --strict: a broken link, a page
# missing from the nav or a nav entry without a page fails. tests/unit/test_docs.py runs it too.
# NO_MKDOCS_2_WARNING: the theme's banner about its own end of life (May 2027), not about these docs.
docs: docs-ref  ## regenerate the reference pages, then build the documentation site (MkDocs, strict) into build/site
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

schema: venv  ## regenerate the chart's generated files (values.schema.json, files/torrc, files/variants.yaml)
	$(BIN)/torbed chart-files

images: venv  ## container images (dirauth, client, relay per variant family, prometheus) for this machine; PLATFORM=linux/arm64 for arm64
	$(BIN)/python -m torbed.images $(if $(PLATFORM),--platform $(PLATFORM)) $(IMAGES_ARGS)

images-arm64: venv  ## the same for linux/arm64 (tor cross-compiled, the rest under qemu); tags end in -arm64
	$(BIN)/python -m torbed.images --platform linux/arm64 $(IMAGES_ARGS)

# A registry for multi-arch tags and the chart (hack/images/registry.sh: Debian's docker-registry on
# 127.0.0.1:5000, plain HTTP). REGISTRY=host:port pushes elsewhere (docker login first).
REGISTRY ?= 127.0.0.1:5000
registry-up:  ## start the local registry (127.0.0.1:5000)
	hack/images/registry.sh up
registry-down:  ## stop the local registry (its data stays)
	hack/images/registry.sh down
images-push: venv  ## push every built architecture of each image under one tag (manifest list) and the chart (OCI) to REGISTRY
	$(if $(filter 127.0.0.1:5000,$(REGISTRY)),hack/images/registry.sh up)
	$(BIN)/python -m torbed.backends.k8s.registry --registry $(REGISTRY) --chart $(IMAGES_ARGS)

images-test: images  ## tests/images against the built images
	$(BIN)/pytest -q tests/images $(PYTEST_ARGS)

bench: setup  ## benchmarks (linkemu, local backend, torchestra, background load cost, mtrelay throughput); results in runs/bench/ (BENCH_QUICK=1: shorter)
	hack/bench.sh

# Seed papers' pre-registered comparisons (analysis/preregistration.yaml) -> one record per finished
# repetition under docs/reproduction/records/ -> docs/reproduction.md (analysis/campaign.py).
# Many hours in all: run it again in every session until each experiment has concluded; Ctrl-C
# is safe. `$(BIN)/python -m torbed.analysis.reproduce --estimate` prints the machine time left.
# Not niced: a measurement must never run at a lower priority than other load (it would
# measure that load); `torbed run` warns when the machine is busy (torbed/hostload.py).
reproduce: setup  ## one session of the papers' pre-registered campaign (resumes from docs/reproduction/records); RENDER_ONLY=1: only re-render docs/reproduction.md
	$(BIN)/python -m torbed.analysis.reproduce $(if $(filter-out 0,$(RENDER_ONLY)),--render-only)

# scenarios/tor-sample-60.yaml from CollecTor's 2022-11-19 10:00 consensus, downloaded by the user
# (commands in hack/tor-sample.sh; COLLECTOR_DIR, CAPACITY=consensus|descriptors, BUDGET=pinned|machine).
tor-sample: venv  ## regenerate scenarios/tor-sample-60.yaml from downloaded CollecTor documents (docs/generate.md)
	hack/tor-sample.sh

clean:  ## remove leftovers of killed runs (namespaces, processes)
	$(BIN)/torbed clean

# Local single-node Kubernetes cluster for e2e tests (hack/cluster/cluster.sh; root). The binaries are
# built from the Go module proxy once and cached under ~/.cache/torbed/k8s (TORBED_CACHE).
.PHONY: cluster-build cluster-up cluster-down cluster-status e2e-cluster e2e

cluster-build:  ## build/cache Kubernetes v1.33.13, CoreDNS and the cluster's images (about 15 min the first time)
	hack/cluster/cluster.sh build

cluster-up:  ## start the local cluster; prints the KUBECONFIG to export
	hack/cluster/cluster.sh up

cluster-down:  ## stop the local cluster and remove its processes, mounts, bridge and iptables rules
	hack/cluster/cluster.sh down

cluster-status:
	hack/cluster/cluster.sh status

# The cluster stays up afterwards (tests/e2e uses the reachable KUBECONFIG and leaves it be):
# rerun quickly, then `make cluster-down`.
e2e-cluster: venv  ## bring the cluster up, check pod/Service/DNS networking, then run tests/e2e against it
	hack/cluster/cluster.sh up
	hack/cluster/cluster.sh smoke
	KUBECONFIG=$${TORBED_K8S_STATE:-/var/lib/torbed-k8s}/kubeconfig $(BIN)/pytest -q -m e2e tests/e2e $(PYTEST_ARGS)

e2e: tools  ## e2e tests on a real cluster: KUBECONFIG's when reachable, else the local one (brought up and down again)
	hack/run-e2e.sh $(PYTEST_ARGS)
