"""What runs inside the pods of the Helm chart (charts/torbed), in the client image.

Each module is a pod's program: ``keygen`` (pre-install hook: keys into a Secret, public
identities into a ConfigMap; pre-delete: removes them), ``client`` (waits for the network,
runs the measurement driver), ``relayside`` (the relay pods' collector sidecar), ``server``
(file server), ``results`` (the service results are streamed to) and ``shaper`` (per-link
tc shaping). They share the scenario (``load_scenario``), node naming (``node_name``) and
the streaming of JSON-lines files to the results service (``Shipper``) and how every write
to it is made (``results_post``: a POST carrying the release's token).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .. import network, safeload
from ..records import RecordWriter
from ..scenario import Scenario, parse

SCENARIO_FILE = Path("/etc/torbed/scenario/scenario.json")
IDENTITIES_DIR = Path("/etc/torbed/identities")
# The release's results token, in the results service and in every pod that writes to it.
RESULTS_TOKEN_ENV = "TORBED_RESULTS_TOKEN"


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"torbed.pods: environment variable {name} is not set (the chart sets it)")
    return value


def load_scenario(path: Path | None = None) -> Scenario:
    """The release's scenario: TORBED_SCENARIO_JSON (hooks, which run before ConfigMaps
    exist) or the scenario ConfigMap's file."""
    text = os.environ.get("TORBED_SCENARIO_JSON")
    if text:
        return parse(json.loads(text), source="scenario (chart values)")
    path = path or SCENARIO_FILE
    # The same bounds as every input file (size, UTF-8, nesting), with its path in the error.
    return parse(safeload.load_json(path, "scenario (chart values)"), source=str(path))


# Where the tor container of a relay pod writes its `uname -m` (images/common/torbed-node).
TOR_MACHINE_FILE = Path("/var/lib/torbed/machine")


UNKNOWN_ARCH = "unknown"


def write_hardware(out: Path, node: str, group: str, tor_machine: Path | None = None,
                   wait_s: float | None = None) -> None:
    """One hardware.jsonl record: which Kubernetes node this pod of ``node`` runs on and that
    node's CPU as the pod sees it (the API server knows the node, not its CPU model).
    ``tor_machine``: the file where the pod's tor container writes its architecture, which may
    differ from this process's ``arch`` (an arm64 tor under qemu-user beside a native
    collector). The record waits for it (``wait_s`` None: as long as it takes; tor writes it
    before it starts, so before the network can be ready) and says ``tor_arch: "unknown"``
    when it never came: this process's own architecture is no answer for tor's."""
    import platform

    from ..provenance import cpu_model
    rec = {"node": node, "group": group, "pod": os.environ.get("POD_NAME"),
           "k8s_node": os.environ.get("NODE_NAME"), "arch": platform.machine(), "cpu_model": cpu_model(),
           "cpus": os.cpu_count(), "kernel": platform.release(), "variant": variant(), "rep": repetition()}
    if tor_machine is not None:
        deadline = None if wait_s is None else time.time() + wait_s
        while not tor_machine.exists() and (deadline is None or time.time() < deadline):
            time.sleep(0.2)
        try:
            rec["tor_arch"] = tor_machine.read_text().strip() or UNKNOWN_ARCH
        except OSError:
            rec["tor_arch"] = UNKNOWN_ARCH
    with RecordWriter(out / "hardware.jsonl") as w:
        w.write({**rec, "t": time.time()})


def variant() -> str:
    return env("TORBED_VARIANT")


def repetition() -> int:
    return int(os.environ.get("TORBED_REPETITION", "0"))


def plan(s: Scenario) -> network.Plan:
    return network.plan(s, variant())


def node_name(group: str) -> str:
    """The node a pod is, named as on the local backend: <group><ordinal|index>."""
    index = os.environ.get("TORBED_INDEX")
    if index is None:
        index = env("POD_NAME").rsplit("-", 1)[-1]
    return ("auth" if group == "authority" else group) + str(int(index))


def service_host(name: str) -> str:
    """DNS name of one of the release's Services, '<release>-<name>'."""
    domain = os.environ.get("TORBED_CLUSTER_DOMAIN", "cluster.local")
    return f"{env('TORBED_RELEASE')}-{name}.{env('TORBED_NAMESPACE')}.svc.{domain}"


def fingerprints() -> dict[str, str]:
    return json.loads((IDENTITIES_DIR / "fingerprints.json").read_text())


def results_post(url: str, data: bytes = b"", content_type: str = "application/octet-stream",
                 token: str | None = None) -> urllib.request.Request:
    """A POST to the results service carrying the release's token (``token``, else
    TORBED_RESULTS_TOKEN, which the chart sets from its Secret in every writing pod): the
    service refuses writes without it (torbed.pods.results)."""
    token = token if token is not None else os.environ.get(RESULTS_TOKEN_ENV, "")
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token.strip()}"
    return urllib.request.Request(url, data=data, method="POST", headers=headers)


class Shipper:
    """Streams the JSON-lines files of a directory to the results service as they grow:
    only whole lines, each byte once, in order; what the service could not take yet is
    sent on the next round. ``stop()`` makes a last round."""

    def __init__(self, directory: Path, url: str, interval: float = 1.0):
        self.dir, self.url, self.interval = directory, url.rstrip("/"), interval
        self.offsets: dict[str, int] = {}
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.failures = 0

    def start(self) -> "Shipper":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stop_ev.wait(self.interval):
            self.ship()

    def ship(self) -> bool:
        ok = True
        for path in sorted(self.dir.glob("*")):
            if not path.is_file():
                continue
            off = self.offsets.get(path.name, 0)
            with open(path, "rb") as f:
                f.seek(off)
                data = f.read()
            end = data.rfind(b"\n") + 1
            if end == 0:
                continue
            req = results_post(f"{self.url}/append/{path.name}", data[:end])
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()
                self.offsets[path.name] = off + end
            except (urllib.error.URLError, OSError) as e:
                self.failures += 1
                ok = False
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log(f"shipper: {path.name}: results service not reachable ({e}); keeping it for the next round")
        return ok

    def stop(self, attempts: int = 30) -> bool:
        self.stop_ev.set()
        self.thread.join(timeout=self.interval + 15)
        for _ in range(attempts):
            if self.ship():
                return True
            time.sleep(1)
        return False
