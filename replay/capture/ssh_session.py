"""Capture an interactive SSH session: a real sshd and ssh client, human-paced typing.

    python replay/capture/ssh_session.py OUT.trace.jsonl.gz [--seed 2012]

Debian's OpenSSH sshd (9.2: no keystroke-timing obfuscation, which arrived in 9.5) runs on
a private port in one namespace with throw-away host and user keys; ``ssh -tt`` runs in the
other namespace on a pseudo-terminal driven by this script, which types a fixed list of
shell commands key by key. Inter-key intervals are lognormal with a median of 200 ms (Dhakal
et al., "Observations on Typing from 136 Million Keystrokes", CHI 2018, report a mean
inter-key interval of about 240 ms), and a think pause of 2-6 s (uniform) precedes each
command, after its output has arrived. tcpdump captures the client's veth (headers only).
"""

from __future__ import annotations

import argparse
import math
import os
import pty
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torbed.replay import convert  # noqa: E402
from torbed.replay.capture.netpair import CLIENT_ADDR, SERVER_ADDR, NetPair  # noqa: E402
from torbed.replay.cli import Tcpdump  # noqa: E402
from torbed.replay.trace import write  # noqa: E402

PORT = 2222
COMMANDS = ["ls -la /etc | head -20", "uptime", "cat /etc/os-release", "cd /tmp && ls",
            "df -h | head -5", "ps aux | head -8", "echo 'replay me through tor'", "history | tail -5", "exit"]
IKI_MEDIAN_S, IKI_SIGMA = 0.200, 0.45
THINK_S = (2.0, 6.0)


def _drain(fd: int, seconds: float) -> bytes:
    out = b""
    end = time.time() + seconds
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], max(0.0, end - time.time()))
        if not r:
            break
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=2012)
    args = ap.parse_args(argv)
    sshd, ssh = shutil.which("sshd") or "/usr/sbin/sshd", shutil.which("ssh")
    if not (Path(sshd).exists() and ssh):
        print("sshd/ssh not found: hack/install-deps.sh --capture", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    Path("/run/sshd").mkdir(exist_ok=True)   # sshd's privilege separation directory
    with tempfile.TemporaryDirectory(prefix="tbcap-ssh-") as tmp, NetPair() as net:
        tmp = Path(tmp)
        for name in ("host", "user"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
        (tmp / "authorized_keys").write_text((tmp / "user.pub").read_text())
        cfg = tmp / "sshd_config"
        cfg.write_text(f"Port {PORT}\nListenAddress {SERVER_ADDR}\nHostKey {tmp / 'host'}\n"
                       f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nPidFile {tmp / 'sshd.pid'}\n"
                       "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                       "UsePAM no\nStrictModes no\nPrintMotd no\nPrintLastLog no\n")
        server = subprocess.Popen(net.prefix("srv") + [sshd, "-D", "-e", "-f", str(cfg)],
                                  stdout=subprocess.DEVNULL, stderr=open(tmp / "sshd.log", "w"))
        time.sleep(1.0)
        pcap = tmp / "ssh.pcap"
        try:
            with Tcpdump(net.cli_if, pcap, net.cli):
                pid, fd = pty.fork()
                if pid == 0:
                    os.execvp("ip", net.prefix("cli") + [ssh, "-tt", "-i", str(tmp / "user"), "-p", str(PORT),
                                                         "-o", "StrictHostKeyChecking=no",
                                                         "-o", "UserKnownHostsFile=/dev/null",
                                                         "-o", "LogLevel=ERROR", f"root@{SERVER_ADDR}"])
                shown = _drain(fd, 3.0)
                if b"#" not in shown and b"$" not in shown:
                    raise RuntimeError(f"no shell prompt from ssh: {shown[-300:]!r}\n{(tmp / 'sshd.log').read_text()}")
                for cmd in COMMANDS:
                    shown += _drain(fd, rng.uniform(*THINK_S))
                    for ch in cmd + "\r":
                        os.write(fd, ch.encode())
                        shown += _drain(fd, IKI_MEDIAN_S * math.exp(rng.gauss(0.0, IKI_SIGMA)))
                shown += _drain(fd, 2.0)
                os.waitpid(pid, 0)
        finally:
            server.terminate()
            server.wait(5)
        version = subprocess.run([ssh, "-V"], capture_output=True, text=True).stderr.strip()
        trace = convert.from_pcap(pcap, filter=f"host {CLIENT_ADDR} and server port {PORT}", circuit_by="flow", meta={
            "source": f"interactive SSH session ({version}, Debian sshd) typing {len(COMMANDS)} shell commands "
                      f"key by key: inter-key intervals lognormal, median {IKI_MEDIAN_S * 1000:.0f} ms, "
                      f"think pauses {THINK_S[0]:g}-{THINK_S[1]:g} s",
            "tool": "tcpdump -s 128 on the client's veth (offloads off) + torbed.replay.convert.from_pcap",
            "licence": "CC0-1.0", "origin": "captured by the torbed project on its own test machine "
                                           "(replay/capture/ssh_session.py); no third-party traffic",
            "commands": COMMANDS, "seed": args.seed})
    write(trace, args.out)
    print(f"wrote {args.out}: {len(trace.flows)} flows, {trace.duration:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
