"""By hardware: a metric compared between the kinds of hardware a run's relays ran on, as the
report compares it between variants.

A Kubernetes run records, per repetition, which node each torbed node ran on (meta.json
``nodes[].k8s_node``) and what that node is (``hardware``: architecture, hardware labels,
``pod_arch`` what the pods ran as, ``emulated`` when that is not the kubelet's). A node's
*hardware kind* is the architecture its pods ran as (else the node's) and its
``torbed.io/hardware`` label, marked emulated where it was: ``amd64``, ``arm64/rpi``,
``arm64/rpi (emulated)``.

Client experience: each client group's path (the scenario's ``path`` of relay groups) ran on
a set of hardware kinds; client groups fetching the same file whose paths ran on different
sets are the arms (scenarios/hardware-comparison.yaml: web and bulk clients through a middle
on amd64, the same through a middle on the Pi). The arm whose path ran on the fewest kinds
(the all-server path) is the baseline; each other arm is compared with it per variant on the
per-repetition medians of TTFB and TTLB, with repetitions as the unit (``stats.compare_reps``,
as variants are compared), so one repetition gives estimates and no test.
Relay throughput: each relay's per-repetition value, grouped by the kind it ran on.

Descriptive beside the variant family: these tests are not in the Holm family or the
headline (a hardware arm is a placement, not a treatment the run randomised).

Public API:

- ``hardware_kind(h) -> str``
- ``by_hardware(run, extracted) -> dict | None``  (None: the run ran on one kind, or not on
  Kubernetes)
"""

from __future__ import annotations

import numpy as np

from ..constants import MACHINE_ARCH
from . import inference, stats
from .load import Run
from .metrics import Extracted

HARDWARE_LABEL = "torbed.io/hardware"
ARCH_LABEL = "kubernetes.io/arch"
COMPARED = ("ttfb_s", "ttlb_s")


def hardware_kind(h: dict) -> str:
    labels = h.get("labels") or {}
    pod_arch = h.get("pod_arch")
    arch = MACHINE_ARCH.get(pod_arch, pod_arch) if pod_arch else labels.get(ARCH_LABEL) or h.get("arch") or "?"
    kind = f"{arch}/{labels[HARDWARE_LABEL]}" if labels.get(HARDWARE_LABEL) else str(arch)
    return kind + (" (emulated)" if h.get("emulated") else "")


def _placements(run: Run) -> tuple[dict, dict, dict]:
    """(kinds {kind: {"nodes", "relays", "emulated"}}, relay_kind {(variant, rep, relay): kind},
    group_kinds {relay group: set of kinds})."""
    kinds: dict[str, dict] = {}
    relay_kind: dict[tuple, str] = {}
    group_kinds: dict[str, set] = {}
    for r in run.reps:
        meta = r.meta or {}
        hw = meta.get("hardware")
        if not isinstance(hw, dict):
            continue
        for n in meta.get("nodes") or []:
            h = hw.get(n.get("k8s_node") or "")
            if not isinstance(h, dict) or n.get("role") != "relay":
                continue
            kind = hardware_kind(h)
            e = kinds.setdefault(kind, {"nodes": set(), "relays": set(), "emulated": bool(h.get("emulated"))})
            e["nodes"].add(n["k8s_node"])
            e["relays"].add(n["name"])
            relay_kind[(r.variant, r.index, n["name"])] = kind
            group_kinds.setdefault(n.get("group"), set()).add(kind)
    return kinds, relay_kind, group_kinds


def _client_paths(run: Run) -> dict[str, list[str]]:
    sc = run.info.get("scenario") if isinstance(run.info.get("scenario"), dict) else {}
    clients = sc.get("clients") if isinstance(sc.get("clients"), dict) else {}
    return {g: list(c["path"]) for g, c in clients.items() if isinstance(c, dict) and isinstance(c.get("path"), list)}


def _arm_label(kinds: set[str]) -> str:
    return " + ".join(sorted(kinds))


def by_hardware(run: Run, extracted: Extracted) -> dict | None:
    kinds, relay_kind, group_kinds = _placements(run)
    if len(kinds) < 2:
        return None
    paths = _client_paths(run)
    # The hardware a client group's path ran on; unknown (no fixed path, or a group never
    # placed) leaves the group out.
    path_kinds: dict[str, set] = {}
    for g, path in paths.items():
        ks = set()
        for rg in path:
            if rg not in group_kinds:
                break
            ks |= group_kinds[rg]
        else:
            path_kinds[g] = ks
    comparisons = []
    for metric in COMPARED:
        by_file: dict[str, dict[str, list]] = {}
        for mid, m in extracted.metrics.items():
            if m.metric != metric or m.params.get("group") not in path_kinds:
                continue
            label = _arm_label(path_kinds[m.params["group"]])
            by_file.setdefault(str(m.params.get("file")), {}).setdefault(label, []).append(m)
        for file, arms in sorted(by_file.items()):
            if len(arms) < 2:
                continue
            base_label = min(arms, key=lambda a: (a.count(" + "), "(emulated)" in a, a))
            for v in run.variants:
                entry = {"metric": metric, "file": file, "variant": v, "baseline_arm": base_label, "arms": {}}
                per_rep: dict[str, list[float]] = {}
                for label, ms in sorted(arms.items()):
                    reps = sorted({k for m in ms for k in m.values.get(v, {})})
                    pooled_by_rep = {k: np.concatenate([m.values[v][k] for m in ms if k in m.values.get(v, {})])
                                     for k in reps}
                    medians = [float(np.median(x)) for k, x in sorted(pooled_by_rep.items()) if x.size]
                    pooled = np.concatenate(list(pooled_by_rep.values())) if pooled_by_rep else np.array([])
                    per_rep[label] = medians
                    entry["arms"][label] = {"groups": sorted(m.params["group"] for m in ms),
                                            "n": int(pooled.size),
                                            "median": float(np.median(pooled)) if pooled.size else None,
                                            "per_rep_medians": medians}
                for label in entry["arms"]:
                    if label != base_label:
                        entry["arms"][label]["vs_baseline"] = stats.compare_reps(
                            per_rep[label], per_rep[base_label],
                            rng=stats.rng_for(run.seed, "hardware", metric, file, v, label))
                comparisons.append(entry)
    throughput: dict[str, dict] = {}
    for mid, m in extracted.metrics.items():
        if m.metric != "relay_throughput_Bps":
            continue
        relay = m.params.get("relay")
        for v, reps in m.values.items():
            for k, vals in reps.items():
                kind = relay_kind.get((v, k, relay))
                if kind is None or not np.asarray(vals).size:
                    continue
                t = throughput.setdefault(kind, {"relays": {}, "values": []})
                t["relays"].setdefault(relay, []).append(float(np.asarray(vals)[0]))
                t["values"].append(float(np.asarray(vals)[0]))
    for t in throughput.values():
        t["median"] = float(np.median(t.pop("values")))
        t["relays"] = {r: float(np.median(x)) for r, x in sorted(t["relays"].items())}
    return {"hardware": {k: {"nodes": sorted(e["nodes"]), "relays": sorted(e["relays"]), "emulated": e["emulated"]}
                         for k, e in sorted(kinds.items())},
            "client_groups": {g: _arm_label(k) for g, k in sorted(path_kinds.items())},
            "comparisons": comparisons, "relay_throughput_Bps": dict(sorted(throughput.items())),
            "note": "descriptive: not in the Holm family or the headline; per-repetition medians compared "
                    f"with Welch's t as variants are ({inference.primary_stat('ttlb_s')} per repetition)"}
