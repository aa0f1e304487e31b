"""The CPU samples a Kubernetes pod takes of itself for the mechanism gates
(torbed.pods.cpusample): which processes of a shared process namespace are sampled and as
what, and that the records name their pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torbed.pods import cpusample


def fake_proc(root: Path, procs: dict[int, tuple[str, list[str]]]) -> Path:
    for pid, (comm, argv) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (root / "self").mkdir()
    return root


def test_classify_by_command():
    assert cpusample.classify("tor", ["tor", "-f", "/run/torbed/torrc"]) == "tor"
    assert cpusample.classify("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.shaper", "--group", "x"]) == "shaper"
    assert cpusample.classify("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.client"]) == "driver"
    assert cpusample.classify("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.relayside"]) == "collector"
    assert cpusample.classify("pause", ["/pause"]) is None
    assert cpusample.classify("bash", ["bash", "/usr/local/bin/torbed-node"]) is None
    assert cpusample.classify("python", ["python", "-m"]) is None
    assert cpusample.classify("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.replayserver"]) == "server"


def test_a_server_pods_processes_are_named_as_locally(tmp_path):
    """The file server is the node itself, the replay server <node>.replay (as the local
    backend names them), the shaper sidecar that samples them <node>.shaper."""
    proc = fake_proc(tmp_path, {1: ("pause", ["/pause"]),
                                5: ("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.shaper"]),
                                9: ("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.server", "--group", "srv"]),
                                11: ("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.replayserver"])})
    got = cpusample.pod_processes("srv0", "srv", "server", proc, me=5)
    assert got == {"srv0": (9, "server", "srv"), "srv0.replay": (11, "server", "srv"),
                   "srv0.shaper": (5, "shaper", "srv")}


def test_pod_processes_of_a_relay_pod(tmp_path):
    proc = fake_proc(tmp_path, {1: ("pause", ["/pause"]), 7: ("tor", ["tor", "-f", "x"]),
                                12: ("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.shaper"]),
                                20: ("python", ["/opt/torbed/bin/python", "-m", "torbed.pods.relayside"]),
                                33: ("sh", ["sh", "-c", "cat /run/torbed/shaper/ready"])})
    got = cpusample.pod_processes("middle0", "middle", "relay", proc, me=20)
    assert got == {"middle0": (7, "relay", "middle"), "middle0.shaper": (12, "shaper", "middle"),
                   "middle0.collector": (20, "collector", "middle")}


def test_a_real_process_tree_is_sampled_with_its_pod_as_source(tmp_path):
    """This machine's /proc: a child running `python -m torbed.pods.shaper`-like command line
    is found and sampled with scheduler counters; the record carries the pod's node."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "torbed.pods.shaper"])
    try:
        # classify reads "-m <module>" anywhere in argv: the child's argv ends with it
        sampler = cpusample.start(tmp_path, "exit0", "exit", "relay")
        time.sleep(1.5)
        errors = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert errors == []
    recs = [json.loads(line) for line in (tmp_path / "cpu.jsonl").read_text().splitlines()]
    assert len(recs) >= 2 and all(r["source"] == "exit0" and r["type"] == "cpu" for r in recs)
    shaper = [p for r in recs for n, p in r["procs"].items() if n == "exit0.shaper"]
    assert shaper and shaper[0]["role"] == "shaper" and "wait_ns" in shaper[0] and "run_ns" in shaper[0]
    assert recs[-1]["host"]["cpus"] == os.cpu_count()
