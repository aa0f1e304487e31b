"""Interrupts and teardown: a benchmark interrupted with Ctrl-C lets its `torbed run` tear down
(subprocess.run would SIGKILL it, leaving the run's network behind), and the supervisor's
teardown finishes even when an interrupt left a Popen's wait lock held."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from torbed import constants
from torbed.backends.local.supervise import Supervisor, run_child

CHILD = """
import signal, sys, time
def stop(*_):
    time.sleep(0.5)                 # a teardown that takes a while
    open(sys.argv[1], "w").write("torn down")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
open(sys.argv[2], "w").write("up")
time.sleep(60)
"""


def test_interrupt_lets_the_child_tear_down(tmp_path):
    done, up = tmp_path / "done", tmp_path / "up"
    # A shell's background job starts with SIGINT ignored, and Python then installs no
    # handler: Ctrl-C's KeyboardInterrupt must not depend on how the test run was started.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt():
        for _ in range(200):
            if up.exists():
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGINT)      # as Ctrl-C does to the benchmark

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_child([sys.executable, "-c", CHILD, str(done), str(up)], teardown_s=30)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done.read_text() == "torn down"


def test_completed_child_returns_like_subprocess_run(tmp_path):
    p = run_child([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\n", "err\n")


def test_stop_reaps_a_process_whose_wait_lock_an_interrupt_left_held(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "STATE_DIR", tmp_path)
    sup = Supervisor("t-leak", {})
    proc = sup.start("stubborn", [sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"], tmp_path / "log")
    threading.Event().wait(0.5)
    assert proc._waitpid_lock.acquire(False)      # as a signal between acquire and `with` leaves it
    done = threading.Event()
    threading.Thread(target=lambda: (sup.stop_all(grace=0.5), done.set()), daemon=True).start()
    assert done.wait(30), "teardown hung on Popen.wait()"
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)                        # reaped, not a zombie
