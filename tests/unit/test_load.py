"""Background load: the plan's load nodes, their torrc, Locust's command lines and
configuration, the report's reading of load.jsonl, and the backends' refusals."""

import json
import shutil
import subprocess

import pytest

from tests.unit.test_scenario import patched
from tests.unit.test_torrc import fake_identities
from torbed import engine, load, network, scenario
from torbed.torrc import NodePaths, render_fragments, render_node
from torbed.variants import load_variant

LOAD = {"users": 6, "workers": 2, "path": ["guard", "middle", "exit"], "start": "10s",
        "mix": {"web": {"weight": 9, "size": "50KiB", "think": {"distribution": "constant", "mean": "1s"}},
                "bulk": {"weight": 1, "size": "1MiB"}}}


def loaded(**load_changes) -> scenario.Scenario:
    return scenario.parse(patched({"load": {**LOAD, **load_changes}}), "load.yaml")


def test_plan_adds_a_master_and_one_tor_per_load_node():
    plan = network.plan(loaded(), "kist")
    master, = plan.by_role("loadmaster")
    workers = plan.by_role("loadworker")
    assert master.name == "locust0" and not master.runs_tor and "master" in master.ports
    assert [w.name for w in workers] == ["load0", "load1"] and all(w.runs_tor for w in workers)
    assert len({n.address for n in plan.nodes}) == len(plan.nodes)
    plain = network.plan(scenario.parse(patched({}), "plain.yaml"), "kist")
    assert not plain.by_role("loadmaster") and not plain.by_role("loadworker")


def test_load_node_torrc_isolates_users_and_pins_the_path():
    s = loaded()
    plan = network.plan(s, "kist")
    ids = fake_identities(plan)
    text = render_node(plan.node("load0"), plan, NodePaths(datadir="/d", log="/l"), "/t")
    assert "%include /t/role-client.torrc" in text
    assert "SocksPort 127.0.0.1:9050 IsolateSOCKSAuth" in text
    lines = load.torrc_lines(s, plan, ids.fingerprints)
    assert f"MiddleNodes ${ids.fingerprints['middle0']}" in lines
    assert f"EntryNodes ${ids.fingerprints['guard0']}" in lines and "StrictNodes 1" in lines
    assert load.torrc_lines(loaded(path=None), plan, ids.fingerprints) == []


def test_tor_accepts_a_load_node_torrc(tmp_path):
    """tor --verify-config on a load node's whole torrc (MiddleNodes exists in this tor)."""
    tor = shutil.which("tor")
    assert tor, "tor not installed: run make setup"
    s = loaded()
    plan = network.plan(s, "kist")
    ids = fake_identities(plan)
    (tmp_path / "torrc").mkdir()
    variants = {v: load_variant(v) for v in plan.variants_in_use()}
    for name, text in render_fragments(plan, ids, variants).items():
        (tmp_path / "torrc" / name).write_text(text)
    (tmp_path / "data").mkdir(mode=0o700)
    text = render_node(plan.node("load0"), plan, NodePaths(datadir=str(tmp_path / "data"), log=str(tmp_path / "l")),
                       str(tmp_path / "torrc"))
    text += "".join(line + "\n" for line in load.torrc_lines(s, plan, ids.fingerprints))
    (tmp_path / "load0.torrc").write_text(text)
    p = subprocess.run([tor, "--verify-config", "-f", str(tmp_path / "load0.torrc")], capture_output=True, text=True)
    assert p.returncode == 0 and "Configuration was valid" in p.stdout, p.stdout[-2000:]


def test_locust_config_and_command_lines(tmp_path):
    s = loaded()
    plan = network.plan(s, "kist")
    manifest = {"load-web": {"size": 51200, "sha256": "x"}, "load-bulk": {"size": 1048576, "sha256": "y"}}
    cfg = load.locust_config(s, plan, manifest, variant="kist", rep=1, output=tmp_path / "load.jsonl")
    assert cfg["servers"] == [f"http://{plan.node('www0').address}:80"]
    assert {r["name"]: (r["file"], r["size"], r["weight"]) for r in cfg["requests"]} == {
        "web": ("load-web", 51200, 9), "bulk": ("load-bulk", 1048576, 1)}
    assert cfg["requests"][0]["think"] == {"distribution": "constant", "mean_s": 1.0, "min_s": None, "max_s": None}
    argv = load.master_argv(s, plan, run_time_s=49.6, csv_prefix=tmp_path / "locust" / "stats")
    master = plan.node("locust0")
    for flag, value in (("--expect-workers", "2"), ("-u", "6"), ("--run-time", "50s"),
                        ("--master-bind-host", master.address), ("--exit-code-on-error", "0")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--headless" in argv and str(load.LOCUSTFILE) in argv
    worker = load.worker_argv(plan)
    assert worker[worker.index("--master-host") + 1] == master.address


def test_scenario_files_include_the_load_files():
    s = loaded()
    assert s.load_files() == {"load-web": "50KiB", "load-bulk": "1MiB"}
    assert scenario.parse(patched({}), "plain.yaml").load_files() == {}


def test_both_backends_run_load():
    from torbed.backends.k8s.backend import K8sBackend
    from torbed.backends.local.backend import LocalBackend
    s = loaded()
    assert "load" in engine.features_used(s)
    assert engine.unsupported(s, LocalBackend) == []
    assert engine.unsupported(s, K8sBackend) == []


def _record(t, users, requests, failures, size, p50):
    stat = {"requests": requests, "failures": failures, "bytes": size, "rps": 1.0, "fail_per_s": 0.0,
            "p50_ms": p50, "p90_ms": p50, "p95_ms": p50, "p99_ms": p50,
            **({k: None for k in ("p50_ms_all", "p90_ms_all", "p95_ms_all", "p99_ms_all")} if p50 is None else
               {"p50_ms_all": p50, "p90_ms_all": 2 * p50, "p95_ms_all": 2 * p50, "p99_ms_all": 3 * p50})}
    return {"type": "load", "variant": "kist", "rep": 0, "t": t, "label": "periodic", "users": users,
            "total": stat, "by_name": {"web": stat}}


def test_report_row_from_load_records(tmp_path):
    from torbed.analysis import background
    recs = [_record(100, 0, 0, 0, 0, None), _record(102, 4, 0, 0, 0, None), _record(112, 4, 20, 1, 4_000_000, 300),
            _record(122, 4, 40, 2, 8_000_000, 400)]
    path = tmp_path / "load.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"type": "load", "t": 1')   # cut by a crash
    got = background.read(path)
    assert len(got) == 4
    row = background.rep_row(got)
    assert row["users"] == 4 and row["requests"] == 40 and row["failures"] == 2
    assert row["requests_per_s"] == pytest.approx(40 / 20) and row["bytes_per_s"] == pytest.approx(8e6 / 20)
    assert (row["p50_ms"], row["p90_ms"], row["p99_ms"]) == (400, 800, 1200)
    assert background.rep_row([]) is None


def test_report_shows_the_load_beside_the_foreground(tmp_path):
    """A run directory with load.jsonl: summary.json has a load row, report.md its table."""
    from torbed.analysis.report import report
    run = tmp_path / "run"
    rep = run / "kist" / "rep-0"
    rep.mkdir(parents=True)
    s = loaded()
    (run / "run.json").write_text(json.dumps({"schema": 1, "name": "t", "scenario": s.model_dump(mode="json"),
                                              "seed": 1, "variants": ["kist"], "baseline": "kist", "repetitions": 1,
                                              "status": "ok"}))
    (rep / "meta.json").write_text(json.dumps({"schema": 1, "variant": "kist", "rep": 0, "status": "ok",
                                               "t_workload_start": 90.0, "warmup_s": 0, "duration_s": 60}))
    transfers = [{"type": "transfer", "status": "ok", "warmup": False, "group": "web", "file": "small",
                  "client": "web0", "ttlb_s": x, "ttfb_s": x / 2, "t_start": 100 + i, "bytes": 300000, "size": 300000}
                 for i, x in enumerate([0.5, 0.7, 0.9])]
    (rep / "transfers.jsonl").write_text("".join(json.dumps(t) + "\n" for t in transfers))
    (rep / "load.jsonl").write_text("".join(json.dumps(_record(100 + 10 * i, 4, 10 * i, 0, 10**6 * i, 200)) + "\n"
                                            for i in range(4)))
    out = report(run)
    assert out["load"][0]["requests"] == 30 and out["load"][0]["foreground_transfers"] == 3
    assert out["load"][0]["foreground_ttlb_median_s"] == pytest.approx(0.7)
    md = (run / "report" / "report.md").read_text()
    assert "## Background load (Locust)" in md and "| kist | 0 | 4 | 30 | 0 |" in md
    assert (run / "report" / "figures" / "timeseries-load.png").exists()
