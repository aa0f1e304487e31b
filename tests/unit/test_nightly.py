"""The nightly definition, history store and regression detector (synthetic histories and
the golden run directory; the whole `torbed nightly` loop runs in tests/integration)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from scipy import signal

from torbed.nightly import detect as detect_mod
from torbed.nightly import history as history_mod
from torbed.nightly import spec as spec_mod
from torbed.nightly.history import History, Night

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/data/golden-run"


def _spec(tmp_path: Path, **over) -> spec_mod.NightlySpec:
    data = {"apiVersion": "torbed/v1", "kind": "Nightly", "name": "t",
            "matrix": [{"scenario": str(ROOT / "scenarios/quickstart.yaml")}], **over}
    return spec_mod.parse(data, "nightly.yaml", base_dir=tmp_path)


# ------------------------------------------------------------------ the definition file

def test_docs_example_is_valid():
    s = spec_mod.load(ROOT / "scenarios/nightly/quickstart.yaml")
    assert s.matrix and s.lookback >= s.min_history


@pytest.mark.parametrize("over, path, words", [
    ({"lookbak": 3}, "", "unknown key 'lookbak'"),
    ({"schedule": "every night"}, "schedule", "cron"),
    ({"compare_by": ["variant"]}, "compare_by", "scenario"),
    ({"compare_by": ["scenario", "variant", "moon"]}, "compare_by", "moon"),
    ({"thresholds": {"z": -1}}, "thresholds.z", "greater than 0"),
    ({"thresholds": {"min_change": "five"}}, "thresholds.min_change", "not a percentage"),
    ({"min_history": 9, "lookback": 4}, "min_history", "more than lookback"),
    ({"matrix": []}, "matrix", "at least 1"),
    ({"matrix": [{"scenario": "nope.yaml"}]}, "matrix[0].scenario", "cannot read"),
    ({"matrix": [{"scenario": str(ROOT / "scenarios/quickstart.yaml"), "variants": ["rr"]}]},
     "matrix[0].variants", "'rr' is not among"),
    ({"matrix": [{"scenario": str(ROOT / "scenarios/quickstart.yaml"), "duration": "soon"}]},
     "matrix[0].duration", "not a duration"),
])
def test_invalid_definitions_name_the_field(tmp_path, over, path, words):
    with pytest.raises(spec_mod.NightlyError) as e:
        _spec(tmp_path, **over)
    assert any(p == path and words in m for p, m in e.value.problems), e.value.problems
    assert str(e.value).startswith("nightly.yaml: ")


@pytest.mark.parametrize("content, words", [
    (b"", "empty"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"a: [1, 2\n b: {", "not valid YAML"),
    (b"a:\n" + b"".join(b"  " * i + b"- \n" for i in range(1, 200)), "nested more than"),
    (b"- just\n- a list\n", "mapping"),
    (b"x" * (2 << 20), "more than 1 MiB"),
])
def test_unusable_files_fail_with_one_line(tmp_path, content, words):
    f = tmp_path / "n.yaml"
    f.write_bytes(content)
    with pytest.raises(spec_mod.NightlyError) as e:
        spec_mod.load(f)
    assert words in str(e.value) and str(f) in str(e.value)


# ------------------------------------------------------------------ the store

def test_golden_run_ingested_with_its_keys(tmp_path):
    with History(tmp_path / "h") as h:
        ids = h.ingest(GOLDEN, night="2026-11-01")
        assert len(ids) == 2   # vanilla and ewma-66
        rows = h.db.execute("SELECT variant, tor_version, hardware, scenario FROM runs ORDER BY variant").fetchall()
        assert [r[0] for r in rows] == ["ewma-66", "vanilla"]
        assert rows[0][1] == "0.4.9.11" and rows[0][2] == "x86_64, 8 CPUs, 16 GiB"
        assert rows[0][3] == "golden"
        n = h.db.execute("SELECT COUNT(*) FROM reps WHERE metric='ttlb_s/web:small'").fetchone()[0]
        assert n >= 2
        # Re-ingesting the same directory replaces, it does not duplicate.
        h.ingest(GOLDEN, night="2026-11-01")
        assert h.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2
        series = h.series(["scenario", "variant"], "ttlb_s/web:small")
        assert {k[1] for k in series} == {"vanilla", "ewma-66"}
    meta = dict(sqlite3.connect(tmp_path / "h" / history_mod.FILENAME).execute("SELECT * FROM meta").fetchall())
    assert meta["schema_version"] == str(history_mod.SCHEMA_VERSION) and "table.runs" in meta


def test_a_kubernetes_run_is_keyed_by_its_nodes_hardware(tmp_path):
    run = tmp_path / GOLDEN.name
    shutil.copytree(GOLDEN, run)
    pi = {"arch": "amd64", "pod_arch": "aarch64", "labels": {"torbed.io/hardware": "rpi"}, "emulated": True,
          "cpu_model": "AMD EPYC", "cpus": "2"}
    for m in run.glob("*/rep-*/meta.json"):
        meta = json.loads(m.read_text())
        meta["hardware"] = {"vm": {"arch": "amd64", "pod_arch": "x86_64", "cpu_model": "AMD EPYC", "cpus": "2"},
                            "torbed-pi": pi}
        m.write_text(json.dumps(meta))
    with History(tmp_path / "h") as h:
        h.ingest(run, night="2026-11-01")
        hw = {r[0] for r in h.db.execute("SELECT hardware FROM runs").fetchall()}
    assert hw == {"k8s: 1 x amd64, AMD EPYC, 2 CPUs; 1 x arm64/rpi (emulated), AMD EPYC, 2 CPUs"}


def test_newer_schema_is_refused(tmp_path):
    History(tmp_path).close()
    db = sqlite3.connect(tmp_path / history_mod.FILENAME)
    with db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.close()
    with pytest.raises(history_mod.HistoryError, match="newer"):
        History(tmp_path)


def test_not_a_store_is_refused(tmp_path):
    (tmp_path / history_mod.FILENAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(history_mod.HistoryError, match="not a torbed history store"):
        History(tmp_path)


def test_a_failed_record_leaves_nothing(tmp_path):
    with History(tmp_path) as h:
        with pytest.raises(ValueError):
            h.record("n1", {"run_dir": "r", "scenario": "s", "variant": "v"},
                     {"m": {0: [1.0, 2.0]}, "bad": {"not-an-int": [1.0]}})
        assert h.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
        assert h.db.execute("SELECT COUNT(*) FROM reps").fetchone()[0] == 0


def test_subsample_keeps_quantiles():
    rng = np.random.default_rng(1)
    x = rng.lognormal(0, 1, 50_000)
    s = history_mod._subsample(x)
    assert len(s) == history_mod.MAX_SAMPLES
    for q in (0.1, 0.5, 0.9):
        assert abs(np.quantile(s, q) / np.quantile(x, q) - 1) < 0.02


# ------------------------------------------------------------------ the detector

def _night(rng, label: str, level: float, reps: int = 3, n: int = 150, rep_cv: float = 0.05) -> Night:
    """A night as a noisy shared machine makes it: the night's level, each repetition's own
    offset (a fresh network), and correlated samples inside a repetition (AR(1) on the log)."""
    meds, samples = [], []
    for _ in range(reps):
        rep_level = level * np.exp(rng.normal(0, rep_cv))
        e = signal.lfilter([0.6], [1, -0.8], rng.normal(size=n))   # AR(1), phi 0.8
        vals = rep_level * np.exp(0.3 * e)
        meds.append(float(np.median(vals)))
        samples.append(vals)
    return Night(label, [1], meds, np.concatenate(samples))


def _history(rng, levels) -> list[Night]:
    return [_night(rng, f"2026-11-{i + 1:02d}", lv) for i, lv in enumerate(levels)]


def test_a_step_change_is_flagged(tmp_path):
    spec = _spec(tmp_path)
    rng = np.random.default_rng(7)
    noise = np.exp(rng.normal(0, 0.04, 8))          # night-to-night machine noise, ~4%
    nights = _history(rng, list(2.0 * noise) + [2.0 * 1.4])
    f = detect_mod.assess(nights, nights[-1].night, spec, "ttlb_s/web:small", {"variant": "v"})
    assert f.status == "regression", f.reason
    assert f.z > 3 and f.p < 0.01 and f.change > 0.2
    # The same step in a throughput metric is an improvement.
    f = detect_mod.assess(nights, nights[-1].night, spec, "relay_throughput_Bps/middle0", {"variant": "v"})
    assert f.status == "improvement"


def test_noise_of_the_measured_size_is_not_flagged(tmp_path):
    """200 histories of pure noise (night-to-night 4%, repetition 5%, correlated samples):
    the detector flags the last night at most 1% of the time, while the pooled Mann-Whitney
    test on its own would cry wolf far more often (so this test could fail)."""
    spec = _spec(tmp_path)
    rng = np.random.default_rng(11)
    flagged = pooled_alarms = 0
    trials = 200
    for _ in range(trials):
        nights = _history(rng, list(2.0 * np.exp(rng.normal(0, 0.04, 9))))
        f = detect_mod.assess(nights, nights[-1].night, spec, "ttlb_s/web:small", {"variant": "v"})
        flagged += f.flagged
        pooled_alarms += f.p is not None and f.p < spec.thresholds.p
    assert flagged / trials <= 0.01
    assert pooled_alarms / trials >= 0.2


def test_too_little_history_flags_nothing(tmp_path):
    spec = _spec(tmp_path, min_history=3)
    rng = np.random.default_rng(3)
    nights = _history(rng, [2.0, 2.0, 5.0])
    f = detect_mod.assess(nights, nights[-1].night, spec, "ttlb_s/web:small", {})
    assert f.status == "insufficient-history" and not f.flagged


def test_only_like_is_compared_with_like(tmp_path):
    """Nights on other hardware are another history: a slow Pi night after fast server
    nights is not a regression of either."""
    spec = _spec(tmp_path)
    rng = np.random.default_rng(5)
    with History(tmp_path / "h") as h:
        for i in range(6):
            for hw, level in (("server", 1.0), ("rpi", 4.0)):
                night = _night(rng, f"2026-11-{i + 1:02d}", level)
                h.record(night.night, {"run_dir": f"r{i}{hw}", "scenario": "q@x", "variant": "v",
                                       "hardware": hw, "tor_version": "0.4.9.11", "torbed_version": "0.1.0",
                                       "backend": "local"},
                         {"ttlb_s/web:small": {k: night.samples[k * 150:(k + 1) * 150] for k in range(3)}})
        findings = detect_mod.detect(h, spec, "2026-11-06")
    assert len(findings) == 2 and not any(f.flagged for f in findings)
    assert {f.key["hardware"] for f in findings} == {"server", "rpi"}


def test_untracked_metrics_are_ignored(tmp_path):
    spec = _spec(tmp_path, metrics=["relay_throughput_Bps/*"])
    assert spec.tracks("relay_throughput_Bps/middle0") and not spec.tracks("ttlb_s/web:small")


def test_report_shows_the_flagged_night(tmp_path):
    from torbed.nightly.report import write_report
    spec = _spec(tmp_path)
    rng = np.random.default_rng(7)
    with History(tmp_path / "h") as h:
        levels = list(2.0 * np.exp(rng.normal(0, 0.03, 7))) + [3.0]
        for i, lv in enumerate(levels):
            night = _night(rng, f"2026-11-{i + 1:02d}", lv)
            h.record(night.night, {"run_dir": f"r{i}", "scenario": "q@x", "variant": "vanilla", "hardware": "hw",
                                   "backend": "local"},
                     {"ttlb_s/web:small": {k: night.samples[k * 150:(k + 1) * 150] for k in range(3)}})
        findings = detect_mod.detect(h, spec, "2026-11-08")
    data = write_report(findings, spec, "2026-11-08", tmp_path / "out")
    assert data["regressions"] == 1 and data["findings"][0]["status"] == "regression"
    saved = json.loads((tmp_path / "out/nightly.json").read_text())
    assert saved["flagged"] == 1 and len(saved["findings"][0]["history"]) == 8
    md = (tmp_path / "out/nightly.md").read_text()
    assert "| regression | ttlb_s/web:small |" in md
    pngs = list((tmp_path / "out/figures").glob("trend-*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 5000
    assert "data:image/png;base64," in (tmp_path / "out/nightly.html").read_text()


# ------------------------------------------------------------------ the night's runner

def test_a_night_passes_and_records_each_entrys_overrides(tmp_path):
    # Before, the runner gave the backend neither the entry's repetitions/duration as
    # overrides nor the scenario file as the source (it passed the nightly file): run.json
    # said "no overrides", tonight's report did not say what ran, and `torbed run --resume`
    # of a nightly run rebuilt a different scenario. The fake backend runs nothing: it
    # copies the golden run directory and keeps what it was given.
    from rich.console import Console

    from torbed.nightly import runner

    spec = _spec(tmp_path, matrix=[{"scenario": str(ROOT / "scenarios/quickstart.yaml"), "repetitions": 2,
                                    "duration": "40s"},
                                   {"scenario": str(ROOT / "scenarios/quickstart.yaml")}])
    calls = []

    def run_scenario(s, out, variants, source=None, overrides=None):
        calls.append({"repetitions": s.repetitions, "duration": s.measure.duration.seconds,
                      "source": source, "overrides": overrides})
        dest = Path(out) / f"golden-{len(calls)}"
        shutil.copytree(GOLDEN, dest)
        return dest

    code, report = runner.run_night(spec, tmp_path / "hist", run_scenario, Console(file=open("/dev/null", "w")),
                                    night="2026-11-01")
    src = str(ROOT / "scenarios/quickstart.yaml")
    assert calls[0] == {"repetitions": 2, "duration": 40.0, "source": src,
                        "overrides": {"repetitions": 2, "duration": "40s"}}
    assert calls[1]["source"] == src and calls[1]["overrides"] == {}
    assert [r["overrides"] for r in report["runs"]] == [{"repetitions": 2, "duration": "40s"}, {}]
    written = json.loads((tmp_path / "hist/reports/2026-11-01/nightly.json").read_text())
    assert written["runs"][0]["overrides"] == {"repetitions": 2, "duration": "40s"}
    assert written["runs"][0]["source"] == src
    assert "repetitions 2, duration 40s" in (tmp_path / "hist/reports/2026-11-01/nightly.md").read_text()
