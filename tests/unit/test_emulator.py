"""linkemu glue: link tables from plans, the shaper choice, scenario fields, control requests.

No namespaces here; the one test that runs the binary only validates a table (`linkemu check`).
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import threading

import pytest

from torbed.backends.local import emulator, netns
from torbed import network, scenario, shaping
from torbed.network import LinkSpec

BASE = {
    "apiVersion": "torbed/v1",
    "name": "t",
    "variants": ["kist"],
    "network": {"authorities": 3, "relays": {"guard": {"guard": True}, "middle": {}, "exit": {"exit": True}}},
    "links": {"default": {"rate": "100mbit", "delay": "20ms"},
              "pairs": [{"between": ["guard", "middle"], "rate": "4mbit", "loss": "1%", "loss_burst": 3,
                         "queue": "50ms", "delay": "20ms", "jitter": "2ms", "jitter_distribution": "pareto"}]},
    "servers": {"www": {"files": {"small": "300KB"}}},
    "clients": {"web": {"path": ["guard", "middle", "exit"], "workload": {"kind": "fetch", "file": "small"}}},
    "measure": {"warmup": "0s", "duration": "30s"},
}

NO_NETEM = shaping.KernelCaps(htb=True, netem=False, detail="netem: Error: Specified qdisc kind is unknown.")
NETEM = shaping.KernelCaps(htb=True, netem=True)
NOTHING = shaping.KernelCaps(htb=False, netem=False, detail="no qdiscs")


def make_plan(links: dict | None = None) -> network.Plan:
    data = copy.deepcopy(BASE)
    if links is not None:
        data["links"] = links
    return network.plan(scenario.parse(data, "t.yaml"), "kist")


def table_for(plan: network.Plan) -> dict:
    topo = netns.Topology("unit", plan, switch="linkemu")
    return emulator.link_table(plan, topo, control_socket=None, stats_file=None)


def test_link_props_carry_every_property_in_linkemu_terms():
    spec = LinkSpec(rate_bps=4_000_000, delay_s=0.02, jitter_s=0.002, loss=0.01, jitter_dist="pareto",
                    loss_burst=3.0, queue_s=0.05)
    assert emulator.link_props(spec) == {"rate_bps": 4_000_000, "delay_s": 0.02, "jitter_s": 0.002,
                                         "jitter_dist": "pareto", "loss": 0.01, "loss_burst": 3.0, "queue_s": 0.05}
    assert emulator.link_props(LinkSpec()) == {}
    assert emulator.link_props(LinkSpec(queue_bytes=65536, rate_bps=10**6)) == {"rate_bps": 10**6, "queue_bytes": 65536}
    # A burst length of 1 is independent loss: nothing to say.
    assert "loss_burst" not in emulator.link_props(LinkSpec(loss=0.01, loss_burst=1.0))


def test_table_has_a_port_per_node_and_an_unshaped_control_port():
    plan = make_plan()
    t = table_for(plan)
    assert t["version"] == 1 and t["seed"] == plan.scenario.seed
    assert [p["dev"] for p in t["ports"]] == [f"s{i}" for i in range(len(plan.nodes))] + ["ctlp"]
    assert [p["node"] for p in t["ports"][:-1]] == [n.name for n in plan.nodes]
    assert [p["ipv4"] for p in t["ports"][:-1]] == [[n.address] for n in plan.nodes]
    assert t["ports"][-1] == {"dev": "ctlp", "node": "control", "ipv4": [plan.control_address], "shaped": False}
    assert all("shaped" not in p for p in t["ports"][:-1])
    assert t["default"] == {"rate_bps": 100_000_000, "delay_s": 0.02}


def test_table_lists_only_pairs_that_differ_from_the_default_in_both_directions():
    plan = make_plan()
    t = table_for(plan)
    pairs = {(link["src"], link["dst"]) for link in t["links"]}
    assert pairs == {("guard0", "middle0"), ("middle0", "guard0")}
    props = t["links"][0]["props"]
    # The override inherits the default's delay; its own fields replace the rest.
    assert props == {"rate_bps": 4_000_000, "queue_s": 0.05, "delay_s": 0.02, "jitter_s": 0.002,
                     "jitter_dist": "pareto", "loss": 0.01, "loss_burst": 3.0}


def test_table_matches_plan_link_for_every_ordered_pair():
    plan = make_plan({"default": {"delay": "5ms"},
                      "pairs": [{"between": ["authority", "exit"], "delay": "40ms"},
                                {"between": ["web", "guard"], "rate": "2mbit"}]})
    t = table_for(plan)
    explicit = {(link["src"], link["dst"]): link["props"] for link in t["links"]}
    for a in plan.nodes:
        for b in plan.nodes:
            if a is not b:
                assert explicit.get((a.name, b.name), t["default"]) == emulator.link_props(plan.link(a, b)), (a.name, b.name)
    assert explicit[("auth1", "exit0")] == {"delay_s": 0.04}
    assert explicit[("guard0", "web0")] == {"rate_bps": 2_000_000, "delay_s": 0.005}


def test_table_is_accepted_by_linkemu(tmp_path):
    binary = emulator.ensure_binary()
    t = table_for(make_plan())
    path = tmp_path / "table.json"
    path.write_text(json.dumps(t))
    p = subprocess.run([str(binary), "check", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "9 ports, 2 link overrides" in p.stdout
    t["default"]["dealy_s"] = 1
    path.write_text(json.dumps(t))
    p = subprocess.run([str(binary), "check", str(path)], capture_output=True, text=True)
    assert p.returncode == 1 and "unknown field `dealy_s`" in p.stderr


@pytest.mark.parametrize("links, caps, expected", [
    ({"default": {"rate": "10mbit"}}, NETEM, "htb"),
    ({"default": {"rate": "10mbit"}}, NO_NETEM, "htb"),                         # rate only: the kernel is enough
    ({"default": {"rate": "10mbit"}}, NOTHING, "linkemu"),
    ({"default": {"rate": "10mbit", "delay": "20ms"}}, NETEM, "htb+netem"),
    ({"default": {"rate": "10mbit", "delay": "20ms"}}, NO_NETEM, "linkemu"),    # this machine
    ({"default": {"loss": "1%"}}, NO_NETEM, "linkemu"),
    ({"default": {"rate": "10mbit", "delay": "20ms", "queue": "64KB"}}, NETEM, "linkemu"),  # netem cannot bound it
    ({"default": {"rate": "10mbit", "queue": "64KB"}}, NETEM, "htb"),
    ({}, NO_NETEM, "none"),
    ({"emulator": "linkemu"}, NETEM, "linkemu"),                                # asked for, even unshaped
    ({"default": {"rate": "10mbit"}, "emulator": "linkemu"}, NETEM, "linkemu"),
    ({"default": {"rate": "10mbit", "delay": "20ms"}, "emulator": "tc"}, NETEM, "htb+netem"),
])
def test_choose_shaper(links, caps, expected):
    assert shaping.choose_shaper(make_plan(links), caps) == expected


@pytest.mark.parametrize("links, caps, message", [
    ({"default": {"delay": "20ms"}, "emulator": "tc"}, NO_NETEM, "no sch_netem"),
    ({"default": {"rate": "1mbit"}, "emulator": "tc"}, NOTHING, "no sch_htb"),
    ({"default": {"rate": "1mbit", "delay": "5ms", "queue": "10ms"}, "emulator": "tc"}, NETEM, "cannot bound the queue"),
])
def test_tc_only_is_refused_where_the_kernel_cannot(links, caps, message):
    with pytest.raises(shaping.ShapingError, match=message):
        shaping.choose_shaper(make_plan(links), caps)


def test_tc_batch_maps_distribution_bursty_loss_and_queue():
    plan = make_plan({"default": {"rate": "10mbit", "delay": "20ms", "jitter": "2ms",
                                  "jitter_distribution": "paretonormal", "loss": "2%", "loss_burst": 4},
                      "pairs": [{"between": ["web", "guard"], "delay": "0ms", "queue": "10ms"}]})
    batch = shaping.tc_batch(plan, plan.node("exit0"), netem=True)
    assert "delay 20.000ms 2.000ms distribution paretonormal" in batch
    # p = loss * r / (1 - loss) with r = 1/4
    assert "loss gemodel 0.5102% 25.0000%" in batch
    uniform = make_plan({"default": {"delay": "20ms", "jitter": "2ms", "jitter_distribution": "uniform"}})
    batch = shaping.tc_batch(uniform, uniform.node("exit0"), netem=True)
    assert "delay 20.000ms 2.000ms" in batch and "distribution" not in batch  # netem's own default is uniform
    queued = make_plan({"default": {"rate": "8mbit", "queue": "10ms"}})
    assert "bfifo limit 10000" in shaping.tc_batch(queued, queued.node("web0"))


@pytest.mark.parametrize("links, path, text", [
    ({"emulator": "ns3"}, "links.emulator", "'auto', 'tc' or 'linkemu'"),
    ({"default": {"rate": "1mbit", "queue": "lots"}}, "links.default.queue", "not a queue size"),
    ({"default": {"delay": "5ms", "queue": "10ms"}}, "links.default.queue", "set a rate"),
    ({"default": {"loss": "1%", "loss_burst": 0.5}}, "links.default.loss_burst", "greater than or equal to 1"),
    ({"default": {"delay": "5ms", "loss_burst": 2}}, "links.default.loss_burst", "set a loss"),
    ({"default": {"jitter": "1ms", "delay": "5ms", "jitter_distribution": "cauchy"}},
     "links.default.jitter_distribution", "normal"),
])
def test_invalid_link_fields_name_their_path(links, path, text):
    data = copy.deepcopy(BASE)
    data["links"] = links
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.parse(data, "t.yaml")
    assert any(p == path and text in m for p, m in e.value.problems), e.value.problems


def test_queue_is_a_size_or_a_time():
    plan = make_plan({"default": {"rate": "8mbit", "queue": "64KB"},
                      "pairs": [{"between": ["guard", "middle"], "queue": "20ms"}]})
    assert plan.default_link.queue_bytes == 64_000 and plan.default_link.queue_s is None
    pair = plan.link(plan.node("guard0"), plan.node("middle0"))
    assert pair.queue_s == pytest.approx(0.02) and pair.queue_bytes is None and pair.rate_bps == 8_000_000
    assert "queue 20 ms" in pair.describe()


def test_default_emulator_is_auto_and_in_the_schema():
    assert scenario.parse(copy.deepcopy(BASE), "t.yaml").links.emulator == "auto"
    links = scenario.json_schema()["$defs"]["Links"]["properties"]
    assert links["emulator"]["enum"] == ["auto", "tc", "linkemu"]


class FakeLinkemu:
    """A control socket answering canned replies, recording requests."""

    def __init__(self, path, replies):
        self.path, self.replies, self.requests = path, list(replies), []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        for reply in self.replies:
            conn, _ = self.sock.accept()
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    data += conn.recv(4096)
                self.requests.append(json.loads(data))
                conn.sendall(reply)


def test_set_link_sends_linkemu_props_and_raises_on_refusal(tmp_path):
    sock = tmp_path / "le.sock"
    fake = FakeLinkemu(sock, [b'{"ok": true, "changed": 2}\n',
                              b'{"ok": false, "error": "no port has node \'zz\'"}\n', b"garbage\n"])
    assert emulator.set_link(sock, "guard0", "middle0", LinkSpec(delay_s=0.05)) == 2
    assert fake.requests[0] == {"op": "set", "src": "guard0", "dst": "middle0", "props": {"delay_s": 0.05},
                                "symmetric": True}
    with pytest.raises(emulator.EmulatorError, match="no port has node 'zz'"):
        emulator.Emulator(socket=sock, table_path=tmp_path / "t.json").set_link("zz", "*", {"loss": 1.0})
    with pytest.raises(emulator.EmulatorError, match="unreadable answer"):
        emulator.request(sock, {"op": "ping"})
    with pytest.raises(emulator.EmulatorError, match="control socket"):
        emulator.request(tmp_path / "absent.sock", {"op": "ping"})


def test_topology_ports_and_switch_kind():
    plan = make_plan()
    topo = netns.Topology("unit", plan, switch="linkemu")
    ports = topo.ports()
    assert ports[0] == ("s0", plan.nodes[0]) and ports[-1] == ("ctlp", None)
    with pytest.raises(ValueError):
        netns.Topology("unit", plan, switch="hub")


def _big_plan(links: dict, relays: int = 100) -> network.Plan:
    data = copy.deepcopy(BASE)
    data["network"]["relays"] = {"guard": {"count": relays, "guard": True}, "exit": {"count": relays, "exit": True}}
    data["clients"]["web"]["path"] = ["guard", "exit"]
    data["links"] = links
    return network.plan(scenario.parse(data), "kist")


def test_shaped_pair_count_agrees_with_the_pairs():
    for links in ({"default": {"rate": "10mbit"}}, {},
                  {"pairs": [{"between": ["guard", "exit"], "rate": "1mbit"},
                             {"between": ["guard", "guard"], "rate": "2mbit"}]}):
        plan = _big_plan(links, relays=7)
        assert plan.shaped_pair_count() == len(plan.shaped_pairs())
    assert make_plan().shaped_pair_count() == len(make_plan().shaped_pairs())


def test_too_many_htb_classes_take_linkemu_and_tc_is_refused():
    """Per-pair htb classes cost more the more classes the machine has (flow-offload block
    list), so a network past HTB_MAX_SHAPED_PAIRS leaves tc under 'auto' and is refused under
    'tc'; a network below it, and an unshaped one of any size, keep their shaper."""
    big = _big_plan({"default": {"rate": "1gbit"}})               # 205 nodes, 41,820 shaped pairs
    assert big.shaped_pair_count() > shaping.HTB_MAX_SHAPED_PAIRS
    assert shaping.choose_shaper(big, NO_NETEM) == "linkemu"
    with pytest.raises(shaping.ShapingError, match=r"shape 41,820 node pairs, one htb class each") as e:
        shaping.choose_shaper(_big_plan({"default": {"rate": "1gbit"}, "emulator": "tc"}), NETEM)
    assert "sch_netem" not in str(e.value)
    # Only the shaped pairs count: one group pair of 100 x 100 (both directions) fits.
    few = _big_plan({"pairs": [{"between": ["guard", "exit"], "rate": "10mbit"}]})
    assert few.shaped_pair_count() == 20_000 and shaping.choose_shaper(few, NO_NETEM) == "htb"
    assert shaping.choose_shaper(_big_plan({}), NO_NETEM) == "none"
