"""scenarios/tor-sample-60.yaml, hack/tor-sample.sh and the pre-registered comparison agree with
each other: the document the script checks is the one the scenario records, the comparison
runs the scenario's variants, and the script refuses missing documents naming them."""

from __future__ import annotations

import os
import re
import subprocess

import yaml

from analysis import prereg
from torbed import resources
from torbed.scenario import load

ROOT = resources.ROOT
SCENARIO = ROOT / "scenarios" / "tor-sample-60.yaml"
SCRIPT = ROOT / "hack" / "tor-sample.sh"


def test_the_shipped_sample_records_the_document_the_script_checks():
    data = yaml.safe_load(SCENARIO.read_text())
    gen = data["generated"]
    want = re.search(r"^want=([0-9a-f]{64})$", SCRIPT.read_text(), re.M).group(1)
    (cons,) = gen["sources"]
    assert cons["kind"] == "consensus" and cons["sha256"] == want
    assert cons["valid_after"] == "2022-11-19T10:00:00Z" and cons["entries"] == 6088
    assert gen["parameters"]["capacity_source"].startswith("consensus weight")
    assert want in SCENARIO.read_text().split("\n", 3)[1]      # the header says it too
    sc = load(SCENARIO)
    relays = sum(g["count"] for g in data["network"]["relays"].values())
    clients = sum(c["count"] for c in data["clients"].values())
    assert relays == 60 and clients == 63 and data["network"]["authorities"] == 3
    assert sc.name == "tor-sample-60"


def test_the_comparison_runs_the_shipped_sample():
    p = prereg.load()
    exp = p.experiments["tor-sample-60"]
    data = yaml.safe_load(SCENARIO.read_text())
    assert exp.scenario == "scenarios/tor-sample-60.yaml"
    assert set(exp.variants) == set(data["variants"]) == {"vanilla", "ewma-66", "kist"}
    rows = [c for c in p.secondaries if c.experiment == "tor-sample-60"]
    assert {(c.baseline, c.variant) for c in rows} == {("vanilla", "ewma-66"), ("vanilla", "kist")}
    # The metric names a client group and file the scenario has.
    for c in rows:
        group, file = c.metrics[0].split("/", 1)[1].split(":")
        assert data["clients"][group]["workload"]["file"] == file


def test_the_script_refuses_missing_documents_naming_them(tmp_path):
    env = {**os.environ, "COLLECTOR_DIR": str(tmp_path), "OUT": str(tmp_path / "out.yaml")}
    p = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert str(tmp_path / "2022-11-19-10-00-00-consensus") in p.stderr and "missing" in p.stderr
    p = subprocess.run([str(SCRIPT)], env={**env, "CAPACITY": "advertised"}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "CAPACITY=advertised" in p.stderr
    assert not (tmp_path / "out.yaml").exists()
