"""The results service's per-release token, with the service run as its own process (as in the
results pod: `python -m torbed.pods.results`) and the writers' real request code."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from torbed.errors import EXIT_BAD_INPUT
from torbed.pods import RESULTS_TOKEN_ENV, Shipper, bringup, results_post, shaper

TOKEN = "k3Yq9vTz0bXr7LmP2sWd4FgH6jNc8aQe1uIo5yRt"   # 40 characters, as the chart makes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, token: str | None):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != RESULTS_TOKEN_ENV}
    if token is not None:
        env[RESULTS_TOKEN_ENV] = token
    proc = subprocess.Popen([sys.executable, "-m", "torbed.pods.results", "--dir", str(tmp_path / "results"),
                             "--bind", "127.0.0.1", "--port", str(port), "--clients", "1"],
                            env=env, stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def service(tmp_path):
    proc, url = _start(tmp_path, TOKEN)
    deadline = time.time() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                break
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline, "results service did not come up in 20 s"
            time.sleep(0.05)
    yield proc, url, tmp_path / "results"
    proc.terminate()
    proc.wait(timeout=10)


def _post(url: str, headers: dict[str, str], data: bytes = b'{"a": 1}\n') -> int:
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_writes_need_the_token_reads_do_not(service):
    proc, url, d = service
    assert _post(f"{url}/append/transfers.jsonl", {}) == 401
    assert _post(f"{url}/append/transfers.jsonl", {"Authorization": "Bearer " + "x" * 40}) == 403
    assert _post(f"{url}/append/transfers.jsonl", {"Authorization": TOKEN}) == 403        # no scheme
    assert _post(f"{url}/ready/client0", {}) == 401
    assert _post(f"{url}/peer/relay-0", {}, b'{"group": "guard", "ip": "10.0.0.9"}') == 401
    assert _post(f"{url}/cache/relay-0", {}) == 401
    assert not (d / "transfers.jsonl").exists()
    with urllib.request.urlopen(f"{url}/start", timeout=5) as r:
        assert r.status == 204                       # the refused ready report counted for nothing
    with urllib.request.urlopen(f"{url}/peers", timeout=5) as r:
        assert json.loads(r.read()) == {"pods": {}}

    assert _post(f"{url}/append/transfers.jsonl", {"Authorization": f"Bearer {TOKEN}"}) == 200
    assert (d / "transfers.jsonl").read_bytes() == b'{"a": 1}\n'
    with urllib.request.urlopen(f"{url}/files/transfers.jsonl", timeout=5) as r:   # GETs stay open
        assert r.read() == b'{"a": 1}\n'
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'torbed_results_refused_writes_total{code="401"} 4.0' in metrics
    assert 'torbed_results_refused_writes_total{code="403"} 2.0' in metrics

    proc.terminate()
    _, err = proc.communicate(timeout=10)
    refusals = [line for line in err.splitlines() if "refused POST" in line]
    assert len(refusals) == 6, err
    assert "'/append/transfers.jsonl' from 127.0.0.1: no token" in refusals[0]
    assert refusals[1].endswith("from 127.0.0.1: wrong token")


def test_the_writers_present_the_token_from_their_environment(service, tmp_path, monkeypatch):
    _, url, d = service
    src = tmp_path / "out"
    src.mkdir()
    (src / "cellstats.jsonl").write_text('{"x": 1}\n')

    monkeypatch.delenv(RESULTS_TOKEN_ENV, raising=False)
    sh = Shipper(src, url, interval=3600)
    assert not sh.ship()                       # refused: kept for the next round
    assert not shaper.report_complete(url, "client-0")
    assert not shaper.announce(url, "client-0", "client", "10.0.0.7")

    monkeypatch.setenv(RESULTS_TOKEN_ENV, TOKEN)
    assert sh.ship()
    assert (d / "cellstats.jsonl").read_text() == '{"x": 1}\n'
    assert shaper.announce(url, "client-0", "client", "10.0.0.7")
    assert shaper.announced(url) == {"client": {"10.0.0.7"}}
    assert shaper.report_complete(url, "client-0")
    assert bringup.wait_start(url, node="client0", deadline=time.time() + 10) is not None


def test_results_post_prefers_an_explicit_token(monkeypatch):
    monkeypatch.setenv(RESULTS_TOKEN_ENV, "from-env")
    assert results_post("http://x/a", token="given").get_header("Authorization") == "Bearer given"
    assert results_post("http://x/a").get_header("Authorization") == "Bearer from-env"
    monkeypatch.delenv(RESULTS_TOKEN_ENV)
    assert results_post("http://x/a").get_header("Authorization") is None


@pytest.mark.parametrize("token, what", [(None, "not set"), ("short", "5 characters"), ("   ", "not set")])
def test_the_service_does_not_start_without_a_usable_token(tmp_path, token, what):
    proc, _ = _start(tmp_path, token)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == EXIT_BAD_INPUT
    assert f"environment variable {RESULTS_TOKEN_ENV}: {what}" in err
    assert "results.token" in err
