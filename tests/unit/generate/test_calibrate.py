"""torbed calibrate: the budget's figures from a finished run's CPU-gate readings and relay
bytes (torbed/generate/calibrate.py), and budget.machine reading the newest calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torbed import cli
from torbed.errors import InputError
from torbed.generate import budget, calibrate

WINDOW = (1000.0, 1100.0)       # 100 s
SCENARIO = {
    "name": "cal",
    "network": {"authorities": 3, "relays": {"r": {"count": 4, "bandwidth": "800kbit"}}},   # 100 kB/s each
    "servers": {"www": {"files": {"page": "50KiB", "big": "5MiB"}}},
    "clients": {"web": {"count": 4, "workload": {"kind": "fetch", "file": "page", "pause": "5s"}},
                "bulk": {"count": 1, "workload": {"kind": "bulk", "file": "big"}}},
}


def _procs(scale: float) -> dict:
    """Per-process cores as the CPU gate records them: 4 relays, 5 client tors and drivers, 3
    authorities, a server, linkemu, the collector, torbed and Prometheus."""
    p = {}
    for i in range(4):
        p[f"r{i}"] = {"role": "relay", "group": "r", "cpu_cores": 0.052 * scale, "wait_fraction": 0.01}
    for i in range(5):
        p[f"c{i}"] = {"role": "client", "group": "web", "cpu_cores": 0.002, "wait_fraction": 0.0}
        p[f"c{i}.driver"] = {"role": "driver", "group": "web", "cpu_cores": 0.004, "wait_fraction": 0.0}
    for i in range(3):
        p[f"auth{i}"] = {"role": "authority", "group": "auth", "cpu_cores": 0.008, "wait_fraction": 0.0}
    p["www0"] = {"role": "server", "group": "www", "cpu_cores": 0.006, "wait_fraction": 0.0}
    p["linkemu"] = {"role": "shaper", "group": None, "cpu_cores": 0.15 * scale, "wait_fraction": 0.0}
    p["collector"] = {"role": "collector", "group": None, "cpu_cores": 0.012, "wait_fraction": 0.0}
    p["torbed"] = {"role": "torbed", "group": None, "cpu_cores": 0.05, "wait_fraction": 0.0}
    p["prometheus"] = {"role": "prometheus", "group": None, "cpu_cores": 0.03, "wait_fraction": 0.0}
    return p


def _rep(run: Path, variant: str, k: int, mbps: float, *, valid: bool = True, procs: dict | None = None,
         status: str = "ok") -> None:
    d = run / variant / f"rep-{k}"
    d.mkdir(parents=True)
    gates = {"version": 1, "window": list(WINDOW), "valid": valid,
             "invalid_reasons": [] if valid else ["CPU-starved: 1 process(es) waited ..."],
             "cpu": {"status": "ok" if valid else "invalid", "processes": procs if procs is not None else _procs(mbps / 2),
                     "host": {"cpus": 2, "busy_fraction": 0.5, "steal_fraction": 0.0}}}
    (d / "meta.json").write_text(json.dumps({"status": status, "gates": gates}))
    # Each of 4 relays writes mbps/4 MB/s, one BW sample a second; samples outside the window
    # (warm-up, after) must not count.
    lines = []
    for relay in range(4):
        for t in range(int(WINDOW[0]) - 20, int(WINDOW[1]) + 20):
            w = mbps / 4 * 1e6 if WINDOW[0] < t <= WINDOW[1] else 9e9
            lines.append(json.dumps({"type": "relay_bw", "relay": f"r{relay}", "t": float(t), "written": w}))
    (d / "relay_bw.jsonl").write_text("\n".join(lines) + "\n")
    for f in ("transfers.jsonl", "cellstats.jsonl"):
        (d / f).write_text("")


def _run(tmp_path: Path, mbps_by_rep: list[float], **kw) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema": 1, "name": "cal", "variants": ["kist"],
                                              "repetitions": len(mbps_by_rep), "scenario": SCENARIO}))
    for k, m in enumerate(mbps_by_rep):
        _rep(run, "kist", k, m, **kw)
    return run


def test_figures_are_the_per_role_cores_over_the_load_median_over_repetitions(tmp_path):
    run = _run(tmp_path, [2.0, 2.0, 2.0])
    cal = calibrate.calibrate(run)
    f = cal["figures"]
    assert [r["relayed_mbps"] for r in cal["repetitions"]] == [2.0, 2.0, 2.0]   # warm-up samples left out
    # relays: 4 x 0.052 = 0.208 cores, less 4 x 0.002 idle = 0.2, over 2 MB/s
    assert f["cpu_per_relayed_mbps"] == pytest.approx(0.1)
    assert f["cpu_shaper_per_mbps"] == pytest.approx(0.075)
    assert f["cpu_observe_relay"] == pytest.approx(0.003)
    assert f["cpu_client"] == pytest.approx(0.006)          # client tor + driver, per client
    assert f["cpu_fixed"] == pytest.approx(0.08)
    assert f["cpu_idle_authority"] == pytest.approx((0.024 + 0.006) / 3)
    # offered at the median rate of 100 kB/s: 4 fetches of 51200 B per (5 s + 0.512 s) + 1 bulk
    offered = (4 * 51200 / (5 + 0.512) + 100_000) / 1e6
    assert f["relayed_per_offered"] == pytest.approx(2.0 / offered, rel=1e-3)
    assert cal["machine"]["cpus"] == 2 and cal["not_used"] == []


def test_the_median_resists_one_odd_repetition_and_ranges_show_the_spread(tmp_path):
    run = _run(tmp_path, [2.0, 2.0, 2.0, 2.0, 4.0])
    # Per rep the relays' cores scale with the load (procs scale mbps/2): the odd one has other
    # per-MB/s figures only through the idle share; the median is the common value.
    cal = calibrate.calibrate(run)
    assert cal["figures"]["cpu_per_relayed_mbps"] == pytest.approx(0.1)
    lo, hi = cal["ranges"]["cpu_per_relayed_mbps"]
    assert lo < hi


def test_rejected_and_idle_repetitions_are_not_used_and_too_few_are_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema": 1, "name": "cal", "variants": ["kist"], "repetitions": 5,
                                              "scenario": SCENARIO}))
    _rep(run, "kist", 0, 2.0)
    _rep(run, "kist", 1, 2.0)
    _rep(run, "kist", 2, 2.0, valid=False)            # a gate rejected it: its CPU is queueing
    _rep(run, "kist", 3, 0.05)                        # the relays carried almost nothing
    _rep(run, "kist", 4, 2.0, procs={})               # no per-process readings
    with pytest.raises(InputError) as e:
        calibrate.calibrate(run)
    msg = str(e.value)
    assert msg.startswith(f"{run}: 2 usable repetition(s), a calibration needs 3")
    assert "kist/rep-2: rejected by a gate" in msg and "kist/rep-3: relays wrote 0.05 MB/s" in msg
    assert "kist/rep-4: no per-process CPU readings" in msg


def test_budget_uses_the_newest_calibration_of_a_machine_with_as_many_cores(tmp_path):
    bench = tmp_path / "bench"
    cal = calibrate.calibrate(_run(tmp_path, [2.0, 2.0, 2.0]))
    path = calibrate.write(cal, bench)
    b = budget.machine(cores=2, memory_mib=4096, bench_dir=bench)
    assert b.cpu_per_relayed_mbps == pytest.approx(0.1) and b.cpu_shaper_per_mbps == pytest.approx(0.075)
    assert str(path) in b.source
    # Options still win over the calibration; another machine's calibration is not used.
    assert budget.machine(cores=2, memory_mib=4096, bench_dir=bench, cpu_per_relayed_mbps=0.5).cpu_per_relayed_mbps == 0.5
    other = budget.machine(cores=8, memory_mib=4096, bench_dir=bench)
    assert other.cpu_per_relayed_mbps == budget.CPU_PER_RELAYED_MBPS and "calibration" not in other.source


def test_the_command_writes_the_calibration_and_refuses_a_non_run_with_exit_2(tmp_path, capsys):
    run = _run(tmp_path, [2.0, 2.0, 2.0])
    bench = tmp_path / "bench"
    assert cli.main(["calibrate", str(run), "--bench-dir", str(bench)]) == 0
    out = capsys.readouterr().out
    written = list(bench.glob("calibration-*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["figures"]["cpu_fixed"] == pytest.approx(0.08)
    assert "cpu_per_relayed_mbps" in out and str(written[0]) in out
    assert cli.main(["calibrate", str(tmp_path / "nothing"), "--bench-dir", str(bench)]) == 2
    err = capsys.readouterr()
    assert "nothing" in err.err + err.out and "Traceback" not in err.err + err.out
