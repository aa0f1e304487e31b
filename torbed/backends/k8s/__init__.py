"""The Kubernetes backend: the scenario's network as a helm release of charts/torbed.

This module is what the core sees of it (torbed.engine.backend_module("k8s")): its
command-line options, how to build it from them and its own subcommand. It imports nothing
heavy (the backend needs the kubernetes client); the backend itself is in ``backend.py``.

    backend.py     K8sBackend (the engine's Backend) and cluster access (Cluster, helm)
    faults.py      fault actions on pods (on torbed.fault_schedule; Chaos Mesh or kubectl)
    chart.py       the chart's generated files from the scenario model (`torbed chart-files`)
    dashboards.py  the chart's Grafana dashboards, as code
    registry.py    push images and the chart to a registry (`make images-push`)
    imageload.py   images onto a cluster's nodes: kind, k3s, minikube, a registry (`torbed images load`)

The programs that run inside the pods are torbed.pods (not part of this backend: the images
carry them, and the chart invokes them by module name).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

HELP = ("helm install of charts/torbed into the current kubeconfig context, one release per variant "
        "and repetition")


@dataclass(frozen=True)
class Options:
    """The Kubernetes backend's command-line options (``torbed run``, ``torbed nightly``)."""

    namespace: str = "default"
    context: str | None = None
    extra_set: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Options":
        return cls(namespace=args.namespace, context=args.context, extra_set=list(args.set or []))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="default", help="k8s: namespace of the releases")
    parser.add_argument("--context", default=None, help="k8s: kubeconfig context (default: the current one)")
    parser.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                        help="k8s: extra chart values, e.g. images.registry=reg:5000 (repeatable)")


def backend_class() -> type:
    from .backend import K8sBackend
    return K8sBackend


def create(options: Options, console, scenario_path: Path | None = None):
    return backend_class().from_options(options, console, scenario_path)


def plan_lines(plan) -> list[str]:
    """What ``torbed plan`` prints for this backend: what it does not measure."""
    return ["mechanism gates: shaper backlog and kernel send queues (each pod's shaper sidecar), CPU of the relay "
            "and client pods' processes (their collector and driver; other processes' load "
            "[yellow]not judged on k8s[/yellow]), transfer completion (docs/statistics.md, Mechanism gates)"]


def cmd_chart_files(args) -> int:
    from ...errors import EXIT_FAILED, EXIT_OK
    from . import chart
    from rich.console import Console
    if args.check:
        stale = chart.check()
        for rel in stale:
            Console(stderr=True).print(f"[red]error[/red] charts/torbed/{rel} is out of date: run `make schema`")
        return EXIT_FAILED if stale else EXIT_OK
    for rel in chart.write():
        Console().print(f"wrote charts/torbed/{rel}")
    return EXIT_OK


def register_commands(sub, fmt) -> None:
    """Subcommands only this backend has: chart-files, images."""
    p = sub.add_parser("chart-files", help="regenerate charts/torbed's generated files", formatter_class=fmt)
    p.add_argument("--check", action="store_true", help="only check they are in sync (exit 1 if not)")
    p.set_defaults(func=cmd_chart_files)
    from . import imageload
    imageload.add_parser(sub, fmt)
