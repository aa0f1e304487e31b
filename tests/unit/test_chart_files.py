"""The chart's generated files are in sync with the Python sources, and its values schema
accepts every scenario plus the chart's own values.yaml, and nothing else."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from torbed.backends.k8s import chart

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))


def test_generated_files_are_in_sync():
    assert chart.check() == [], "run `make schema` (torbed chart-files)"


def _values(scenario: Path) -> dict:
    values = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    values.update(yaml.safe_load(scenario.read_text()))
    return values


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_schema_accepts_scenario_with_chart_defaults(scenario):
    jsonschema.validate(_values(scenario), chart.values_schema())


@pytest.mark.parametrize("mutate,where", [
    (lambda v: v.update(varient="x"), "varient"),
    (lambda v: v["images"].update(pullpolicy="Never"), "pullpolicy"),
    (lambda v: v["network"]["relays"]["middle"].update(count=0), "count"),
    (lambda v: v["links"]["pairs"][0].update(rate="4 megabits"), "4 megabits"),
    (lambda v: v.update(repetition=-1), "-1"),
])
def test_schema_rejects(mutate, where):
    v = copy.deepcopy(_values(REPO / "scenarios" / "quickstart.yaml"))
    mutate(v)
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate(v, chart.values_schema())
    assert where in str(e.value)


def test_torrc_fragments_are_the_local_backends():
    from torbed import torrc
    for name, lines in torrc.static_fragments(chart.K8S_METRICS_ACCEPT).items():
        text = (chart.CHART_DIR / "files" / "torrc" / name).read_text()
        assert text.splitlines()[1:] == lines


def test_the_pods_scenario_is_the_scenario_keys_only():
    """_helpers.tpl hands the pods (which decode strictly) only the scenario's own keys, read
    from the generated files/scenario-keys.yaml; every other top-level value is a chart key."""
    keys = yaml.safe_load(chart.generated_files()["files/scenario-keys.yaml"])["keys"]
    assert keys == list(chart.Scenario.model_fields)
    props = set(chart.values_schema()["properties"])
    assert set(keys) | set(chart.ChartValues.model_fields) == props
    assert not set(keys) & set(chart.ChartValues.model_fields)
    assert "files/scenario-keys.yaml" in (chart.CHART_DIR / "templates" / "_helpers.tpl").read_text()


def test_schema_rejects_a_group_name_outside_the_pattern():
    v = copy.deepcopy(_values(REPO / "scenarios" / "quickstart.yaml"))
    v["network"]["relays"]["Guard_1"] = v["network"]["relays"].pop("guard")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(v, chart.values_schema())


def test_default_requests_are_the_measured_figures_rounded_up():
    """values.yaml's resources are the model's defaults, which cover what each component
    was measured to use (chart.MEASURED): a figure raised without the chart following fails."""
    values = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())["resources"]
    assert values == chart.Resources().model_dump()
    mib = {"Mi": 1, "Gi": 1024}
    for component, m in chart.MEASURED.items():
        req = values[component]["requests"]
        assert set(values[component]) == {"requests"}, f"{component}: no limits by default"
        memory = float(req["memory"][:-2]) * mib[req["memory"][-2:]]
        assert m.memory_mib <= memory < m.memory_mib + 16, (component, req)
        assert m.cpu_cores * 1000 <= float(req["cpu"].rstrip("m")) < m.cpu_cores * 1000 + 10, (component, req)
    assert values["load"] == {}


@pytest.mark.parametrize("measured, want", [
    (chart.Measured(44.4, 0.037, ""), {"cpu": "40m", "memory": "48Mi"}),
    (chart.Measured(48.0, 0.040, ""), {"cpu": "40m", "memory": "48Mi"}),     # exact: not one step more
    (chart.Measured(48.1, 0.0401, ""), {"cpu": "50m", "memory": "64Mi"}),
    (chart.Measured(0.0, 0.0, ""), {"cpu": "10m", "memory": "16Mi"}),
])
def test_request_for_rounds_up(measured, want):
    assert chart.request_for(measured) == want
