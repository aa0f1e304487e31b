"""Background load: Locust users whose traffic crosses the private network through tor.

A scenario's ``load:`` section (``torbed.scenario.Load``) becomes one Locust master (node
``locust0``, no tor) and ``load.workers`` load nodes (``load<i>``), each a tor client with a
Locust worker beside it; the users fetch the ``load-<mix name>`` files of the load's server
(``Scenario.load_files``) through their node's SOCKS port. The locustfile is
``torbed/load/locustfile.py``.

Public API:

- ``LOCUSTFILE``: path of the locustfile
- ``locust_config(s, plan, manifest, *, variant, rep, output, servers=None, socks_port=None,
  metrics=False, metrics_address=None) -> dict``: the locustfile's JSON
- ``metrics_target(plan) -> (address, port)``: the master's Prometheus exporter (``torbed.load.metrics``)
- ``path_options(s, plan, fingerprints) -> {option: value}`` / ``torrc_lines(...) -> [str]``: a load
  node's path restriction
- ``master_argv(...)`` / ``worker_argv(...)``: the Locust command lines

load.jsonl is read for the report by ``torbed.analysis.background``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..client.driver import think_config
from ..client.metrics import TIME_BUCKETS

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"


def locust_config(s, plan, manifest: dict, *, variant: str, rep: int, output: Path,
                  servers: list[str] | None = None, socks_port: int | None = None, metrics: bool = False,
                  metrics_address: str | None = None) -> dict:
    """``servers`` / ``socks_port``: where the load's server and the load node's SOCKS port
    are when not at the plan's addresses (Kubernetes: the server group's Service).
    ``metrics``: the master serves its statistics to Prometheus at ``metrics_target(plan)``,
    or on ``metrics_address`` (Kubernetes: the pod's, 0.0.0.0) at that port."""
    ld, group = s.load, s.load_server()
    if servers is None:
        servers = [f"http://{n.address}:{n.ports['http']}" for n in plan.group_nodes(group)]
    return {
        "variant": variant, "rep": rep, "seed": s.seed + rep, "servers": servers,
        "socks_port": socks_port or plan.by_role("loadworker")[0].ports["socks"],
        "requests": [{"name": name, "file": f"load-{name}", "size": manifest[f"load-{name}"]["size"],
                      "weight": r.weight, "think": think_config(r.think)} for name, r in ld.mix.items()],
        "timeout_s": ld.timeout.seconds, "stats_interval_s": ld.stats_interval.seconds,
        "stats_output": str(output),
        "metrics": _metrics(plan, metrics_address) if metrics else None,
    }


def _metrics(plan, address: str | None) -> dict:
    addr, port = metrics_target(plan)
    return {"address": address or addr, "port": port, "buckets": list(TIME_BUCKETS)}


def metrics_target(plan) -> tuple[str, int]:
    master = plan.by_role("loadmaster")[0]
    return master.address, master.ports["metrics"]


def path_options(s, plan, fingerprints: dict[str, str]) -> dict[str, str]:
    """A load node's tor builds its circuits through the load's path groups (entry,
    middle, exit), or where tor chooses when there is no path: {torrc option: value}."""
    if not s.load.path:
        return {}
    fprs = [",".join("$" + fingerprints[n.name] for n in plan.group_nodes(g)) for g in s.load.path]
    return {"EntryNodes": fprs[0], "MiddleNodes": fprs[1], "ExitNodes": fprs[2], "StrictNodes": "1"}


def torrc_lines(s, plan, fingerprints: dict[str, str]) -> list[str]:
    """``path_options`` as torrc lines (the local backend's load-node torrc)."""
    opts = path_options(s, plan, fingerprints)
    if not opts:
        return []
    return ["# Background load: circuits only through the load's path groups (scenario load.path)."] + \
        [f"{k} {v}" for k, v in opts.items()]


def _locust() -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "INFO"]


def master_argv(s, plan, *, run_time_s: float, csv_prefix: Path) -> list[str]:
    """Headless master: waits for every worker, spawns the users, stops after run_time_s.
    A failed request is a measurement (in the statistics), not a reason to exit non-zero."""
    ld, master = s.load, plan.by_role("loadmaster")[0]
    return _locust() + [
        "--master", "--headless", "--master-bind-host", master.address,
        "--master-bind-port", str(master.ports["master"]), "--expect-workers", str(ld.workers),
        "--expect-workers-max-wait", "60", "-u", str(ld.users), "-r", str(ld.spawn_rate),
        "--run-time", f"{max(1, round(run_time_s))}s", "--stop-timeout", "0", "--exit-code-on-error", "0",
        "--csv", str(csv_prefix), "--csv-full-history", "--only-summary"]


def worker_argv(plan) -> list[str]:
    master = plan.by_role("loadmaster")[0]
    return _locust() + ["--worker", "--master-host", master.address, "--master-port", str(master.ports["master"])]
