"""One plain `helm install` of the chart on a real cluster, as a cluster user gets it: from a
registry. `python -m torbed.backends.k8s.registry` (`make images-push`) puts every built
architecture of each image under one tag (a manifest list) and the chart as an OCI artifact
into the local registry (hack/images/registry.sh); the release is installed from there and
its nodes pull every image from it (pullPolicy Always: the images imported for the other
tests are not used). One release (CI time, issue 44), shared by the tests that only need a
running one: the registry's tags and the pods' image references, `helm test`, egress
isolation, the results service's token, and the in-chart Prometheus (prometheus.enabled,
Debian's package in torbed/prometheus): every target of the release up at once, the relays',
collectors' and drivers' series there with the labels the dashboards filter by, and every
dashboard panel that can have data on Kubernetes returning series."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from conftest import ISOLATE, QUICKSTART, REPO, exec_in, uninstall, wait_running

pytestmark = pytest.mark.e2e
REL = "shared"
REGISTRY = "127.0.0.1:5000"
# Panels that cannot have data on Kubernetes: linkemu is a local-backend shaper.
NO_DATA_ON_K8S = {"Node throughput through linkemu", "Frames lost and dropped", "Largest link backlog"}


def _api(kube, path: str, **query) -> dict:
    """GET Prometheus' HTTP API through the API server's Service proxy."""
    api = kube.ApiClient()
    r = api.call_api(f"/api/v1/namespaces/default/services/{REL}-prometheus:web/proxy{path}", "GET",
                     query_params=list(query.items()), auth_settings=["BearerToken"],
                     _preload_content=False, _return_http_data_only=True, _request_timeout=30)
    body = json.loads(r.data)
    assert body["status"] == "success", body
    return body["data"]


def _series(kube, expr: str) -> list[dict]:
    return _api(kube, "/api/v1/query", query=expr)["result"]


@pytest.fixture(scope="module")
def registry(images):
    """The local registry (hack/images/registry.sh) with the images and the chart published
    into it; stopped afterwards unless it ran before. The publisher's output."""
    registry_sh = ["bash", str(REPO / "hack" / "images" / "registry.sh")]
    was_up = subprocess.run([*registry_sh, "status"], capture_output=True).returncode == 0
    up = subprocess.run([*registry_sh, "up"], capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    try:
        t0 = time.time()
        p = subprocess.run([sys.executable, "-m", "torbed.backends.k8s.registry", "--registry", REGISTRY, "--chart",
                            "--variants", "vanilla,ewma"], capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        print(f"images and chart published in {time.time() - t0:.0f} s")
        yield p.stdout
    finally:
        if not was_up:   # leave nothing running that this module started
            subprocess.run([*registry_sh, "down"], capture_output=True)


@pytest.fixture(scope="module")
def release(kube, helm, registry):
    """One plain `helm install` of the chart from the registry (no values file: the chart's
    default scenario, the quickstart) with the in-chart Prometheus, shared by every test of
    this module: each asserts one thing about it, so a failure stays specific."""
    from torbed import __version__
    base = [helm["bin"], "-n", "default"]
    t0 = time.time()
    p = subprocess.run([*base, "install", REL, f"oci://{REGISTRY}/charts/torbed", "--version", __version__,
                        "--plain-http", "--set", f"images.registry={REGISTRY}", "--set", "images.pullPolicy=Always",
                        "--set", ISOLATE, "--set", "prometheus.enabled=true", "--set", "prometheus.scrapeInterval=5s",
                        "--set", "measure.duration=150s", "--timeout", "300s"],
                       capture_output=True, text=True, env=helm["env"])
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        yield {"t0": t0, "install": p}
    finally:
        left = uninstall(kube, helm, REL)
        assert left == []


def _local_image(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def _manifest_list(repo: str, tag: str) -> dict:
    req = urllib.request.Request(f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", headers={
        "Accept": "application/vnd.docker.distribution.manifest.list.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_one_tag_for_every_architecture_and_every_pod_pulled_from_the_registry(kube, release):
    from torbed import __version__, images as imgs
    host = imgs.host_arch()
    for repo, tag in (("torbed/client", __version__), ("torbed/dirauth", __version__),
                      ("torbed/relay", f"vanilla-{__version__}"), ("torbed/prometheus", __version__)):
        ml = _manifest_list(repo, tag)
        assert ml["mediaType"].endswith("manifest.list.v2+json"), ml
        arches = {m["platform"]["architecture"] for m in ml["manifests"]}
        assert host in arches, (repo, arches)
        # One tag for every architecture built here: the arm64 build (the emulated Pi's relay
        # image, tests/e2e/test_pi_k8s.py) must be under the same tag when it exists locally.
        built = {a for a in ("amd64", "arm64") if _local_image(f"{repo}:{tag}" + ("" if a == host else f"-{a}"))}
        assert built <= arches, (repo, built, arches)
    wait_running(kube, f"{REL}-exit-0")
    pods = kube.CoreV1Api().list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={REL}")
    refs = {c.image for p in pods.items for c in (p.status.container_statuses or [])}
    assert refs and all(r.startswith(f"{REGISTRY}/") for r in refs), refs
    print(f"{len(refs)} image references, all from {REGISTRY}")


def _wait(what: str, check, timeout: float):
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            last = check()
            if last is True or (last and last is not False and not isinstance(last, str)):
                return last
        except Exception as e:      # Prometheus not up yet, proxy 503: keep polling
            last = f"{type(e).__name__}: {e}"
        time.sleep(3)
    raise AssertionError(f"{what} not within {timeout:.0f} s; last: {last}")


def test_every_target_up_and_every_exporter_series_there(kube, release):
    scenario = yaml.safe_load(QUICKSTART.read_text())
    relays = {f"{g}{i}" for g, rg in scenario["network"]["relays"].items() for i in range(rg.get("count", 1))}
    clients = {f"{g}{i}" for g, cg in scenario["clients"].items() for i in range(cg.get("count", 1))}
    want = {("prometheus", "prometheus"), ("results", "results"), *{("tor", n) for n in relays},
            *{("collector", n) for n in relays}, *{("driver", n) for n in clients}}

    def all_up():
        targets = _api(kube, "/api/v1/targets", state="active")["activeTargets"]
        got = {(t["labels"]["job"], t["labels"]["node"]): t["health"] for t in targets}
        assert set(got) == want, sorted(set(got) ^ want)      # exactly the release's pods
        down = {k: v for k, v in got.items() if v != "up"}
        return True if not down else f"not up: {sorted(down)}"

    # Bring-up (keys, authorities, consensus) comes first; the drivers' exporters answer from
    # their start, the collectors' once tor's control port does.
    _wait("every target up", all_up, 420)
    print(f"all {len(want)} targets up {time.time() - release['t0']:.0f} s after helm install began")

    # Relays: MetricsPort series per relay, labelled as the dashboards expect.
    res = _series(kube, f'tor_relay_traffic_bytes{{release="{REL}", direction="written"}}')
    assert {r["metric"]["node"] for r in res} == relays, res
    assert {r["metric"]["variant"] for r in res} == {"vanilla"}, res
    # Drivers: per client group; the collectors: CELL_STATS per relay once cells flow.
    groups = set(scenario["clients"])
    _wait("transfers started in every group", lambda: {
        r["metric"]["group"] for r in _series(kube, f'torbed_transfers_started_total{{release="{REL}"}} > 0')} == groups
        or False, 240)
    _wait("CELL_STATS cells at every relay", lambda: {
        r["metric"]["relay"] for r in _series(kube, f'torbed_relay_cells_total{{release="{REL}"}} > 0')} == relays
        or False, 240)
    res = _series(kube, f'process_cpu_seconds_total{{release="{REL}"}}')
    assert {r["metric"]["job"] for r in res} >= {"prometheus", "driver", "collector"}, res


def test_every_dashboard_panel_query_returns_series(kube, release):
    """As tests/integration/test_prometheus.py does against a local run's Prometheus: each
    panel's query, template variables filled in as Grafana would, must return series (the
    linkemu panels excepted: no linkemu on Kubernetes)."""
    from torbed.backends.k8s import dashboards
    # A transfer must have finished in every group for the TTLB panels to have data.
    groups = set(yaml.safe_load(QUICKSTART.read_text())["clients"])
    _wait("a finished transfer in every group", lambda: {r["metric"]["group"] for r in _series(
        kube, f'sum by (group) (torbed_transfers_finished_total{{release="{REL}"}}) > 0')} == groups or False, 300)
    failed = _series(kube, f'torbed_transfers_failed_total{{release="{REL}"}}')
    start, end = release["t0"], time.time()
    empty, n = [], 0
    for name, model in dashboards.dashboards().items():
        for title, expr in dashboards.panel_queries(model):
            if title in NO_DATA_ON_K8S:
                continue
            # No transfer failed: the failure counters have no series yet (labelled by cause).
            if title == "Errors by cause" and not failed:
                continue
            q = dashboards.expand(expr, release=REL)
            n += 1
            if not _api(kube, "/api/v1/query_range", query=q, start=f"{start:.3f}", end=f"{end:.3f}",
                        step="5")["result"]:
                empty.append(f"{name}: {title}: {q}")
    print(f"{n} panel queries returned series"
          f"{'' if failed else ' (Errors by cause not run: no transfer failed)'}")
    assert n >= 15 and not empty, "\n".join(empty)
    for label, match, want in (("release", "up", {REL}), ("variant", "up", {"vanilla"}),
                               ("group", "torbed_transfers_started_total", groups)):
        got = set(_api(kube, f"/api/v1/label/{label}/values", **{"match[]": match}))
        assert want <= got, (label, got)


def test_egress_outside_the_release_is_blocked(kube, release, outside_listener):
    host, port, accepted = outside_listener
    wait_running(kube, f"{REL}-exit-0")
    probe = f'timeout 5 bash -c "exec 3<>/dev/tcp/{host}/{port}" && echo CONNECTED || echo BLOCKED'
    # Control: the results pod has no shaper and this cluster's CNI does not enforce
    # NetworkPolicy, so the address is reachable from the pod network...
    results_pod = kube.CoreV1Api().list_namespaced_pod(
        "default", label_selector=f"app.kubernetes.io/instance={REL},app.kubernetes.io/component=results").items[0]
    wait_running(kube, results_pod.metadata.name)
    assert "CONNECTED" in exec_in(kube, results_pod.metadata.name, "results", probe)
    n = len(accepted)
    # ...but not from an exit relay (whose exit policy accepts everything).
    out = exec_in(kube, f"{REL}-exit-0", "tor", probe)
    assert "BLOCKED" in out and len(accepted) == n, out
    # The release's own authorities are reachable from the relay.
    auth = kube.CoreV1Api().read_namespaced_service(f"{REL}-auth-0", "default").spec.cluster_ip
    assert "CONNECTED" in exec_in(kube, f"{REL}-exit-0", "tor",
                                f'timeout 5 bash -c "exec 3<>/dev/tcp/{auth}/7000" && echo CONNECTED || echo BLOCKED')


def test_helm_install_without_values_deploys_the_quickstart_and_helm_test_passes(kube, helm, release):
    assert 'scenario "quickstart"' in release["install"].stdout, release["install"].stdout
    t = subprocess.run([helm["bin"], "-n", "default", "test", REL, "--logs", "--timeout", "600s"],
                       capture_output=True, text=True, env=helm["env"])
    assert t.returncode == 0 and "Phase:          Succeeded" in t.stdout, t.stdout[-3000:] + t.stderr[-3000:]
    assert "ok: " in t.stdout and " fetched " in t.stdout, t.stdout[-3000:]
    print(t.stdout.splitlines()[-1] if t.stdout else "")


def test_results_service_takes_writes_only_with_the_release_token(kube, release):
    """From inside the release (a relay's collector, which writes its records there): a POST
    without the token is refused 401, with another 403, with the pod's own (the release's
    Secret) taken; the service logs each refusal with the caller's address."""
    wait_running(kube, f"{REL}-guard-0")
    script = r'''/opt/torbed/bin/python - <<'PY'
import os, urllib.request, urllib.error
url = os.environ["TORBED_RESULTS_URL"] + "/append/e2e-token-check.jsonl"
for name, token in (("none", None), ("wrong", "x" * 40), ("own", os.environ["TORBED_RESULTS_TOKEN"])):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, data=b'{"check": "%s"}\n' % name.encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(name, r.status)
    except urllib.error.HTTPError as e:
        print(name, e.code)
PY'''
    out = exec_in(kube, f"{REL}-guard-0", "collector", script)
    assert out.split() == ["none", "401", "wrong", "403", "own", "200"], out
    core = kube.CoreV1Api()
    results_pod = core.list_namespaced_pod(
        "default", label_selector=f"app.kubernetes.io/instance={REL},app.kubernetes.io/component=results").items[0]
    log = core.read_namespaced_pod_log(results_pod.metadata.name, "default", container="results")
    assert log.count("refused POST '/append/e2e-token-check.jsonl'") == 2, log[-2000:]
    # A trailing line that is not JSON: the Kubernetes client's exec stream hands back output
    # that parses as JSON as a Python object, whose str() has single quotes.
    got = exec_in(kube, results_pod.metadata.name, "results", "cat /results/e2e-token-check.jsonl; echo '#end'")
    assert got.split("#end")[0].strip() == '{"check": "own"}', got
