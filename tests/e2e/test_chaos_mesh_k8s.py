"""Chaos Mesh itself carries out a scenario's kill fault, on time: its controller-manager,
built from its Go module by hack/cluster/chaos-mesh.sh (image FROM scratch), runs in the cluster;
`torbed run --backend k8s --set chaosMesh.enabled=true` creates the chart's PodChaos (kept
as a manifest in the release's <release>-faults ConfigMap) at the fault's time, the
controller deletes the relay's pod and its StatefulSet recreates it.

Chaos Mesh carries out a one-shot PodChaos (pod-kill) as soon as it exists, paused or not
(controllers/common/desiredphase decides "running" for one-shot kinds before it looks at the
pause annotation): the chart used to create it paused at `helm install`, which killed the
relay at install time. This test is the one that found it; it now checks that the pod's UID
changes only after the fault's time.

What this does not exercise: chaos-daemon (container-kill, network, stress and IO chaos),
which is neither built nor run here (no sch_netem in this kernel, and it would replace the
pod's root qdisc that the shaper owns), and Chaos Mesh's admission webhooks (not registered;
the CRD schemas still validate server-side, see test_k8s.py)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
import yaml

from conftest import QUICKSTART, REPO, leftovers, records, torbed_run

pytestmark = pytest.mark.e2e
CHAOS_MESH = ["bash", str(REPO / "hack" / "cluster" / "chaos-mesh.sh")]


@pytest.fixture(scope="module")
def chaos_mesh(cluster):
    """The controller-manager running in namespace chaos-mesh; removed afterwards."""
    t0 = time.time()
    b = subprocess.run([*CHAOS_MESH, "build"], capture_output=True, text=True)
    if b.returncode != 0:
        pytest.fail(f"Chaos Mesh's controller-manager could not be built from its Go module:\n"
                    f"{b.stderr[-3000:]}", pytrace=False)
    tarball = b.stdout.strip().splitlines()[-1]
    print(f"controller-manager image ready after {time.time() - t0:.1f} s ({b.stderr.strip()[-200:]})")
    if cluster["local"]:   # also when KUBECONFIG already points at it (make e2e-cluster)
        ld = subprocess.run(["bash", str(REPO / "hack" / "cluster" / "cluster.sh"), "load-image", tarball],
                            capture_output=True, text=True)
        assert ld.returncode == 0, ld.stdout[-3000:] + ld.stderr[-3000:]
    env = {**os.environ, "KUBECONFIG": cluster["kubeconfig"]}
    t0 = time.time()
    up = subprocess.run([*CHAOS_MESH, "up"], capture_output=True, text=True, env=env)
    try:
        assert up.returncode == 0, f"hack/cluster/chaos-mesh.sh up failed:\n{up.stdout[-2000:]}\n{up.stderr[-4000:]}"
        print(f"controller-manager running {time.time() - t0:.1f} s after `up`")
        yield env
    finally:
        subprocess.run([*CHAOS_MESH, "down"], capture_output=True, text=True, env=env)


class PodWatch:
    """Every (time, pod, uid) seen for the middle relay's pods, polled twice a second while
    the run goes on (the run's release name is not known in advance)."""

    def __init__(self, kube, selector: str):
        self.core, self.selector = kube.CoreV1Api(), selector
        self.seen: dict[tuple[str, str], list[float]] = {}   # (pod, uid) -> [first seen, last seen]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                pods = self.core.list_namespaced_pod("default", label_selector=self.selector).items
            except Exception:
                pods = []
            now = time.time()
            for p in pods:
                if p.metadata.deletion_timestamp:
                    continue   # being deleted: the fault has happened
                span = self.seen.setdefault((p.metadata.name, p.metadata.uid), [now, now])
                span[1] = now
            self.stop.wait(0.5)

    def close(self):
        self.stop.set()
        self.thread.join()


def test_chaos_mesh_kills_the_relay_at_the_faults_time(kube, chaos_mesh, tmp_path):
    data = yaml.safe_load(QUICKSTART.read_text())
    data["faults"] = [{"at": "20s", "kind": "kill", "target": "middle0"}]
    scenario = tmp_path / "cm-kill.yaml"
    scenario.write_text(yaml.safe_dump(data))
    watch = PodWatch(kube, "app.kubernetes.io/component=relay,torbed.io/group=middle")
    try:
        p, run_dir = torbed_run(tmp_path, scenario, "--variant", "ewma-66", "--duration", "45s",
                                "--set", "chaosMesh.enabled=true")
    finally:
        watch.close()
    assert run_dir, p.stdout[-3000:] + p.stderr[-3000:]
    rep = run_dir / "ewma-66" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    rel = meta["release"]
    assert meta["chaos_mesh"] is True, meta
    # The timeline: planned at workload start + 20 s, applied then by creating the PodChaos.
    recs = records(rep / "faults.jsonl")
    planned = next(r for r in recs if r["event"] == "planned")
    apply = next(r for r in recs if r["event"] == "apply")
    assert planned["t_apply_planned"] == pytest.approx(meta["t_workload_start"] + 20, abs=0.01)
    assert apply["t_planned"] == planned["t_apply_planned"] and "error" not in apply, apply
    assert 0 <= apply["t"] - apply["t_planned"] < 1.5, apply   # the backend wakes for it
    assert apply["done"].startswith(f"Chaos Mesh PodChaos {rel}-fault-0 created"), apply
    assert apply["pods"] == [f"{rel}-middle-0"]
    # The pod: one UID from install until the fault's time, a new one only after it.
    mine = sorted((span, uid) for (pod, uid), span in watch.seen.items() if pod == f"{rel}-middle-0")
    assert len(mine) == 2, mine
    (first_span, uid0), (second_span, uid1) = mine
    print(f"middle-0: uid {uid0[:8]} seen {first_span[0] - apply['t']:+.1f} .. {first_span[1] - apply['t']:+.1f} s "
          f"around the fault's apply; uid {uid1[:8]} from {second_span[0] - apply['t']:+.1f} s; "
          f"apply {apply['t'] - apply['t_planned']:.2f} s after planned")
    assert first_span[0] < meta["t_workload_start"], "the relay's first pod did not live until the workload"
    assert first_span[1] > apply["t_planned"] - 1.5, "the relay's pod was gone before the fault's time"
    assert apply["t_planned"] - 1 < second_span[0] < apply["t"] + 30, (second_span, apply)
    # It was Chaos Mesh: the controller's event on the PodChaos (torbed deleted no pod itself).
    ev = kube.CoreV1Api().list_namespaced_event("default", field_selector=f"involvedObject.name={rel}-fault-0").items
    assert any(e.reason == "Applied" for e in ev), [(e.reason, e.message) for e in ev]
    assert "pod deleted" not in json.dumps(meta["faults"])
    # ...and what the PodChaos said it did, kept in meta.json before teardown deleted it.
    assert meta["chaos_objects"] == {f"{rel}-fault-0": {"kind": "PodChaos", "injected": [f"default/{rel}-middle-0"]}}
    # The recreated relay came back as itself and carried transfers again.
    transfers = records(rep / "transfers.jsonl")
    assert [t for t in transfers if t["status"] == "ok" and t["t_start"] > second_span[0]], \
        "no transfer succeeded after middle0 came back"
    # Teardown deleted the PodChaos and everything of the release.
    left = kube.CustomObjectsApi().list_namespaced_custom_object(
        "chaos-mesh.org", "v1alpha1", "default", "podchaos", label_selector=f"app.kubernetes.io/instance={rel}")
    assert left["items"] == []
    assert leftovers(kube, rel) == []
