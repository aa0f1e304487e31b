"""The IPSJ own-path arm's mechanism with real tor (circswitch README A.8, issue 37 item 2d):
guard and middle run circswitch-ownpath with a second address each (a second veth, a port of
its own in linkemu); downloads fill the middle's buffer toward the guard, the middle opens the
second connection of the pair, and that connection must leave from the middle's second
address and cross its own link:

- while the run goes on, ``ss`` in the middle's namespace shows an established TCP connection
  from the second address to the guard's ORPort (the heavy channel's socket is bound there);
- linkemu's per-link bytes afterwards: the links of a second address carry bytes only between
  a relay that bound a second connection (its log says so) and the peer it opened it to;
  nothing else ever crosses a second address;
- the circuit moves still complete (no aborted switch, every transfer sha256-verified).

One run of 30 s (plus bring-up): about a minute on a quiet machine.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import require_root
from tests.integration.helpers import TORBED, only_run_dir, start_torbed, write_scenario
from torbed import constants
from torbed.analysis import circswitch as bench_circswitch

pytestmark = pytest.mark.integration

BINDS = "CircSwitch: the second connection binds to "


@pytest.fixture(autouse=True)
def _root():
    require_root()


def _scenario() -> dict:
    data = bench_circswitch.scenario("it-circswitch-ownpath", "30s", guard_variant="circswitch-ownpath",
                                     middle_variant="circswitch-ownpath")
    for g in ("guard", "middle"):
        data["network"]["relays"][g]["second_address"] = True
    data["links"]["emulator"] = "linkemu"
    return data


def _our_namespace(pid: int, node: str) -> str | None:
    """The namespace of ``node`` in the run torbed process ``pid`` owns (other runs may be
    going on beside this one)."""
    for f in constants.STATE_DIR.glob("*.json"):
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if state.get("owner_pid") == pid:
            for ns in state.get("namespaces") or []:
                if ns.endswith(f"-{node}"):
                    return ns
    return None


def _watch_sockets(proc: subprocess.Popen, address2: str, timeout: float) -> list[str]:
    """Established TCP connections from ``address2`` in the middle's namespace, polled once a
    second while torbed runs; the first non-empty answer."""
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        ns = _our_namespace(proc.pid, "middle0")
        if ns:
            p = subprocess.run(["ss", "-N", ns, "-Htn", "state", "established", "src", address2],
                               capture_output=True, text=True, timeout=10)
            lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
            if lines:
                return lines
        time.sleep(1.0)
    return []


def _link_bytes(rep) -> dict[tuple[str, str], int]:
    stats = json.loads((rep / "linkemu.stats.json").read_text())
    return {(x["src"], x["dst"]): x["bytes_out"] for x in stats["links"]}


def test_the_second_connection_leaves_from_the_second_address_over_its_own_link(tmp_path):
    data = _scenario()
    out = tmp_path / "runs"
    proc = start_torbed(["run", str(write_scenario(tmp_path, data)), "--out", str(out)], tmp_path / "torbed.log")
    try:
        plan = json.loads(subprocess.run(
            [*TORBED, "plan", "--json",
             str(tmp_path / f"{data['name']}.yaml")], capture_output=True, text=True, timeout=120).stdout)
        addr2 = {n["name"]: n["address2"] for n in plan["nodes"] if n.get("address2")}
        first = {n["name"]: n["address"] for n in plan["nodes"]}
        bound = _watch_sockets(proc, addr2["middle0"], timeout=900)
        proc.wait(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "torbed.log").read_text()[-3000:]
    run_dir = only_run_dir(out)
    summary = bench_circswitch.analyse(run_dir, "circswitch")
    assert bench_circswitch.problems(summary) == []
    mid = summary["relays"]["middle0"]
    assert mid["circswitch"]["switch_to_second"] >= 1, mid

    # ss: the heavy channel's socket, bound to the second address, toward the guard's ORPort.
    assert bound, "no connection from the middle's second address was ever established"
    assert any(f"{addr2['middle0']}:" in ln and f"{first['guard0']}:{constants.OR_PORT}" in ln for ln in bound), bound

    rep = run_dir / "circswitch" / "rep-0"
    logs = {r: (rep / "logs" / f"{r}.log").read_text(errors="replace") for r in ("guard0", "middle0")}
    assert BINDS + addr2["middle0"] in logs["middle0"]
    links = _link_bytes(rep)
    assert links.get(("middle0:second", "guard0"), 0) > 0 and links.get(("guard0", "middle0:second"), 0) > 0
    assert links.get(("middle0", "guard0"), 0) > 0          # the first connection too
    # Only a relay that bound a second connection has bytes on its second address's links,
    # and only with the peer of that connection.
    allowed = {("middle0:second", "guard0"), ("guard0", "middle0:second")}
    if BINDS + addr2["guard0"] in logs["guard0"]:
        allowed |= {("guard0:second", "middle0"), ("middle0", "guard0:second")}
    second = {k: v for k, v in links.items() if v and any(e.endswith(":second") for e in k)}
    assert set(second) <= allowed, second
    print(json.dumps({"bound": bound[:2], "second_links": {f"{a}>{b}": v for (a, b), v in second.items()},
                      "first_link": links.get(("middle0", "guard0")), "moves": mid["circswitch"]}))
