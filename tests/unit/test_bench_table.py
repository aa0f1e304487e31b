"""docs/performance.md's benchmark table is what the recorded results give (issue 38).

The committed results (docs/performance/results/) regenerate the table exactly; a changed
number, in a result or in the doc, fails the check; a result file that cannot be used is an
error naming the file and the field (exit 2). The parts' own formats are made here by the
parts' own code where it is a function of its inputs (backend.summarize, mtrelay.summarise).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from torbed.bench import backend as bb
from torbed.bench import mtrelay as bm
from torbed.bench import results as br
from torbed.bench import table as bt

ROOT = Path(__file__).resolve().parents[2]


def _about(part: str, args: list[str], quick: bool, started: str = "2026-11-28T00:01:02Z") -> dict:
    return {**br.bench_run(part, args, quick), "started": started, "host": {"cpus": 2, "hostname": "h", "load1": 0.4}}


def linkemu_doc(p99: float = 0.2, tput: float = 900.0) -> dict:
    return {"bench": "linkemu", "bench_run": _about("linkemu", ["--quick"], True),
            "targets": {"delay_p99_error_ms": {"value": p99, "target": "<= 1.0", "met": abs(p99) <= 1.0},
                        "rate_error_pct": {"value": 1.25, "target": "<= 5 (1-100 Mbit/s)", "met": True},
                        "aggregate_mbit_one_core": {"value": tput, "target": ">= 500", "met": tput >= 500}},
            "results": {"jitter": {"configured_ms": {"delay": 20.0, "jitter_sd": 5.0}, "sd_ms": 4.93, "ks_pvalue": 0.41,
                                   "dense_reordered": 0, "dense_probes": 200},
                        "loss": {"random_1pct": {"configured": 0.01, "loss_rate": 0.0104, "interval95": [0.008, 0.012],
                                                 "within_interval": True}}}}


def _run(ready: float, soak: float, rss: float) -> dict:
    return {"cmd_to_ready_s": ready, "setup_to_ready_s": ready - 1, "cmd_to_first_transfer_s": ready + 3,
            "rss_ready_mib": {"relay0": 20.0}, "rss_end_mib": {"relay0": rss}, "rss_peak_mib": {"relay0": rss},
            "cpu_pct_ready_to_end": {"relay0": 1.0}, "roles": {"relay0": "relay"}, "soak_s": soak, "run_dir": "r"}


def backend_doc(fast=(5.5, 6.0, 9.0), classic=(11.0,)) -> dict:
    runs = {"quickstart": [_run(r, 30, 13.0) for r in fast], "quickstart-classic": [_run(r, 20, 13.0) for r in classic]}
    doc = {n: {"summary": bb.summarize(n, rs), "runs": rs, "targets": bb.TARGETS.get(n), "env": bb.ENV.get(n)}
           for n, rs in runs.items()}
    return {**doc, "bench_run": _about("backend", ["--runs", "1", "--soak", "30"], True)}


def mtrelay_doc() -> dict:
    values = {"kist": [2.0e6, 2.2e6], "mtrelay-3": [5.0e6, 4.4e6]}
    return {"rows": bm.summarise(values), "values": values, "failed_transfers": {"kist": 0, "mtrelay-3": 0},
            "incomplete": {}, "bench_run": _about("mtrelay", ["--quick"], True)}


def _repo(tmp_path: Path, docs: dict[str, dict]) -> Path:
    """A checkout's layout with docs/performance.md and the given recorded results."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / bt.DOC).write_text(f"# Performance\n\nprose\n\n{bt.BEGIN}\n{bt.END}\n\nmore prose\n")
    for name, doc in docs.items():
        (root / bt.RESULTS).mkdir(parents=True, exist_ok=True)
        (root / bt.RESULTS / name).write_text(json.dumps(doc))
    return root


def test_the_docs_table_is_what_the_committed_results_give():
    files = bt.result_files(ROOT / bt.RESULTS)
    assert files, "no recorded results: python -m torbed.bench.table --record"
    assert bt.check(ROOT) == [], "run `python -m torbed.bench.table`"
    text = (ROOT / bt.DOC).read_text()
    for path in files:                            # every recorded part has its rows in the doc
        part, (date, _, _), rows = bt.part_rows(path)
        assert f"| {part} | {rows[0].figure} |" in text and date in text


def test_a_changed_result_or_a_changed_number_in_the_doc_fails_the_check(tmp_path):
    root = _repo(tmp_path, {"linkemu-20261128T000102Z.json": linkemu_doc(),
                            "backend-20261128T001000Z.json": backend_doc()})
    assert bt.write(root) and bt.check(root) == []
    text = (root / bt.DOC).read_text()
    assert "| 900 Mbit/s | >= 500 Mbit/s | met |" in text
    assert "6.0 s [5.5-9.0] (n=3) | <= 8 s median, <= 10 s every run | met |" in text
    assert "| x0.55 |" in text                                   # 6.0 / 11.0
    assert text.startswith("# Performance\n\nprose\n") and text.endswith(f"{bt.END}\n\nmore prose\n")
    # A result changes (a new recording): the committed table no longer says it.
    (root / bt.RESULTS / "linkemu-20261128T000102Z.json").write_text(json.dumps(linkemu_doc(tput=450.0)))
    problems = bt.check(root)
    assert problems and "900 Mbit/s" in problems[0] and "450 Mbit/s" in problems[0]
    bt.write(root)
    assert "| 450 Mbit/s | >= 500 Mbit/s | **missed** |" in (root / bt.DOC).read_text() and bt.check(root) == []
    # A number edited by hand in the table.
    doc = root / bt.DOC
    doc.write_text(doc.read_text().replace("6.0 s [5.5-9.0]", "5.0 s [5.5-9.0]"))
    assert bt.check(root) and "5.0 s [5.5-9.0]" in bt.check(root)[0]


def _set(data, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        data = data[int(k)] if isinstance(data, list) else data[k]
    if isinstance(data, list):
        data[int(keys[-1])] = value
    else:
        data[keys[-1]] = value


def numbers_read(path: Path) -> list[tuple[str, float]]:
    """(field, value) of every number the table reads from a results file."""
    f = bt.load_file(path)
    bt.PARTS[f.get("bench_run.part")](f)
    bt.header_cells(f)
    out = []
    for dotted in sorted(f.read):
        v = f.get(dotted)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((dotted, v))
    return out


def unnoticed_changes(root: Path) -> tuple[int, list[str]]:
    """Each number the table reads from each recorded result of ``root``, changed on its own:
    (how many were tried, those the check did not catch)."""
    missed, tried = [], 0
    for path in bt.result_files(root / bt.RESULTS):
        original = path.read_text()
        for dotted, v in numbers_read(path):
            data = json.loads(original)
            _set(data, dotted, int(v * 1.5) + 1 if isinstance(v, int) else v * 1.5 + 1)
            path.write_text(json.dumps(data))
            tried += 1
            try:
                noticed = bool(bt.check(root))
            except bt.ResultError:          # e.g. a median no longer within its [min, max]
                noticed = True
            if not noticed:
                missed.append(f"{path.name}: {dotted}")
        path.write_text(original)
    return tried, missed


def test_every_number_the_committed_table_reads_shows_in_it(tmp_path):
    # Each number of each committed result, changed on its own in a copy, changes the table:
    # the check catches a wrong number wherever it sits.
    root = tmp_path / "repo"
    shutil.copytree(ROOT / bt.RESULTS, root / bt.RESULTS)
    (root / "docs" / "performance.md").write_text((ROOT / bt.DOC).read_text())
    assert bt.check(root) == []
    tried, missed = unnoticed_changes(root)
    assert tried >= 10 and not missed, missed


def test_every_part_renders_and_every_number_it_reads_shows(tmp_path):
    # Every part, whether or not a result of it is committed now.
    about = {part: _about(part, ["--quick"], True) for part in bt.PARTS}
    load = {"levels": [{"users": 10, "workers": 1, "users_reached": 10, "requests": 120, "failures": 0,
                        "requests_per_s": 2.26, "cpu_pct_per_user": 0.38, "web_p50_ms": 27, "web_p90_ms": 93,
                        "carried": True, "rate_per_user_vs_smallest": 1.0},
                       {"users": 100, "error": "network never became ready"}], "bench_run": about["load"]}
    prom = {"modes": {"on": {"ready_s": [10.0, 12.0], "relay_cpu_cores": [0.037],
                             "observer_cpu_cores": [{"prometheus": 0.003, "driver": 0.016, "collector": None}]},
                      "off": {"ready_s": [9.0], "relay_cpu_cores": [0.036]}},
            "ttlb": {"web": {"n_on": 48, "n_off": 50, "median_on": 2.11, "median_off": 2.1, "ks_p": 0.69}},
            "bench_run": about["prometheus"]}
    tor = {"transfers_ok": 100, "transfers_failed": 0, "bytes_ok": 5e8, "duration": "2m", "switches_completed": 12,
           "relays": {"exit0": {"exit_moves": {"to_heavy": 3, "to_light": 2}}}, "problems": [],
           "bench_run": about["torchestra"]}
    docs = {"linkemu": linkemu_doc(), "backend": backend_doc(), "mtrelay": mtrelay_doc(), "load": load,
            "prometheus": prom, "torchestra": tor}
    root = _repo(tmp_path, {f"{part}-20261128T000102Z.json": doc for part, doc in docs.items()})
    bt.write(root)
    text = (root / bt.DOC).read_text()
    for part in bt.PARTS:
        assert f"| {part} | " in text
    assert "| 100 users | failed: network never became ready |  | **failed** |" in text
    assert "| TTLB web, medians on / off (n) | 2.11 / 2.10 s (48 / 50) |  | x1.00, KS p = 0.69 |" in text
    assert "| exit moved circuits light->heavy / heavy->light | 3 / 2 | both > 0 | met |" in text
    tried, missed = unnoticed_changes(root)
    assert tried >= 50 and not missed, missed


def test_each_part_has_rows_and_the_settings_say_quick_or_full(tmp_path):
    root = _repo(tmp_path, {"mtrelay-20261128T003000Z.json": mtrelay_doc()})
    section = bt.render(root / bt.RESULTS)
    assert "| mtrelay | kist: target relay's throughput (max 30 s average) | 2.10 MB/s [2.00-2.20] (n=2) |" in section
    assert "x2.25 vs stock [2.00-2.50] (n=2 blocks)" in section   # per-block ratios 2.5 and 2.0
    assert "| 2026-11-28 00:01 | quick: `--quick` | 2 cores, load 0.4 |" in section
    full = {**linkemu_doc(), "bench_run": _about("linkemu", [], False)}
    _, (_, settings, _), _ = bt.part_rows(_repo(tmp_path / "b", {"linkemu-20261128T000102Z.json": full})
                                          / bt.RESULTS / "linkemu-20261128T000102Z.json")
    assert settings == "full"


def test_a_part_that_failed_shows_as_failed(tmp_path):
    doc = backend_doc()
    doc["bench-100-relays"] = {"summary": None, "runs": [], "targets": bb.TARGETS["bench-100-relays"]}
    root = _repo(tmp_path, {"backend-20261128T001000Z.json": doc})
    assert "| bench-100-relays: `torbed run` start -> ready | no run became ready |  | **failed** |" in \
        bt.render(root / bt.RESULTS)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["targets"]["aggregate_mbit_one_core"].pop("value"), "field targets.aggregate_mbit_one_core.value: missing"),
    (lambda d: d["results"]["jitter"].update(sd_ms="4.9"), "field results.jitter.sd_ms: '4.9' is not a number"),
    (lambda d: d.pop("bench_run"), "field bench_run: missing"),
    (lambda d: d["bench_run"].update(part="linkemuu"), "field bench_run.part: 'linkemuu' is not one of"),
    (lambda d: d["bench_run"].update(started="yesterday"), "field bench_run.started: 'yesterday'"),
])
def test_a_bad_result_names_the_file_and_the_field(tmp_path, capsys, edit, message):
    doc = linkemu_doc()
    edit(doc)
    root = _repo(tmp_path, {"linkemu-20261128T000102Z.json": doc})
    with pytest.raises(bt.ResultError, match=re.escape(message)):
        bt.check(root)
    assert bt.main(["--check", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "linkemu-20261128T000102Z.json" in err and message in err and "Traceback" not in err


def test_unreadable_files_are_bad_input_too(tmp_path, capsys):
    root = _repo(tmp_path, {})
    (root / bt.RESULTS).mkdir(parents=True)
    (root / bt.RESULTS / "load-20261128T000000Z.json").write_text("{not json")
    assert bt.main(["--root", str(root)]) == 2
    assert "load-20261128T000000Z.json: not JSON" in capsys.readouterr().err
    (root / bt.RESULTS / "load-20261128T000000Z.json").unlink()
    (root / bt.RESULTS / "notes.txt").write_text("x")
    assert bt.main(["--root", str(root)]) == 2
    assert "notes.txt: not a recorded result" in capsys.readouterr().err
    (root / bt.DOC).write_text("# Performance\n")                 # markers gone
    (root / bt.RESULTS / "notes.txt").unlink()
    assert bt.main(["--check", "--root", str(root)]) == 2
    assert "needs the generated section's markers" in capsys.readouterr().err


def test_record_copies_each_parts_newest_result_small(tmp_path, capsys):
    src = tmp_path / "runs" / "bench"
    src.mkdir(parents=True)
    old, new = backend_doc(fast=(9.0,)), backend_doc()
    (src / "backend-20261127T000000Z.json").write_text(json.dumps(old))
    (src / "backend-20261128T001000Z.json").write_text(json.dumps(new))
    (src / "linkemu-20261128T000102Z.json").write_text(json.dumps(linkemu_doc()))
    root = _repo(tmp_path, {"backend-20261101T000000Z.json": old})     # an older recording, replaced
    assert bt.main(["--record", "--from", str(src), "--root", str(root)]) == 0
    names = sorted(p.name for p in (root / bt.RESULTS).iterdir())
    assert names == ["backend-20261128T001000Z.json", "linkemu-20261128T000102Z.json"]
    recorded = json.loads((root / bt.RESULTS / names[0]).read_text())
    assert "runs" not in recorded["quickstart"] and recorded["quickstart"]["run_dirs"] == ["r", "r", "r"]
    assert bt.check(root) == [] and "6.0 s [5.5-9.0] (n=3)" in (root / bt.DOC).read_text()
    # A named part without results is an error; nothing recorded.
    assert bt.main(["--record", "mtrelay", "--from", str(src), "--root", str(root)]) == 2
    assert "no results of part mtrelay" in capsys.readouterr().err


def test_bench_run_records_settings_without_out(monkeypatch):
    monkeypatch.setenv(br.QUICK_ENV, "1")
    about = br.bench_run("load", ["--users", "10,100", "--out", "x", "--duration=30", "--out=y"])
    assert about["settings"] == {"quick": True, "args": ["--users", "10,100", "--duration=30"]}
    assert about["host"]["cpus"] >= 1 and re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", about["started"])
    assert br.stamp(about["started"]) == about["started"].replace("-", "").replace(":", "")
    monkeypatch.setenv(br.QUICK_ENV, "0")
    assert br.bench_run("load", [])["settings"]["quick"] is False
