"""Fault injection on the local backend with real tor (docs/faults.md): each kind's effect
measured, the timeline in faults.jsonl, and nothing left behind (a stopped tor resumed, no
cgroup, no namespace), also after Ctrl-C while faults are in force. Each run is short
(30-40 s of workload); the scenarios are small_scenario's guard/middle/exit network."""

import json
import os
import signal
import statistics
import time
from pathlib import Path

from .helpers import (namespaces, only_run_dir, processes_mentioning, records, run_torbed, small_scenario,
                      start_torbed, wait_for, write_scenario)

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


def test_partition_gives_typed_errors_then_recovers_and_the_report_says_so(tmp_path):
    """Every link of middle0 cut for 10 s: transfers started then fail with typed errors
    (the 5 s timeout, or tor giving up on the circuit), none completes, and transfers
    succeed again after the links come back; the report splits them and finds the recovery."""
    rep = _run(tmp_path, "it-fault-part", **{
        "clients.web.workload": FETCH, "measure.duration": "40s",
        "faults": [{"at": "8s", "kind": "link", "target": "middle0", "partition": True, "duration": "8s"}]})
    ev = _events(rep)
    t_on, t_off = ev[(0, "apply")]["t"], ev[(0, "undo")]["t"]
    transfers = records(rep / "transfers.jsonl")
    before = [t for t in transfers if t["t_start"] < t_on - 1]
    during = [t for t in transfers if t_on <= t["t_start"] < t_off]
    assert before and all(t["status"] == "ok" for t in before)
    assert not [t for t in transfers if t["t_last_byte"] and t_on + 0.5 < t["t_last_byte"] < t_off], \
        "nothing gets through a partition"
    failed = [t for t in during if t["status"] != "ok"]
    assert len(failed) >= 1, during
    assert {t["error"]["cause"] for t in failed} <= {"timeout", "circuit_failed", "stream_detached"}, failed
    recovered = sorted(t["t_last_byte"] for t in transfers if t["status"] == "ok" and t["t_last_byte"] > t_off)
    # In one CI run the first circuit through middle0 was built 14.8 s after the partition
    # ended (its connections stayed open through it); the cause was not pinned down: TCP's
    # retransmission back-off alone would have resumed them within ~5 s.
    assert recovered and recovered[0] - t_off < 20, "transfers should succeed again after the partition"
    assert len([t for t in transfers if t["t_start"] > recovered[0]]) >= 3
    print(f"{len(failed)} typed errors during the partition; first success {recovered[0] - t_off:.2f} s after it")

    p = run_torbed(["report", str(rep.parents[1])])
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((rep.parents[1] / "report" / "summary.json").read_text())
    (row,) = summary["faults"]
    assert row["what"] == "link middle0 (partition)"
    assert row["during"]["errors"] == len(failed) and row["during"]["ok"] == len(during) - len(failed)
    assert abs(row["recover_s"] - (recovered[0] - t_off)) < 0.01
    assert "## Faults" in (rep.parents[1] / "report" / "report.md").read_text()
    assert not _left_behind(rep)


def test_pause_then_restart_of_a_relay(tmp_path):
    """SIGSTOP of middle0's tor: the process is stopped (state T) while the fault lasts, no
    transfer completes, and it runs again once resumed. Then a restart: the tor stops, a new
    one (same keys and data directory) starts 2 s later, transfers succeed through it again,
    and the collector reconnects to it (relay_bw continues)."""
    data = small_scenario("it-fault-pause", **{
        "clients.web.workload": FETCH, "measure.duration": "32s",
        "faults": [{"at": "5s", "kind": "pause", "target": "middle0", "duration": "6s"},
                   {"at": "15s", "kind": "restart", "target": "middle0", "duration": "2s"}]})
    proc, out = _start(tmp_path, data)
    try:
        rep = _workload_started(out)
        applied = wait_for(lambda: _events(rep).get((0, "apply")), 30, "the pause")
        pid = applied["pids"]["middle0"]
        assert _proc_state(pid) == "T", "middle0's tor should be stopped"
        time.sleep(3)
        assert _proc_state(pid) == "T"
        wait_for(lambda: _events(rep).get((0, "undo")), 30, "the resume")
        assert _proc_state(pid) in ("S", "R", "D"), "middle0's tor should run again"
        assert proc.wait(timeout=120) == 0, (tmp_path / "torbed.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ev = _events(rep)
    transfers = records(rep / "transfers.jsonl")
    t_on, t_off = ev[(0, "apply")]["t"], ev[(0, "undo")]["t"]
    assert not [t for t in transfers if t["t_last_byte"] and t_on + 0.5 < t["t_last_byte"] < t_off]
    assert [t for t in transfers if t["status"] == "ok" and t_off < t["t_start"] < ev[(1, "apply")]["t"]]
    # The restart: down for its duration, then a new process; clients get through it again.
    down, up = ev[(1, "apply")], ev[(1, "undo")]
    assert up["reason"] == "duration" and abs(up["t"] - down["t_planned"] - 2.0) < 0.5
    assert str(pid) not in up["done"] and "started again: middle0 (pid" in up["done"]
    assert [t for t in transfers if t["status"] == "ok" and t["t_start"] > up["t"]]
    assert [b for b in records(rep / "relay_bw.jsonl") if b["relay"] == "middle0" and b["t"] > up["t"] + 2]
    meta = json.loads((rep / "meta.json").read_text())
    assert "middle0" not in meta["unexpected_exits"]
    assert not _left_behind(rep)


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


def test_interrupt_while_faults_are_in_force_leaves_nothing_behind(tmp_path):
    """Ctrl-C with a pause, a CPU quota and a partition in force (none has a duration):
    teardown undoes each (faults.jsonl: reason teardown) before it stops the processes, so
    the stopped tor is resumed and exits on its SIGTERM, and no cgroup or namespace stays."""
    data = small_scenario("it-fault-int", **{
        "clients.web.workload": FETCH, "measure.duration": "5m",
        "faults": [{"at": "3s", "kind": "pause", "target": "middle0"},
                   {"at": "3s", "kind": "cpu", "target": "exit0", "cpu": "10%"},
                   {"at": "3s", "kind": "link", "between": ["web", "guard"], "partition": True}]})
    proc, out = _start(tmp_path, data)
    try:
        rep = _workload_started(out)
        wait_for(lambda: all((i, "apply") in _events(rep) for i in range(3)), 30, "the three faults")
        ev = _events(rep)
        pid = ev[(0, "apply")]["pids"]["middle0"]
        cgroup = Path(ev[(1, "apply")]["cgroup"])
        assert _proc_state(pid) == "T"
        assert str(ev[(1, "apply")]["pids"]["exit0"]) in (cgroup / "cgroup.procs").read_text().split()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 130, (tmp_path / "torbed.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ev = _events(rep)
    assert all(ev[(i, "undo")]["reason"] == "teardown" and not ev[(i, "undo")].get("error") for i in range(3))
    assert not cgroup.exists()
    assert _proc_state(pid) is None
    # Resumed before the SIGTERM, tor handled it itself (a stopped one would have been SIGKILLed).
    assert "Catching signal TERM" in (rep / "logs" / "middle0.log").read_text()
    assert not _left_behind(rep)
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "interrupted" and not meta.get("teardown_errors")


def test_leftover_fault_cgroups_are_removed(tmp_path):
    """What ``torbed clean`` does with a SIGKILLed run's cgroup: its processes go back to
    the parent and the cgroup is removed (a real cgroup and process)."""
    from torbed.faults import check_cpu_cgroups, remove_cgroups
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
