"""Bring-up help on Kubernetes (torbed.pods.bringup): which relays are directory caches, the
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
from torbed.pods import bringup
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


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_relay_nudge_hups_a_real_tor_only_once_the_authority_has_a_complete_consensus(tmp_path):
    """A real tor relay with no consensus, its authority our DirPort: no SIGHUP while the
    authority has nothing complete, then SIGHUPs (tor logs the reload), and tor asks the
    authority again at once instead of after its download back-off. (The canned consensus is
    unsigned, so tor never accepts it and stays without one.)"""
    import shutil
    import subprocess

    import stem.control

    tor = shutil.which("tor")
    assert tor, "tor not installed: run make setup"
    p = _plan()
    fprs = {n.name: f"{i + 1:040X}" for i, n in enumerate(p.by_role("relay"))}
    a = _Authority()
    requests: list[tuple[float, str]] = []       # tor's own: not authority_consensus's exact path
    handler = a.srv.RequestHandlerClass
    get = handler.do_GET

    def counting_get(self):
        if self.path != "/tor/status-vote/current/consensus":
            requests.append((time.time(), self.path))
        get(self)
    handler.do_GET = counting_get
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    sock = tmp_path / "control"
    log_file = tmp_path / "tor.log"
    port = a.srv.server_address[1]
    (tmp_path / "torrc").write_text(
        f"DataDirectory {data}\nControlSocket {sock}\nSocksPort 0\nORPort 127.0.0.1:{_free_port()}\n"
        "Address 127.0.0.1\nAssumeReachable 1\nPublishServerDescriptor 0\nTestingTorNetwork 1\n"
        f"DirAuthority fake orport=9 no-v2 v3ident={'A' * 40} 127.0.0.1:{port} {'B' * 40}\n"
        f"Log notice file {log_file}\n")
    proc = subprocess.Popen([tor, "-f", str(tmp_path / "torrc")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()

    def connect():
        deadline = time.time() + 30
        while True:
            try:
                ctl = stem.control.Controller.from_socket_file(str(sock))
                ctl.authenticate()
                return ctl
            except stem.SocketError:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
    try:
        # Nothing complete at the authority: 404s; never a SIGHUP.
        done = bringup.relay_nudge(connect, p, fprs, [a.url], "http://127.0.0.1:9", "tb-guard-0", False,
                                   time.time() + 4, stop)
        assert done["hups"] == 0 and "error" not in done, done
        assert requests, "tor never asked the authority"
        assert "Received reload signal" not in log_file.read_text()
        # One relay missing: still no SIGHUP.
        a.doc = _consensus(p, fprs, drop=p.by_role("relay")[-1].name)
        done = bringup.relay_nudge(connect, p, fprs, [a.url], "http://127.0.0.1:9", "tb-guard-0", False,
                                   time.time() + 2, stop)
        assert done["hups"] == 0, done
        # Complete: SIGHUP (at most one per HUP_SPACING_S), and tor fetches again right after.
        a.doc = _consensus(p, fprs)
        time.sleep(1.0)
        t_hup = time.time()
        done = bringup.relay_nudge(connect, p, fprs, [a.url], "http://127.0.0.1:9", "tb-guard-0", False,
                                   time.time() + bringup.HUP_SPACING_S + 1, stop)
        assert done["hups"] == 2 and not done["cache_reported"], done
        time.sleep(1.0)
        assert log_file.read_text().count("Received reload signal") == 2
        # Without the SIGHUPs tor would wait out its back-off (several seconds by now).
        after = [t for t, _ in requests if t > t_hup]
        assert len(after) >= 2, requests
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        a.close()
