"""End-to-end tests on a real Kubernetes cluster (`make e2e`).

The cluster: the one KUBECONFIG points to when it is reachable (kind, k3s, a real cluster:
the images must be available to its nodes), else the local single-node cluster that
hack/cluster/cluster.sh builds and starts (and stops again at the end of the session). The images
are built (`python -m torbed.images`, cached) and loaded into the local cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "chart"))
TORBED = [sys.executable, "-m", "torbed.cli"]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
# The local cluster's pod and Service ranges: the shapers drop everything else.
ISOLATE = "isolation.allowedCIDRs={10.244.0.0/16,10.96.0.0/12}"


def _reachable(kubeconfig: str) -> bool:
    from kubernetes import client, config
    try:
        config.load_kube_config(config_file=kubeconfig)
        client.VersionApi().get_code(_request_timeout=5)
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def cluster():
    """{'kubeconfig': path, 'local': bool (hack/cluster/cluster.sh's: the images are loaded into it),
    'ours': bool (brought up here: torn down afterwards)}."""
    existing = os.environ.get("KUBECONFIG")
    if existing and _reachable(existing):
        # KUBECONFIG may be the local cluster's own (`make e2e-cluster` exports it): its nodes
        # get the images only from us, or the tests would run whatever images were loaded last.
        env = subprocess.run(["bash", str(REPO / "hack" / "cluster" / "cluster.sh"), "env"], capture_output=True, text=True)
        local = f"KUBECONFIG={existing}" in env.stdout
        yield {"kubeconfig": existing, "local": local, "ours": False}
        return
    up = subprocess.run(["bash", str(REPO / "hack" / "cluster" / "cluster.sh"), "up"], capture_output=True, text=True)
    if up.returncode != 0:
        pytest.fail(f"hack/cluster/cluster.sh up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}", pytrace=False)
    m = re.search(r"export KUBECONFIG=(\S+)", up.stdout + up.stderr)
    assert m, up.stdout
    kubeconfig = m.group(1).strip("'\"")
    os.environ["KUBECONFIG"] = kubeconfig
    try:
        yield {"kubeconfig": kubeconfig, "local": True, "ours": True, "bringup": up.stdout}
    finally:
        subprocess.run(["bash", str(REPO / "hack" / "cluster" / "cluster.sh"), "down"], capture_output=True, text=True)


@pytest.fixture(scope="session")
def images(cluster):
    """Build the images (cached) and, on the local cluster, load them into its runtime."""
    # The default images (Prometheus: tests/e2e/test_prometheus_k8s.py; locust:
    # tests/e2e/test_load_k8s.py) plus the nightly runner (tests/e2e/test_nightly.py).
    b = subprocess.run([sys.executable, "-m", "torbed.images", "--images",
                        "dirauth,client,locust,relay,prometheus,nightly"],
                       capture_output=True, text=True, cwd=REPO)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    tags = re.findall(r"(torbed/[a-z]+:[a-z0-9.-]+)", b.stdout)
    tags = sorted({t for t in tags if not t.endswith("-arm64")})
    assert tags, b.stdout
    if cluster["local"]:
        t0 = time.time()
        ld = subprocess.run(["bash", str(REPO / "hack" / "cluster" / "cluster.sh"), "load-image", *tags],
                            capture_output=True, text=True)
        assert ld.returncode == 0, ld.stdout[-3000:] + ld.stderr[-3000:]
        print(f"loaded {len(tags)} images into the cluster in {time.time() - t0:.1f} s")
    return tags


@pytest.fixture(scope="session")
def kube(cluster, images):
    from kubernetes import client, config
    config.load_kube_config(config_file=cluster["kubeconfig"])
    return client


@pytest.fixture(scope="session")
def helm():
    from test_chart import tool_env
    bin_dir, env = tool_env()
    return {"bin": str(Path(bin_dir) / "helm"), "env": env}


def uninstall(kube, helm, release: str) -> list[str]:
    """helm uninstall the release (waiting for it), then wait up to 120 s for everything
    labelled with it to go; returns what is left (leftovers)."""
    subprocess.run([helm["bin"], "-n", "default", "uninstall", release, "--wait", "--timeout", "180s"],
                   capture_output=True, text=True, env=helm["env"])
    deadline = time.time() + 120
    while leftovers(kube, release) and time.time() < deadline:
        time.sleep(2)
    return leftovers(kube, release)


def leftovers(kube, release: str, namespace: str = "default") -> list[str]:
    """Everything labelled with the release that still exists."""
    sel = f"app.kubernetes.io/instance={release}"
    core, apps, batch = kube.CoreV1Api(), kube.AppsV1Api(), kube.BatchV1Api()
    net, rbac = kube.NetworkingV1Api(), kube.RbacAuthorizationV1Api()
    found = []
    for kind, lister in (("pod", core.list_namespaced_pod), ("service", core.list_namespaced_service),
                         ("secret", core.list_namespaced_secret), ("configmap", core.list_namespaced_config_map),
                         ("serviceaccount", core.list_namespaced_service_account),
                         ("statefulset", apps.list_namespaced_stateful_set),
                         ("deployment", apps.list_namespaced_deployment), ("job", batch.list_namespaced_job),
                         ("networkpolicy", net.list_namespaced_network_policy),
                         ("role", rbac.list_namespaced_role), ("rolebinding", rbac.list_namespaced_role_binding)):
        found += [f"{kind}/{o.metadata.name}" for o in lister(namespace, label_selector=sel).items]
    return found


@contextlib.contextmanager
def listening_outside():
    """A TCP listener on an address outside every allowed range (TEST-NET-1, an address of
    this node): reachable from the pod network unless something blocks it. Yields (host,
    port, the peers it accepted)."""
    # On lo: a local address of the node, whatever interface (this kernel has no dummy links).
    subprocess.run(["ip", "addr", "add", "192.0.2.1/32", "dev", "lo"], check=True)
    try:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("192.0.2.1", 8099))
        srv.listen(16)
        accepted = []

        def serve():
            while True:
                try:
                    c, a = srv.accept()
                except OSError:
                    return
                accepted.append(a)
                c.close()
        threading.Thread(target=serve, daemon=True).start()
        try:
            yield ("192.0.2.1", 8099, accepted)
        finally:
            # shutdown wakes the thread blocked in accept(); close alone would leave the socket
            # listening (the next test's bind: "Address already in use").
            srv.shutdown(socket.SHUT_RDWR)
            srv.close()
    finally:
        subprocess.run(["ip", "addr", "del", "192.0.2.1/32", "dev", "lo"], check=False)


@pytest.fixture
def outside_listener():
    with listening_outside() as listener:
        yield listener


# Shared by the test modules: `torbed run --backend k8s`, records, exec in a pod.

def torbed_run(tmp_path, scenario: Path, *extra) -> tuple[subprocess.CompletedProcess, Path | None]:
    p = subprocess.run([*TORBED, "run", str(scenario), "--backend", "k8s", "--out", str(tmp_path / "runs"),
                        "--set", ISOLATE, *extra], capture_output=True, text=True, cwd=REPO, timeout=1200)
    runs = sorted((tmp_path / "runs").glob("*/run.json"))
    return p, (runs[-1].parent if runs else None)


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def exec_in(kube, pod: str, container: str, script: str) -> str:
    from kubernetes.stream import stream
    return stream(kube.CoreV1Api().connect_get_namespaced_pod_exec, pod, "default", container=container,
                  command=["bash", "-c", script], stderr=True, stdin=False, stdout=True, tty=False)


def wait_running(kube, pod: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            p = kube.CoreV1Api().read_namespaced_pod(pod, "default")
            if p.status.phase == "Running" and all(c.ready for c in p.status.container_statuses or []):
                return
        except Exception:
            pass
        time.sleep(1)
    raise AssertionError(f"{pod} not running after {timeout} s")
