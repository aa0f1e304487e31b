"""How a local run ends when its torbed process cannot end it: killed with SIGKILL, or the
machine's OOM killer.

Three layers, each covering what the one before cannot:

- every process the Supervisor starts gets a parent-death signal (``pdeathsig_prefix``:
  ``setpriv --pdeathsig KILL``), so tor, the drivers, linkemu and Prometheus die with the
  torbed that started them, at once;
- each repetition holds a lock (``RunLock``: ``flock`` on ``<scratch>/.lock``) for as long as
  it lives, and a watchdog process (``python -m torbed.backends.local.lifetime``, started by
  the Supervisor, in a session of its own) waits on a second descriptor of that lock. When the
  lock comes free and the run's state file is still there, torbed died before its teardown:
  the watchdog cleans the run (``clean_run``): what any process started (a grandchild the
  parent-death signal does not reach), the namespaces, the scratch directory, fault cgroups;
- ``torbed clean`` does the same for any run whose lock is free (the watchdog itself was
  killed), and leaves a run whose lock is held alone.

Records already written stay: every record file is appended and flushed line by line, and
the run directory is never removed. Its meta.json and run.json, still ``running``, are marked
``killed`` (``mark_killed``), so a report or ``torbed run --resume`` sees what happened.

Public API:

- ``RunLock(scratch)``: makes the scratch directory and holds its lock; ``.path``,
  ``.watch_fd()`` (a second, unlocked descriptor for the watchdog), ``.release()``
- ``lock_held(path) -> bool | None``: whether a run's lock is held (None: no such lock file)
- ``pdeathsig_prefix() -> list[str]``: argv prefix giving a child SIGKILL when its parent dies
- ``start_watchdog(state_file, fd) -> Popen``; ``main(argv)``: the watchdog itself
- ``clean_run(state, why, log=None) -> int``: stop and remove what a dead run left (namespaces
  removed); ``mark_killed(rep_dir, why) -> list[Path]``: the records marked
- ``clean(console, force=False) -> dict``: ``torbed clean``: every dead run (``run_alive``), and
  scratch directories whose lock is free; with ``force`` live runs and namespaces no run
  claims too. Returns counts: runs, namespaces, live (left alone), unclaimed (names)
- ``run_alive(state) -> bool``: by the run's lock, else by its owner's pid and start time
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

LOCK_NAME = ".lock"
SCRATCH_NAME = re.compile(r"torbed-[0-9a-f]{6}")     # /tmp/torbed-<run id> (backend.prepare)


class RunLock:
    """A repetition's scratch directory (mode 0700) and the lock that says its torbed lives."""

    def __init__(self, scratch: Path):
        scratch.mkdir(mode=0o700)
        self.path = scratch / LOCK_NAME
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def watch_fd(self) -> int:
        """A second open file description of the lock (a flock belongs to one: the watchdog,
        holding its own, blocks until this process' lock is released). The caller closes it."""
        return os.open(self.path, os.O_RDWR | os.O_CLOEXEC)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_held(path: str | Path) -> bool | None:
    """Whether another process holds the lock at ``path``; None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` (util-linux), or nothing where setpriv is missing (the
    watchdog then stops the processes, a moment later). The signal comes when the *thread*
    that started the process ends, so the Supervisor uses it from the main thread only."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def start_watchdog(state_file: Path, fd: int) -> subprocess.Popen:
    """The watchdog of the run recorded in ``state_file``, waiting on lock descriptor ``fd``.
    In a session of its own: a Ctrl-C at the terminal or a kill of torbed's process group
    does not reach it."""
    from ... import resources
    env = dict(os.environ)
    root = str(resources.package_parent())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen([sys.executable, "-m", "torbed.backends.local.lifetime", str(state_file), str(fd)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            pass_fds=(fd,), start_new_session=True, env=env)


def main(argv: list[str]) -> int:
    """The watchdog: block on the lock; once it is free, clean the run if its state file is
    still there (torbed died before its teardown, which removes the file first)."""
    state_file, fd = Path(argv[0]), int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        return 1
    clean_run(state, "its torbed process ended without tearing the run down (seen by the run's watchdog)")
    return 0


def clean_run(state: dict, why: str, log=None) -> int:
    """Stop every process of a dead run, remove its namespaces, scratch directory and fault
    cgroups, mark its records killed and remove its state file. ``log``: a callable for what
    was done. Returns how many namespaces were removed."""
    from . import faults, netns, threadcaps
    for pid in (state.get("pids") or {}).values():
        try:
            os.killpg(pid, signal.SIGKILL)      # each process leads a session of its own
        except (ProcessLookupError, PermissionError, TypeError):
            pass
    removed = 0
    present = set(netns.list_namespaces())
    for ns in state.get("namespaces") or []:
        if ns in present:
            netns.delete_namespace(ns)          # kills what is still inside first
            removed += 1
    if state.get("scratch"):
        shutil.rmtree(state["scratch"], ignore_errors=True)
    faults.remove_cgroups([*(state.get("cgroups") or []),
                           *(threadcaps.leftovers(state["run_id"]) if state.get("run_id") else [])])
    marked = mark_killed(Path(state["run_dir"]), why) if state.get("run_dir") else []
    if state.get("_file"):
        Path(state["_file"]).unlink(missing_ok=True)
    else:
        from ... import constants
        (constants.STATE_DIR / f"{state.get('run_id')}.json").unlink(missing_ok=True)
    if log:
        log(f"cleaned run {state.get('run_id')} ({state.get('run_dir', '?')}): {removed} namespace(s)"
            + (f"; marked killed: {', '.join(str(p) for p in marked)}" if marked else ""))
    return removed


def mark_killed(rep_dir: Path, why: str) -> list[Path]:
    """meta.json of the repetition and run.json of its run (two levels up), where still
    ``running``: status ``killed``, the reason, the time. Returns the files changed."""
    now = time.time()
    stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds")
    changed = []
    meta_path = rep_dir / "meta.json"
    meta = _read(meta_path)
    if meta is not None and meta.get("status") == "running":
        meta.update(status="killed", error=why, t_end=meta.get("t_end") or now, killed_at=stamp)
        _write(meta_path, meta)
        changed.append(meta_path)
    return changed + mark_run_killed(rep_dir.parent.parent, why)


def mark_run_killed(run_dir: Path, why: str) -> list[Path]:
    """run.json of a run, where still ``running`` (and its last session): ``killed``."""
    stamp = dt.datetime.fromtimestamp(time.time(), dt.timezone.utc).isoformat(timespec="seconds")
    run_path = run_dir / "run.json"
    info = _read(run_path)
    if info is None or info.get("status") != "running":
        return []
    info.update(status="killed", finished=stamp, killed=why)
    sessions = info.get("sessions") or []
    if sessions and sessions[-1].get("status") == "running":
        sessions[-1].update(status="killed", finished=stamp)
    _write(run_path, info)
    return [run_path]


def run_alive(state: dict) -> bool:
    """A run's lock decides (its holder is the run's torbed, alive); without one (a bare
    ``netns.Topology`` claim, or the lock's scratch directory gone) the owner's pid and, where
    recorded, its start time (a pid reused by another process is not the owner)."""
    held = lock_held(state["lock"]) if state.get("lock") else None
    if held is not None:
        return held
    from .supervise import owner_alive
    if not owner_alive(state):
        return False
    return state.get("owner_start") is None or process_start(state["owner_pid"]) == state["owner_start"]


def process_start(pid: int) -> int | None:
    """A process' start time (clock ticks since boot, /proc/PID/stat field 22): with the pid,
    it names one process for good."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def clean(console, force: bool = False) -> dict:
    """``torbed clean``: clean every run whose torbed is gone (``clean_run``), leave live runs
    alone; remove scratch directories (``/tmp/torbed-*``) whose lock is free. A namespace no
    state file claims (a test or benchmark's own ``netns.Topology`` from an older torbed, or
    a lost state file) may still be in use: reported, removed only with ``force``, which
    also cleans runs that look alive."""
    from . import netns
    from .supervise import read_states
    out = {"runs": 0, "namespaces": 0, "live": 0, "unclaimed": []}
    claimed: set[str] = set()
    live_scratch: set[str] = set()
    for st in read_states():
        claimed.update(st.get("namespaces") or [])
        if run_alive(st) and not force:
            out["live"] += 1
            live_scratch.add(str(st.get("scratch")))
            continue
        out["namespaces"] += clean_run(st, "its torbed process was gone (`torbed clean`)", log=console.log)
        out["runs"] += 1
    for ns in netns.list_namespaces():
        if ns in claimed:
            continue
        if not force:
            out["unclaimed"].append(ns)
            continue
        n = netns.kill_namespace_processes(ns)
        netns.delete_namespace(ns)
        out["namespaces"] += 1
        console.log(f"removed namespace {ns}" + (f" and {n} process(es)" if n else ""))
    if netns.restore_tcp_hash():
        console.log("put back net.ipv4.tcp_child_ehash_entries, left set by a run killed while creating namespaces")
    for d in Path("/tmp").glob("torbed-*"):
        if not d.is_dir() or str(d) in live_scratch:
            continue
        held = lock_held(d / LOCK_NAME)
        # Without a lock: a run of an older torbed, or no scratch at all (`torbed prometheus`
        # serves a copy from /tmp/torbed-prometheus-*): removed only when forced, and only
        # what is named like a scratch directory.
        if held is False or (force and held is None and SCRATCH_NAME.fullmatch(d.name)):
            shutil.rmtree(d, ignore_errors=True)
    return out


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")   # as engine.write_json
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
