"""The nightly CronJob on a real cluster: installed in nightly mode, triggered by hand as
`kubectl create job --from=cronjob/...`, it runs a tiny matrix with `torbed nightly --backend
k8s` from inside the cluster under its own least-privilege service account, and leaves run
directories (with every pod's log), the history store and the night's report on its claim."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from conftest import REPO, leftovers

pytestmark = pytest.mark.e2e
RELEASE = "nightlye2e"
NS = "default"
ISOLATE = "isolation.allowedCIDRs={10.244.0.0/16,10.96.0.0/12}"


def _kubectl():
    out = subprocess.run(["bash", "-c", f"source {REPO}/hack/cluster/common.sh && echo $K8S_BIN/kubectl"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


def _wait_job(kube, name: str, timeout: float) -> str:
    batch = kube.BatchV1Api()
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = batch.read_namespaced_job(name, NS).status
        if st.succeeded:
            return "succeeded"
        if st.failed:
            return "failed"
        time.sleep(3)
    return "timeout"


def _read_claim(kube, helm_env, claim: str, image: str) -> dict:
    """What the history claim holds, read by a pod that mounts it (works on any cluster)."""
    script = ("import json,os,sqlite3,pathlib,subprocess;r=pathlib.Path('/var/lib/torbed');"
              "files=sorted(str(p.relative_to(r)) for p in r.rglob('*') if p.is_file());"
              "db=sqlite3.connect(r/'history.sqlite');"
              "runs=db.execute('select night,scenario,variant,status,backend from runs').fetchall();"
              "reps=[str(p.relative_to(r)) for p in r.glob('reports/*/nightly.json')];"
              "rep=json.loads((r/reps[0]).read_text()) if reps else None;"
              "print('CLAIM'+json.dumps({'files':files,'runs':runs,'report':rep}))")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{RELEASE}-reader", "namespace": NS},
           "spec": {"restartPolicy": "Never",
                    "securityContext": {"runAsUser": 10000, "runAsGroup": 10000, "fsGroup": 10000},
                    "containers": [{"name": "r", "image": image, "imagePullPolicy": "IfNotPresent",
                                    "command": ["/opt/torbed/bin/python", "-c", script],
                                    "volumeMounts": [{"name": "h", "mountPath": "/var/lib/torbed"}]}],
                    "volumes": [{"name": "h", "persistentVolumeClaim": {"claimName": claim}}]}}
    core = kube.CoreV1Api()
    core.create_namespaced_pod(NS, pod)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            phase = core.read_namespaced_pod(pod["metadata"]["name"], NS).status.phase
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(2)
        log = core.read_namespaced_pod_log(pod["metadata"]["name"], NS)
        line = next((x for x in log.splitlines() if x.startswith("CLAIM")), None)
        assert line, log[-3000:]
        return json.loads(line[len("CLAIM"):])
    finally:
        core.delete_namespaced_pod(pod["metadata"]["name"], NS, grace_period_seconds=0)


def test_nightly_cronjob_runs_a_night_and_keeps_the_history(kube, helm, images, tmp_path):
    assert any(t.startswith("torbed/nightly:") for t in images), images
    image = next(t for t in images if t.startswith("torbed/nightly:"))
    values = {"nightly": {
        "enabled": True, "suspend": True, "storage": {"keep": False}, "set": [ISOLATE],
        "definition": {"apiVersion": "torbed/v1", "kind": "Nightly", "name": "e2e",
                       "matrix": [{"scenario": "scenarios/quickstart.yaml", "variants": ["ewma-66"],
                                   "repetitions": 1, "duration": "20s"}],
                       "metrics": ["ttlb_s/*"], "lookback": 3, "min_history": 2}}}
    vf = tmp_path / "nightly-values.yaml"
    vf.write_text(yaml.safe_dump(values))
    env = helm["env"]
    inst = subprocess.run([helm["bin"], "install", RELEASE, str(REPO / "charts" / "torbed"), "-n", NS, "-f", str(vf)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert inst.returncode == 0, inst.stderr
    job = f"{RELEASE}-manual"
    try:
        kc = subprocess.run([_kubectl(), "-n", NS, "create", "job", f"--from=cronjob/{RELEASE}-nightly", job],
                            capture_output=True, text=True, timeout=60)
        assert kc.returncode == 0, kc.stderr
        t0 = time.time()
        state = _wait_job(kube, job, timeout=900)
        pods = kube.CoreV1Api().list_namespaced_pod(NS, label_selector=f"job-name={job}").items
        log = kube.CoreV1Api().read_namespaced_pod_log(pods[0].metadata.name, NS) if pods else ""
        print(f"nightly job {state} after {time.time() - t0:.0f} s")
        assert state == "succeeded", log[-5000:]
        claim = _read_claim(kube, env, f"{RELEASE}-nightly", image)
        files = claim["files"]
        # The run directory, with its report and every pod's log, the history, the night's report
        # and the runner's own log are on the claim.
        assert any(f.startswith("runs/quickstart-") and f.endswith("/run.json") for f in files), files
        assert any("/ewma-66/rep-0/transfers.jsonl" in f for f in files), files
        assert any("/ewma-66/rep-0/logs/" in f for f in files), files
        assert any(f.endswith("/report/summary.json") for f in files), files
        assert any(f.startswith("logs/nightly-") for f in files), files
        assert [r[1:] for r in claim["runs"]] == [["quickstart", "ewma-66", "ok", "k8s"]], claim["runs"]
        rep = claim["report"]
        assert rep and rep["nightly"] == "e2e" and rep["findings"], rep
        assert {f["status"] for f in rep["findings"]} == {"insufficient-history"}, rep["findings"]
        # The runner's releases are gone: only the nightly's own objects carry torbed's name.
        left = kube.CoreV1Api().list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=torbed").items
        assert [p.metadata.name for p in left if not p.metadata.name.startswith(RELEASE)] == [], log[-3000:]
    finally:
        subprocess.run([helm["bin"], "uninstall", RELEASE, "-n", NS, "--wait"], capture_output=True, env=env, timeout=180)
        kube.BatchV1Api().delete_namespaced_job(job, NS, propagation_policy="Background") \
            if any(j.metadata.name == job for j in kube.BatchV1Api().list_namespaced_job(NS).items) else None
    deadline = time.time() + 60
    while time.time() < deadline and leftovers(kube, RELEASE):
        time.sleep(2)
    assert leftovers(kube, RELEASE) == []
    claims = [c.metadata.name for c in kube.CoreV1Api().list_namespaced_persistent_volume_claim(NS).items]
    assert f"{RELEASE}-nightly" not in claims
