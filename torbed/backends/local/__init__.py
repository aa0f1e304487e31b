"""The local backend: the scenario's network in network namespaces on this machine.

This module is what the core sees of it (torbed.engine.backend_module("local")): its
command-line options, how to build it from them, its own subcommands and what it adds to
``torbed plan``. It imports nothing heavy; the backend itself is in ``backend.py``.

    backend.py     LocalBackend (the engine's Backend): bring-up, measure, teardown, clean
    netns.py       namespaces, veths, the switch          emulator.py  linkemu from Python
    supervise.py   child processes and their states       prometheus.py  a run's Prometheus
    torenv.py      tor's environment (torbed/builds.py, in the core, builds tor per variant)
    faults.py      fault actions (on torbed.fault_schedule)
    state.py       RepState: one repetition's typed state
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

HELP = "network namespaces on this machine"


@dataclass(frozen=True)
class Options:
    """The local backend's command-line options (``torbed run``, ``torbed nightly``)."""

    system_tor: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Options":
        return cls(system_tor=bool(getattr(args, "system_tor", False)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system-tor", action="store_true",
                        help="config-only variants use the tor on PATH instead of the cached stock build")


def backend_class() -> type:
    from .backend import LocalBackend
    return LocalBackend


def create(options: Options, console, scenario_path: Path | None = None):
    """The backend for a run. Unprivileged (or TORBED_USERNS=1), this re-executes torbed in a
    user namespace first (never returns then)."""
    return backend_class().from_options(options, console)


def plan_lines(plan) -> list[str]:
    """What ``torbed plan`` prints for this backend: the shaper it would use here."""
    from .emulator import describe_binary
    from ...shaping import ShapingError, choose_shaper, linkemu_reason, probe_kernel
    caps = probe_kernel()
    try:
        shaper = choose_shaper(plan, caps)
    except ShapingError as e:
        return [f"shaper: [red]cannot run here[/red]: {e}"]
    kernel = f"kernel: htb {'yes' if caps.htb else 'no'}, netem {'yes' if caps.netem else 'no'}"
    line = f"{shaper} ({plan.shaped_pair_count()} shaped node pairs; {kernel})"
    if shaper == "linkemu":
        line += f"\n  userspace link emulator: {linkemu_reason(plan, caps)}; {describe_binary()}"
    mech = plan.scenario.measure.mechanism
    gates = (f"mechanism gates: {mech.kind}" + (f" (target {mech.target} must be CPU-saturated)" if mech.target else "")
             + "; shaper backlog, relays' kernel send queues and CPU sampled every second")
    return [f"shaper: {line}", gates]


def register_commands(sub, fmt) -> None:
    """Subcommands only this backend has: clean, prometheus, variants, build."""
    from . import commands
    for register in commands.REGISTER:
        register(sub, fmt)
