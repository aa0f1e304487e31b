"""The two front doors refuse the same scenarios: every invalid scenario of one table is refused
by `torbed validate` (exit 2, the field named) and by `helm template -f SCENARIO` of the chart
(non-zero, the field named). The table is the scenario unit tests' INVALID corpus plus cases
that once passed the chart: out-of-range rates and percentages, address ranges and their
size, refused torrc lines, link faults naming one group (or a group and its node) twice, link
pairs listed twice.
"""

import re

import pytest
import yaml

from test_chart import CHART, run, show
from tests.unit.test_scenario import INVALID, patched

from torbed import cli

# (case id, changes to the unit tests' BASE scenario, field path, text torbed's message contains)
EXTRA = [
    # Rates and percentages out of range.
    ("pair-rate-too-low", {"links.pairs.0.rate": "4kbit"}, "links.pairs[0].rate", "below 8kbit"),
    ("rate-below-8kbit-bytes", {"links.default.rate": "999B/s"}, "links.default.rate", "below 8kbit"),
    ("pair-loss-over-100", {"links.pairs.0.loss": "100.5%"}, "links.pairs[0].loss", "above 100%"),
    ("fault-loss-over-100", {"faults": [{"at": "10s", "kind": "link", "target": "middle", "loss": "101%"}]},
     "faults[0].loss", "above 100%"),
    ("fault-cpu-over-100", {"faults": [{"at": "10s", "kind": "cpu", "target": "middle", "cpu": "250%"}]},
     "faults[0].cpu", "above 100%"),
    ("fault-cpu-below-1", {"faults": [{"at": "10s", "kind": "cpu", "target": "middle", "cpu": "0.5%"}]},
     "faults[0].cpu", "below 1%"),
    ("fault-rate-too-low", {"faults": [{"at": "10s", "kind": "link", "target": "middle", "rate": "2kbit"}]},
     "faults[0].rate", "below 8kbit"),
    ("jitter-above-delay", {"links.default.delay": "2ms", "links.default.jitter": "5ms"}, "links.default.jitter",
     "reorder"),
    ("loss-burst-below-1", {"links.default.loss": "1%", "links.default.loss_burst": 0.5}, "links.default.loss_burst",
     "greater than or equal to 1"),
    ("bw-interval-too-short", {"measure.bw_interval": "50ms"}, "measure.bw_interval", "at least 100ms"),
    ("relay-count-over-1000", {"network.relays.middle.count": 1001}, "network.relays.middle.count",
     "less than or equal to 1000"),
    # Address ranges and their size.
    ("subnet-too-small", {"network.subnet": "10.77.0.0/25"}, "network.subnet", "/24 or larger"),
    ("subnet-host-bits", {"network.subnet": "10.77.0.1/16"}, "network.subnet", "not an IPv4 network"),
    ("subnet-public-172", {"network.subnet": "172.32.0.0/16"}, "network.subnet", "private"),
    ("subnet-netmask", {"network.subnet": "10.77.0.0/255.255.0.0"}, "network.subnet", "ADDRESS/PREFIX"),
    ("subnet-garbage-octet", {"network.subnet": "10.300.0.0/16"}, "network.subnet", "not an IPv4 network"),
    # Extra torrc lines now refused.
    ("torrc-log-file", {"network.relays.exit.torrc": "Log notice file /etc/passwd"}, "network.relays.exit.torrc",
     "Log:"),
    ("torrc-unknown", {"network.relays.middle.torrc": "Schedulr KIST"}, "network.relays.middle.torrc",
     "unknown option 'Schedulr'"),
    ("torrc-abbreviation", {"network.relays.middle.torrc": "datadir /etc"}, "network.relays.middle.torrc",
     "unknown option 'datadir'"),
    ("torrc-include", {"network.relays.middle.torrc": "%include /etc/shadow"}, "network.relays.middle.torrc",
     "%include"),
    ("torrc-control", {"network.relays.guard.torrc": "+ControlPort 9999"}, "network.relays.guard.torrc",
     "ControlPort:"),
    ("torrc-carriage-return", {"network.relays.middle.torrc": "Schedulers KIST\rUser nobody"},
     "network.relays.middle.torrc", "not allowed"),
    ("torrc-comment-in-continuation", {"network.relays.middle.torrc": "Schedulers KIST,\\\n# x\nUser nobody"},
     "network.relays.middle.torrc", "comment inside a continued line"),
    ("torrc-bandwidth-twice", {"network.relays.middle.bandwidth": "1MB/s",
                               "network.relays.middle.torrc": "BandwidthRate 2 MB"},
     "network.relays.middle.torrc", "'bandwidth' sets it"),
    ("torrc-patched-option-stock-variant", {"network.relays.middle.torrc": "CircSwitch 0"},
     "network.relays.middle.torrc", "unknown option 'CircSwitch'"),
    ("torrc-patched-option-not-every-variant", {"variants": ["circswitch", "kist"],
                                                "network.relays.middle.torrc": "CircSwitch 0"},
     "network.relays.middle.torrc", "unknown option 'CircSwitch'"),
    # Links that name one group (or node) twice. (links.pairs [g, g] is valid: the links within g.)
    ("fault-between-group-and-its-node", {"faults": [{"at": "10s", "kind": "link", "between": ["middle", "middle0"],
                                                      "delay": "10ms"}]}, "faults[0].between", "share node(s)"),
    ("fault-between-authority-twice", {"faults": [{"at": "10s", "kind": "link", "between": ["authority", "auth1"],
                                                   "loss": "1%"}]}, "faults[0].between", "share node(s)"),
    ("subnet-just-too-small", {"network.subnet": "192.168.4.0/24", "clients.bulk.count": 238},
     "network.subnet", "has room for 245 nodes"),
    # Voted consensus weights (the keygen hook writes the bandwidth file on Kubernetes).
    ("weights-count", {"network.relays.guard.weights": [10, 20], "network.relays.middle.weights": [5],
                       "network.relays.exit.weights": [5]},
     "network.relays.guard.weights", "2 weights for 1 relays"),
    ("weights-on-some-groups", {"network.relays.guard.weights": [10]}, "network.relays",
     "weights are set on guard but not on"),
    ("weights-two-authorities", {"network.authorities": 2, "network.relays.guard.weights": [10],
                                 "network.relays.middle.weights": [5], "network.relays.exit.weights": [5]},
     "network.authorities", "relay weights need 3 or more"),
    ("link-pair-listed-twice", {"links.pairs": [{"between": ["guard", "middle"], "rate": "1mbit"},
                                                {"between": ["middle", "guard"], "rate": "2mbit"}]},
     "links.pairs[1].between", "listed twice"),
]

# What only torbed can check: the chart cannot read the trace files a replay names (pods
# look them up at start, in replayTraces or the client image).
TORBED_ONLY = {
    "replay-trace-missing": "reads the trace file",
    "replay-unknown-flow": "reads the trace's flows",
    "replay-more-clients-than-circuits": "reads the trace's circuit keys",
}

CASES = [c for c in INVALID + EXTRA if c[0] not in TORBED_ONLY]


def field_spellings(path: str, text: str) -> list[tuple[str, ...]]:
    """How helm's error may name the field, each a tuple of strings that must all appear:
    _validate.tpl's dotted path (torbed's own), the schema's JSON pointer, or the pointer of
    the enclosing object and the key (the schema's spelling of a missing or unknown key)."""
    key = re.search(r"unknown key '([^']+)'", text)
    if key:
        return [(f"'{key.group(1)}'",)]
    parts = [p for p in re.split(r"\.|\[(\d+)\]", path) if p]
    pointer = "".join(f"/{p}" for p in parts)
    parent = "".join(f"/{p}" for p in parts[:-1])
    return [(f"{path}:",), (f"'{pointer}'",), (f"at '{parent}'", f"'{parts[-1]}'")]


def write_case(tmp_path, changes) -> str:
    data = patched(changes)
    f = tmp_path / "scenario.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(f)


def test_table_covers_the_unit_corpus_and_the_new_cases():
    assert len(CASES) >= len(INVALID) - len(TORBED_ONLY) + 20
    assert set(TORBED_ONLY) <= {c[0] for c in INVALID}


def test_base_passes_both(tools, tmp_path, capsys):
    f = write_case(tmp_path, {})
    assert cli.main(["validate", f]) == 0, capsys.readouterr()
    p = run(tools, tools["helm"], "template", "t", str(CHART), "-f", f)
    assert p.returncode == 0, show(p, limit=1500)


@pytest.mark.parametrize("changes", [
    pytest.param({"network.relays.middle.torrc": "schedulers KIST\n+KISTSchedRunInterval 2 msec  # c\n"
                                                 "ConstrainedSockets 1\\\n  \nDoSConnectionEnabled 0"}, id="allowed"),
    pytest.param({"variants": ["circswitch"], "network.relays.middle.torrc": "CircSwitch 0"}, id="patched-option"),
    pytest.param({"network.subnet": "192.168.4.0/24", "clients.bulk.count": 237}, id="subnet-just-large-enough"),
    pytest.param({"links.pairs.0.between": ["guard", "guard"]}, id="link-pair-within-one-group"),
    pytest.param({"network.relays.guard.weights": [10], "network.relays.middle.weights": [5],
                  "network.relays.exit.weights": [5]}, id="weights"),
    pytest.param({"network.relays.middle.variant": "mtrelay-2", "network.relays.middle.torrc": "RelayConnectionThreads 4"},
                 id="patched-option-group-variant"),
])
def test_both_accept(tools, tmp_path, capsys, changes):
    f = write_case(tmp_path, changes)
    assert cli.main(["validate", f]) == 0, capsys.readouterr()
    p = run(tools, tools["helm"], "template", "t", str(CHART), "-f", f)
    assert p.returncode == 0, show(p, limit=1500)


@pytest.mark.parametrize("case,changes,path,text", CASES, ids=[c[0] for c in CASES])
def test_both_refuse(tools, tmp_path, capsys, case, changes, path, text):
    f = write_case(tmp_path, changes)
    code = cli.main(["validate", f])
    out = capsys.readouterr()
    said = out.out + out.err
    assert code == 2 and f"{f}: {path}: " in said and text in said and "Traceback" not in said, said
    p = run(tools, tools["helm"], "template", "t", str(CHART), "-f", f)
    assert p.returncode != 0, "helm template accepted a scenario torbed validate refuses\n" + show(p, limit=1500)
    names = field_spellings(path, text)
    assert any(all(n in p.stderr for n in alt) for alt in names), \
        f"helm's error names the field in none of the ways {names}\n" + show(p, limit=3000)

