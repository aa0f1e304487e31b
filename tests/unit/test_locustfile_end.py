"""The locustfile's 'end' record holds every request the master counted, workers' last
reports included: a real Locust master and two workers on loopback, their users fetching
from a loopback HTTP server through a minimal SOCKS5 relay standing in for the load node's
tor (socks5h, as the locustfile speaks to tor). Locust's own final statistics
(``--json-file``, written at shutdown from the master's merged statistics) are the reference.

With --run-time, Locust fires test_stop before it tells the workers to quit, and a worker
sends the requests of its last report interval (3 s) only on quit: an end record written at
test_stop misses them. The users here never pause, so that interval always has requests."""

import http.server
import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time

import pytest

from torbed import load
from torbed.backends.local.prometheus import pump

BODY = b"x" * 2048


class _Socks5(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Socks5Handler(socketserver.BaseRequestHandler):
    # RFC 1928, just what PySocks asks for: no authentication, CONNECT, IPv4 or a name.
    def handle(self):
        c = self.request
        _, n = c.recv(2)
        c.recv(n)
        c.sendall(b"\x05\x00")
        _, cmd, _, atyp = c.recv(4)
        host = socket.inet_ntoa(c.recv(4)) if atyp == 1 else c.recv(c.recv(1)[0]).decode()
        (port,) = struct.unpack("!H", c.recv(2))
        up = socket.create_connection((host, port))
        c.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack("!H", 0))
        threading.Thread(target=pump, args=(up, c), daemon=True).start()
        pump(c, up)


class _Files(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *_):
        pass


@pytest.fixture()
def loopback():
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    web.daemon_threads = True
    socks = _Socks5(("127.0.0.1", 0), _Socks5Handler)
    for srv in (web, socks):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield web.server_address[1], socks.server_address[1]
    for srv in (web, socks):
        srv.shutdown()
        srv.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", ["run-time", "sigterm"])
def test_end_record_includes_the_workers_last_reports(tmp_path, loopback, how):
    web_port, socks_port = loopback
    cfg = {"variant": "kist", "rep": 0, "seed": 1, "servers": [f"http://127.0.0.1:{web_port}"],
           "socks_port": socks_port, "timeout_s": 10, "stats_interval_s": 1,
           "stats_output": str(tmp_path / "load.jsonl"),
           "requests": [{"name": "web", "file": "load-web", "size": len(BODY), "weight": 1, "think": None}]}
    (tmp_path / "locust.json").write_text(json.dumps(cfg))
    env = {**os.environ, "TORBED_LOAD_CONFIG": str(tmp_path / "locust.json")}
    master_port = _free_port()
    base = [sys.executable, "-m", "locust", "-f", str(load.LOCUSTFILE), "--loglevel", "INFO"]
    procs = [subprocess.Popen(base + ["--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port)],
                              env={**env, "TORBED_LOAD_NODE": f"w{i}"}, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / f"w{i}.log", "w")) for i in range(2)]
    run_time = "4s" if how == "run-time" else "60s"
    master = subprocess.Popen(base + ["--master", "--headless", "--master-bind-host", "127.0.0.1",
                                      "--master-bind-port", str(master_port), "--expect-workers", "2",
                                      "--expect-workers-max-wait", "30", "-u", "4", "-r", "100",
                                      "--run-time", run_time, "--stop-timeout", "0", "--exit-code-on-error", "0",
                                      "--json-file", str(tmp_path / "final"), "--only-summary"],
                              env={**env, "TORBED_LOAD_NODE": "m"}, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "master.log", "w"))
    procs.append(master)
    try:
        if how == "sigterm":
            # Stopped while the users run (torbed's stop before load.stop, Ctrl-C): a few
            # periodic records first.
            deadline = time.time() + 30
            while time.time() < deadline and not (tmp_path / "load.jsonl").exists():
                time.sleep(0.2)
            time.sleep(4.5)
            master.send_signal(signal.SIGTERM)
        assert master.wait(timeout=60) == 0, (tmp_path / "master.log").read_text()[-3000:]
        for p in procs[:2]:
            p.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    records = [json.loads(line) for line in (tmp_path / "load.jsonl").read_text().splitlines()]
    ends = [r for r in records if r["label"] == "end"]
    assert len(ends) == 1 and records[-1] is ends[0], [r["label"] for r in records]
    final = {e["name"]: e for e in json.loads((tmp_path / "final.json").read_text())}
    total = ends[0]["total"]
    assert final["web"]["num_requests"] > 0
    assert total["requests"] == final["web"]["num_requests"], (total, final["web"]["num_requests"])
    assert total["bytes"] == final["web"]["total_content_length"] == total["requests"] * len(BODY)
    # The last periodic record was taken before the stop began (none while the users stop),
    # while the workers' last interval was still out: the end record has more.
    periodic = [r for r in records if r["label"] == "periodic"]
    assert periodic and periodic[-1]["total"]["requests"] < total["requests"]
