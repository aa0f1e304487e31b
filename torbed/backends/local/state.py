"""One repetition's state on the local backend (``rep.state``), filled stage by stage.

prepare sets plan, run_id, scratch, topo, sup, then variants, build, stock, t0, ids, paths;
bring_up adds emulator (when linkemu shapes), prometheus, fallback_valid_after; measure adds
faults and gate_sampler. teardown reads whatever is there: a field still None was never reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...fault_schedule import FaultRunner
    from ...gates import Sampler
    from ...network import Plan
    from ...torrc import Identities, NodePaths
    from ...variants import Variant
    from ...builds import Build
    from .emulator import Emulator
    from .netns import Topology
    from .prometheus import Forwarder
    from .supervise import Supervisor
    from .toruser import TorUser


@dataclass
class RepState:
    plan: "Plan | None" = None
    run_id: str = ""
    scratch: Path | None = None                   # /tmp/torbed-<run_id>: data directories, sockets
    topo: "Topology | None" = None                # namespaces, veths, the switch
    sup: "Supervisor | None" = None               # every process started
    variants: "dict[str, Variant]" = field(default_factory=dict)   # in use, by name
    build: "dict[str, Build]" = field(default_factory=dict)        # each node's tor build
    stock: "Build | None" = None
    tor_user: "TorUser | None" = None             # the uid tor runs as (None: the caller's)
    t0: float = 0.0                               # bring-up time counts from here (after builds)
    ids: "Identities | None" = None               # keys and fingerprints
    paths: "dict[str, NodePaths]" = field(default_factory=dict)    # each tor's files
    emulator: "Emulator | None" = None            # linkemu, when it shapes the links
    prometheus: "Forwarder | None" = None
    fallback_valid_after: int | None = None       # the fast first round's valid-after (bring-up)
    faults: "FaultRunner | None" = None
    gate_sampler: "Sampler | None" = None         # the mechanism gates' samples (measure)
    thread_caps: list = field(default_factory=list)   # threadcaps.ThreadCaps of cpu_per_thread groups
    crossover: "object | None" = None               # torbed.crossover.Switcher of a crossover repetition


def of(rep) -> RepState:
    """``rep.state`` as a RepState (a fresh one when the engine's default is still there:
    teardown after a prepare that never began)."""
    if not isinstance(rep.state, RepState):
        rep.state = RepState()
    return rep.state
