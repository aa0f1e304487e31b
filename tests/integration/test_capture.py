"""`torbed capture` on a real capture (needs root and tcpdump): a scripted server in one
network namespace sends packets of known sizes with known gaps to a client in another;
the trace must have exactly those payload sizes, directions and gaps."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import require_root, require_tool
from tests.integration.helpers import run_torbed
from torbed.replay.capture.netpair import SERVER_ADDR, NetPair
from torbed.replay.trace import DOWN, UP, read

pytestmark = pytest.mark.integration

PORT = 9999
SIZES = [100, 1000, 1400, 37, 512]
GAPS = [0.05, 0.1, 0.2, 0.05]

SERVER = f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{SERVER_ADDR}", {PORT})); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
got = b""
while len(got) < 10:
    got += c.recv(100)
for i, n in enumerate({SIZES}):
    c.sendall(b"x" * n)
    if i < len({GAPS}):
        time.sleep({GAPS}[i])
while c.recv(100):
    pass
"""

# The client retries its connect until the server listens (no fixed sleep to wait for it).
CLIENT = f"""
import socket, time
deadline = time.monotonic() + 20
while True:
    try:
        c = socket.create_connection(("{SERVER_ADDR}", {PORT})); break
    except ConnectionRefusedError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.sendall(b"r" * 10)
got = 0
while got < {sum(SIZES)}:
    got += len(c.recv(65536))
time.sleep(0.05)
c.sendall(b"q" * 20)
time.sleep(0.1)
c.close()
"""


@pytest.fixture(autouse=True)
def _root():
    require_root()
    require_tool("tcpdump")


def test_capture_keeps_sizes_directions_and_gaps(tmp_path):
    out = tmp_path / "cap.trace.jsonl.gz"
    with NetPair() as net:
        server = subprocess.Popen(net.prefix("srv") + [sys.executable, "-c", SERVER])
        try:
            p = run_torbed(["capture", str(out), "-i", net.cli_if, "--netns", net.cli, "--filter",
                            f"server port {PORT}", "--circuit-by", "flow", "--source", "test",
                            "--", sys.executable, "-c", CLIENT], timeout=60)
        finally:
            server.kill()
            server.wait()
        assert p.returncode == 0, p.stdout + p.stderr
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(net.srv) or n.startswith(net.cli)]
    t = read(out)
    assert t.meta["source"] == "test" and "tcpdump" in t.meta["tool"]
    assert len(t.flows) == 1
    pk = t.flows[0].packets
    assert [(p.direction, p.size) for p in pk] == [(UP, 10)] + [(DOWN, n) for n in SIZES] + [(UP, 20)]
    down = [p.t for p in pk if p.direction == DOWN]
    gaps = [b - a for a, b in zip(down, down[1:])]
    print("captured gaps (s):", [round(g, 4) for g in gaps], "expected", GAPS)
    # A gap is never shorter than the server's sleep; a loaded machine can only lengthen it,
    # so the upper bound is loose (what it must still show: the gaps' sizes, in order).
    for got, want in zip(gaps, GAPS):
        assert want <= got < want + 0.1, (gaps, GAPS)
    assert gaps[2] > gaps[1] > gaps[0], gaps
