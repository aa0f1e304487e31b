"""Process supervision for the local backend: start, watch, stop (SIGTERM, then SIGKILL).

Every process runs in its own session (a Ctrl-C at the terminal reaches only torbed, which
then stops them in order) and is recorded in a state file (``STATE_DIR/<run id>.json``)
together with the namespaces and scratch directory of the run. Given the run's lock
(``lifetime.RunLock``), the Supervisor also makes its processes die with torbed and starts
the run's watchdog (torbed.backends.local.lifetime): a run killed with SIGKILL stops and
cleans itself; ``torbed clean`` covers a watchdog killed too.

Public API:

- ``Supervisor(run_id, state, lock=None)``: ``.start(name, argv, log_path)``, ``.kill(name)``, ``.respawn(name)``,
  ``.exited() -> {name: returncode}``, ``.stop_all(grace)``, ``.forget()``
- ``NodeFailed``: a node that exited early; ``.tail`` holds the last lines of its log
- ``tail(path, n) -> str``
- ``read_states() -> list[dict]``; ``owner_alive(state) -> bool``
- ``run_torbed(args, capture=True, cwd=None) -> CompletedProcess``: ``python -m torbed.cli ARGS``
  for the benchmarks, interrupted without SIGKILL (so the child tears its network down)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ... import constants
from ...errors import RunFailed
from . import lifetime


# How long a benchmark waits for an interrupted `torbed run` to tear down (750 tors: ~1 min).
CHILD_TEARDOWN_S = 600.0


def run_torbed(args: list[str], capture: bool = True, cwd: str | Path | None = None,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m torbed.cli ARGS`` to completion, as subprocess.run would, except on Ctrl-C:
    subprocess.run SIGKILLs its child then, and a SIGKILLed run leaves its namespaces and tors
    behind (seen: a 750-tor benchmark left 750 tors running). Here the child gets SIGINT (a
    terminal's Ctrl-C has sent it one already; torbed ignores more while it tears down), its
    teardown is waited for, and then the interrupt goes on. ``env``: variables added to this
    process' environment."""
    return run_child([sys.executable, "-m", "torbed.cli", *args], capture, cwd, env=env)


def run_child(cmd: list[str], capture: bool = True, cwd: str | Path | None = None,
              teardown_s: float = CHILD_TEARDOWN_S, env: dict | None = None) -> subprocess.CompletedProcess:
    """run_torbed's body, for any command."""
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, cwd=cwd,
                          env={**os.environ, **env} if env else None) as p:
        try:
            out, err = p.communicate()
        except KeyboardInterrupt:
            p.send_signal(signal.SIGINT)
            try:
                p.communicate(timeout=teardown_s)
            except subprocess.TimeoutExpired:
                p.terminate()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


class NodeFailed(RunFailed):
    def __init__(self, name: str, message: str, log: Path | None = None):
        self.name = name
        self.tail = tail(log) if log else ""
        super().__init__(f"{name}: {message}" + (f"\n--- last lines of {log} ---\n{self.tail}" if self.tail else ""))


def tail(path: Path | None, n: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except (OSError, TypeError):
        return ""


class Supervisor:
    def __init__(self, run_id: str, state: dict, lock: "lifetime.RunLock | None" = None):
        """``lock``: the run's lock, held by this process; with it, children get a
        parent-death signal and a watchdog waits on the lock (module docstring)."""
        self.run_id = run_id
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.launch: dict[str, tuple[list[str], dict | None]] = {}   # name -> (argv, env), for restarts
        self.killed: set[str] = set()
        self.lock = lock
        self.state = {**state, "run_id": run_id, "owner_pid": os.getpid(),
                      "owner_start": lifetime.process_start(os.getpid()), "pids": {},
                      **({"lock": str(lock.path)} if lock else {})}
        constants.STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.state_file = constants.STATE_DIR / f"{run_id}.json"
        self._save()
        self.deathsig = lifetime.pdeathsig_prefix() if lock else []
        self.watchdog: subprocess.Popen | None = None
        if lock:
            fd = lock.watch_fd()
            try:
                self.watchdog = lifetime.start_watchdog(self.state_file, fd)
            finally:
                os.close(fd)
            self.update_state(watchdog_pid=self.watchdog.pid)

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_file)

    def update_state(self, **kw) -> None:
        self.state.update(kw)
        self._save()

    def start(self, name: str, argv: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The parent-death signal fires when the starting *thread* ends: main thread only.
        prefix = self.deathsig if threading.current_thread() is threading.main_thread() else []
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(prefix + argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        self.procs[name] = (proc, log_path)
        self.launch[name] = (argv, env)
        self.state["pids"][name] = proc.pid
        self._save()
        return proc

    def log_of(self, name: str) -> Path:
        return self.procs[name][1]

    def kill(self, name: str) -> None:
        """SIGKILL one process on purpose (a fault); it no longer counts as a failure."""
        self.killed.add(name)
        proc, _ = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def respawn(self, name: str) -> subprocess.Popen:
        """Start a process again as it was started (a restart fault), appending to its log."""
        argv, env = self.launch[name]
        self.killed.discard(name)
        return self.start(name, argv, self.procs[name][1], env=env)

    def signal(self, name: str, sig: int) -> None:
        proc, _ = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def exited(self, names=None) -> dict[str, int]:
        out = {}
        for name, (proc, _) in self.procs.items():
            if names is not None and name not in names:
                continue
            if name not in self.killed and proc.poll() is not None:
                out[name] = proc.returncode
        return out

    def check(self, names) -> None:
        for name, rc in self.exited(names).items():
            raise NodeFailed(name, f"exited with status {rc}", self.log_of(name))

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self.procs[name][0].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, names, grace: float = constants.STOP_GRACE) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left."""
        live = [(n, self.procs[n][0]) for n in names if n in self.procs and self.procs[n][0].poll() is None]
        for _, proc in live:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace
        for _, proc in live:
            try:
                proc.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _reap(proc)

    def stop_all(self, grace: float = constants.STOP_GRACE) -> None:
        self.stop(list(self.procs), grace)

    def forget(self) -> None:
        """The run ended its own way: remove the state file, then release the lock, so the
        watchdog wakes, finds no state file and exits (waited for here)."""
        try:
            self.state_file.unlink()
        except FileNotFoundError:
            pass
        if self.lock is not None:
            self.lock.release()
        if self.watchdog is not None:
            try:
                self.watchdog.wait(10)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                _reap(self.watchdog)
            self.watchdog = None


def _reap(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Wait for a SIGKILLed process. Popen.wait() blocks on a lock of the Popen, and a signal
    handler that raises (torbed's SIGINT/SIGTERM) between that lock's acquire and its with
    block leaves it held for good: seen after a Ctrl-C during a 750-tor launch, when the
    teardown hung on proc.wait() over a process that was long dead. So waitpid() directly
    when wait() cannot finish."""
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return                      # reaped elsewhere
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return
        time.sleep(0.05)


def read_states() -> list[dict]:
    states = []
    for f in sorted(constants.STATE_DIR.glob("*.json")):
        try:
            states.append({**json.loads(f.read_text()), "_file": str(f)})
        except (OSError, json.JSONDecodeError):
            states.append({"_file": str(f), "run_id": f.stem, "owner_pid": None})
    return states


def owner_alive(state: dict) -> bool:
    pid = state.get("owner_pid")
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
