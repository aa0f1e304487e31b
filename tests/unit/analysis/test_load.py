"""Reading run directories: partial runs load, malformed input is named by file and line."""

import json

import pytest

from torbed.analysis.errors import RecordError, RunDirError
from torbed.analysis.load import load_run, read_jsonl


def write_run(root, variants=("a", "b"), reps=1, **extra):
    root.mkdir(parents=True, exist_ok=True)
    info = {"schema": 1, "name": "tiny", "scenario": {"name": "tiny"}, "seed": 1,
            "variants": list(variants), "baseline": variants[0], "repetitions": reps, **extra}
    (root / "run.json").write_text(json.dumps(info))
    return root


def write_rep(root, variant, k, status="ok", transfers=(), tail=""):
    d = root / variant / f"rep-{k}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"schema": 1, "variant": variant, "rep": k, "status": status,
                                             "error": None if status == "ok" else "boom",
                                             "t_workload_start": 100.0, "warmup_s": 5.0}))
    (d / "transfers.jsonl").write_text("".join(json.dumps(t) + "\n" for t in transfers) + tail)
    return d


T = {"type": "transfer", "status": "ok", "warmup": False, "ttlb_s": 1.0, "t_start": 110.0}


def test_missing_run_json(tmp_path):
    with pytest.raises(RunDirError, match="run.json: missing"):
        load_run(tmp_path)


def test_not_a_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a directory"):
        load_run(tmp_path / "nope")


def test_bad_run_json(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(RecordError) as e:
        load_run(tmp_path)
    assert e.value.path.name == "run.json" and e.value.line == 1
    (tmp_path / "run.json").write_text(json.dumps({"variants": [], "repetitions": 1}))
    with pytest.raises(RecordError, match="'variants'"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"variants": ["a"], "repetitions": "2"}))
    with pytest.raises(RecordError, match="'repetitions'"):
        load_run(tmp_path)


def test_malformed_record_names_file_and_line(tmp_path):
    run = write_run(tmp_path / "r")
    d = write_rep(run, "a", 0, transfers=[T, T])
    with open(d / "transfers.jsonl", "a") as f:
        f.write("{oops\n")
        f.write(json.dumps(T) + "\n")
    with pytest.raises(RecordError) as e:
        load_run(run)
    assert e.value.path == d / "transfers.jsonl"
    assert e.value.line == 3
    assert str(e.value).startswith(f"{d / 'transfers.jsonl'}:3: not valid JSON")


def test_record_missing_required_key_or_wrong_type(tmp_path):
    run = write_run(tmp_path / "r")
    write_rep(run, "a", 0, transfers=[T, {"type": "transfer", "warmup": False}])
    with pytest.raises(RecordError, match=r"transfers.jsonl:2: transfer record lacks 'status'"):
        load_run(run)
    run = write_run(tmp_path / "r2")
    write_rep(run, "a", 0, transfers=[{**T, "type": "relay_bw"}])
    with pytest.raises(RecordError, match=r":1: record type 'relay_bw'"):
        load_run(run)
    run = write_run(tmp_path / "r3")
    write_rep(run, "a", 0, transfers=[[1, 2]])
    with pytest.raises(RecordError, match=r":1: expected a JSON object"):
        load_run(run)


def test_truncated_last_line_is_dropped_with_a_note(tmp_path):
    run = write_run(tmp_path / "r")
    write_rep(run, "a", 0, status="failed", transfers=[T, T], tail='{"type": "transfer", "sta')
    r = load_run(run).rep("a", 0)
    assert len(r.transfers) == 2
    assert r.status == "failed" and r.error == "boom"
    assert any("transfers.jsonl line 3: truncated record" in n for n in r.notes)


def test_partial_run_loads(tmp_path):
    run = write_run(tmp_path / "r", variants=("a", "b"), reps=2)
    write_rep(run, "a", 0, transfers=[T, {**T, "warmup": True}])
    (run / "a" / "rep-1").mkdir(parents=True)        # started, nothing written
    loaded = load_run(run)
    assert [(r.variant, r.index) for r in loaded.reps] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    a0, a1, b0 = loaded.rep("a", 0), loaded.rep("a", 1), loaded.rep("b", 0)
    assert a0.status == "ok" and len(a0.measured_transfers) == 1
    assert a0.t0 == 100.0 and a0.warmup_s == 5.0
    assert "no cellstats.jsonl" in a0.notes
    assert a1.status == "unknown" and "no meta.json" in a1.notes
    assert b0.status == "not run" and b0.transfers == []
    assert b0.describe() == "variant b rep 0: not run; 0 transfers (0 after warm-up)"
    assert loaded.baseline == "a" and loaded.scenario_name == "tiny" and loaded.seed == 1


def test_read_jsonl_blank_lines_and_clean_eof(tmp_path):
    p = tmp_path / "relay_bw.jsonl"
    p.write_text('{"relay": "m", "t": 1.0, "written": 5}\n\n{"relay": "m", "t": 1.5, "written": 6}\n')
    recs, notes = read_jsonl(p, "relay_bw.jsonl")
    assert [r["written"] for r in recs] == [5, 6] and notes == []
    p.write_text('{"relay": "m", "t": "x", "written": 5}\n')
    with pytest.raises(RecordError, match="'t' must be a number"):
        read_jsonl(p, "relay_bw.jsonl")
