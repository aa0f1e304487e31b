"""torbed/hostload.py: /proc parsing on canned files, the busy decision, and `torbed run`'s
use of it (a warning by default, exit 2 with --require-quiet, the reading in run.json)."""

from pathlib import Path

import pytest

from torbed import cli, hostload

STAT_IDLE = """cpu  1000 0 500 8000 100 0 0 0 0 0
cpu0 500 0 250 4000 50 0 0 0 0 0
cpu1 500 0 250 4000 50 0 0 0 0 0
intr 12345
ctxt 678
"""


def pid_stat(pid, name, ppid, utime, stime):
    # Fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 4194304 10 0 0 0 {utime} {stime} 0 0 20 0 1 0 100 0 0\n"


def write_proc(root: Path, stat: str, loadavg: str, procs: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(stat)
    (root / "loadavg").write_text(loadavg)
    for d in root.iterdir():
        if d.is_dir():
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
    for pid, (name, ppid, ut, st) in procs.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(pid_stat(pid, name, ppid, ut, st))
    (root / "self").mkdir()                     # non-numeric entries are skipped
    return root


def test_read_loadavg_and_cpu_times(tmp_path):
    proc = write_proc(tmp_path / "proc", STAT_IDLE, "0.52 0.40 0.31 2/180 4242\n", {})
    assert hostload.read_loadavg(proc) == (0.52, 0.40, 0.31)
    busy, total, cpus = hostload.read_cpu_times(proc)
    assert (busy, total, cpus) == (1500, 9600, 2)          # idle 8000 and iowait 100 are not busy


def test_guest_time_is_not_counted_twice(tmp_path):
    proc = write_proc(tmp_path / "proc", "cpu  100 0 0 100 0 0 0 0 50 50\ncpu0 100 0 0 100 0 0 0 0 50 50\n",
                      "0 0 0 1/1 1\n", {})
    assert hostload.read_cpu_times(proc) == (100, 200, 1)


def test_process_names_with_spaces_and_parentheses(tmp_path):
    proc = write_proc(tmp_path / "proc", STAT_IDLE, "0 0 0 1/1 1\n",
                      {10: ("tor", 1, 30, 12), 11: ("Web Content (x)", 1, 5, 5)})
    ps = hostload.read_processes(proc)
    assert ps[10] == ("tor", 1, 42) and ps[11] == ("Web Content (x)", 1, 10)
    assert hostload._parse_pid_stat("garbage") is None


def test_descendants():
    procs = {1: ("init", 0, 0), 100: ("torbed", 1, 0), 101: ("tor", 100, 0), 102: ("tor", 101, 0),
             200: ("cc1", 1, 0)}
    assert hostload.descendants(procs, 100) == {100, 101, 102}


def sample(tmp_path, before, after, load="0.10 0.10 0.10 1/100 1\n", self_pid=100):
    """measure() on canned /proc: ``before`` and ``after`` are (stat text, procs); the fake
    sleep swaps the files between the two readings."""
    proc = tmp_path / "proc"
    write_proc(proc, before[0], load, before[1])
    return hostload.measure(proc, interval=1.0, self_pid=self_pid, ticks_per_s=100,
                            sleep=lambda s: write_proc(proc, after[0], load, after[1]))


def stat_with(busy_ticks_per_cpu, idle_per_cpu):
    u, i = busy_ticks_per_cpu, idle_per_cpu
    return (f"cpu  {2 * u} 0 0 {2 * i} 0 0 0 0 0 0\ncpu0 {u} 0 0 {i} 0 0 0 0 0 0\n"
            f"cpu1 {u} 0 0 {i} 0 0 0 0 0 0\n")


def test_quiet_machine(tmp_path):
    procs0 = {100: ("torbed", 1, 50, 10), 300: ("sshd", 1, 5, 5)}
    procs1 = {100: ("torbed", 1, 52, 10), 300: ("sshd", 1, 5, 6)}
    r = sample(tmp_path, (stat_with(1000, 9000), procs0), (stat_with(1002, 9098), procs1))
    assert not r["busy"] and r["reasons"] == []
    assert r["cpus"] == 2 and r["machine_busy_fraction"] == pytest.approx(4 / 200)
    assert r["ours_fraction"] == pytest.approx(2 / 200) and r["busy_fraction"] == pytest.approx(2 / 200)
    assert r["top"] == [{"pid": 300, "name": "sshd", "cpu_cores": pytest.approx(0.01)}]


def test_busy_machine_names_the_top_consumers_and_not_ours(tmp_path):
    procs0 = {100: ("torbed", 1, 0, 0), 101: ("tor", 100, 0, 0), 200: ("cc1plus", 1, 1000, 0),
              201: ("python3", 1, 10, 0), 202: ("idle", 1, 0, 0)}
    procs1 = {100: ("torbed", 1, 0, 0), 101: ("tor", 100, 40, 0), 200: ("cc1plus", 1, 1095, 0),
              201: ("python3", 1, 40, 20), 202: ("idle", 1, 0, 0), 203: ("new", 1, 5, 0)}
    # 200 ticks of capacity: 175 busy, of which 40 ours (tor under torbed).
    r = sample(tmp_path, (stat_with(1000, 9000), procs0), (stat_with(1087, 9013), procs1), self_pid=100)
    assert r["machine_busy_fraction"] == pytest.approx(174 / 200)
    assert r["ours_fraction"] == pytest.approx(40 / 200)
    assert r["busy_fraction"] == pytest.approx(134 / 200)
    assert r["busy"] and "busy with other processes" in r["reasons"][0]
    assert [p["name"] for p in r["top"]] == ["cc1plus", "python3"]      # not tor (ours), not idle
    assert r["top"][0]["cpu_cores"] == pytest.approx(0.95)
    text = hostload.describe(r)
    assert "cc1plus (pid 200, 95% of a CPU)" in text and "python3" in text


def test_judge_thresholds():
    base = {"loadavg": [0.2, 0.2, 0.2], "cpus": 2, "interval_s": 1.0, "busy_fraction": 0.05, "top": []}
    assert not hostload.judge(base)["busy"]
    assert hostload.judge({**base, "busy_fraction": 0.2})["busy"]
    high = hostload.judge({**base, "loadavg": [1.6, 1.0, 0.5]})
    assert high["busy"] and "load average 1.60 on 2 CPU(s)" in high["reasons"][0]
    assert not hostload.judge({**base, "loadavg": [1.6, 1.0, 0.5]}, max_load_per_cpu=1.0)["busy"]
    assert high["thresholds"] == {"max_busy_fraction": hostload.MAX_BUSY_FRACTION,
                                  "max_load_per_cpu": hostload.MAX_LOAD_PER_CPU}


def test_reads_this_machine():
    """The real /proc parses (whatever its load)."""
    r = hostload.measure(interval=0.05)
    assert r["cpus"] >= 1 and 0 <= r["busy_fraction"] <= 1 and len(r["loadavg"]) == 3


BUSY = {"loadavg": [3.0, 3.0, 3.0], "cpus": 2, "interval_s": 1.0, "machine_busy_fraction": 0.9,
        "ours_fraction": 0.0, "others_cpu_fraction": 0.9, "busy_fraction": 0.9,
        "top": [{"pid": 4242, "name": "make", "cpu_cores": 1.8}]}


def quickstart():
    return str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml")


def test_run_require_quiet_refuses_on_a_busy_machine(monkeypatch, capsys, tmp_path):
    from torbed import engine
    monkeypatch.setattr(hostload, "measure", lambda proc="/proc": hostload.judge(dict(BUSY)))
    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail("the run must not start"))
    assert cli.main(["run", quickstart(), "--require-quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "machine is busy" in err and "make (pid 4242" in err and "--require-quiet" in err
    assert not any(tmp_path.iterdir())


def test_run_warns_and_records_the_reading(monkeypatch, capsys, tmp_path):
    from torbed import commands, engine
    seen = {}

    def fake_run(s, backend, out, console, variants=None, source=None, host_load=None, **_):
        seen["host_load"] = host_load
        raise KeyboardInterrupt                 # stop here: nothing else of the run is under test

    class FakeBackend:
        class Options:
            @classmethod
            def from_args(cls, args):
                return cls()

        @classmethod
        def create(cls, options, console, scenario_path=None):
            return cls()
    monkeypatch.setattr(hostload, "measure", lambda proc="/proc": hostload.judge(dict(BUSY)))
    monkeypatch.setattr(engine, "run", fake_run)
    args = cli.build_parser().parse_args(["run", quickstart(), "--out", str(tmp_path)])
    monkeypatch.setattr(engine, "backend_module", lambda name: FakeBackend)
    with pytest.raises(KeyboardInterrupt):
        commands.cmd_run(args)
    assert "warning" in capsys.readouterr().err
    assert seen["host_load"]["busy"] and seen["host_load"]["top"][0]["name"] == "make"


def test_report_shows_the_recorded_host_load(tmp_path):
    import json
    import shutil
    from torbed.analysis import render
    from torbed.analysis.report import analyse
    golden = Path(__file__).resolve().parents[1] / "data" / "golden-run"
    run = tmp_path / "golden-run"
    shutil.copytree(golden, run, ignore=shutil.ignore_patterns("report"))
    info = json.loads((run / "run.json").read_text())
    info["host_load"] = hostload.judge(dict(BUSY))
    (run / "run.json").write_text(json.dumps(info))
    _, _, s = analyse(run)
    assert s["run"]["host_load"]["busy"]
    text = render.to_markdown(render.blocks(s, []), tmp_path)
    assert "BUSY: load average 3.0 on 2 CPU(s)" in text and "make (180% of a CPU)" in text
