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
per-repetition medians of TTFB and TTLB, with repetitions as the unit. Both arms ran in the
same repetitions, so repetition k is a block (what it shared: the machine's load, the network
state): with intact blocks the test is paired on the per-block log ratios
(``stats.compare_paired``, as inference.py pairs variants), and where blocks are broken (a
repetition with a value in one arm only, or one that did not finish ok) Welch across
repetitions (``stats.compare_reps``); ``test_reason`` says which and why. One repetition gives
estimates and no test.
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


def _path_kinds(run: Run, group_kinds: dict[str, set]) -> dict[str, set]:
    """The hardware kinds each client group's path ran on; unknown (no fixed path, or a
    relay group never placed) leaves the group out."""
    path_kinds: dict[str, set] = {}
    for g, path in _client_paths(run).items():
        ks: set = set()
        for rg in path:
            if rg not in group_kinds:
                break
            ks |= group_kinds[rg]
        else:
            path_kinds[g] = ks
    return path_kinds


def _invalid(run: Run, variant: str) -> dict[int, str]:
    """{rep: why} for ``variant``'s repetitions that did not finish ok: not paired."""
    return {r.index: f"{r.status} in {variant}" for r in run.reps_of(variant) if r.status != "ok"}


def _arm(ms: list, variant: str) -> tuple[dict, dict[int, float]]:
    """One arm (its metric samples, the groups whose paths ran on the same kinds) of one
    variant: its summary entry and {rep: median of the pooled transfers}."""
    reps = sorted({k for m in ms for k in m.values.get(variant, {})})
    pooled_by_rep = {k: np.concatenate([m.values[variant][k] for m in ms if k in m.values.get(variant, {})])
                     for k in reps}
    by_rep = {k: float(np.median(x)) for k, x in sorted(pooled_by_rep.items()) if x.size}
    pooled = np.concatenate(list(pooled_by_rep.values())) if pooled_by_rep else np.array([])
    return ({"groups": sorted(m.params["group"] for m in ms), "n": int(pooled.size),
             "median": float(np.median(pooled)) if pooled.size else None,
             "per_rep_medians": list(by_rep.values()), "reps": list(by_rep)}, by_rep)


def vs_baseline(new: dict[int, float], base: dict[int, float], invalid: dict[int, str], rng) -> dict:
    """An arm's per-repetition medians against the baseline arm's: paired on the blocks when
    they are intact (inference.block_check), else Welch across repetitions."""
    paired, why = inference.block_check(new, base, True, invalid)
    res = inference.test_arms(new, base, paired, None, rng, None)
    res["test_reason"] = why
    return res


def _comparisons(run: Run, extracted: Extracted, path_kinds: dict[str, set]) -> list[dict]:
    comparisons = []
    for metric in COMPARED:
        by_file: dict[str, dict[str, list]] = {}
        for m in extracted.metrics.values():
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
                by_rep = {}
                for label, ms in sorted(arms.items()):
                    entry["arms"][label], by_rep[label] = _arm(ms, v)
                for label in entry["arms"]:
                    if label != base_label:
                        entry["arms"][label]["vs_baseline"] = vs_baseline(
                            by_rep[label], by_rep[base_label], _invalid(run, v),
                            stats.rng_for(run.seed, "hardware", metric, file, v, label))
                comparisons.append(entry)
    return comparisons


def _throughput(extracted: Extracted, relay_kind: dict) -> dict:
    """Relay throughput by the hardware kind each relay ran on (per-repetition values)."""
    throughput: dict[str, dict] = {}
    for m in extracted.metrics.values():
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
    return dict(sorted(throughput.items()))


def by_hardware(run: Run, extracted: Extracted) -> dict | None:
    kinds, relay_kind, group_kinds = _placements(run)
    if len(kinds) < 2:
        return None
    path_kinds = _path_kinds(run, group_kinds)
    return {"hardware": {k: {"nodes": sorted(e["nodes"]), "relays": sorted(e["relays"]), "emulated": e["emulated"]}
                         for k, e in sorted(kinds.items())},
            "client_groups": {g: _arm_label(k) for g, k in sorted(path_kinds.items())},
            "comparisons": _comparisons(run, extracted, path_kinds),
            "relay_throughput_Bps": _throughput(extracted, relay_kind),
            "note": "descriptive: not in the Holm family or the headline; per-repetition medians "
                    f"({inference.primary_stat('ttlb_s')} per repetition) compared paired on the per-block log "
                    "ratios where every repetition has both arms, else with Welch's t (each comparison's "
                    "test_reason says which)"}
