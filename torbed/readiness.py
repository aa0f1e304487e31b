"""Readiness: the evidence that a private network is ready, the same on every backend.

Ready means: every authority's consensus lists every relay as Running, Valid, Fast and
Stable (clients pick guards and path nodes only among Fast and Stable ones), with Guard on
guard groups and Exit on exit groups; every client is at Bootstrapped 100% and holds the
consensus entry and the microdescriptor of every relay of its path (with the entry alone,
EXTENDCIRCUIT fails with "No descriptor").

Public API:

- ``EXPECTED_FLAGS``; ``wanted_flags(node) -> set``
- ``flags_problem(plan, flags_by_fingerprint, fingerprints) -> str | None``: what a
  consensus still lacks (None: every relay with its flags)
- ``consensus_file_problem(path, plan, fingerprints) -> (str | None, {relay: flags})``: the
  same for a cached-consensus file (the local backend reads the authorities' files)
- ``knows(ctl, fingerprint) -> bool``: a client can extend a circuit to this relay
- ``path_relays(plan, client) -> [Node]``
- ``client_problem(ctl, plan, fingerprints, path_nodes, check_flags) -> str | None``: what a
  client still lacks, from its control port
"""

from __future__ import annotations

from pathlib import Path

import stem
import stem.control
from stem.descriptor.networkstatus import NetworkStatusDocumentV3

from .network import Node, Plan

EXPECTED_FLAGS = frozenset({"Running", "Valid", "Fast", "Stable"})


def wanted_flags(node: Node) -> set[str]:
    return set(EXPECTED_FLAGS) | ({"Guard"} if node.guard else set()) | ({"Exit"} if node.exit else set())


def flags_problem(plan: Plan, flags: dict[str, set[str]], fingerprints: dict[str, str]) -> str | None:
    """What the consensus with ``flags`` ({fingerprint: flags}) lacks, or None."""
    for n in plan.by_role("relay"):
        have = flags.get(fingerprints[n.name])
        if have is None:
            return f"{n.name} not in the consensus yet"
        want = wanted_flags(n)
        if not want <= set(have):
            return f"{n.name} has flags {sorted(have)}, waiting for {sorted(want)}"
    return None


def consensus_file_problem(path: Path, plan: Plan, fingerprints: dict[str, str]) -> tuple[str | None, dict]:
    """(what the consensus at ``path`` lacks or None, {relay name: sorted flags})."""
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"no consensus yet ({type(e).__name__})", {}
    return consensus_problem(data, plan, fingerprints)


def consensus_problem(data: bytes, plan: Plan, fingerprints: dict[str, str]) -> tuple[str | None, dict]:
    """(what the consensus document ``data`` lacks or None, {relay name: sorted flags})."""
    try:
        doc = NetworkStatusDocumentV3(data, validate=False)
    except ValueError as e:
        return f"no consensus yet ({type(e).__name__})", {}
    flags = {e.fingerprint: set(e.flags) for e in doc.routers.values()}
    by_name = {n.name: sorted(flags[fingerprints[n.name]]) for n in plan.by_role("relay")
               if fingerprints[n.name] in flags}
    return flags_problem(plan, flags, fingerprints), by_name


def path_relays(plan: Plan, client: str) -> list[Node]:
    node = plan.node(client)
    if node.role == "loadworker":
        path = plan.scenario.load.path or []
    else:
        path = plan.scenario.clients[node.group].path or []
    return [r for g in path for r in plan.group_nodes(g)]


def knows(ctl: stem.control.Controller, fingerprint: str) -> bool:
    """The client has this relay's consensus entry and its microdescriptor."""
    try:
        return bool(ctl.get_info(f"ns/id/{fingerprint}", "")) and bool(ctl.get_info(f"md/id/{fingerprint}", ""))
    except stem.ControllerError:
        return False


def client_problem(ctl: stem.control.Controller, plan: Plan, fingerprints: dict[str, str],
                   path_nodes: list[str], check_flags: bool = True) -> str | None:
    """What a client still lacks (None: ready). ``check_flags``: also check its own
    consensus lists every relay with its flags (where nobody reads the authorities')."""
    phase = ctl.get_info("status/bootstrap-phase", "")
    if "PROGRESS=100" not in phase:
        return f"bootstrapping: {phase}"
    if check_flags:
        why = flags_problem(plan, {e.fingerprint: set(e.flags) for e in ctl.get_network_statuses([])}, fingerprints)
        if why:
            return why
    missing = [name for name in path_nodes if not knows(ctl, fingerprints[name])]
    if missing:
        return f"no microdescriptor of path relay(s) {', '.join(missing)} yet"
    return None
