"""pause, restart and cpu faults on Kubernetes without Chaos Mesh (the paths that run on this
cluster; docs/faults.md): one `torbed run --backend k8s` of the quickstart with a CPU limit
lowered in place on exit0, then a pause of exit0, then a restart of guard0. What the test
sees from outside the run: the tor container's CFS quota (read in the pod while the run
goes on), the transfers (none completes while exit0, on every path, is stopped), the guard's
container restart count, and faults.jsonl."""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml

from conftest import QUICKSTART, exec_in, leftovers, records, torbed_run

pytestmark = pytest.mark.e2e
CPU_QUOTA = ("cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || "
             "cut -d' ' -f1 /sys/fs/cgroup/cpu.max")   # cgroup v1 here; v2 elsewhere


class QuotaWatch:
    """(t0, t1, CFS quota of exit0's tor container) about once a second during the run: the
    quota was read at some time between t0 and t1 (an exec takes a while)."""

    def __init__(self, kube):
        self.kube, self.samples, self.stop = kube, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        core = self.kube.CoreV1Api()
        while not self.stop.is_set():
            try:
                pods = core.list_namespaced_pod(
                    "default", label_selector="app.kubernetes.io/component=relay,torbed.io/group=exit").items
                running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
                if running:
                    t0 = time.time()
                    out = exec_in(self.kube, running[0].metadata.name, "tor", CPU_QUOTA).strip()
                    self.samples.append((t0, time.time(), out))
            except Exception:
                pass
            self.stop.wait(1.0)

    def close(self):
        self.stop.set()
        self.thread.join()


def test_pause_restart_and_cpu_faults_on_kubernetes(kube, tmp_path):
    data = yaml.safe_load(QUICKSTART.read_text())
    # Gaps sized from a run on the 2-core machine: the kubelet resized the quota 0.5 s after
    # the patch and back in 0.2 s (the watch reads it about once a second: 7 s during, 5 s
    # after), and the first transfer succeeded 1.4 s after guard0's restart (11 s left here).
    data["faults"] = [{"at": "5s", "kind": "cpu", "target": "exit0", "cpu": "5%", "duration": "9s"},
                      {"at": "19s", "kind": "pause", "target": "exit0", "duration": "8s"},
                      {"at": "31s", "kind": "restart", "target": "guard0"}]
    scenario = tmp_path / "faults.yaml"
    scenario.write_text(yaml.safe_dump(data))
    watch = QuotaWatch(kube)
    try:
        p, run_dir = torbed_run(tmp_path, scenario, "--variant", "vanilla", "--duration", "42s")
    finally:
        watch.close()
    assert run_dir, p.stdout[-3000:] + p.stderr[-3000:]
    rep = run_dir / "vanilla" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    rel = meta["release"]
    assert meta["chaos_mesh"] is False and not meta.get("teardown_errors"), meta
    recs = records(rep / "faults.jsonl")
    ev = {(r["fault"], r["event"]): r for r in recs}
    for i in range(3):
        assert not [r for r in recs if r["fault"] == i and r.get("error")], recs
        assert 0 <= ev[(i, "apply")]["t"] - ev[(i, "apply")]["t_planned"] < 1.5, ev[(i, "apply")]
    for i in (0, 1):   # undone at the end of their duration, on time
        assert ev[(i, "undo")]["reason"] == "duration" and 0 <= ev[(i, "undo")]["t"] - ev[(i, "undo")]["t_planned"] < 1.5

    # cpu: the kubelet changed the container's CFS quota in place (no restart) and set it back.
    cpu_apply, cpu_undo = ev[(0, "apply")], ev[(0, "undo")]
    assert cpu_apply["limits_before"] == {f"{rel}-exit-0": "1"}, cpu_apply
    quota = lambda t0, t1: {q for a, b, q in watch.samples if t0 < a and b < t1}  # noqa: E731
    before = quota(meta["t_workload_start"] - 30, cpu_apply["t"])
    during = quota(cpu_apply["t_done"], cpu_undo["t"])
    after = quota(cpu_undo["t_done"], ev[(1, "apply")]["t"])
    print(f"exit0's tor CFS quota (us per 100 ms): before {before}, during the cpu fault {during}, after {after}; "
          f"the kubelet applied the resize {cpu_apply['resize_s']} s after the patch")
    assert before == {"100000"} and during == {"5000"} and after == {"100000"}, \
        [(round(a - cpu_apply["t"], 2), round(b - cpu_apply["t"], 2), q) for a, b, q in watch.samples]

    # pause: nothing completes while exit0's tor is stopped (every path ends there), then it does.
    pause, resume = ev[(1, "apply")], ev[(1, "undo")]
    assert pause["done"].startswith(f"SIGSTOP tor in {rel}-exit-0 (pid "), pause
    transfers = records(rep / "transfers.jsonl")
    done_while = [t for t in transfers if t.get("t_last_byte") and pause["t_done"] + 3.5 < t["t_last_byte"] < resume["t"]]
    assert not done_while, done_while
    assert [t for t in transfers if t["status"] == "ok" and t["t_last_byte"] > resume["t_done"]], \
        "no transfer completed after exit0 resumed"

    # restart: guard0's tor container restarted once in the same pod; transfers afterwards.
    restart = ev[(2, "apply")]
    assert restart["pods"] == [f"{rel}-guard-0"] and restart["done"].startswith("SIGTERM to tor"), restart
    assert meta["pod_restarts"].get(f"{rel}-guard-0") == 1, meta["pod_restarts"]
    ok_after = [t for t in transfers if t["status"] == "ok" and t["t_start"] > restart["t"]]
    print(f"after the restart of guard0: {len(ok_after)} transfers succeeded (first started "
          f"{min((t['t_start'] for t in ok_after), default=float('nan')) - restart['t']:.1f} s after it)")
    assert ok_after, "no transfer succeeded after guard0's tor restarted"
    # meta.json lists each applied fault with its undo time; the report has a Faults section.
    assert [f["kind"] for f in meta["faults"]] == ["cpu", "pause", "restart"]
    assert leftovers(kube, rel) == []
