"""Two network namespaces joined by one veth pair, for capturing the project's own traces.

``server`` (10.99.0.1/24) and ``client`` (10.99.0.2/24), named ``tbcap-<pid>-srv`` /
``tbcap-<pid>-cli`` (not ``tb-``: ``torbed clean`` leaves them alone, and the pid tells whose
they are). Segmentation and receive offloads are turned off on both ends (ethtool) so the
capture shows wire-sized TCP segments, as a capture on a real network would, instead of the
64 KB segments a veth passes along. No route leaves the pair.

Usage: ``with NetPair() as net: net.run("cli", [...])``; removed on exit, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess

SERVER_ADDR, CLIENT_ADDR = "10.99.0.1", "10.99.0.2"


class NetPair:
    def __init__(self):
        tag = f"tbcap-{os.getpid()}"
        self.srv, self.cli = f"{tag}-srv", f"{tag}-cli"
        self.srv_if, self.cli_if = "veth-srv", "veth-cli"

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def __enter__(self):
        try:
            self._ip("netns", "add", self.srv)
            self._ip("netns", "add", self.cli)
            self._ip("-n", self.srv, "link", "add", self.srv_if, "type", "veth", "peer", "name", self.cli_if,
                     "netns", self.cli)
            for ns, dev, addr in ((self.srv, self.srv_if, SERVER_ADDR), (self.cli, self.cli_if, CLIENT_ADDR)):
                self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                self._ip("-n", ns, "link", "set", dev, "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
                if shutil.which("ethtool"):
                    subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off",
                                    "gro", "off"], capture_output=True)
        except subprocess.CalledProcessError as e:
            self.__exit__()
            raise RuntimeError(f"{' '.join(e.cmd)}: {e.stderr.strip()}") from None
        return self

    def __exit__(self, *exc):
        for ns in (self.srv, self.cli):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def prefix(self, which: str) -> list[str]:
        return ["ip", "netns", "exec", self.srv if which == "srv" else self.cli]
