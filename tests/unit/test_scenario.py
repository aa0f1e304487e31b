"""Scenario model: every shipped scenario is valid; a table of invalid ones fails on the right field."""

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from torbed import scenario

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))

BASE = {
    "apiVersion": "torbed/v1",
    "name": "t",
    "variants": ["kist", "ewma-66"],
    "network": {"authorities": 3, "relays": {"guard": {"count": 1, "guard": True}, "middle": {},
                                              "exit": {"exit": True}}},
    "links": {"default": {"rate": "10mbit"}, "pairs": [{"between": ["guard", "middle"], "rate": "1mbit"}]},
    "servers": {"www": {"files": {"small": "300KB", "bulk": "5MiB"}}},
    "clients": {
        "bulk": {"count": 2, "path": ["guard", "middle", "exit"], "workload": {"kind": "bulk", "file": "bulk"}},
        "web": {"path": ["guard", "middle", "exit"],
                "workload": {"kind": "fetch", "file": "small", "repeat": 5, "pause": "1s"}},
    },
    "measure": {"warmup": "5s", "duration": "1m"},
}

DELETE = object()
TRACE = "tests/data/replay/two-flows.trace.jsonl"   # relative to the repository


def patched(changes: dict) -> dict:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        keys = dotted.split(".")
        node = data
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        last = keys[-1]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


# (case id, changes to BASE, expected field path, text the message must contain)
_DESIGN = {"pilot": 3, "max_repetitions": 6, "stop_when": {"metric": "ttlb_s/bulk:bulk", "ci_width_pct": 20}}

INVALID = [
    # Sequential designs (issue 36 item 6).
    ("design-pilot-too-small", {"design": {**_DESIGN, "pilot": 2}}, "design.pilot", "greater than or equal to 3"),
    ("design-pilot-over-max", {"design": {**_DESIGN, "pilot": 7}}, "design.pilot", "more than design.max_repetitions"),
    ("design-repetitions-differ", {"design": _DESIGN, "repetitions": 4}, "repetitions", "repetitions is the maximum"),
    ("design-unknown-group", {"design": {**_DESIGN, "stop_when": {"metric": "ttlb_s/nope:bulk", "ci_width_pct": 20}}},
     "design.stop_when.metric", "not a client group"),
    ("design-wrong-file", {"design": {**_DESIGN, "stop_when": {"metric": "ttlb_s/bulk:small", "ci_width_pct": 20}}},
     "design.stop_when.metric", "fetches 'bulk', not 'small'"),
    ("design-variant-is-baseline", {"design": {**_DESIGN, "stop_when": {**_DESIGN["stop_when"], "variant": "kist"}}},
     "design.stop_when.variant", "other than the baseline"),
    ("design-unknown-relay", {"design": {**_DESIGN, "stop_when": {"metric": "relay_throughput_Bps/nope0",
                                                                  "ci_width_pct": 20}}},
     "design.stop_when.metric", "not a relay"),
    ("unknown-top-key", {"variantz": ["kist"]}, "<top level>", "unknown key 'variantz'"),
    ("unknown-nested-key", {"clients.web.workload.repat": 3}, "clients.web.workload", "unknown key 'repat'"),
    ("unknown-relay-key", {"network.relays.middle.cout": 2}, "network.relays.middle", "unknown key 'cout'"),
    ("wrong-api-version", {"apiVersion": "torbed/v2"}, "apiVersion", "torbed/v1"),
    ("missing-name", {"name": DELETE}, "name", "required"),
    ("bad-name", {"name": "Has Spaces"}, "name", "does not match"),
    ("no-variants", {"variants": []}, "variants", "at least 1"),
    ("unknown-variant", {"variants": ["kist", "fifo"]}, "variants[1]", "unknown variant 'fifo'"),
    ("ewma-not-a-number", {"variants": ["ewma-fast"]}, "variants[0]", "not a number"),
    ("unknown-preset", {"variants": ["torchestra-exp9"]}, "variants[0]", "not a preset of 'torchestra'; presets: exp1"),
    ("group-unknown-preset", {"network.relays.middle.variant": "torchestra-fast"}, "network.relays.middle.variant",
     "not a preset"),
    ("cpu-per-thread-too-small", {"network.relays.middle.cpu_per_thread": "0.5%"},
     "network.relays.middle.cpu_per_thread", "outside 1%..100% of one core"),
    ("cpu-per-thread-not-percent", {"network.relays.middle.cpu_per_thread": "0.2"},
     "network.relays.middle.cpu_per_thread", "not a percentage"),
    ("duplicate-variants", {"variants": ["kist", "kist"]}, "variants", "unique"),
    ("baseline-not-a-variant", {"baseline": "kistlite"}, "baseline", "not one of variants"),
    ("zero-count", {"network.relays.middle.count": 0}, "network.relays.middle.count", "greater than or equal to 1"),
    ("zero-authorities", {"network.authorities": 0}, "network.authorities", "greater than or equal to 1"),
    ("bad-group-name", {"network.relays.Middle-1": {}}, "network.relays.Middle-1", "does not match"),
    ("no-exit-group", {"network.relays.exit.exit": False}, "network.relays", "no relay group has 'exit: true'"),
    ("path-unknown-group", {"clients.web.path": ["guard", "midle", "exit"]}, "clients.web.path[1]", "'midle' is not a relay group"),
    ("path-not-ending-at-exit", {"clients.web.path": ["guard", "exit", "middle"]}, "clients.web.path[2]", "must end at an exit"),
    ("path-empty", {"clients.web.path": []}, "clients.web.path", "at least 1"),
    ("bad-size-unit", {"servers.www.files.small": "300kb"}, "servers.www.files.small", "not a size"),
    ("size-without-unit", {"servers.www.files.small": 300000}, "servers.www.files.small", "string"),
    ("bad-rate", {"links.default.rate": "10mbps"}, "links.default.rate", "not a rate"),
    ("bad-duration", {"measure.duration": "15 minutes"}, "measure.duration", "not a duration"),
    ("warmup-too-long", {"measure.warmup": "2m"}, "measure.warmup", "not shorter than duration"),
    ("unknown-file", {"clients.web.workload.file": "huge"}, "clients.web.workload.file", "'huge' is not a file"),
    ("unknown-server", {"clients.web.workload.server": "ftp"}, "clients.web.workload.server", "'ftp' is not a server group"),
    ("unknown-workload-kind", {"clients.web.workload.kind": "stream"}, "clients.web.workload", "unknown workload kind 'stream'"),
    ("missing-workload-kind", {"clients.web.workload.kind": DELETE}, "clients.web.workload", "'kind' is required"),
    ("repeat-zero", {"clients.web.workload.repeat": 0}, "clients.web.workload.repeat", "greater than or equal to 1"),
    ("zero-stallout", {"clients.web.workload.stallout": "0s"}, "clients.web.workload.stallout", "longer than 0s"),
    ("bad-stallout", {"clients.bulk.workload.stallout": "soon"}, "clients.bulk.workload.stallout", "not a duration"),
    ("zero-timeout", {"clients.web.workload.timeout": "0ms"}, "clients.web.workload.timeout", "longer than 0s"),
    ("pause-and-think", {"clients.web.workload.think": {"mean": "2s"}}, "clients.web.workload.think", "either 'pause' or 'think'"),
    ("uniform-without-bounds", {"clients.web.workload.pause": "0s",
                                "clients.web.workload.think": {"distribution": "uniform"}},
     "clients.web.workload.think", "needs 'min' and 'max'"),
    ("link-unknown-group", {"links.pairs.0.between": ["guard", "core"]}, "links.pairs[0].between[1]", "'core' is not a group"),
    ("link-three-groups", {"links.pairs.0.between": ["guard", "middle", "exit"]}, "links.pairs[0].between", "at most 2"),
    ("link-override-empty", {"links.pairs.0.rate": DELETE}, "links.pairs[0]", "sets none of"),
    ("jitter-without-delay", {"links.default.jitter": "2ms"}, "links.default.jitter", "needs a delay"),
    ("rate-too-low", {"links.default.rate": "1kbit"}, "links.default.rate", "below 8kbit"),
    ("loss-over-100", {"links.default.loss": "150%"}, "links.default.loss", "above 100%"),
    ("group-name-clash", {"servers.web": {"files": {"a": "1KB"}}}, "clients.web", "also used in servers"),
    ("reserved-group", {"network.relays.authority": {}}, "network.relays.authority", "reserved"),
    ("public-subnet", {"network.subnet": "8.8.0.0/16"}, "network.subnet", "private"),
    ("subnet-garbage", {"network.subnet": "10.0.0.1/33"}, "network.subnet", "not an IPv4 network"),
    ("unknown-collector", {"measure.collect": ["transfers", "pcap"]}, "measure.collect[1]", "must be"),
    ("placement-unknown-group", {"placement": {"core": {"nodeSelector": {"a": "b"}}}}, "placement.core", "not a group"),
    ("fault-unknown-target", {"faults": [{"at": "10s", "kind": "kill", "target": "core0"}]}, "faults[0].target", "not a relay group"),
    ("fault-index-out-of-range", {"faults": [{"at": "10s", "kind": "kill", "target": "middle3"}]}, "faults[0].target", "has 1 node"),
    ("fault-after-end", {"faults": [{"at": "2m", "kind": "kill", "target": "middle"}]}, "faults[0].at", "after the end"),
    ("relay-variant-unknown", {"network.relays.middle.variant": "fifo"}, "network.relays.middle.variant", "unknown variant"),
    ("repetitions-zero", {"repetitions": 0}, "repetitions", "greater than or equal to 1"),
    ("not-a-mapping", {"clients.web": "fast"}, "clients.web", "dictionary"),
    # Replay workloads and replay servers.
    ("replay-without-replay-server", {"clients.web.workload": {"kind": "replay", "trace": TRACE}},
     "clients.web.workload.server", "has no replay server"),
    ("replay-trace-missing", {"servers.www.replay": {}, "clients.web.workload": {"kind": "replay", "trace": "nope.jsonl"}},
     "clients.web.workload.trace", "cannot read"),
    ("replay-trace-required", {"servers.www.replay": {}, "clients.web.workload": {"kind": "replay"}},
     "clients.web.workload.trace", "required"),
    ("replay-unknown-flow", {"servers.www.replay": {},
                             "clients.web.workload": {"kind": "replay", "trace": TRACE, "flows": ["f0", "zz"]}},
     "clients.web.workload.flows[1]", "no flow 'zz'"),
    ("replay-unknown-key", {"servers.www.replay": {}, "clients.web.workload": {"kind": "replay", "trace": TRACE,
                                                                               "loops": True}},
     "clients.web.workload", "unknown key 'loops'"),
    ("replay-more-clients-than-circuits", {"servers.www.replay": {}, "clients.web.count": 3,
                                           "clients.web.workload": {"kind": "replay", "trace": TRACE}},
     "clients.web.count", "share 2 circuit key(s)"),
    ("replay-bad-distribute", {"servers.www.replay": {},
                               "clients.web.workload": {"kind": "replay", "trace": TRACE, "distribute": "some"}},
     "clients.web.workload.distribute", "'split' or 'each'"),
    ("replay-port-is-http-port", {"servers.www.replay": {"port": 80}}, "servers.www.replay.port", "already the HTTP port"),
    ("server-without-files-or-replay", {"servers.www.files": {}}, "servers.www", "needs 'files'"),
    ("fetch-from-replay-only-server", {"servers.www": {"replay": {}}}, "clients.web.workload.server", "has no files"),
    # Background load (load:).
    ("load-unknown-key", {"load": {"userz": 3}}, "load", "unknown key 'userz'"),
    ("load-zero-users", {"load": {"users": 0}}, "load.users", "greater than or equal to 1"),
    ("load-spawn-rate-zero", {"load": {"spawn_rate": 0}}, "load.spawn_rate", "greater than 0"),
    ("load-path-two-hops", {"load": {"path": ["guard", "exit"]}}, "load.path", "at least 3"),
    ("load-path-unknown-group", {"load": {"path": ["guard", "midle", "exit"]}}, "load.path[1]", "not a relay group"),
    ("load-path-no-exit", {"load": {"path": ["guard", "exit", "middle"]}}, "load.path[2]", "must end at an exit"),
    ("load-unknown-server", {"load": {"server": "ww"}}, "load.server", "not a server group"),
    ("load-replay-only-server", {"servers.www": {"replay": {}}, "clients.web.workload": {"kind": "replay", "trace": TRACE},
                                 "clients.bulk": DELETE, "load": {}}, "load.server", "serves no HTTP files"),
    ("load-more-workers-than-users", {"load": {"users": 2, "workers": 3}}, "load.workers", "run no user"),
    ("load-start-after-end", {"load": {"start": "2m"}}, "load.start", "not before the end"),
    ("load-stop-before-start", {"load": {"start": "20s", "stop": "10s"}}, "load.stop", "not after load.start"),
    ("load-stop-after-end", {"load": {"stop": "90s"}}, "load.stop", "after the end of the workload"),
    ("load-bad-size", {"load": {"mix": {"web": {"weight": 1, "size": "50 kilobytes"}}}}, "load.mix.web.size",
     "not a size"),
    ("load-all-weights-zero", {"load": {"mix": {"web": {"weight": 0, "size": "50KiB"}}}}, "load.mix", "every weight is 0"),
    ("load-negative-weight", {"load": {"mix": {"web": {"weight": -1, "size": "50KiB"}}}}, "load.mix.web.weight",
     "greater than or equal to 0"),
    ("load-uniform-think-without-bounds", {"load": {"mix": {"web": {"weight": 1, "size": "1KiB",
                                                                    "think": {"distribution": "uniform"}}}}},
     "load.mix.web.think", "needs 'min' and 'max'"),
    ("load-bad-mix-name", {"load": {"mix": {"Web Pages": {"weight": 1, "size": "1KiB"}}}}, "load.mix.Web Pages",
     "does not match"),
    # Address ranges, links, extra torrc lines (tests/chart/test_parity.py runs these through helm too).
    ("subnet-too-small-for-the-nodes", {"network.subnet": "10.77.0.0/24", "network.relays.middle.count": 300},
     "network.subnet", "has room for 245 nodes"),
    ("fault-between-one-group-twice", {"faults": [{"at": "10s", "kind": "link", "between": ["middle", "middle"],
                                                   "delay": "10ms"}]}, "faults[0].between", "share node(s)"),
    ("subnet-loopback", {"network.subnet": "127.0.0.0/16"}, "network.subnet", "RFC 1918"),
    ("subnet-not-cidr", {"network.subnet": "10.77.0.0"}, "network.subnet", "ADDRESS/PREFIX"),
    ("torrc-datadirectory", {"network.relays.middle.torrc": "DataDirectory /etc"}, "network.relays.middle.torrc",
     "names a host path"),
    ("load-group-name-reserved", {"clients.load": {"workload": {"kind": "bulk", "file": "bulk"}}}, "clients.load",
     "reserved"),
]


def test_base_is_valid():
    s = scenario.parse(copy.deepcopy(BASE), "base.yaml")
    assert s.baseline_variant == "kist"


@pytest.mark.parametrize("case,changes,path,text", INVALID, ids=[c[0] for c in INVALID])
def test_invalid(case, changes, path, text):
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.parse(patched(changes), f"{case}.yaml")
    message = str(err.value)
    expected_prefix = f"{case}.yaml: {path}: "
    lines = [line for line in message.splitlines() if line.startswith(expected_prefix)]
    assert lines, f"no error for field {path!r}; got:\n{message}"
    assert any(text in line for line in lines), f"expected {text!r} in:\n{message}"


def test_corpus_is_large_enough():
    assert len(INVALID) >= 25


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_shipped_scenarios_are_valid(path):
    s = scenario.load(path)
    assert s.name
    text = path.read_text()
    assert text.startswith("#"), f"{path.name} must start with a comment citing what it reproduces"


def test_readme_example_is_valid(repo):
    readme = (repo / "README.md").read_text()
    start = readme.index("```yaml\napiVersion: torbed/v1")
    block = readme[start + len("```yaml\n"):readme.index("```", start + 8)]
    scenario.parse(yaml.safe_load(block), "README.md")


def test_errors_name_the_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("apiVersion: torbed/v1\nname: [unclosed\n")
    with pytest.raises(scenario.ScenarioError, match="broken.yaml: <top level>: not valid YAML: line 3, column 1: expected ',' or ']'"):
        scenario.load(f)
    with pytest.raises(scenario.ScenarioError, match="missing.yaml: <top level>: cannot read"):
        scenario.load(tmp_path / "missing.yaml")


def test_several_problems_reported_together():
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.parse(patched({"clients.web.path": ["guard", "nope", "exit"], "baseline": "x"}), "two.yaml")
    assert len(err.value.problems) == 2


def test_defaults_filled():
    s = scenario.parse(copy.deepcopy(BASE))
    assert s.repetitions == 1 and s.seed == 1
    assert s.measure.collect == ["transfers", "cellstats", "relay_bw", "metrics"]
    assert s.clients["bulk"].workload.concurrency == 1


def test_few_authorities_warn():
    s = scenario.parse(patched({"network.authorities": 1}))
    assert any("3 or more" in w for w in s.warnings)


def test_json_schema_accepts_valid_and_rejects_unknown_keys():
    schema = scenario.json_schema()
    jsonschema.validate(BASE, schema)
    for path in SCENARIOS:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(patched({"clients.web.workload.repat": 3}), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(patched({"links.default.rate": "10mbps"}), schema)
    json.dumps(schema)


def test_replay_workload_valid_and_trace_found_next_to_the_scenario(tmp_path, repo):
    data = patched({"servers.www.replay": {}, "clients.web.count": 2,
                    "clients.web.workload": {"kind": "replay", "trace": TRACE}})
    s = scenario.parse(data, "ok.yaml")
    wl = s.clients["web"].workload
    assert wl.kind == "replay" and wl.loop and wl.distribute == "split" and wl.flows is None
    assert s.trace_path(wl.trace) == (repo / TRACE).resolve()
    # A trace next to the scenario file wins over the repository.
    (tmp_path / "local.jsonl").write_text((repo / TRACE).read_text())
    f = tmp_path / "s.yaml"
    data["clients"]["web"]["workload"]["trace"] = "local.jsonl"
    f.write_text(yaml.safe_dump(data))
    s = scenario.load(f)
    assert s.trace_path("local.jsonl") == tmp_path / "local.jsonl"


# ---------------------------------------------------------------------------------------
# Files that are not scenarios at all: (case id, file content, text the one line must contain).
# Each must fail as bad input (exit 2) with one line naming the file, before anything starts.
NESTED = b"a: " + b"[" * 100_000
ALIASES = b"a: &a [" + b"1," * 9 + b"1]\n" + b"".join(
    b"%c: &%c [%s]\n" % (c, c, b",".join([b"*" + bytes([c - 1])] * 10)) for c in range(ord("b"), ord("h")))
INVALID_FILES = [
    ("binary", b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)), "binary data"),
    ("not-utf8", "name: café\n".encode("latin-1"), "not UTF-8 text (byte 0xe9"),
    ("utf16", "apiVersion: torbed/v1\n".encode("utf-16"), "not UTF-8"),
    ("empty", b"", "empty file"),
    ("whitespace-only", b"\n   \n\t\n", "empty file"),
    ("enormous", b"# padding\n" * 500_000, "too large for a scenario"),
    ("deeply-nested-flow", NESTED, "nested more than 64 levels deep"),
    ("deeply-nested-block", b"".join(b" " * i + b"k:\n" for i in range(200)), "nested more than 64 levels deep"),
    ("alias-bomb", ALIASES, "once aliases are expanded"),
    ("a-list", b"- 1\n- 2\n", "a scenario is a mapping"),
]


@pytest.mark.parametrize("case,content,text", INVALID_FILES, ids=[c[0] for c in INVALID_FILES])
def test_invalid_files(tmp_path, capsys, case, content, text):
    from torbed import cli
    f = tmp_path / f"{case}.yaml"
    f.write_bytes(content)
    with pytest.raises(scenario.ScenarioError) as err:
        scenario.load(f)
    assert str(f) in str(err.value) and text in str(err.value), str(err.value)[:300]
    rc = cli.main(["validate", str(f)])
    out, errors = capsys.readouterr()
    assert rc == 2
    lines = [line for line in errors.splitlines() if line.strip()]
    assert len(lines) == 1 and str(f) in lines[0] and text in lines[0], errors[:500]
    assert "Traceback" not in errors


def test_unreadable_inputs_name_the_file(tmp_path):
    with pytest.raises(scenario.ScenarioError, match="is a directory"):
        scenario.load(tmp_path)
    with pytest.raises(scenario.ScenarioError, match="too large for a scenario"):
        scenario.load("/dev/zero")   # endless: only the limit is read


def test_units_are_parsed_once_into_typed_values():
    s = scenario.parse(patched({"links.default.delay": "20ms", "links.default.loss": "0.5%"}))
    assert s.measure.duration == "1m" and s.measure.duration.seconds == 60.0
    assert s.links.default.rate.bps == 10_000_000 and s.links.default.delay.seconds == pytest.approx(0.02)
    assert s.links.default.loss.fraction == pytest.approx(0.005)
    assert s.servers["www"].files["bulk"].bytes == 5 * 1024 * 1024
    assert s.clients["web"].workload.pause.seconds == 1.0
    # Defaults are typed too, and the user's spelling survives a dump (run.json, Helm values).
    assert s.measure.ready_timeout.seconds == 180.0
    assert s.model_dump(mode="json")["measure"]["duration"] == "1m"
    assert type(s.model_dump(mode="json")["measure"]["duration"]) is str


def test_overrides_are_validated_like_the_file():
    s = scenario.parse(copy.deepcopy(BASE), "t.yaml")
    o = scenario.with_overrides(s, "t.yaml", repetitions=3, measure__duration="90s")
    assert o.repetitions == 3 and o.measure.duration.seconds == 90.0 and s.measure.duration == "1m"
    with pytest.raises(scenario.ScenarioError, match="t.yaml: --duration: not a duration: '5q'"):
        scenario.with_overrides(s, "t.yaml", measure__duration="5q")
    with pytest.raises(scenario.ScenarioError, match="t.yaml: measure.warmup: warmup 5s is not shorter"):
        scenario.with_overrides(s, "t.yaml", measure__duration="2s")


def test_load_defaults_to_the_mccoy_mix():
    """The default mix: weights are McCoy et al. 2008's connection shares (HTTP 92.45%, BitTorrent
    3.33%, as Tang & Goldberg 2010 quote them); its sizes give byte shares near the paper's
    57.97% / 40.20% (41% BitTorrent of the two together)."""
    s = scenario.parse(patched({"load": {}}), "load.yaml")
    mix = s.load.mix
    assert {n: r.weight for n, r in mix.items()} == {"web": 92.45, "bulk": 3.33}
    by = {n: r.weight * r.size.bytes for n, r in mix.items()}
    share = by["bulk"] / sum(by.values())
    assert abs(share - 40.20 / (57.97 + 40.20)) < 0.02, share
    assert s.load.stop is None and s.load.start.seconds == 0
    assert s.load_server() == "www" and set(s.load_files()) == {"load-web", "load-bulk"}


def test_load_groups_can_be_shaped():
    s = scenario.parse(patched({"load": {}, "links.pairs": [{"between": ["load", "guard"], "rate": "2mbit"}]}), "l.yaml")
    assert s.links.pairs[0].between == ["load", "guard"]
    with pytest.raises(scenario.ScenarioError, match="links.pairs\\[0\\].between\\[0\\]: 'load' is not a group"):
        scenario.parse(patched({"links.pairs": [{"between": ["load", "guard"], "rate": "2mbit"}]}), "l.yaml")


@pytest.mark.parametrize("subnet", ["10.77.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "172.31.255.0/24", "192.168.0.0/16",
                                    "192.168.7.0/24", "10.0.0.0/25", "10.0.0.0/7", "172.32.0.0/16", "192.169.0.0/16",
                                    "8.8.0.0/16", "127.0.0.0/16", "10.300.0.0/16", "010.0.0.0/8", "10.0.0.0/08",
                                    "10.77.0.0", "10.77.0.0/255.255.0.0"])
def test_subnet_schema_pattern_agrees_with_the_check(subnet):
    """The chart's schema (a pattern) and torbed's check accept the same subnets (host bits
    aside: a pattern cannot see them; _validate.tpl checks those)."""
    import re
    pattern = scenario.json_schema()["$defs"]["Network"]["properties"]["subnet"]["pattern"]
    try:
        scenario.parse(patched({"network.subnet": subnet}), "s.yaml")
        valid = True
    except scenario.ScenarioError:
        valid = False
    assert bool(re.search(pattern, subnet)) == valid


@pytest.mark.parametrize("loss", ["0%", "0.5%", "100%", "100.0%", "099%", "100.5%", "101%", "250%", "1000%"])
def test_percent_schema_pattern_agrees_with_the_parser(loss):
    import re
    pattern = scenario.json_schema()["$defs"]["Link"]["properties"]["loss"]["anyOf"][0]["pattern"]
    try:
        scenario.parse(patched({"links.default.loss": loss}), "s.yaml")
        valid = True
    except scenario.ScenarioError:
        valid = False
    assert bool(re.search(pattern, loss)) == valid


def test_subnet_room_is_what_the_plan_needs():
    """The check's arithmetic is network.plan's: 245 nodes fit a /24, 246 do not."""
    from torbed import network
    fits = scenario.parse(patched({"network.subnet": "192.168.4.0/24", "clients.bulk.count": 237}))
    assert len(network.plan(fits, "kist").nodes) == 245
    with pytest.raises(scenario.ScenarioError, match="has room for 245 nodes"):
        scenario.parse(patched({"network.subnet": "192.168.4.0/24", "clients.bulk.count": 238}))
