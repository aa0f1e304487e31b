"""The Kubernetes shaper sidecar's netem path (links with delay, jitter, loss), tested as far
as this machine allows (issue 42 item 5; its kernel has no sch_netem): the tc commands the
sidecar renders per peer group are the local backend's for the same link (one function,
torbed.shaping.class_lines), and real tc in a throwaway netns parses every rendered netem
line, so only the kernel's missing qdisc refuses it ("Specified qdisc kind is unknown"), not
a malformed argument. On a kernel with sch_netem the same batch is accepted whole."""

import copy
import subprocess

import pytest

from torbed import scenario as scenario_mod
from torbed import shaping
from torbed.network import plan
from torbed.pods import shaper

from tests.unit.test_faults import BASE
from tests.conftest import scratch_veth

LINKS = {"default": {"rate": "10mbit", "delay": "20ms", "jitter": "5ms", "loss": "1%"},
         "pairs": [{"between": ["guard", "middle"], "rate": "4mbit", "delay": "50ms", "loss": "2%", "loss_burst": 4},
                   {"between": ["exit", "www"], "rate": "20mbit"}]}


def _scenario():
    data = copy.deepcopy(BASE)
    data["links"] = LINKS
    return scenario_mod.parse(data)


def test_netem_leaves_per_peer_group_match_the_local_backend():
    s = _scenario()
    p = plan(s, s.variants[0])
    specs = shaper._link_specs(s, p, "middle")
    cmds, ids = shaper.classes("eth0", specs)
    netem = [c for c in cmds if " netem " in c]
    # Every peer group (middle's other node too) has a delayed link: one netem leaf each,
    # under its htb class; the pair's own values over the default's (jitter inherited).
    assert sorted(specs) == ["authority", "exit", "guard", "middle", "web", "www"]
    assert len(netem) == 6 and all(f"parent {ids[g]} " in "\n".join(netem) for g in specs), cmds
    guard = next(c for c in netem if f"parent {ids['guard']} " in c)
    assert guard.endswith("netem limit 100000 delay 50.000ms 5.000ms distribution normal loss gemodel 0.5102% 25.0000%"), guard
    web = next(c for c in netem if f"parent {ids['web']} " in c)
    assert web.endswith("netem limit 100000 delay 20.000ms 5.000ms distribution normal loss random 1.0000%"), web
    # The local backend's batch for middle0 -> guard0 has the same leaf (the handle differs).
    middle, g = p.group_nodes("middle")[0], p.group_nodes("guard")[0]
    local = shaping.tc_batch(p, middle, netem=True)
    assert guard.split(" netem ", 1)[1] in local
    assert shaping.class_lines("eth0", 2, p.link(middle, g))[1].split(" netem ", 1)[1] == guard.split(" netem ", 1)[1]


def test_authority_pods_shape_the_links_between_authorities():
    # Every authority pod's sidecar is the first authority for _link_specs; the node it reads
    # the authority group's link from must be another one (it was the first as well, so the
    # authorities' links to each other had no class, while the local backend shapes them).
    s = _scenario()
    p = plan(s, s.variants[0])
    auth = p.by_role("authority")
    specs = shaper._link_specs(s, p, "authority")
    assert sorted(specs) == ["authority", "exit", "guard", "middle", "web", "www"]
    assert specs["authority"] == p.link(auth[0], auth[1]) == p.default_link


@pytest.mark.integration
def test_real_tc_parses_every_rendered_netem_line():
    s = _scenario()
    p = plan(s, s.variants[0])
    cmds, _ = shaper.classes("eth0", shaper._link_specs(s, p, "middle"))
    with scratch_veth("tb-netem") as ex:
        netem_here = shaping.probe_kernel().netem
        for line in cmds:
            proc = subprocess.run(ex + ["tc", *line.split()], capture_output=True, text=True)
            if " netem " in line and not netem_here:
                # Parsed by tc, refused by the kernel: exit 2 and the kernel's message.
                assert proc.returncode == 2 and "qdisc kind is unknown" in proc.stderr, (line, proc.stderr)
            else:
                assert proc.returncode == 0, (line, proc.stderr)
        # A malformed netem line is refused by tc itself (exit 1), before the kernel: the
        # distinction the assertion above relies on.
        bad = subprocess.run(ex + ["tc", "qdisc", "add", "dev", "eth0", "parent", "1:2", "handle", "99:", "netem",
                                   "delay", "20ms", "bogus", "3"], capture_output=True, text=True)
        assert bad.returncode == 1 and "bogus" in bad.stderr, bad.stderr
