"""Ctrl-C in the middle of a run that has everything going at once (needs root): linkemu
shaping every link, Locust users through the relays, the foreground fetch client, and three
faults in force with no duration (a SIGSTOPped relay, a CPU quota in a cgroup, a partition).

One run, watched while it goes (module fixture), carries every assertion about what SIGINT
must do; each is its own test so a failure names what broke: the exit status and records,
the faults undone in teardown, Locust stopped, linkemu stopped, and nothing left behind.
The faults target two spare relays that no path uses, so the load and the fetches keep
flowing until the partition cuts the fetch client off.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import require_root
from tests.integration.helpers import (namespaces, only_run_dir, processes_mentioning, records, start_torbed,
                                       wait_for, write_scenario)
from tests.integration.test_load import load_records, load_scenario, processes_with_env

pytestmark = pytest.mark.integration
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _events(rep: Path) -> dict:
    return {(r["fault"], r["event"]): r for r in records(rep / "faults.jsonl")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    require_root()
    tmp = tmp_path_factory.mktemp("interrupt")
    data = load_scenario("it-interrupt", **{"measure.duration": "5m", "load.start": "0s"})
    data["network"]["relays"]["spare"] = {"count": 2}
    data["links"] = {"default": {"rate": "100mbit", "delay": "5ms"}, "emulator": "linkemu"}
    data["clients"]["web"]["workload"] = {"kind": "fetch", "file": "small", "repeat": 1000, "pause": "300ms",
                                          "timeout": "5s"}
    # Late enough that Locust's first requests and three fetches have finished (watched below).
    data["faults"] = [{"at": "25s", "kind": "pause", "target": "spare0"},
                      {"at": "25s", "kind": "cpu", "target": "spare1", "cpu": "10%"},
                      {"at": "25s", "kind": "link", "between": ["web", "guard"], "partition": True}]
    out = tmp / "runs"
    log = tmp / "torbed.log"
    proc = start_torbed(["run", str(write_scenario(tmp, data)), "--out", str(out), "--system-tor"], log)
    seen: dict = {}
    try:
        run_dir = wait_for(lambda: out.exists() and any(out.iterdir()) and only_run_dir(out), 60, "run directory")
        rep = run_dir / "kist" / "rep-0"
        emu_log = wait_for(lambda: next(rep.glob("logs/linkemu.log"), None), 120, "linkemu to start")
        wait_for(lambda: "forwarding between" in emu_log.read_text(), 60, "linkemu to forward")
        wait_for(lambda: len(records(rep / "transfers.jsonl")) >= 3, 180, "three transfers")
        wait_for(lambda: any(r["total"]["requests"] > 0 for r in load_records(rep)), 180, "Locust requests")
        wait_for(lambda: all((i, "apply") in _events(rep) for i in range(3)), 90, "the three faults")
        ev = _events(rep)
        run_id = json.loads((rep / "meta.json").read_text())["run_id"]
        seen.update(
            run_id=run_id,
            namespaces=namespaces(run_dir),
            locust=processes_with_env(str(run_dir)),
            linkemu=processes_mentioning(f"/tmp/torbed-{run_id}/linkemu.json"),
            paused_pid=ev[(0, "apply")]["pids"]["spare0"],
            cgroup=ev[(1, "apply")]["cgroup"],
            quota_pid=ev[(1, "apply")]["pids"]["spare1"],
        )
        seen["paused_state"] = _proc_state(seen["paused_pid"])
        seen["cgroup_procs"] = (Path(seen["cgroup"]) / "cgroup.procs").read_text().split()
        seen["transfers_at_sigint"] = len(records(rep / "transfers.jsonl"))
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"rc": rc, "log": log.read_text(), "dir": run_dir, "rep": rep, "seen": seen,
            "meta": json.loads((rep / "meta.json").read_text())}


def test_everything_was_running_before_the_interrupt(run):
    seen = run["seen"]
    assert seen["namespaces"], "the run's namespaces should exist while it runs"
    assert len(seen["locust"]) >= 3, "Locust's master and two workers should be running"
    assert seen["linkemu"], "linkemu should be running"
    assert seen["paused_state"] == "T", "spare0's tor should be stopped"
    assert str(seen["quota_pid"]) in seen["cgroup_procs"]


def test_exit_status_130_and_the_run_says_interrupted(run):
    assert run["rc"] == 130, run["log"][-3000:]
    assert "interrupted" in run["log"]
    assert run["meta"]["status"] == "interrupted" and not run["meta"].get("teardown_errors"), run["meta"]
    assert json.loads((run["dir"] / "run.json").read_text())["status"] == "interrupted"


def test_what_was_measured_is_kept(run):
    assert len(records(run["rep"] / "transfers.jsonl")) >= run["seen"]["transfers_at_sigint"] >= 3
    assert load_records(run["rep"]), "load.jsonl lost"


def test_faults_are_undone_in_teardown_before_the_processes_stop(run):
    ev = _events(run["rep"])
    assert all(ev[(i, "undo")]["reason"] == "teardown" and not ev[(i, "undo")].get("error") for i in range(3)), ev
    assert not Path(run["seen"]["cgroup"]).exists()
    assert _proc_state(run["seen"]["paused_pid"]) is None
    # Resumed before the SIGTERM, tor handled it itself (a stopped one would have been SIGKILLed).
    assert "Catching signal TERM" in (run["rep"] / "logs" / "spare0.log").read_text()


def test_locust_linkemu_and_every_process_are_gone(run):
    assert not processes_with_env(str(run["dir"])), "Locust processes left behind"
    assert not processes_mentioning(str(run["dir"])), "processes left behind"
    assert not processes_mentioning(f"/tmp/torbed-{run['seen']['run_id']}"), "linkemu or scratch processes left"
    assert "signal 15: stopping" in (run["rep"] / "logs" / "linkemu.log").read_text()


def test_no_namespace_or_cgroup_is_left(run):
    assert not namespaces(run["dir"]), "namespaces left behind"
    assert not list(CGROUP_CPU.glob(f"torbed-{run['seen']['run_id']}-*"))
    assert os.path.exists(run["rep"] / "meta.json")
