"""`helm test`'s check (torbed.pods.helmtest) against a real results service on loopback."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request

import pytest

from torbed.pods import helmtest
from torbed.pods.results import make_handler


@pytest.fixture
def results(tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(tmp_path))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"

    def append(*recs: dict) -> None:
        data = "".join(json.dumps(r) + "\n" for r in recs).encode()
        urllib.request.urlopen(urllib.request.Request(f"{url}/append/transfers.jsonl", data=data, method="POST"))

    yield url, append
    srv.shutdown()


def _transfer(status="ok", got=5242880, size=5242880, cause=None) -> dict:
    return {"type": "transfer", "client": "bulk0", "server": "www0", "file": "bulk", "size": size, "bytes": got,
            "status": status, "ttlb_s": 3.5, "error": {"cause": cause, "detail": ""} if cause else None,
            "circuit": {"path": [{"node": "guard0"}, {"node": "middle0"}, {"node": "exit0"}]}}


def test_passes_once_a_whole_file_crossed(results, capsys):
    url, append = results
    append(_transfer("error", got=0, cause="circuit_failed"), _transfer("ok", got=100, size=200), _transfer())
    assert helmtest.main(["--results", url, "--timeout", "10"]) == 0
    out = capsys.readouterr().out
    assert "bulk0 fetched bulk (5242880 B) from www0 through guard0-middle0-exit0" in out
    assert "3 transfers" in out


def test_fails_naming_the_causes_when_nothing_crossed(results, capsys, monkeypatch):
    url, append = results
    monkeypatch.setattr(helmtest, "POLL_S", 0.2)
    append(_transfer("error", got=0, cause="circuit_failed"), _transfer("timeout", got=10, cause="timeout"))
    assert helmtest.main(["--results", url, "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "no transfer crossed the network" in err and "'circuit_failed': 1" in err and "'timeout': 1" in err


def test_fails_when_the_results_service_is_unreachable(capsys, monkeypatch):
    monkeypatch.setattr(helmtest, "POLL_S", 0.2)
    assert helmtest.main(["--results", "http://127.0.0.1:9", "--timeout", "1"]) == 1
    assert "results service http://127.0.0.1:9" in capsys.readouterr().err


def test_a_scenario_with_faults_says_they_were_not_run(results, capsys, monkeypatch):
    url, append = results
    append(_transfer())
    assert helmtest.main(["--results", url, "--timeout", "10", "--faults-not-run", "2"]) == 0
    out = capsys.readouterr().out
    assert "fetched bulk" in out and "the scenario has 2 fault(s) and this release ran none of them" in out
    monkeypatch.setattr(helmtest, "POLL_S", 0.2)
    assert helmtest.main(["--results", "http://127.0.0.1:9", "--timeout", "1", "--faults-not-run", "1"]) == 1
    assert "1 fault(s) and this release ran none" in capsys.readouterr().err
    # Without faults (the chart passes nothing): no note.
    assert helmtest.main(["--results", url, "--timeout", "10"]) == 0
    assert "fault" not in capsys.readouterr().out
