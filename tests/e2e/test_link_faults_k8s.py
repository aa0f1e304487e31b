"""Link faults on Kubernetes through the shaper sidecar (docs/faults.md): one `torbed run
--backend k8s` of a quickstart-like scenario with a partition of middle0 (every link of it),
then a rate fault of 1 Mbit/s between the bulk clients and the guard. What the test sees:
the transfers (typed errors and nothing completing through the partition, success again
after it; the bulk clients' goodput held near the fault's rate while it lasts), every
pod's tc tree read in its shaper container while the run goes on (the fault's filters and
classes in force during it, the tree as before the first fault once each is undone), and
faults.jsonl (per pod: the classes and the peers' addresses)."""

from __future__ import annotations

import json
import threading

import pytest
import yaml

from conftest import QUICKSTART, exec_in, leftovers, records, torbed_run
from torbed.pods.shaper import DROP_CLASS, tree_summary

pytestmark = pytest.mark.e2e
TREE = "tc class show dev eth0; echo ====; tc filter show dev eth0"
RATE_BPS = 1_000_000


class TreeWatch:
    """Every pod's tc tree (summarised, torbed.pods.shaper.tree_summary), read through the
    shaper container at each point of the fault timeline: when the workload starts
    ('before'), after each fault's apply and after each undo."""

    def __init__(self, kube, runs):
        self.kube, self.runs = kube, runs
        self.trees: dict[str, dict[str, tuple[set, set]]] = {}   # moment -> pod -> tree
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _snapshot(self, release: str) -> dict:
        core = self.kube.CoreV1Api()
        out = {}
        for p in core.list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={release}").items:
            names = [c.name for c in p.spec.init_containers or []]
            if p.status.phase != "Running" or "shaper" not in names:
                continue
            try:
                text = exec_in(self.kube, p.metadata.name, "shaper", TREE)
            except Exception as e:
                self.errors.append(f"{p.metadata.name}: {e}")
                continue
            classes, filters = text.split("====", 1)
            out[p.metadata.name] = tree_summary(classes, filters)
        return out

    def _run(self):
        seen: set[str] = set()
        while not self.stop.is_set():
            for f in self.runs.glob("*/vanilla/rep-0/faults.jsonl"):
                release = json.loads((f.parent / "meta.json").read_text())["release"]
                for r in records(f):
                    moment = "before" if r["event"] == "planned" else f"{r['event']} {r['fault']}"
                    if moment not in seen and not r.get("error"):
                        seen.add(moment)
                        self.trees[moment] = self._snapshot(release)
            self.stop.wait(0.3)

    def close(self):
        self.stop.set()
        self.thread.join()


def goodput_bps(transfers: list[dict], t0: float, t1: float) -> float:
    """Body bits the transfers received between t0 and t1, per second: each transfer's
    byte count interpolated between its progress marks (the driver's record)."""
    def at(t, points):
        if not points or t <= points[0][1]:
            return 0.0
        for (b0, ta), (b1, tb) in zip(points, points[1:]):
            if t <= tb:
                return b0 + (b1 - b0) * (t - ta) / (tb - ta) if tb > ta else b1
        return float(points[-1][0])
    total = 0.0
    for tr in transfers:
        points = [(0, tr["t_start"])] + [tuple(p) for p in tr.get("progress") or []]
        total += at(t1, points) - at(t0, points)
    return total * 8 / (t1 - t0)


def test_partition_and_rate_link_faults_on_kubernetes(kube, tmp_path):
    data = yaml.safe_load(QUICKSTART.read_text())
    data["servers"]["www"]["files"]["bulk"] = "1MiB"   # progress marks every 100 KiB: a rate in seconds
    data["clients"]["web"]["workload"].update(pause="300ms", timeout="5s")
    data["faults"] = [{"at": "8s", "kind": "link", "target": "middle0", "partition": True, "duration": "10s"},
                      {"at": "32s", "kind": "link", "between": ["bulk", "guard"], "rate": "1mbit", "duration": "16s"}]
    scenario = tmp_path / "link-faults.yaml"
    scenario.write_text(yaml.safe_dump(data))
    watch = TreeWatch(kube, tmp_path / "runs")
    try:
        p, run_dir = torbed_run(tmp_path, scenario, "--variant", "vanilla", "--duration", "56s")
    finally:
        watch.close()
    assert run_dir, p.stdout[-3000:] + p.stderr[-3000:]
    rep = run_dir / "vanilla" / "rep-0"
    meta = json.loads((rep / "meta.json").read_text())
    rel = meta["release"]
    assert p.returncode == 0 and meta["status"] == "ok" and not meta.get("teardown_errors"), \
        (meta, p.stdout[-3000:], p.stderr[-3000:])
    recs = records(rep / "faults.jsonl")
    ev = {(r["fault"], r["event"]): r for r in recs}
    assert not [r for r in recs if r.get("error")], recs
    for i in (0, 1):
        a, u = ev[(i, "apply")], ev[(i, "undo")]
        print(f"fault {i}: applied {a['t'] - a['t_planned']:.2f} s after its time, tc changed in "
              f"{len(a['pods'])} pods within {a['t_done'] - a['t']:.2f} s; undone in {u['t_done'] - u['t']:.2f} s")
        assert 0 <= a["t"] - a["t_planned"] < 1.5 and a["t_done"] - a["t"] < 10, a
        assert u["reason"] == "duration" and 0 <= u["t"] - u["t_planned"] < 1.5 and u["t_done"] - u["t"] < 10, u
    assert not watch.errors, watch.errors
    pods = {f"{rel}-{n}" for n in ("auth-0", "auth-1", "auth-2", "guard-0", "middle-0", "exit-0", "www-0")}

    # partition: every pod (all are middle0's peers) drops toward middle0; middle0 toward all.
    part = ev[(0, "apply")]
    assert pods <= set(part["pods"]) and len(part["pods"]) == 10, part["pods"]    # + bulk0, bulk1, web0
    mid = part["shaper"][f"{rel}-middle-0"]
    assert set(mid["classes"].values()) == {DROP_CLASS} and len(mid["peers"]) == 6, mid   # every group but middle
    middle_ip = part["shaper"][f"{rel}-guard-0"]["addresses"]["middle"]
    assert len(middle_ip) == 1, part["shaper"][f"{rel}-guard-0"]
    during = watch.trees["apply 0"]
    assert f"pref 1 ip -> {DROP_CLASS} {_hex(middle_ip[0])}/ffffffff" in during[f"{rel}-guard-0"][1]
    assert sum(1 for f in during[f"{rel}-middle-0"][1] if f.startswith(f"pref 1 ip -> {DROP_CLASS}")) >= 9

    transfers = records(rep / "transfers.jsonl")
    t_on, t_off = part["t_done"], ev[(0, "undo")]["t"]
    through = [t for t in transfers if t.get("t_last_byte") and t_on + 0.5 < t["t_last_byte"] < t_off]
    assert not through, through
    # Typed errors for what started once the partition was being applied: on a loaded machine
    # the shapers of the ten pods took 6.4 s to apply it (2026-11-26), and the one transfer
    # started in between timed out; from its end (t_on) to the undo no new one started.
    failed = [t for t in transfers if part["t"] <= t["t_start"] < t_off and t["status"] != "ok"]
    assert failed and {t["error"]["cause"] for t in failed} <= {"timeout", "circuit_failed", "stream_detached"}, failed
    ok_after = sorted(t["t_last_byte"] for t in transfers if t["status"] == "ok" and t["t_last_byte"] > t_off)
    assert ok_after and ok_after[0] - ev[(0, "undo")]["t_done"] < 20, "no transfer succeeded after the partition"
    print(f"partition of middle0: {len(failed)} typed errors ({sorted({t['error']['cause'] for t in failed})}), "
          f"none completed; first success {ok_after[0] - ev[(0, 'undo')]['t_done']:.1f} s after the undo")

    # rate: the guard's egress toward the bulk clients in a 1 Mbit/s class (and theirs toward it).
    rate = ev[(1, "apply")]
    assert sorted(rate["pods"]) == sorted([f"{rel}-guard-0"] + [p for p in rate["pods"] if "-bulk-" in p]) \
        and len(rate["pods"]) == 3, rate["pods"]
    g = rate["shaper"][f"{rel}-guard-0"]
    assert list(g["classes"]) == ["bulk"] and len(g["addresses"]["bulk"]) == 2, g
    assert f"htb {g['classes']['bulk']} rate 1Mbit" in watch.trees["apply 1"][f"{rel}-guard-0"][0]
    bulk = [t for t in transfers if t["group"] == "bulk"]
    r_on, r_off = rate["t_done"], ev[(1, "undo")]["t"]
    before = goodput_bps(bulk, r_on - 10, r_on)
    during_bps = goodput_bps(bulk, r_on + 2, r_off)   # 2 s: what was queued before the change drains
    after = goodput_bps(bulk, ev[(1, "undo")]["t_done"] + 1, ev[(1, "undo")]["t_done"] + 7)
    print(f"bulk clients' goodput: {before / 1e6:.2f} Mbit/s before the 1 Mbit/s fault, "
          f"{during_bps / 1e6:.2f} during, {after / 1e6:.2f} after")
    # The fault bounds the goodput, and undoing it frees it again. The 10 s before the fault are
    # printed, not asserted: they follow the partition, after which the bulk clients may start
    # again late; in one run their failed downloads (9 s) were followed by new ones only at 27
    # and 28 s, so half of that window had none (1.34 Mbit/s before, 0.89 during, 2.98 after).
    assert 0.5 * RATE_BPS < during_bps <= 1.02 * RATE_BPS and after > 1.5 * during_bps

    # Every pod's tree is the one from before the first fault once both are undone.
    for moment in ("undo 0", "undo 1"):
        changed = {p: (watch.trees["before"][p][0] ^ t[0], watch.trees["before"][p][1] ^ t[1])
                   for p, t in watch.trees[moment].items() if p in watch.trees["before"] and t != watch.trees["before"][p]}
        assert not changed and pods <= set(watch.trees[moment]), (moment, changed)
    assert [f["kind"] for f in meta["faults"]] == ["link", "link"]
    assert leftovers(kube, rel) == []


def _hex(ip: str) -> str:
    return "".join(f"{int(x):02x}" for x in ip.split("."))
