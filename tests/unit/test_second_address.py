"""A relay's second address (network.relays.<g>.second_address; circswitch README A.8): the
model and its checks, the plan's address2, the second veth's routing, the shapers seeing it as
a node of its own (``<node>:second``), the torrc line, and the refusal on Kubernetes. That tor
binds the second connection there: tor's unit test (torchestra/circswitch/binds_second_connection)
and tests/integration/test_circswitch_ownpath.py."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tests.unit.test_scenario import patched
from tests.unit.test_torrc import fake_identities, render_all
from torbed import cli, engine, network, scenario, shaping
from torbed.backends.k8s.backend import K8sBackend
from torbed.backends.local import emulator, gatesample, netns
from torbed.errors import InputError

OWN = {"variants": ["circswitch", "circswitch-ownpath"],
       "network.relays.guard.second_address": True, "network.relays.middle.second_address": True}


def own_plan(variant: str = "circswitch-ownpath", **extra) -> network.Plan:
    return network.plan(scenario.parse(patched({**OWN, **extra}), "t.yaml"), variant)


def test_second_addresses_come_after_every_first_address_and_only_for_their_groups():
    p = own_plan()
    firsts = [ipaddress.IPv4Address(n.address) for n in p.nodes]
    seconds = {n.name: n.address2 for n in p.nodes if n.address2}
    assert sorted(seconds) == ["guard0", "middle0"]
    assert all(ipaddress.IPv4Address(a) > max(firsts) for a in seconds.values())
    assert len(set(seconds.values())) == 2
    # The first addresses are those of the same scenario without second addresses.
    plain = network.plan(scenario.parse(patched({"variants": ["circswitch"]}), "t.yaml"), "circswitch")
    assert [n.address for n in plain.nodes] == [n.address for n in p.nodes]
    ends = p.endpoints()
    assert [e.name for e in ends[len(p.nodes):]] == ["guard0:second", "middle0:second"]
    assert ends[-1].address == seconds["middle0"] and network.owner(ends[-1]) == ("middle0", "eth1")
    # A second address's links are its group's: guard <-> middle is the 1 mbit pair.
    g2, mid = ends[-2], p.node("middle0")
    assert p.link(g2, mid) == p.link(p.node("guard0"), mid) != p.default_link


@pytest.mark.parametrize("changes,field,message", [
    ({"network.relays.guard.second_address": "yes please"}, "network.relays.guard.second_address", "boolean"),
    ({"variants": ["kist", "circswitch"], "network.relays.guard.second_address": True},
     "network.relays.guard.second_address", "no variant this group runs"),
    ({"variants": ["circswitch", "circswitch-ownpath"]}, "variants[1]", "no relay group has second_address"),
    ({**OWN, "network.subnet": "10.9.0.0/24", "clients.bulk.count": 236},
     "network.subnet", "2 second addresses"),
    ({**OWN, "faults": [{"at": "10s", "kind": "link", "target": "guard", "loss": "100%", "duration": "5s"}]},
     "faults[0].kind", "do not change the links of a second address"),
])
def test_invalid_second_address_is_refused_naming_the_field(changes, field, message):
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.parse(patched(changes), "t.yaml")
    assert any(f == field and message in m for f, m in e.value.problems), e.value.problems


def test_an_invalid_second_address_exits_2_naming_file_and_field_without_a_traceback(tmp_path, capsys):
    import yaml
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(patched({"network.relays.guard.second_address": "yes please"})))
    assert cli.main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "s.yaml" in err and "network.relays.guard.second_address" in err and "Traceback" not in err


def test_the_second_veth_has_its_address_without_a_prefix_route_and_a_policy_route():
    p = own_plan()
    topo = netns.Topology("unit", p, switch="linkemu")
    mid = p.node("middle0")
    net = ipaddress.IPv4Network(p.subnet)
    macs = {e.name: netns.mac_address(i + 1) for i, e in enumerate(p.endpoints())}
    peers = [(e.address, macs[e.name]) for e in p.endpoints()]
    lines = topo._second_lines(mid, macs, peers, net).splitlines()
    assert f"addr add {mid.address2}/{net.prefixlen} dev eth1 noprefixroute" in lines
    assert f"rule add from {mid.address2} lookup {netns.SECOND_TABLE} pref 100" in lines
    assert f"route add {net} dev eth1 src {mid.address2} table {netns.SECOND_TABLE}" in lines
    assert f"link set eth1 address {macs['middle0:second']}" in lines
    # Neighbours: every peer address (first and second) except the relay's own two.
    neigh = [ln.split()[2] for ln in lines if ln.startswith("neigh")]
    assert p.node("guard0").address2 in neigh and p.node("guard0").address in neigh
    assert mid.address not in neigh and mid.address2 not in neigh
    assert len(set(macs.values())) == len(macs)
    assert topo.device(p.endpoints()[-1]) == (topo.ns("middle0"), "eth1")
    assert [d for d, n in topo.ports()][-3:] == [f"s{len(p.nodes)}", f"s{len(p.nodes) + 1}", topo.CONTROL_PORT]


def test_htb_shapes_the_second_address_as_a_node_of_its_own():
    p = own_plan()
    guard, mid = p.node("guard0"), p.node("middle0")
    classes = {dst.name: (minor, spec) for minor, dst, spec in shaping.shaped_classes(p, guard)}
    assert "middle0:second" in classes and "guard0:second" not in classes and "guard0" not in classes
    assert classes["middle0:second"][1].rate_bps == classes["middle0"][1].rate_bps == 1_000_000
    minor = classes["middle0:second"][0]
    assert f"match ip dst {mid.address2}/32 flowid 1:{minor:x}" in shaping.tc_batch(p, guard)
    second = p.endpoints()[-1]
    batch = shaping.tc_batch(p, second, dev="eth1")
    assert batch.startswith("qdisc add dev eth1 root")
    to_guard = {dst.name: spec for _, dst, spec in shaping.shaped_classes(p, second)}
    assert to_guard["guard0"].rate_bps == 1_000_000 and "middle0" not in to_guard
    links, _ = gatesample.htb_links(p)
    assert "middle0:second>guard0" in links.values() and "guard0>middle0:second" in links.values()


def test_linkemu_has_a_port_and_links_for_the_second_address():
    p = own_plan()
    table = emulator.link_table(p, netns.Topology("unit", p, switch="linkemu"), None, None)
    ports = {x["node"]: x for x in table["ports"]}
    assert ports["middle0:second"]["ipv4"] == [p.node("middle0").address2]
    assert ports["middle0:second"]["dev"] not in {ports["middle0"]["dev"], ports["guard0"]["dev"]}
    links = {(x["src"], x["dst"]): x["props"] for x in table["links"]}
    assert links[("middle0:second", "guard0")] == links[("middle0", "guard0")] == {"rate_bps": 1_000_000}
    assert links[("guard0", "middle0:second")] == {"rate_bps": 1_000_000}
    assert ("middle0", "middle0:second") not in links


def test_only_a_variant_with_own_path_gets_the_bind_line(tmp_path):
    for variant, want in (("circswitch-ownpath", True), ("circswitch", False)):
        p = own_plan(variant)
        files = render_all(p, fake_identities(p), str(tmp_path))
        mid = p.node("middle0")
        assert (f"CircSwitchBindAddress {mid.address2}" in files["middle0.torrc"].splitlines()) == want
        assert "CircSwitchBindAddress" not in files["exit0.torrc"]


def test_second_address_is_refused_on_kubernetes_naming_the_group():
    s = scenario.parse(patched(OWN), "t.yaml")
    assert [f for f, _ in engine.unsupported(s, K8sBackend)] == ["second_address"]
    with pytest.raises(InputError, match=r"^s\.yaml: network\.relays\.guard\.second_address: .*local backend only"):
        K8sBackend(console=None, scenario_path=Path("s.yaml")).preflight(s)
