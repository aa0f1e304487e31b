"""One meaning per fault kind on every backend (issue 42): kill = SIGKILL and the relay stays
down, restart = SIGTERM then start after the duration, cpu = a CFS quota; the mechanism in
each apply record and in the report; the kubelet's crash back-off refused where a restart's
schedule would meet it. The Kubernetes actions run against a stub context here (what they
ask the pod to do); tests/e2e/test_faults_k8s.py runs them on a real cluster."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from torbed import scenario
from torbed.analysis.render import _fault_blocks
from torbed.backends.k8s import backoff
from torbed.backends.k8s import faults as k8s
from torbed.backends.local import faults as local
from torbed.errors import InputError, RunFailed
from torbed.fault_schedule import FaultRunner

from tests.unit.test_faults import with_faults


def test_both_backends_have_a_mechanism_for_every_kind():
    assert set(k8s.KINDS) == set(local.FAULTS) == set(scenario.FAULT_KINDS)
    for kinds in (k8s.KINDS, local.FAULTS):
        assert all(cls.mechanism is not None or "mechanism" in cls.apply.__code__.co_names
                   for cls in kinds.values()), kinds


@pytest.mark.parametrize("exit_no, since, wait", [
    (1, None, 0), (2, 5.0, 10), (3, 5.0, 20), (4, 5.0, 40), (8, 5.0, 300), (20, 1.0, 300),
    (3, 601.0, 0),   # more than twice the maximum since the last exit: the kubelet starts over
])
def test_kubelet_backoff(exit_no, since, wait):
    assert backoff.kubelet_backoff_s(exit_no, since) == wait


def _problems(*faults, duration="20m"):
    data = with_faults(*faults)
    data["measure"]["duration"] = duration
    return backoff.problems(scenario.parse(data))


def test_backoff_refuses_a_restart_whose_downtime_it_would_lengthen():
    r = lambda at, d=None, t="middle1": {"at": at, "kind": "restart", "target": t,  # noqa: E731
                                         **({"duration": d} if d else {})}
    assert _problems(r("10s"), r("20s", t="middle0")) == []          # two pods, one exit each
    [(field, why)] = _problems(r("10s"), r("20s"))
    assert field == "faults[1].duration" and "exit #2" in why and "waits 10 s" in why and "10s or more" in why
    assert _problems(r("10s"), r("20s", "10s"), r("40s", "20s")) == []
    [(field, why)] = _problems(r("10s"), r("20s", "10s"), r("40s", "19s"))
    assert field == "faults[2].duration" and "exit #3" in why and "waits 20 s" in why
    # A group restart is each of its pods' exit; 601 s apart the count starts again.
    assert [f for f, _ in _problems(r("10s", t="middle"), r("20s", t="middle1"))] == ["faults[1].duration"]
    assert _problems(r("10s"), r("611s")) == []


def test_k8s_preflight_refuses_the_backoff_with_file_and_field_and_cli_exits_2(tmp_path):
    import subprocess
    import sys

    import yaml
    from torbed.backends.k8s.backend import K8sBackend
    data = with_faults({"at": "10s", "kind": "restart", "target": "middle1"},
                       {"at": "20s", "kind": "restart", "target": "middle1"})
    with pytest.raises(InputError, match=r"^s\.yaml: faults\[1\]\.duration: restart of middle1 at 20s"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(scenario.parse(data))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    p = subprocess.run([sys.executable, "-m", "torbed.cli", "run", "--backend", "k8s", "--out", str(tmp_path / "runs"),
                        str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "faults[1].duration" in p.stderr and str(path) in p.stderr.replace("\n", "")
    assert "Traceback" not in p.stderr


class PodCtx:
    """The Kubernetes actions' context without a cluster: what each pod was asked to do."""

    def __init__(self, chaos=None, daemon_problem=None, restarts=0):
        self.calls, self.chaos, self._daemon, self.restarts = [], chaos or {}, daemon_problem, restarts
        self.checked = []
        self.plan = SimpleNamespace(node=lambda n: SimpleNamespace(group=n.rstrip("0123456789"), index=n[-1]))

    def pods(self, nodes):
        return [f"r-{self.plan.node(n).group}-{self.plan.node(n).index}" for n in nodes]

    def chaos_object(self, i):
        return self.chaos.get(i)

    def daemon_problem(self):
        return self._daemon

    def tor_exits(self, pod):
        return {"restarts": self.restarts, "last_exit": None}

    def exec_tor(self, pod, script, what):
        self.calls.append((pod, script))
        if "kill -" in script:
            return "signalled: 42"
        return "held:1" if "touch" in script else "held:0"

    def signal_tor(self, pod, sig, hold=False):
        return k8s.Ctx.signal_tor(self, pod, sig, hold)

    def hold(self, pod, on, wait_s=0.0):
        return k8s.Ctx.hold(self, pod, on, wait_s)

    def check_gone(self, pod, pids, sig, wait_s=3.0):
        self.checked.append((pod, pids, sig))

    def create(self, obj):
        self.calls.append(("create", obj["spec"]["action"]))
        return f"Chaos Mesh PodChaos {obj['metadata']['name']} created"

    def wait_injected(self, name, want):
        self.calls.append(("wait", name, want))
        return {"object": name, **k8s.chaos_status(PODCHAOS), "t_seen": 1.0}


# A PodChaos container-kill's status as Chaos Mesh's controller writes it (the fields torbed reads).
T_APPLY = 1795820462.0   # 2026-11-27T23:01:02Z
PODCHAOS = {"kind": "PodChaos", "status": {"experiment": {"containerRecords": [
    {"id": "default/r-middle-0/tor", "phase": "Injected", "selectorKey": ".", "injectedCount": 1, "events": [
        {"operation": "Apply", "type": "Failed", "timestamp": "2026-11-27T23:01:01Z", "message": "rpc error"},
        {"operation": "Apply", "type": "Succeeded", "timestamp": "2026-11-27T23:01:02Z"}]}]}}}


def _fault(**kw):
    return scenario.parse(with_faults(kw)).faults[0]


def test_k8s_kill_is_sigkill_with_the_pod_held_on_either_path():
    f = _fault(at="10s", kind="kill", target="middle0")
    ctx = PodCtx()
    act = k8s.Kill(0, f, ["middle0"])
    act.apply(ctx)
    [(pod, script)] = ctx.calls
    assert pod == "r-middle-0" and script.startswith(f"touch {k8s.HOLD} &&") and "kill -KILL $p" in script
    assert act.record["signal"] == "SIGKILL" and act.mechanism.startswith("torbed: SIGKILL")
    assert ctx.checked == [("r-middle-0", "42", "SIGKILL")]   # the signalled tor is checked gone
    obj = {"metadata": {"name": "x-fault-0"}, "spec": {"action": "container-kill"}}
    ctx = PodCtx(chaos={0: obj})   # chaos-daemon runs: it sends the SIGKILL, after the hold
    act = k8s.Kill(0, f, ["middle0"])
    act.apply(ctx)
    assert [c[1].split()[0] for c in ctx.calls] == ["touch", "container-kill", "x-fault-0"]
    assert act.mechanism.startswith("Chaos Mesh PodChaos container-kill")
    # The apply record has Chaos Mesh's own report of the kill, waited for (one pod).
    assert ctx.calls[2] == ("wait", "x-fault-0", 1) and act.record["chaos_mesh"]["t_injected"] == T_APPLY
    ctx = PodCtx(chaos={0: obj}, daemon_problem="no chaos-daemon pod runs")
    act = k8s.Kill(0, f, ["middle0"])
    act.apply(ctx)
    assert "kill -KILL" in ctx.calls[0][1] and act.record["chaos_mesh_not_used"] == "no chaos-daemon pod runs"


def test_k8s_restart_is_sigterm_held_for_its_duration_and_released_only_on_time():
    f = _fault(at="10s", kind="restart", target="middle0", duration="5s")
    ctx = PodCtx(restarts=1)
    act = k8s.Restart(0, f, ["middle0"])
    act.apply(ctx)
    assert ctx.calls[0][1].startswith(f"touch {k8s.HOLD} &&") and "kill -TERM $p" in ctx.calls[0][1]
    assert act.record["signal"] == "SIGTERM" and act.record["kubelet_backoff_s"] == {"r-middle-0": 10.0}
    ctx.calls.clear()
    assert act.undo(ctx, "duration").startswith("hold released")
    assert ctx.calls == [("r-middle-0", f"rm -f {k8s.HOLD} && echo held:0")]
    act.apply(ctx)
    ctx.calls.clear()
    assert act.undo(ctx, "teardown").startswith("not started again") and ctx.calls == []
    f0 = _fault(at="10s", kind="restart", target="middle0")   # no downtime: no hold
    ctx = PodCtx()
    k8s.Restart(0, f0, ["middle0"]).apply(ctx)
    assert "touch" not in ctx.calls[0][1] and "kill -TERM" in ctx.calls[0][1]


def test_a_failed_hold_fails_the_fault_and_a_container_not_yet_started_is_waited_for():
    ctx = PodCtx()
    ctx.exec_tor = lambda pod, script, what: "rm: cannot remove: Read-only file system"
    with pytest.raises(RunFailed, match="could not remove"):
        k8s.Ctx.hold(ctx, "r-middle-0", False)
    answers = [RunFailed('exec in r-middle-0 (fault hold): container not found ("tor")')] * 2 + ["held:0"]

    def exec_tor(pod, script, what):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a
    ctx.exec_tor = exec_tor
    assert k8s.Ctx.hold(ctx, "r-middle-0", False, wait_s=5) >= 1.0 and answers == []
    answers[:] = [RunFailed('exec in r-middle-0 (fault hold): container not found ("tor")')] * 3
    with pytest.raises(RunFailed, match="container not found"):
        k8s.Ctx.hold(ctx, "r-middle-0", False, wait_s=0.6)


def test_the_mechanism_is_in_faults_jsonl_and_the_report(tmp_path):
    class Rep:
        dir, variant, index = tmp_path, "vanilla", 0
        meta = {"faults": []}
        console = SimpleNamespace(log=lambda *a: None)
        scenario = scenario.parse(with_faults({"at": "1s", "kind": "kill", "target": "middle0"}))

        def write_meta(self):
            pass

    runner = FaultRunner(Rep(), 0.0, SimpleNamespace(plan=None), {"kill": local.Kill})
    runner.ctx.sup = SimpleNamespace(kill=lambda n: None)
    runner.tick(2.0)
    recs = [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]
    apply = [r for r in recs if r["event"] == "apply"][0]
    assert apply["mechanism"] == "torbed supervisor: SIGKILL to tor"
    assert Rep.meta["faults"][0]["mechanism"] == apply["mechanism"]
    row = {"variant": "v", "rep": 0, "fault": 0, "what": "kill middle0", "mechanism": apply["mechanism"],
           "apply_s": 1.0, "undo_s": None, "undone_at_end": False, "before": None, "during": None,
           "after": None, "recover_s": None}
    table = [b for b in _fault_blocks({"faults": [row]}) if b[0] == "table"][0]
    assert table[1][3] == "mechanism" and table[2][0][3] == "torbed supervisor: SIGKILL to tor"


def test_kill_on_kubernetes_notices_a_tor_that_survived_its_signal():
    """Ctx.check_gone's script, run by real bash over real processes: a process still running
    is reported (a SIGKILL from inside a PID namespace to its init is ignored without error),
    a zombie or a pid that is gone counts as ended."""
    import subprocess
    import types

    from torbed.backends.k8s import faults as k8s_faults
    from torbed.errors import RunFailed

    def exec_tor(pod, script, what):
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout
    ctx = types.SimpleNamespace(exec_tor=exec_tor)
    live = subprocess.Popen(["sleep", "30"])
    zombie = subprocess.Popen(["true"])          # not waited for: a zombie until the test ends
    try:
        zombie_pid = zombie.pid
        import time
        time.sleep(0.3)
        k8s_faults.Ctx.check_gone(ctx, "pod", f"{zombie_pid} 999999", "SIGKILL", wait_s=1.0)
        with pytest.raises(RunFailed, match=f"still runs .*alive:{live.pid}"):
            k8s_faults.Ctx.check_gone(ctx, "pod", f"{live.pid} {zombie_pid}", "SIGKILL", wait_s=1.0)
    finally:
        live.kill()
        live.wait()
        zombie.wait()


def test_chaos_mesh_status_gives_injection_and_recovery_times():
    st = k8s.chaos_status(PODCHAOS)
    assert st["t_injected"] == T_APPLY and st["t_recovered"] is None
    [rec] = st["records"]
    assert rec["id"] == "default/r-middle-0/tor" and rec["phase"] == "Injected"
    assert rec["events"][0] == {"operation": "Apply", "type": "Failed", "t": T_APPLY - 1, "message": "rpc error"}
    recovered = json.loads(json.dumps(PODCHAOS))
    recovered["status"]["experiment"]["containerRecords"][0]["events"].append(
        {"operation": "Recover", "type": "Succeeded", "timestamp": "2026-11-27T23:01:17Z"})
    assert k8s.chaos_status(recovered)["t_recovered"] == T_APPLY + 15
    assert k8s.chaos_status({"kind": "PodChaos"}) == {"records": [], "t_injected": None, "t_recovered": None}


class ChaosCluster:
    """The API as Ctx.wait_injected reads it: one object whose status is given."""
    ApiException, TransportError = RuntimeError, (OSError,)

    def __init__(self, obj):
        self.ns, self.obj = "default", obj
        self.custom = SimpleNamespace(get_namespaced_custom_object=lambda *a: self.obj)

    def _call(self, what, fn, *args):
        return fn(*args)


def test_a_container_kill_chaos_mesh_does_not_report_done_fails_the_fault():
    """Reported done: the status; not done within the timeout, after a failed injection (its
    message kept) or none at all (CRDs installed, no controller): RunFailed, the fault did not
    happen."""
    ctx = k8s.Ctx(ChaosCluster(PODCHAOS), None, "r", {})
    ctx.created["x-fault-0"] = "podchaos"
    assert ctx.wait_injected("x-fault-0", 1)["t_injected"] == T_APPLY
    failed = json.loads(json.dumps(PODCHAOS))
    failed["status"]["experiment"]["containerRecords"][0]["events"].pop()
    ctx.cluster.obj = failed
    with pytest.raises(RunFailed, match="0 of 1 containers injected 0 s after .* failed: default/r-middle-0/tor: rpc error"):
        ctx.wait_injected("x-fault-0", 1, timeout_s=0.3)
    ctx.cluster.obj = {"kind": "PodChaos"}
    with pytest.raises(RunFailed, match="the injection was not reported"):
        ctx.wait_injected("x-fault-0", 1, timeout_s=0.3)
