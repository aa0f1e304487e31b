"""hack/cluster.sh's process helpers, sourced without running a command.

The cold-machine failure "etcd exited while waiting for etcd healthy" came from reading a
daemon's /proc/PID/cmdline before the forked shell had exec'd it: `start` must return only
once the recorded pid is the daemon itself, so the liveness check cannot call it dead.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _harness(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    # Everything but the last line (`main "$@"`), then the test's own commands.
    script = (ROOT / "hack/cluster.sh").read_text().rsplit("\nmain \"$@\"", 1)[0]
    script = script.replace('HERE=$(cd "$(dirname "$0")" && pwd)', f"HERE={ROOT / 'hack'}", 1)
    slow = tmp_path / "slow-exec.sh"
    # Stands in for a daemon whose exec is slow on a cold machine: until it execs, its
    # command line is this script's, not the daemon's.
    slow.write_text("sleep 0.6\nexec sleep 4321\n")
    harness = tmp_path / "harness.sh"
    harness.write_text(script + textwrap.dedent(f"""
        PIDS={tmp_path}/pids LOGS={tmp_path}/logs
        bin_of() {{ echo "sleep 4321"; }}
        {body}
        """))
    return subprocess.run(["bash", str(harness)], capture_output=True, text=True, timeout=30)


def test_start_returns_once_the_daemon_has_execd(tmp_path):
    p = _harness(tmp_path, f"""
        start fake bash {tmp_path}/slow-exec.sh
        if pid=$(pid_of fake); then echo "alive $pid"; else echo dead; fi
        kill "$(cat $PIDS/fake.pid)"
        """)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("alive "), p.stdout + p.stderr


def test_start_returns_at_once_when_the_command_dies(tmp_path):
    p = _harness(tmp_path, """
        SECONDS=0
        start fake false
        echo "took $SECONDS"
        pid_of fake || echo gone
        """)
    assert p.returncode == 0, p.stderr
    assert "gone" in p.stdout
    took = int(p.stdout.split("took ")[1].split()[0])
    assert took <= 2, p.stdout
