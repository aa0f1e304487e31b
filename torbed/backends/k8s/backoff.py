"""The kubelet's crash back-off, as it meets torbed's restart and kill faults on Kubernetes.

A container of a pod with ``restartPolicy: Always`` that exits is started again by the
kubelet: at once after its first exit, then after a back-off that starts at 10 s from the
second exit on and doubles per exit (10 s, 20 s, 40 s ... at most 300 s); exits more than
600 s (twice the maximum) apart start the count again (Kubernetes 1.33, kubelet
``flowcontrol.Backoff``, ``kuberuntime_manager.doBackOff``). A restart fault sends SIGTERM
and its tor is to be down for its ``duration`` only, so a repeated restart of one relay
would meet a longer downtime than the schedule says. ``problems`` refuses such a schedule
before anything starts; the apply record keeps the back-off each restart met
(``kubelet_backoff_s``).

Public API: ``kubelet_backoff_s(exit_no, since_last_exit_s) -> float``,
``problems(scenario) -> [(field, message)]``.
"""

from __future__ import annotations

from ...scenario import Scenario, fault_nodes

INITIAL_S, MAX_S = 10.0, 300.0
RESET_S = 2 * MAX_S


def kubelet_backoff_s(exit_no: int, since_last_exit_s: float | None = None) -> float:
    """How long the kubelet waits before it starts a container again after its ``exit_no``-th
    exit (1 = the first) in one pod, the previous exit ``since_last_exit_s`` before."""
    if exit_no <= 1 or (since_last_exit_s is not None and since_last_exit_s > RESET_S):
        return 0.0
    return min(MAX_S, INITIAL_S * 2 ** (exit_no - 2))


def _exits_by_node(s: Scenario) -> dict[str, list[tuple[float, int]]]:
    """Per relay node, the times of the faults that make its tor container exit, with the
    fault's index, in time order."""
    out: dict[str, list[tuple[float, int]]] = {}
    for i, f in enumerate(s.faults):
        if f.kind in ("restart", "kill") and f.target is not None:
            for n in fault_nodes(s, f.target) or []:
                out.setdefault(n, []).append((f.at.seconds, i))
    return {n: sorted(v) for n, v in out.items()}


def problems(s: Scenario) -> list[tuple[str, str]]:
    """(field, message) for each restart whose downtime the kubelet's back-off would make
    longer than its ``duration``."""
    out = []
    for node, exits in sorted(_exits_by_node(s).items()):
        n, prev = 0, None
        for at, i in exits:
            f = s.faults[i]
            n = 1 if prev is not None and at - prev > RESET_S else n + 1
            prev = at
            if f.kind != "restart":
                continue
            wait = kubelet_backoff_s(n)
            downtime = f.duration.seconds if f.duration is not None else 0.0
            if wait > downtime:
                out.append((f"faults[{i}].duration",
                            f"restart of {node} at {f.at} is its tor container's exit #{n} in the pod; the "
                            f"kubelet waits {wait:.0f} s before starting it again (crash back-off: 10 s from the "
                            f"second exit, doubling, reset after {RESET_S:.0f} s without one), longer than the "
                            f"restart's downtime {downtime:g} s: set its duration to {wait:.0f}s or more, space "
                            f"the restarts over {RESET_S:.0f} s apart, or run it with --backend local"))
    return out
