"""Bring-up help on Kubernetes (torbed.k8s.bringup): which relays are directory caches, the
authority's consensus as the relays' collector reads it (a canned consensus served over real
HTTP), and the results service's cache reports the client drivers wait for."""

from __future__ import annotations

import base64
import copy
import http.server
import threading
import time

import pytest

from torbed import network, readiness, scenario
from torbed.k8s import bringup
from tests.unit.test_k8s_runtime import results_server
from tests.unit.test_scenario import BASE


def _plan(guards: bool = True):
    data = copy.deepcopy(BASE)
    if not guards:
        for g in data["network"]["relays"].values():
            g.pop("guard", None)
    s = scenario.parse(data, "t.yaml")
    return network.plan(s, "kist")


def _consensus(p, fprs, drop: str | None = None) -> bytes:
    """A consensus document (the parts torbed.readiness reads) listing every relay but ``drop``."""
    lines = ["network-status-version 3", "vote-status consensus", "consensus-method 32",
             "valid-after 2026-11-24 14:05:20", "fresh-until 2026-11-24 14:05:30",
             "valid-until 2026-11-24 14:05:40", "voting-delay 2 2",
             "known-flags Exit Fast Guard Running Stable V2Dir Valid"]
    for i, n in enumerate(p.by_role("relay")):
        if n.name == drop:
            continue
        ident = base64.b64encode(bytes.fromhex(fprs[n.name])).decode().rstrip("=")
        lines += [f"r {n.name} {ident} {ident} 2026-11-24 14:05:13 10.0.0.{i + 1} 5000 0",
                  "s " + " ".join(sorted(readiness.wanted_flags(n) | {"V2Dir"}))]
    lines.append("directory-footer")
    return ("\n".join(lines) + "\n").encode()


class _Authority:
    """A DirPort that serves /tor/status-vote/current/consensus: 404 until given a document."""

    def __init__(self):
        self.doc: bytes | None = None
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path != "/tor/status-vote/current/consensus" or outer.doc is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.doc)))
                self.end_headers()
                self.wfile.write(outer.doc)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_directory_caches_are_the_guards_or_every_relay():
    p = _plan()
    guards = [n.name for n in p.by_role("relay") if n.guard]
    assert guards and bringup.directory_caches(p) == guards
    p = _plan(guards=False)
    assert not any(n.guard for n in p.by_role("relay"))
    assert bringup.directory_caches(p) == [n.name for n in p.by_role("relay")]


def test_authority_consensus_is_complete_only_with_every_relay():
    p = _plan()
    fprs = {n.name: f"{i + 1:040X}" for i, n in enumerate(p.by_role("relay"))}
    a, b = _Authority(), _Authority()
    try:
        assert "404" in bringup.authority_consensus([a.url], p, fprs)
        last = p.by_role("relay")[-1].name
        a.doc = _consensus(p, fprs, drop=last)
        assert bringup.authority_consensus([a.url], p, fprs) == f"{last} not in the consensus yet"
        assert bringup.authority_consensus(["http://127.0.0.1:9"], p, fprs) is not None   # nobody there
        b.doc = _consensus(p, fprs)
        assert bringup.authority_consensus([a.url, b.url], p, fprs) is None    # one complete is enough
    finally:
        a.close()
        b.close()


def test_clients_wait_for_every_cache_report_but_not_forever(tmp_path):
    with results_server(tmp_path, clients=1) as url:
        t0 = time.time()
        assert bringup.wait_for_caches(url, 1, t0 + 0.6)[0] == 0
        assert time.time() - t0 >= 0.6 - 0.01                      # gave up at the deadline
        assert bringup._post(f"{url}/cache/tb-guard-0")
        assert bringup._post(f"{url}/cache/tb-guard-0")            # a restarted collector: once
        t0 = time.time()
        have, when = bringup.wait_for_caches(url, 1, t0 + 30)
        assert have == 1 and when - t0 < 5
        assert bringup.wait_for_caches(url, 2, time.time() + 0.3)[0] == 1
        assert not bringup._post(f"{url}/cache/..")                # 400: a bad name


@pytest.mark.parametrize("data", [b"", b"not a consensus"])
def test_consensus_problem_on_garbage(data):
    p = _plan()
    fprs = {n.name: f"{i + 1:040X}" for i, n in enumerate(p.by_role("relay"))}
    why, flags = readiness.consensus_problem(data, p, fprs)
    assert why is not None and flags == {}
