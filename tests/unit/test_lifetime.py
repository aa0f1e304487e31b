"""A run's lifetime without root (torbed.backends.local.lifetime): its lock, the watchdog that
cleans up after a torbed killed with SIGKILL, and the records it marks killed. Real processes:
a stand-in for torbed (a Python child holding a Supervisor) is SIGKILLed here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torbed.backends.local import lifetime

REPO = Path(__file__).resolve().parents[2]

# A stand-in for torbed: the run's lock, a Supervisor with its watchdog, a child (tor's
# place) and a child that forks a grandchild the parent-death signal does not reach.
OWNER = """
import json, sys, time
from pathlib import Path
from torbed.backends.local import lifetime
from torbed.backends.local.supervise import Supervisor
scratch, rep, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
lock = lifetime.RunLock(scratch)
sup = Supervisor("unitlife", {"namespaces": [], "scratch": str(scratch), "run_dir": str(rep)}, lock=lock)
sup.start("tor", ["sleep", "300"], rep / "tor.log")
sup.start("driver", ["sh", "-c", "sleep 300 & echo $! > %s; wait" % (rep / "grandchild")], rep / "driver.log")
out.write_text(json.dumps({"pids": sup.state["pids"], "watchdog": sup.watchdog.pid}))
if sys.argv[4] == "finish":
    sup.stop_all(grace=2)
    sup.forget()
    out.write_text(out.read_text() + "\\nfinished")
    sys.exit(0)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:    # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := pred():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _run_dir(tmp_path: Path) -> Path:
    rep = tmp_path / "run" / "kist" / "rep-0"
    rep.mkdir(parents=True)
    (rep / "meta.json").write_text(json.dumps({"status": "running", "t_end": None}))
    (tmp_path / "run" / "run.json").write_text(json.dumps({"status": "running", "sessions": [{"status": "running"}]}))
    (rep / "transfers.jsonl").write_text('{"n": 1}\n')
    return rep


def _owner(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, dict, Path, Path]:
    rep = _run_dir(tmp_path)
    scratch, out = tmp_path / "scratch", tmp_path / "owner.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORBED_STATE": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(scratch), str(rep), str(out), mode], env=env)
    _wait(lambda: out.exists() and out.read_text(), 30, "the stand-in to start its processes")
    if mode == "hold":
        _wait(lambda: (rep / "grandchild").exists() and (rep / "grandchild").read_text().strip(), 30,
              "the grandchild")
    info = json.loads(out.read_text().splitlines()[0])
    if mode == "hold":
        info["grandchild"] = int((rep / "grandchild").read_text())
    return proc, info, rep, scratch


def test_the_lock_says_whether_its_holder_lives(tmp_path):
    lock = lifetime.RunLock(tmp_path / "scratch")
    assert oct((tmp_path / "scratch").stat().st_mode & 0o777) == "0o700"
    assert lifetime.lock_held(lock.path) is True
    lock.release()
    assert lifetime.lock_held(lock.path) is False
    assert lifetime.lock_held(tmp_path / "absent") is None


def test_a_sigkilled_owner_takes_its_processes_with_it_and_the_watchdog_cleans(tmp_path):
    proc, info, rep, scratch = _owner(tmp_path, "hold")
    state_file = tmp_path / "state" / "unitlife.json"
    state = json.loads(state_file.read_text())
    assert state["lock"] == str(scratch / ".lock") and state["watchdog_pid"] == info["watchdog"]
    assert lifetime.run_alive(state), "a live owner's run must count as alive"
    everyone = [*info["pids"].values(), info["grandchild"]]
    assert all(map(_alive, everyone))
    proc.kill()
    proc.wait()
    # The children at once (parent-death signal), the grandchild by the watchdog.
    _wait(lambda: not any(map(_alive, everyone)), 10, "every process of the run to stop")
    _wait(lambda: not state_file.exists(), 10, "the watchdog to remove the state file")
    _wait(lambda: not _alive(info["watchdog"]), 10, "the watchdog to exit")
    assert not scratch.exists()
    meta = json.loads((rep / "meta.json").read_text())
    assert meta["status"] == "killed" and "watchdog" in meta["error"] and meta["t_end"]
    run = json.loads((rep.parent.parent / "run.json").read_text())
    assert run["status"] == "killed" and run["sessions"][-1]["status"] == "killed"
    assert (rep / "transfers.jsonl").read_text() == '{"n": 1}\n', "records must be kept"


def test_an_owner_that_ends_its_own_way_leaves_no_watchdog_and_no_mark(tmp_path):
    proc, info, rep, scratch = _owner(tmp_path, "finish")
    assert proc.wait(30) == 0
    assert not _alive(info["watchdog"])
    assert not (tmp_path / "state" / "unitlife.json").exists()
    assert json.loads((rep / "meta.json").read_text())["status"] == "running"   # the engine's to write
    assert not any(map(_alive, info["pids"].values()))


def test_mark_killed_leaves_finished_records_alone(tmp_path):
    rep = _run_dir(tmp_path)
    (rep / "meta.json").write_text(json.dumps({"status": "ok"}))
    assert lifetime.mark_killed(rep, "why") == [tmp_path / "run" / "run.json"]
    assert json.loads((rep / "meta.json").read_text())["status"] == "ok"
    assert lifetime.mark_killed(rep, "again") == []


def test_a_reused_pid_is_not_the_owner(tmp_path):
    me = {"owner_pid": os.getpid(), "owner_start": lifetime.process_start(os.getpid())}
    assert lifetime.run_alive(me)
    assert not lifetime.run_alive({**me, "owner_start": me["owner_start"] - 1})
    assert not lifetime.run_alive({"owner_pid": None})


def test_a_run_marked_killed_can_be_resumed(tmp_path):
    """What the watchdog or `torbed clean` leaves is what `torbed run --resume` takes: the
    killed repetition is run again, the finished one kept."""
    from torbed import resume
    run = tmp_path / "run"
    for k, status in ((0, "ok"), (1, "running")):
        (run / "kist" / f"rep-{k}").mkdir(parents=True)
        (run / "kist" / f"rep-{k}" / "meta.json").write_text(json.dumps({"status": status}))
    (run / "run.json").write_text(json.dumps({
        "status": "running", "fingerprint": {}, "order": [["kist", 0], ["kist", 1]], "source": "s.yaml",
        "variants": ["kist"], "repetitions": 2, "sessions": [{"status": "running", "pid": 1}]}))
    assert lifetime.mark_killed(run / "kist" / "rep-1", "why") == [run / "kist" / "rep-1" / "meta.json",
                                                                   run / "run.json"]
    info = resume.load_for_resume(run)
    assert info["status"] == "killed" and info["sessions"][-1]["status"] == "killed"
    assert resume.triage(run, info) == ([("kist", 0)], [("kist", 1)])


def test_a_killed_runs_per_thread_cgroups_are_found(tmp_path, monkeypatch):
    """threadcaps names them torbed-tcap-<run id>-<node>-<tid> beside the tor's own cgroup."""
    from torbed.backends.local import threadcaps
    monkeypatch.setattr(threadcaps, "ROOT", tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    for name in ("torbed-tcap-abc123-middle0-41", "user.slice/torbed-tcap-abc123-middle0-42",
                 "torbed-tcap-def456-middle0-43"):
        (tmp_path / "cpu" / name).mkdir(parents=True)
    assert [p.name for p in threadcaps.leftovers("abc123")] == ["torbed-tcap-abc123-middle0-41",
                                                                "torbed-tcap-abc123-middle0-42"]
