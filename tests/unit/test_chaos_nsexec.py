"""hack/cluster/chaos-daemon/nsexec.c, torbed's stand-in for Chaos Mesh's nsexec (chaos-daemon
starts StressChaos's stress-ng through it), compiled and run on real processes: the command
line chaos-daemon's process manager builds, the namespace it enters, SIGTERM passed on to the
command (how chaos-daemon stops a stressor), the exit status, and refusals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.conftest import REPO

SRC = REPO / "hack" / "cluster" / "chaos-daemon" / "nsexec.c"


@pytest.fixture(scope="module")
def nsexec(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("nsexec") / "nsexec"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(out), str(SRC)], check=True)
    return str(out)


def test_runs_the_command_and_returns_its_exit_status(nsexec):
    p = subprocess.run([nsexec, "--", "sh", "-c", "echo hello $1; exit 7", "sh", "world"], capture_output=True, text=True)
    assert (p.returncode, p.stdout) == (7, "hello world\n")
    assert subprocess.run([nsexec, "true"]).returncode == 0   # no "--": the command starts at the first non-option


def test_sigterm_is_passed_to_the_command_which_ends_with_it(nsexec):
    p = subprocess.Popen([nsexec, "--", "sh", "-c", "trap 'kill $!; echo got-term; exit 3' TERM; sleep 30 & wait"],
                         stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    assert (p.returncode, out) == (3, "got-term\n")
    q = subprocess.Popen([nsexec, "sleep", "30"])
    time.sleep(0.3)
    q.send_signal(signal.SIGTERM)
    assert q.wait(timeout=10) == 128 + signal.SIGTERM   # the command's own death by the signal


@pytest.mark.skipif(os.geteuid() != 0, reason="setns needs root")
def test_enters_the_namespaces_it_is_given(nsexec):
    other = subprocess.Popen(["unshare", "--net", "--pid", "--fork", "sleep", "30"])
    try:
        time.sleep(0.5)
        child = subprocess.run(["pgrep", "-P", str(other.pid)], capture_output=True, text=True).stdout.split()[0]
        ns = f"/proc/{child}/ns"
        p = subprocess.run([nsexec, "-n", f"{ns}/net", "-p", f"{ns}/pid", "--", "sh", "-c",
                            "readlink /proc/self/ns/net; readlink /proc/self/ns/pid"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split() == [os.readlink(f"{ns}/net"), os.readlink(f"{ns}/pid")]
    finally:
        other.kill()
        other.wait()


def test_refuses_what_it_does_not_do(nsexec):
    for argv, msg in ((["-l", "-m", "/proc/1/ns/mnt", "--", "true"], "unsupported option -l"),
                      (["-p"], "unsupported option -p"), (["--"], "no command"),
                      (["-n", "/nonexistent", "--", "true"], "cannot enter /nonexistent")):
        p = subprocess.run([nsexec, *argv], capture_output=True, text=True)
        assert p.returncode in (1, 2) and msg in p.stderr, (argv, p.returncode, p.stderr)
