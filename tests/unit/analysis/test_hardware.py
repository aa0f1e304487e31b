"""The report's comparison by hardware (analysis/hardware.py) on synthetic Kubernetes runs: one
middle relay on an amd64 node, one on an emulated Pi, each on the path of its own web client
group, as scenarios/hardware-comparison.yaml places them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from torbed.analysis import hardware, metrics
from torbed.analysis.load import load_run

T0 = 1_700_000_000.0
MAIN = {"arch": "amd64", "pod_arch": "x86_64", "labels": {"kubernetes.io/arch": "amd64"}, "emulated": False}
# The local cluster's emulated Pi: an amd64 kubelet (its arch label too), pods running arm64 code.
PI = {"arch": "amd64", "pod_arch": "aarch64", "labels": {"kubernetes.io/arch": "amd64", "torbed.io/hardware": "rpi"},
      "emulated": True}


def _run(tmp: Path, arm_factor: float, reps: int = 3, seed: int = 1, rep_sd: float = 0.05) -> Path:
    rng = np.random.default_rng(seed)
    run = tmp / "hw-run"
    scenario = {"name": "hw", "clients": {"webamd": {"path": ["guard", "midamd", "exit"]},
                                          "webarm": {"path": ["guard", "midarm", "exit"]}}}
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema": 1, "name": "hw", "scenario": scenario, "seed": 3,
                                              "variants": ["vanilla"], "baseline": "vanilla", "repetitions": reps}))
    relays = [("guard0", "guard", "main"), ("midamd0", "midamd", "main"), ("midarm0", "midarm", "pi"),
              ("exit0", "exit", "main")]
    for k in range(reps):
        d = run / "vanilla" / f"rep-{k}"
        d.mkdir(parents=True)
        meta = {"status": "ok", "t_workload_start": T0, "warmup_s": 0,
                "nodes": [{"name": n, "role": "relay", "group": g, "k8s_node": w} for n, g, w in relays],
                "hardware": {"main": {**MAIN, "ran": ["guard0", "midamd0", "exit0"]},
                             "pi": {**PI, "ran": ["midarm0"]}}}
        (d / "meta.json").write_text(json.dumps(meta))
        lines = []
        rep_effect = rng.lognormal(0, rep_sd)   # repetitions differ (a little by default), both arms alike
        for group, factor in (("webamd", 1.0), ("webarm", arm_factor)):
            for i in range(40):
                ttlb = 0.5 * rep_effect * factor * rng.lognormal(0, 0.2)
                lines.append(json.dumps({"client": f"{group}0", "group": group, "file": "small", "size": 300000,
                                         "status": "ok", "warmup": False, "t_start": T0 + i, "ttfb_s": ttlb / 3, "ttlb_s": ttlb}))
        (d / "transfers.jsonl").write_text("\n".join(lines) + "\n")
        bw = [json.dumps({"relay": r, "group": g, "t": T0 + s, "written": 1e6 * s * (0.5 if r == "midarm0" else 1)})
              for r, g, _ in relays for s in range(0, 100)]
        (d / "relay_bw.jsonl").write_text("\n".join(bw) + "\n")
    return run


def test_hardware_kind_names_architecture_label_and_emulation():
    assert hardware.hardware_kind(MAIN) == "amd64"
    assert hardware.hardware_kind(PI) == "arm64/rpi (emulated)"
    assert hardware.hardware_kind({"arch": "arm64", "labels": {"torbed.io/hardware": "rpi"}}) == "arm64/rpi"
    assert hardware.hardware_kind({"arch": "amd64"}) == "amd64"   # no pod reported: the node's


def test_a_slower_path_through_the_pi_is_found_and_attributed_to_its_hardware(tmp_path):
    run = load_run(_run(tmp_path, arm_factor=2.0))
    h = hardware.by_hardware(run, metrics.extract(run))
    assert h["hardware"]["arm64/rpi (emulated)"]["relays"] == ["midarm0"]
    assert h["client_groups"] == {"webamd": "amd64", "webarm": "amd64 + arm64/rpi (emulated)"}
    ttlb = next(c for c in h["comparisons"] if c["metric"] == "ttlb_s")
    assert ttlb["baseline_arm"] == "amd64"
    vs = ttlb["arms"]["amd64 + arm64/rpi (emulated)"]["vs_baseline"]
    assert vs["status"] == "tested" and vs["pvalue"] < 0.01 and 80 < vs["change_pct"] < 120, vs
    tp = h["relay_throughput_Bps"]
    assert set(tp["arm64/rpi (emulated)"]["relays"]) == {"midarm0"}
    assert tp["arm64/rpi (emulated)"]["median"] < tp["amd64"]["median"]


def test_the_same_hardware_effect_twice_finds_nothing(tmp_path):
    # An A/A check: both paths alike (the Pi's middle no slower): no difference is claimed.
    pvalues = []
    for seed in range(20):
        d = tmp_path / str(seed)
        d.mkdir()
        run = load_run(_run(d, arm_factor=1.0, seed=seed))
        c = next(c for c in hardware.by_hardware(run, metrics.extract(run))["comparisons"] if c["metric"] == "ttlb_s")
        pvalues.append(c["arms"]["amd64 + arm64/rpi (emulated)"]["vs_baseline"]["pvalue"])
    assert sum(p < 0.05 for p in pvalues) <= 3, pvalues


def test_one_kind_of_hardware_or_a_local_run_has_no_hardware_section(tmp_path):
    run_dir = _run(tmp_path, arm_factor=1.0)
    for k in range(3):
        m = run_dir / "vanilla" / f"rep-{k}" / "meta.json"
        meta = json.loads(m.read_text())
        meta["hardware"]["pi"] = dict(MAIN)
        m.write_text(json.dumps(meta))
    run = load_run(run_dir)
    assert hardware.by_hardware(run, metrics.extract(run)) is None
    for k in range(3):
        m = run_dir / "vanilla" / f"rep-{k}" / "meta.json"
        meta = json.loads(m.read_text())
        del meta["hardware"]
        m.write_text(json.dumps(meta))
    run = load_run(run_dir)
    assert hardware.by_hardware(run, metrics.extract(run)) is None


def test_arms_are_paired_by_repetition_so_a_shared_slowdown_cancels(tmp_path):
    # Repetitions differ a lot (sd 0.5 on the log scale: a loaded machine in some) and both
    # arms share it; the Pi path is 25% slower. Paired on the per-repetition log ratios the
    # shared part cancels and the 25% is found; Welch across repetitions (what this compared
    # before) sees a spread of ~50% and cannot tell.
    run = load_run(_run(tmp_path, arm_factor=1.25, reps=5, rep_sd=0.5, seed=4))
    c = next(c for c in hardware.by_hardware(run, metrics.extract(run))["comparisons"] if c["metric"] == "ttlb_s")
    arm = c["arms"]["amd64 + arm64/rpi (emulated)"]
    vs = arm["vs_baseline"]
    assert vs["test"] == "paired" and "blocks intact" in vs["test_reason"], vs
    assert vs["pvalue"] < 0.01 and 10 < vs["change_pct"] < 40 and vs["change_ci95"][0] > 0, vs
    welch = hardware.inference.test_arms(dict(zip(arm["reps"], arm["per_rep_medians"])),
                                         dict(zip(c["arms"]["amd64"]["reps"], c["arms"]["amd64"]["per_rep_medians"])),
                                         False, None, np.random.default_rng(0), None)
    assert welch["pvalue"] > 0.05, "the shared repetition effect should swamp the unpaired test"


def test_broken_blocks_fall_back_to_welch_and_say_why(tmp_path):
    run_dir = _run(tmp_path, arm_factor=2.0, reps=4)
    # Repetition 1 failed; repetition 2 has no Pi-path transfers at all.
    m = run_dir / "vanilla" / "rep-1" / "meta.json"
    m.write_text(json.dumps({**json.loads(m.read_text()), "status": "failed"}))
    t = run_dir / "vanilla" / "rep-2" / "transfers.jsonl"
    t.write_text("".join(line + "\n" for line in t.read_text().splitlines() if '"webarm"' not in line))
    run = load_run(run_dir)
    c = next(c for c in hardware.by_hardware(run, metrics.extract(run))["comparisons"] if c["metric"] == "ttlb_s")
    vs = c["arms"]["amd64 + arm64/rpi (emulated)"]["vs_baseline"]
    assert vs["test"] != "paired" and "blocks broken" in vs["test_reason"], vs
    assert "repetition(s) 2 have no value in the variant" in vs["test_reason"]
    assert "repetition 1 failed in vanilla" in vs["test_reason"], vs["test_reason"]
    assert c["arms"]["amd64 + arm64/rpi (emulated)"]["reps"] == [0, 1, 3]
