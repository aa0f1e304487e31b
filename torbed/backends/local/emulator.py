"""linkemu from Python: build it, write its link table, run it in the switch namespace, and
change links while it runs.

linkemu (the crate in ``linkemu/`` at the top level, Rust) is torbed's userspace link emulator, the local backend's
shaper when the kernel has no sch_netem or the scenario sets ``links.emulator: linkemu``. It
takes the place of the switch namespace's bridge: it forwards Ethernet frames between the
switch-side veth ends with AF_PACKET sockets and applies per (source node, destination node)
delay, jitter, loss and rate with a drop-tail queue (see ``linkemu/src/link.rs`` for
the model). The control plane (collectors in the switch namespace) has its own, unshaped
port (``netns.Topology`` with ``switch="linkemu"``).

Offloads: veths hand over TSO/GSO super-frames of up to 64 KiB and frames whose checksum is
left to "hardware"; forwarded through a packet socket these would be dropped (too large) or
arrive with a bad checksum. ``start`` therefore turns TSO, GSO, GRO and transmit checksum
offload off on every node's ``eth0`` and every switch-side end (``linkemu offloads-off``,
legacy ethtool ioctls: no ethtool binary needed), so the kernel builds MTU-sized frames
with complete checksums and every frame is shaped on its own, as on a real link. MTU stays
at the veth default (1500); linkemu sizes its buffers from the ports' MTU.

linkemu runs as SCHED_FIFO (priority ``REALTIME_PRIORITY``) when allowed: on a busy machine
a normal-priority forwarder wakes milliseconds late, which would show as delay error.

Public API:

- ``ensure_binary(console=None) -> Path`` the linkemu executable, built with
  ``cargo build --release --locked`` (build directory ``~/.cache/torbed/linkemu/target``) and
  kept under a key of its sources and the compiler, so a fresh clone reuses it
  (``TORBED_LINKEMU`` names a prebuilt binary instead); raises ``EmulatorError``
- ``describe_binary() -> str`` one line for ``torbed plan``
- ``link_props(spec) -> dict`` one direction of a link in the table's terms
- ``link_table(plan, topo, control_socket, stats_file) -> dict`` the table for a run
- ``start(sup, topo, plan, workdir, log, stats_file=None) -> Emulator`` offloads off, table
  written, linkemu started under the ``Supervisor`` (name ``linkemu``) and answering
- ``Emulator``: ``.set_link(src, dst, props, symmetric=True)``, ``.get_link(src, dst)``,
  ``.stats()``, ``.reload()`` (reread ``.table_path`` after editing it)
- ``request(socket_path, obj) -> dict`` one control-socket request (torbed.linkemu_control); ``set_link(socket_path,
  src, dst, props, symmetric=True) -> int`` the same as ``Emulator.set_link``
- ``EmulatorError``: the binary cannot be built or started, or linkemu refused a request
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ... import constants, resources
from . import netns
from ...network import LinkSpec, Plan, owner
from .supervise import Supervisor, tail
from ...linkemu_control import EmulatorError, request  # linkemu's control protocol (shared with the collectors)

CRATE_DIR = resources.path("linkemu")
# Built outside the source tree (a checkout's or an installed copy's), so a fresh clone (CI)
# reuses it: cargo's build directory is shared, the binary is kept under a key of the crate's
# sources and the compiler.
BUILD_ROOT = constants.CACHE_DIR / "linkemu"
CARGO_TARGET_DIR = BUILD_ROOT / "target"
NETNS_DIR = Path("/run/netns")       # where `ip netns` keeps namespace handles
REALTIME_PRIORITY = 10               # SCHED_FIFO; above every normal task, below kernel threads
CONTROL_NODE = "control"             # the control plane's port in the table (never shaped)
START_TIMEOUT = 10.0


def _cargo() -> str | None:
    found = shutil.which("cargo")
    if found:
        return found
    home = Path.home() / ".cargo" / "bin" / "cargo"
    return str(home) if home.exists() else None


def _sources() -> list[Path]:
    return [CRATE_DIR / "Cargo.toml", CRATE_DIR / "Cargo.lock", *sorted((CRATE_DIR / "src").glob("*.rs"))]


def _rustc_version(cargo: str | None) -> str:
    rustc = shutil.which("rustc") or (str(Path(cargo).with_name("rustc")) if cargo else None)
    if not rustc:
        return "no-rustc"
    try:
        return subprocess.run([rustc, "-V"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no-rustc"


def content_key() -> str:
    """The crate's sources and the compiler, hashed: a change to either is a new binary."""
    import hashlib
    h = hashlib.sha256(_rustc_version(_cargo()).encode())
    for p in _sources():
        if p.exists():
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def built_binary() -> Path:
    return BUILD_ROOT / content_key() / "linkemu"


def binary_path() -> Path:
    return Path(os.environ["TORBED_LINKEMU"]) if os.environ.get("TORBED_LINKEMU") else built_binary()


def is_built() -> bool:
    return binary_path().exists()


def describe_binary() -> str:
    if is_built():
        return f"binary {binary_path()}"
    if _cargo():
        return "binary not built yet (`torbed run` builds it with cargo, about 30 s)"
    return "[red]binary not built and cargo not found[/red] (install Rust: https://rustup.rs, or set TORBED_LINKEMU)"


def ensure_binary(console=None) -> Path:
    """The linkemu executable, built first when missing or stale. Raises EmulatorError."""
    if is_built():
        return binary_path()
    cargo = _cargo()
    if cargo is None:
        raise EmulatorError("linkemu is not built and cargo is not on PATH: install Rust (https://rustup.rs) "
                            f"and run `cargo build --release --locked --manifest-path {CRATE_DIR}/Cargo.toml`, "
                            "or set TORBED_LINKEMU to a prebuilt linkemu")
    cmd = [cargo, "build", "--release", "--locked", "--manifest-path", str(CRATE_DIR / "Cargo.toml"),
           "--target-dir", str(CARGO_TARGET_DIR)]
    if console is not None:
        console.log(f"building linkemu: {' '.join(cmd[1:])}")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise EmulatorError(f"building linkemu failed ({' '.join(cmd)}):\n{p.stderr[-3000:]}")
    dest = built_binary()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".tmp{os.getpid()}")
    shutil.copy2(CARGO_TARGET_DIR / "release" / "linkemu", tmp)
    tmp.replace(dest)       # atomic: a concurrent run sees the old state or the whole binary
    return dest


def link_props(spec: LinkSpec) -> dict:
    """One direction of a link as linkemu's table has it (absent keys: not set)."""
    props: dict = {}
    if spec.rate_bps:
        props["rate_bps"] = int(spec.rate_bps)
    if spec.queue_bytes:
        props["queue_bytes"] = int(spec.queue_bytes)
    if spec.queue_s:
        props["queue_s"] = float(spec.queue_s)
    if spec.delay_s:
        props["delay_s"] = float(spec.delay_s)
    if spec.jitter_s:
        props["jitter_s"] = float(spec.jitter_s)
        if spec.jitter_dist:
            props["jitter_dist"] = spec.jitter_dist
    if spec.loss:
        props["loss"] = float(spec.loss)
        if spec.loss_burst and spec.loss_burst > 1:
            props["loss_burst"] = float(spec.loss_burst)
    return props


def link_table(plan: Plan, topo: netns.Topology, control_socket: Path | None, stats_file: Path | None,
               realtime_priority: int = REALTIME_PRIORITY) -> dict:
    """linkemu's table for ``plan``: one port per node (its switch-side veth end and address)
    plus the unshaped control-plane port; the default link and every ordered node pair whose
    link differs from it (``plan.link``)."""
    ports = []
    for dev, node in topo.ports():
        if node is None:
            ports.append({"dev": dev, "node": CONTROL_NODE, "ipv4": [plan.control_address], "shaped": False})
        else:
            ports.append({"dev": dev, "node": node.name, "ipv4": [node.address]})
    default = link_props(plan.default_link)
    links = []
    ends = plan.endpoints()     # a relay's second address is a port and a node of its own
    for a in ends:
        for b in ends:
            if owner(a)[0] != owner(b)[0]:
                props = link_props(plan.link(a, b))
                if props != default:
                    links.append({"src": a.name, "dst": b.name, "props": props})
    table = {"version": 1, "seed": plan.scenario.seed, "ports": ports, "default": default, "links": links,
             "realtime_priority": realtime_priority}
    if control_socket is not None:
        table["control_socket"] = str(control_socket)
    if stats_file is not None:
        table["stats_file"] = str(stats_file)
    return table


def disable_offloads(topo: netns.Topology, binary: Path) -> None:
    """TSO/GSO/GRO/tx-checksum off on every node's eth0 and every switch-side device."""
    args = [str(binary), "offloads-off"]
    for dev, node in topo.ports():
        if node is not None:
            ns, dev = topo.device(node)
            args += ["--netns", str(NETNS_DIR / ns), dev]
    args += ["--netns", str(NETNS_DIR / topo.switch), netns.Topology.CONTROL_DEV]
    args += [dev for dev, _ in topo.ports()]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise EmulatorError(f"turning veth offloads off failed: {p.stderr.strip()}")


def _props(props: LinkSpec | dict) -> dict:
    return link_props(props) if isinstance(props, LinkSpec) else dict(props)


def set_link(socket_path: str | Path, src: str, dst: str, props: LinkSpec | dict, symmetric: bool = True) -> int:
    """Replace the properties of src -> dst (and dst -> src when symmetric); a node name or "*"
    (every node). ``props`` is a LinkSpec or linkemu's table keys (``{"loss": 1.0}`` cuts the
    link). Frames already scheduled keep their times. Returns how many directed links changed."""
    return request(socket_path, {"op": "set", "src": src, "dst": dst, "props": _props(props),
                                 "symmetric": symmetric})["changed"]


@dataclass
class Emulator:
    socket: Path
    table_path: Path
    name: str = "linkemu"

    def set_link(self, src: str, dst: str, props: LinkSpec | dict, symmetric: bool = True) -> int:
        return set_link(self.socket, src, dst, props, symmetric)

    def get_link(self, src: str, dst: str) -> dict:
        return request(self.socket, {"op": "get", "src": src, "dst": dst})["props"]

    def stats(self) -> dict:
        return request(self.socket, {"op": "stats"})["stats"]

    def reload(self) -> None:
        request(self.socket, {"op": "reload"})


def start(sup: Supervisor, topo: netns.Topology, plan: Plan, workdir: Path, log: Path,
          stats_file: Path | None = None, name: str = "linkemu", console=None,
          realtime_priority: int = REALTIME_PRIORITY) -> Emulator:
    """Run linkemu in ``topo``'s switch namespace (created with ``switch="linkemu"``) as the
    supervised process ``name``; returns once it answers. Raises EmulatorError."""
    if topo.switch_kind != "linkemu":
        raise EmulatorError("the topology has a bridge; create it with switch='linkemu'")
    binary = ensure_binary(console)
    disable_offloads(topo, binary)
    sock = workdir / f"{name}.sock"
    table_path = workdir / f"{name}.json"
    table = link_table(plan, topo, sock, stats_file, realtime_priority)
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    proc = sup.start(name, netns.exec_prefix(topo.switch) + [str(binary), "run", str(table_path)], log)
    deadline = time.time() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise EmulatorError(f"linkemu exited with status {proc.returncode}:\n{tail(log)}")
        if sock.exists():
            try:
                request(sock, {"op": "ping"}, timeout=1.0)
                return Emulator(socket=sock, table_path=table_path, name=name)
            except EmulatorError:
                pass
        if time.time() > deadline:
            raise EmulatorError(f"linkemu did not answer within {START_TIMEOUT:.0f} s:\n{tail(log)}")
        time.sleep(0.05)
