"""Fault injection on the local backend with real tor (docs/faults.md), needs root.

One run carries every fault kind on one timeline (module fixture, watched while it goes):
a pause, a restart and a CPU quota of middle0, added delay on web0 <-> guard0, a partition
of middle0. Each test asserts one thing about it: that the fault acted (the process stopped,
the quota held the process, the delay showed in TTFB, nothing crossed the partition), that
faults.jsonl has its timeline, that the network recovered, that nothing is left behind.
Ctrl-C with faults in force: tests/integration/test_interrupt.py.

Effect sizes (TTFB rises by exactly the added round trip; a quota lowers throughput) are
experiments (`make experiments`), each on a run of its own.
"""

import json
import os
import statistics
from pathlib import Path

import pytest

from tests.conftest import require_root

from .helpers import (namespaces, only_run_dir, processes_mentioning, records, run_torbed, small_scenario,
                      start_torbed, wait_for, write_scenario)

pytestmark = pytest.mark.integration
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


def _run(tmp_path, name, **overrides) -> Path:
    data = small_scenario(name, **overrides)
    out = tmp_path / "runs"
    p = run_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out), "--system-tor"])
    assert p.returncode == 0, p.stdout + p.stderr
    rep = only_run_dir(out) / "kist" / "rep-0"
    assert json.loads((rep / "meta.json").read_text())["status"] == "ok"
    return rep


def _start(tmp_path, data):
    """`torbed run` of ``data`` in the background (output in torbed.log): (process, runs dir)."""
    out = tmp_path / "runs"
    proc = start_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out), "--system-tor"],
                        tmp_path / "torbed.log")
    return proc, out


def _workload_started(out: Path) -> Path:
    """The repetition directory, once its workload (and so faults.jsonl) has started."""
    return wait_for(lambda: next(out.glob("*/kist/rep-0/faults.jsonl"), None), 120, "the workload to start").parent


def _events(rep: Path) -> dict:
    """faults.jsonl as {(fault, event): record}."""
    return {(r["fault"], r["event"]): r for r in records(rep / "faults.jsonl")}


def _left_behind(rep: Path) -> list[str]:
    run_id = json.loads((rep / "meta.json").read_text())["run_id"]
    cgroups = [str(p) for p in CGROUP_CPU.glob(f"torbed-{run_id}-*")]
    return namespaces(rep.parents[1]) + processes_mentioning(f"/tmp/torbed-{run_id}") + cgroups


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


FETCH = {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "300ms", "timeout": "5s"}


# The timeline, seconds into the workload (fault index: kind).
PAUSE, RESTART, CPU, DELAY, PARTITION = range(5)
TIMELINE = [{"at": "5s", "kind": "pause", "target": "middle0", "duration": "5s"},
            {"at": "14s", "kind": "restart", "target": "middle0", "duration": "2s"},
            {"at": "22s", "kind": "cpu", "target": "middle0", "cpu": "5%", "duration": "6s"},
            {"at": "32s", "kind": "link", "between": ["web", "guard"], "delay": "100ms", "duration": "8s"},
            {"at": "44s", "kind": "link", "target": "middle0", "partition": True, "duration": "8s"}]


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """The run, with what could only be seen while it ran: middle0's process state during and
    after the pause, and the quota's cgroup with its processes while the quota held."""
    require_root()
    tmp = tmp_path_factory.mktemp("faults")
    data = small_scenario("it-faults", **{
        # 10 KB: a fetch takes a few round trips even with the added delay, so many fall in each window
        "servers.www.files": {"tiny": "10KB"}, "clients.web.workload": {**FETCH, "file": "tiny"},
        "measure.duration": "75s", "faults": TIMELINE})
    proc, out = _start(tmp, data)
    seen: dict = {}
    try:
        rep = _workload_started(out)
        applied = wait_for(lambda: _events(rep).get((PAUSE, "apply")), 60, "the pause")
        seen["paused_pid"] = applied["pids"]["middle0"]
        seen["state_paused"] = _proc_state(seen["paused_pid"])
        wait_for(lambda: _events(rep).get((PAUSE, "undo")), 30, "the resume")
        seen["state_resumed"] = _proc_state(seen["paused_pid"])
        quota = wait_for(lambda: _events(rep).get((CPU, "apply")), 60, "the CPU quota")
        cgroup = Path(quota["cgroup"])
        seen.update(cgroup=str(cgroup), quota_pid=quota["pids"]["middle0"],
                    cgroup_procs=(cgroup / "cgroup.procs").read_text().split(),
                    cfs_quota_us=int((cgroup / "cpu.cfs_quota_us").read_text()))
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, (tmp / "torbed.log").read_text()[-3000:]
    return {"rep": rep, "ev": _events(rep), "seen": seen, "transfers": records(rep / "transfers.jsonl"),
            "meta": json.loads((rep / "meta.json").read_text())}


def test_the_timeline_is_recorded_as_planned(timeline):
    ev = timeline["ev"]
    for i in range(len(TIMELINE)):
        apply, undo = ev[(i, "apply")], ev[(i, "undo")]
        assert undo["reason"] == "duration" and not undo.get("error"), undo
        # On time, within what a loaded 2-core machine can promise.
        assert abs(apply["t"] - apply["t_planned"]) < 1.0 and abs(undo["t"] - undo["t_planned"]) < 1.5, (apply, undo)
    assert ev[(DELAY, "planned")]["pairs"] == 2


def test_pause_stops_the_relay_and_the_resume_runs_it_again(timeline):
    ev, seen, transfers = timeline["ev"], timeline["seen"], timeline["transfers"]
    assert seen["state_paused"] == "T", "middle0's tor should be stopped"
    assert seen["state_resumed"] in ("S", "R", "D"), "middle0's tor should run again"
    t_on, t_off = ev[(PAUSE, "apply")]["t"], ev[(PAUSE, "undo")]["t"]
    assert not [t for t in transfers if t["t_last_byte"] and t_on + 0.5 < t["t_last_byte"] < t_off]
    assert [t for t in transfers if t["status"] == "ok" and t_off < t["t_start"] < ev[(RESTART, "apply")]["t"]]


def test_restart_starts_a_new_process_that_carries_traffic(timeline):
    ev, transfers = timeline["ev"], timeline["transfers"]
    down, up = ev[(RESTART, "apply")], ev[(RESTART, "undo")]
    assert str(timeline["seen"]["paused_pid"]) not in up["done"] and "started again: middle0 (pid" in up["done"]
    assert [t for t in transfers if t["status"] == "ok" and up["t"] < t["t_start"] < ev[(CPU, "apply")]["t"]]
    # The collector reconnected to the new tor.
    assert [b for b in records(timeline["rep"] / "relay_bw.jsonl") if b["relay"] == "middle0" and b["t"] > up["t"] + 2]
    assert "middle0" not in timeline["meta"]["unexpected_exits"]
    assert down["t"] < up["t"]


def test_cpu_quota_holds_the_relays_tor_and_is_removed(timeline):
    ev, seen = timeline["ev"], timeline["seen"]
    assert "quota 5000 us per 100000 us" in ev[(CPU, "apply")]["done"]
    assert seen["cfs_quota_us"] == 5000
    assert str(seen["quota_pid"]) in seen["cgroup_procs"]
    assert not Path(seen["cgroup"]).exists()


def test_link_delay_shows_in_ttfb_while_in_force(timeline):
    """100 ms each way on web0 <-> guard0 adds 200 ms to a fetch's TTFB: asserted as at least
    half of that above the fetches before and after (the exact +200 ms is an experiment:
    test_link_delay_raises_ttfb_by_the_added_round_trip_then_recovers)."""
    ev, transfers = timeline["ev"], timeline["transfers"]
    apply, undo = ev[(DELAY, "apply")], ev[(DELAY, "undo")]
    ok = [t for t in transfers if t["status"] == "ok"]
    before = [t["ttfb_s"] for t in ok if ev[(CPU, "undo")]["t"] + 1 < t["t_request"] and t["t_first_byte"] < apply["t"]]
    during = [t["ttfb_s"] for t in ok if apply["t"] + 0.5 < t["t_request"] and t["t_first_byte"] < undo["t"]]
    after = [t["ttfb_s"] for t in ok if undo["t"] + 0.5 < t["t_request"] and t["t_first_byte"] < ev[(PARTITION, "apply")]["t"]]
    assert len(before) >= 3 and len(during) >= 3 and len(after) >= 3, (len(before), len(during), len(after))
    b, d, a = (statistics.median(x) for x in (before, during, after))
    print(f"median TTFB before {b * 1e3:.0f} ms, during {d * 1e3:.0f} ms, after {a * 1e3:.0f} ms (+200 ms added)")
    assert d >= 0.200 and d - b >= 0.100 and d - a >= 0.100


def test_partition_gives_typed_errors_then_recovers_and_the_report_says_so(timeline):
    ev, transfers, rep = timeline["ev"], timeline["transfers"], timeline["rep"]
    t_on, t_off = ev[(PARTITION, "apply")]["t"], ev[(PARTITION, "undo")]["t"]
    during = [t for t in transfers if t_on <= t["t_start"] < t_off]
    assert not [t for t in transfers if t["t_last_byte"] and t_on + 0.5 < t["t_last_byte"] < t_off], \
        "nothing gets through a partition"
    failed = [t for t in during if t["status"] != "ok"]
    assert len(failed) >= 1, during
    assert {t["error"]["cause"] for t in failed} <= {"timeout", "circuit_failed", "stream_detached", "stall"}, failed
    recovered = sorted(t["t_last_byte"] for t in transfers if t["status"] == "ok" and t["t_last_byte"] > t_off)
    # In one CI run the first circuit through middle0 was built 14.8 s after the partition
    # ended (its connections stayed open through it); the cause was not pinned down: TCP's
    # retransmission back-off alone would have resumed them within ~5 s.
    assert recovered and recovered[0] - t_off < 20, "transfers should succeed again after the partition"
    print(f"{len(failed)} typed errors during the partition; first success {recovered[0] - t_off:.2f} s after it")

    p = run_torbed(["report", str(rep.parents[1])])
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((rep.parents[1] / "report" / "summary.json").read_text())
    row = next(r for r in summary["faults"] if r["what"] == "link middle0 (partition)")
    assert row["during"]["errors"] == len(failed) and row["during"]["ok"] == len(during) - len(failed)
    assert abs(row["recover_s"] - (recovered[0] - t_off)) < 0.01
    assert len(summary["faults"]) == len(TIMELINE)
    assert "## Faults" in (rep.parents[1] / "report" / "report.md").read_text()


def test_nothing_is_left_behind(timeline):
    assert not _left_behind(timeline["rep"])


# Experiments: effect sizes, each on a run of its own (make experiments).

@pytest.mark.experiment
def test_link_delay_raises_ttfb_by_the_added_round_trip_then_recovers(tmp_path):
    """100 ms more on web0 <-> guard0 (each way): a request and its first byte cross that
    link once each, so TTFB rises by 200 ms while the fault lasts, and falls back after."""
    rep = _run(tmp_path, "it-fault-delay", **{
        # 10 KB: a fetch takes a few round trips even with the added delay, so many fall in the window
        "servers.www.files": {"tiny": "10KB"}, "clients.web.workload": {**FETCH, "file": "tiny"},
        "measure.duration": "30s",
        "faults": [{"at": "10s", "kind": "link", "between": ["web", "guard"], "delay": "100ms", "duration": "10s"}]})
    ev = _events(rep)
    apply, undo = ev[(0, "apply")], ev[(0, "undo")]
    assert ev[(0, "planned")]["pairs"] == 2 and undo["reason"] == "duration"
    assert abs(apply["t"] - apply["t_planned"]) < 0.3 and abs(undo["t"] - undo["t_planned"]) < 0.3
    ok = [t for t in records(rep / "transfers.jsonl") if t["status"] == "ok"][1:]   # the first builds the circuit
    before = [t["ttfb_s"] for t in ok if t["t_request"] < apply["t"] and t["t_first_byte"] < apply["t"]]
    during = [t["ttfb_s"] for t in ok if apply["t"] + 0.5 < t["t_request"] and t["t_first_byte"] < undo["t"]]
    after = [t["ttfb_s"] for t in ok if t["t_request"] > undo["t"] + 0.5]
    assert len(before) >= 5 and len(during) >= 5 and len(after) >= 5, (len(before), len(during), len(after))
    b, d, a = (statistics.median(x) for x in (before, during, after))
    base = statistics.median(before + after)
    print(f"median TTFB before {b * 1e3:.1f} ms, during {d * 1e3:.1f} ms, after {a * 1e3:.1f} ms: "
          f"+{(d - base) * 1e3:.1f} ms over before and after together (expected +200)")
    assert abs((d - base) - 0.200) <= 0.030
    assert abs(a - b) <= 0.030
    assert not _left_behind(rep)


@pytest.mark.experiment
def test_cpu_quota_lowers_relay_throughput(tmp_path):
    """5% of a core for middle0's tor: the bytes it forwards for a bulk download fall, and
    rise again once the quota is removed."""
    rep = _run(tmp_path, "it-fault-cpu", **{
        "clients.web": {"path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "measure.duration": "30s",
        "faults": [{"at": "10s", "kind": "cpu", "target": "middle0", "cpu": "5%", "duration": "10s"}]})
    ev = _events(rep)
    t_on, t_off = ev[(0, "apply")]["t"], ev[(0, "undo")]["t"]
    assert "quota 5000 us per 100000 us" in ev[(0, "apply")]["done"]
    bw = [b for b in records(rep / "relay_bw.jsonl") if b["relay"] == "middle0"]

    def rate(lo, hi):
        xs = [b for b in bw if lo < b["t"] <= hi]
        return sum(b["written"] for b in xs) / sum(b["interval_s"] for b in xs)
    t0 = json.loads((rep / "meta.json").read_text())["t_workload_start"]
    before, during, after = rate(t0 + 2, t_on), rate(t_on + 1, t_off), rate(t_off + 1, t0 + 29)
    print(f"middle0 forwards {before / 1e6:.2f} MB/s, {during / 1e6:.2f} MB/s under the quota, "
          f"{after / 1e6:.2f} MB/s after")
    assert during < 0.6 * before
    assert after > 1.5 * during
    assert not _left_behind(rep)


def test_leftover_fault_cgroups_are_removed(tmp_path):
    """What ``torbed clean`` does with a SIGKILLed run's cgroup: its processes go back to
    the parent and the cgroup is removed (a real cgroup and process)."""
    from torbed.backends.local.faults import check_cpu_cgroups, remove_cgroups
    assert check_cpu_cgroups() is None
    group = CGROUP_CPU / f"torbed-test{os.getpid()}-fault0"
    group.mkdir()
    import subprocess
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (group / "cgroup.procs").write_text(str(sleeper.pid))
        remove_cgroups([group])
        assert not group.exists()
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        if group.exists():
            group.rmdir()
