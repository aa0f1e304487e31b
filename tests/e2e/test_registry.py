"""Images and chart from a registry, as a cluster user gets them: `make images-push` puts every
built architecture of each image under one tag (a manifest list) and the chart as an OCI
artifact into the local registry (hack/images/registry.sh); the cluster then installs the chart
from the registry and its nodes pull every image from it (pullPolicy Always: the images
imported for the other tests are not used), and `helm test` passes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO, uninstall

pytestmark = pytest.mark.e2e
REGISTRY = "127.0.0.1:5000"
ISOLATE = "isolation.allowedCIDRs={10.244.0.0/16,10.96.0.0/12}"


@pytest.fixture(scope="module")
def registry(images):
    was_up = subprocess.run(["bash", str(REPO / "hack" / "images" / "registry.sh"), "status"], capture_output=True).returncode == 0
    up = subprocess.run(["bash", str(REPO / "hack" / "images" / "registry.sh"), "up"], capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    yield REGISTRY
    if not was_up:   # leave nothing running that this test started
        subprocess.run(["bash", str(REPO / "hack" / "images" / "registry.sh"), "down"], capture_output=True)


def _local_image(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def _manifest_list(repo: str, tag: str) -> dict:
    req = urllib.request.Request(f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", headers={
        "Accept": "application/vnd.docker.distribution.manifest.list.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_chart_and_images_from_the_registry_run_the_quickstart(kube, helm, registry):
    from torbed import __version__, images as imgs
    p = subprocess.run([sys.executable, "-m", "torbed.backends.k8s.registry", "--registry", registry, "--chart",
                        "--variants", "vanilla,ewma"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    host = imgs.host_arch()
    for repo, tag in (("torbed/client", __version__), ("torbed/dirauth", __version__),
                      ("torbed/relay", f"vanilla-{__version__}")):
        ml = _manifest_list(repo, tag)
        assert ml["mediaType"].endswith("manifest.list.v2+json"), ml
        arches = {m["platform"]["architecture"] for m in ml["manifests"]}
        assert host in arches, (repo, arches)
        # One tag for every architecture built here: the arm64 build (the emulated Pi's relay
        # image, tests/e2e/test_pi_k8s.py) must be under the same tag when it exists locally.
        built = {a for a in ("amd64", "arm64") if _local_image(f"{repo}:{tag}" + ("" if a == host else f"-{a}"))}
        assert built <= arches, (repo, built, arches)
    rel = "fromreg"
    base = [helm["bin"], "-n", "default"]
    try:
        t0 = time.time()
        inst = subprocess.run([*base, "install", rel, f"oci://{registry}/charts/torbed", "--version", __version__,
                               "--plain-http", "--set", f"images.registry={registry}", "--set",
                               "images.pullPolicy=Always", "--set", ISOLATE, "--set", "measure.duration=30s",
                               "--timeout", "300s"], capture_output=True, text=True, env=helm["env"])
        assert inst.returncode == 0, inst.stdout + inst.stderr
        t = subprocess.run([*base, "test", rel, "--logs", "--timeout", "600s"], capture_output=True, text=True,
                           env=helm["env"])
        assert t.returncode == 0 and "ok: " in t.stdout, t.stdout[-3000:] + t.stderr[-3000:]
        print(f"installed from the registry and a transfer crossed in {time.time() - t0:.0f} s")
        pods = kube.CoreV1Api().list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={rel}")
        refs = {c.image for p in pods.items for c in (p.status.container_statuses or [])}
        assert refs and all(r.startswith(f"{registry}/") for r in refs), refs
    finally:
        left = uninstall(kube, helm, rel)
    assert left == []
