"""Replay on Kubernetes, the parts that need no cluster: pods find traces by file name
(TORBED_TRACE_DIRS), torbed run --backend k8s inlines only the traces the client image does
not ship (within the Helm release's limit), and the replay container serves the right ones."""

from __future__ import annotations

import base64
import gzip
import shutil
from pathlib import Path

import pytest
import yaml

from torbed.backends.k8s import chart
from torbed import constants
from torbed.pods.replayserver import traces_for
from torbed.scenario import parse

GOPAL = constants.SCENARIOS_DIR / "gopal-heninger-2012-exp2.yaml"
TWO_FLOWS = Path(__file__).resolve().parents[1] / "data" / "replay" / "two-flows.trace.jsonl"


def _gopal(tmp_path, **traces):
    data = yaml.safe_load(GOPAL.read_text())
    for group, trace in traces.items():
        data["clients"][group]["workload"]["trace"] = str(trace)
    return parse(data, source="test", base_dir=tmp_path)


def test_pods_find_traces_by_file_name(tmp_path, monkeypatch):
    """In a pod there is no repository: the scenario's path is looked up by its name in the
    mounted traces first, then in the image's."""
    mounted, image = tmp_path / "etc", tmp_path / "share"
    for d in (mounted, image):
        d.mkdir()
    shutil.copy(TWO_FLOWS, image / "two-flows.trace.jsonl")
    s = _gopal(tmp_path, web=TWO_FLOWS, ssh=TWO_FLOWS)
    monkeypatch.setattr(constants, "TRACE_DIRS", [mounted, image])
    assert s.trace_path("/nowhere/two-flows.trace.jsonl") == image / "two-flows.trace.jsonl"
    assert s.trace_path("elsewhere/two-flows.trace.jsonl") == image / "two-flows.trace.jsonl"
    shutil.copy(TWO_FLOWS, mounted / "two-flows.trace.jsonl")
    assert s.trace_path("/nowhere/two-flows.trace.jsonl") == mounted / "two-flows.trace.jsonl"
    # An existing path still wins.
    assert s.trace_path(str(TWO_FLOWS)) == TWO_FLOWS


def test_shipped_traces_are_not_inlined():
    s = parse(yaml.safe_load(GOPAL.read_text()), source=str(GOPAL), base_dir=GOPAL.parent)
    assert chart.inline_traces(s) == {}


def test_own_traces_are_inlined(tmp_path):
    s = _gopal(tmp_path, web=TWO_FLOWS)
    got = chart.inline_traces(s)
    assert list(got) == ["two-flows.trace.jsonl"]
    assert base64.b64decode(got["two-flows.trace.jsonl"]) == TWO_FLOWS.read_bytes()


def test_traces_over_the_release_limit_are_refused(tmp_path):
    big = tmp_path / "big.trace.jsonl.gz"
    big.write_bytes(gzip.compress(TWO_FLOWS.read_bytes()) + b"\0" * (chart.INLINE_TRACES_MAX_BYTES + 1))
    s = _gopal(tmp_path)
    s.clients["web"].workload.trace = str(big)
    with pytest.raises(ValueError, match=r"big.trace.jsonl.gz: 512 KiB, more than the 512 KiB.*replayTraces.configMap"):
        chart.inline_traces(s)


def test_replay_container_serves_its_groups_traces():
    s = parse(yaml.safe_load(GOPAL.read_text()), source=str(GOPAL), base_dir=GOPAL.parent)
    got = traces_for(s, "replay")
    assert sorted(got) == ["http-browsing", "ssh-session"]
    assert all(p.is_file() for p in got.values())
    assert traces_for(s, "files") == {}


def test_client_pod_replay_workload(monkeypatch, tmp_path):
    """What a replay client pod gives its driver: the local backend's flow assignment, and
    one replay pod's address (the headless Service's addresses, sorted; client i takes i mod
    n) for both the stream and the clock exchanges."""
    import socket

    from torbed.pods import client as k8s_client
    from torbed.network import plan
    monkeypatch.setenv("TORBED_RELEASE", "rel")
    monkeypatch.setenv("TORBED_NAMESPACE", "default")
    asked = []

    def fake_getaddrinfo(host, *a, **kw):
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in ("10.244.0.30", "10.244.0.9")]
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    data = yaml.safe_load(GOPAL.read_text())
    data["servers"]["replay"]["count"] = 2
    data["clients"]["ssh"]["count"] = 2
    data["clients"]["ssh"]["workload"]["distribute"] = "each"
    s = parse(data, source=str(GOPAL), base_dir=GOPAL.parent)
    p = plan(s, "vanilla")
    w0 = k8s_client.replay_workload(s, p, "ssh", "ssh0", "replay", tmp_path)
    w1 = k8s_client.replay_workload(s, p, "ssh", "ssh1", "replay", tmp_path)
    assert asked[0] == "rel-replay-pods.default.svc.cluster.local"
    assert (w0["address"], w1["address"]) == ("10.244.0.9", "10.244.0.30")
    assert w0["port"] == 8000 and w0["trace_name"] == "ssh-session"
    assert w0["flows"] == w1["flows"] and w0["flows"]          # each: every client all flows
    assert w0["offset_s"] == 0 and w1["offset_s"] == pytest.approx(w0["period_s"] / 2)
    assert w0["clock_output"] == str(tmp_path / "clock.jsonl")
    assert w0["cells_output"] == str(tmp_path / "cells.jsonl")
