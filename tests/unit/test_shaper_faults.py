"""Link faults on Kubernetes through the shaper sidecar (torbed.pods.shaper, docs/faults.md):
which pods change toward which peers, the names a peer's addresses come from, the tc
commands of a fault, the fault table kept in step with requests and changing addresses,
the `fault apply|undo` command channel against a running table, and (integration) the
same commands on a real veth: a partition drops, the undo leaves the tree as it was."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from torbed import scenario as scenario_mod
from torbed.backends.k8s.faults import link_sides, peer_args
from torbed.pods import shaper
from torbed.network import LinkSpec, plan

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


def _plan():
    return plan(scenario_mod.load(QUICKSTART), "vanilla")


def _fault(**kw):
    data = scenario_mod.load(QUICKSTART).model_dump(mode="json", exclude_none=True)
    data["faults"] = [{"at": "10s", "kind": "link", "duration": "5s", **kw}]
    return scenario_mod.parse(data).faults[0]


def test_sides_of_a_link_fault_match_the_local_pairs():
    """between: each side's pods toward the other side; target: the target's pods toward
    everyone else and everyone else toward the target, as the local backend's pairs."""
    from torbed.fault_schedule import link_pairs
    p = _plan()
    for f in (_fault(between=["bulk", "guard"], rate="1mbit"), _fault(target="middle0", partition=True)):
        pairs = {(src, dst) for nodes, peers in link_sides(p, f) for src in nodes for dst in peers}
        assert pairs == set(link_pairs(p, f))
    (a, b), (c, d) = link_sides(p, _fault(target="middle0", partition=True))
    assert a == ["middle0"] and "middle0" not in b and len(b) == len(p.nodes) - 1 and (c, d) == (b, a)


def test_peers_are_whole_groups_where_they_can_be():
    p = _plan()
    assert peer_args(p, ["bulk0", "bulk1"]) == ["bulk"]
    assert peer_args(p, ["bulk1", "auth0", "auth1", "auth2", "www0"]) == ["authority", "www", "bulk1"]
    everyone_but_middle = [n.name for n in p.nodes if n.name != "middle0"]
    assert peer_args(p, everyone_but_middle) == ["authority", "guard", "exit", "www", "bulk", "web"]


def test_a_peer_resolves_to_its_group_records_or_its_pod_record():
    s, p = scenario_mod.load(QUICKSTART), _plan()
    names = lambda peer: shaper.node_peer_names("rel", "ns", "cluster.local", s, p, peer)  # noqa: E731
    assert names("bulk") == ["rel-bulk.ns.svc.cluster.local"]
    # A StatefulSet's or indexed Job's pod: <pod>.<governing Service>.
    assert names("bulk1") == ["rel-bulk-1.rel-bulk.ns.svc.cluster.local"]
    # An authority: its pod and its own ClusterIP (what a sender's egress sees).
    assert names("auth2") == ["rel-auth-2.rel-auth.ns.svc.cluster.local", "rel-auth-2.ns.svc.cluster.local"]
    # Alone in its group: the group's records (a server pod has no record of its own).
    assert names("www0") == names("www") == ["rel-www.ns.svc.cluster.local", "rel-www-pods.ns.svc.cluster.local"]
    assert shaper.peer_group(p, "bulk1") == "bulk" and shaper.peer_group(p, "authority") == "authority"


def test_fault_classes_keep_the_groups_queue_and_partition_uses_the_drop_class():
    specs = {"guard": LinkSpec(rate_bps=4_000_000, queue_bytes=30000)}
    cmds, ids = shaper.fault_classes("eth0", {"id": 3, "rate_bps": 1_000_000}, ["guard", "exit", "guard"], specs)
    assert ids == {"exit": "1:10c0", "guard": "1:10c1"}   # 0x1000 + 3 * 0x40 + k, sorted groups
    text = "\n".join(cmds)
    assert "classid 1:10c1 htb rate 1000000bit ceil 1000000bit" in text
    assert "parent 1:10c1 handle 10c1: bfifo limit 30000" in text      # guard's queue kept
    assert "classid 1:10c0 htb rate 1000000bit" in text and "parent 1:10c0" not in text
    assert shaper.fault_classes("eth0", {"id": 0, "partition": True}, ["guard"], specs) == \
        ([], {"guard": shaper.DROP_CLASS})
    assert shaper.class_del("eth0", [shaper.DROP_CLASS, "1:10c1"]) == ["class del dev eth0 classid 1:10c1"]
    # The last fault id's classes still fit htb's 16-bit minor.
    _, top = shaper.fault_classes("eth0", {"id": shaper.MAX_FAULT_ID, "rate_bps": 8000}, ["g"], {})
    assert int(top["g"].split(":")[1], 16) + shaper.FAULT_MINORS - 1 <= 0xffff


class Table:
    """A FaultTable with tc replaced by a recorder and DNS by a dict."""

    def __init__(self, state: Path, dns: dict[str, set[str]], fill=None):
        self.batches: list[list[str]] = []
        self.dns = dns
        p = _plan()
        s = p.scenario
        self.table = shaper.FaultTable(
            "eth0", state, {"guard": LinkSpec(rate_bps=4_000_000)},
            lambda peer: shaper.node_peer_names("rel", "ns", "cluster.local", s, p, peer),
            lambda peer: shaper.peer_group(p, peer), batch=self.batches.append, fill=fill)

    def step(self):
        self.batches.clear()
        self.table.step({"10.0.0.1"}, resolver=lambda name: set(self.dns.get(name, ())))
        return [c for b in self.batches for c in b]


def _request(state: Path, i: int, nonce: str = "n1", **kw):
    (state / "faults").mkdir(parents=True, exist_ok=True)
    (state / "faults" / f"{i}.json").write_text(json.dumps({"id": i, "nonce": nonce, **kw}))



def test_fault_table_adds_announced_addresses_dns_does_not_list_yet(tmp_path):
    """A fault soon after the start: cluster DNS may still answer a group's name from a cache
    filled before its pods existed; the addresses the peers announced are used too."""
    announced = {"guard": {"10.0.0.5", "10.0.0.1"}}
    t = Table(tmp_path, {}, fill=lambda peer, found: found | announced.get(shaper.peer_group(_plan(), peer), set()))
    _request(tmp_path, 0, peers=["guard"], partition=True, rate_bps=None)
    cmds = t.step()
    assert [c for c in cmds if c.startswith("filter")] == [
        "filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.0.0.5/32 flowid 1:fff"]   # not its own
    ack = json.loads((tmp_path / "applied.json").read_text())["faults"]["0"]
    assert ack["addresses"] == {"guard": ["10.0.0.5"]}

def test_fault_table_follows_requests_and_peer_addresses(tmp_path):
    dns = {"rel-guard.ns.svc.cluster.local": {"10.0.0.5"}, "rel-bulk-1.rel-bulk.ns.svc.cluster.local": {"10.0.0.9"}}
    t = Table(tmp_path, dns)
    assert t.step() == [] and json.loads((tmp_path / "applied.json").read_text())["faults"] == {}
    _request(tmp_path, 2, peers=["guard", "bulk1"], rate_bps=1_000_000, partition=False)
    cmds = t.step()
    assert [c.split(" classid ")[1].split()[0] for c in cmds if c.startswith("class add")] == ["1:1080", "1:1081"]
    assert [c for c in cmds if c.startswith("filter")] == [
        "filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.0.0.5/32 flowid 1:1081",
        "filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.0.0.9/32 flowid 1:1080"]
    ack = json.loads((tmp_path / "applied.json").read_text())["faults"]["2"]
    assert ack["nonce"] == "n1" and ack["addresses"] == {"guard": ["10.0.0.5"], "bulk1": ["10.0.0.9"]}
    assert t.step() == []                     # nothing changed: tc untouched
    # guard's pod recreated with a new address: the fault's filter follows it.
    dns["rel-guard.ns.svc.cluster.local"] = {"10.0.0.6"}
    cmds = t.step()
    assert cmds[0] == "filter del dev eth0 parent 1: prio 1" and any("10.0.0.6/32 flowid 1:1081" in c for c in cmds)
    assert not any("class" in c.split()[0] for c in cmds)
    # A second fault (partition toward exit) beside it; then the first one undone.
    dns["rel-exit.ns.svc.cluster.local"] = {"10.0.0.7"}
    _request(tmp_path, 4, peers=["exit"], partition=True, rate_bps=None)
    cmds = t.step()
    assert any(c.endswith(f"10.0.0.7/32 flowid {shaper.DROP_CLASS}") for c in cmds)
    assert not [c for c in cmds if c.startswith("class")]
    (tmp_path / "faults" / "2.json").unlink()
    cmds = t.step()
    # The filters go first (a filter pins its class), then the classes.
    assert cmds[0] == "filter del dev eth0 parent 1: prio 1" and len([c for c in cmds if c.startswith("filter add")]) == 1
    assert cmds[-2:] == ["class del dev eth0 classid 1:1080", "class del dev eth0 classid 1:1081"]
    assert list(json.loads((tmp_path / "applied.json").read_text())["faults"]) == ["4"]
    (tmp_path / "faults" / "4.json").unlink()
    assert t.step() == ["filter del dev eth0 parent 1: prio 1"]


def test_a_failed_tc_change_is_acknowledged_as_an_error(tmp_path):
    t = Table(tmp_path, {})

    def refuse(cmds):
        if cmds:
            raise shaper.TcError("RTNETLINK answers: File exists")
    t.table.batch = refuse
    _request(tmp_path, 1, peers=["guard"], rate_bps=1_000_000, partition=False)
    t.step()
    ack = json.loads((tmp_path / "applied.json").read_text())["faults"]["1"]
    assert ack["error"] == "tc: RTNETLINK answers: File exists" and ack["classes"] == {}


def _fault_cmd(state: Path, *args, timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torbed.pods.shaper", "fault", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=timeout + 20)


def test_fault_command_round_trip_with_a_running_table(tmp_path):
    """`fault apply` returns once the table has acknowledged its request (with the classes
    and addresses), `fault undo` once the fault is gone; without a shaper it times out."""
    dns = {"rel-exit.ns.svc.cluster.local": {"10.0.0.7"}}
    t = Table(tmp_path, dns)
    stop = threading.Event()

    def loop():   # the shaper's loop without its SIGUSR1 wake-up: the command still gets its answer
        while not stop.is_set():
            t.table.step({"10.0.0.1"}, resolver=lambda name: set(dns.get(name, ())))
            stop.wait(0.2)
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        p = _fault_cmd(tmp_path, "apply", "--id", "5", "--peer", "exit", "--rate-bps", "2000000")
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(shaper.REPLY)
        out = json.loads(p.stdout[len(shaper.REPLY):])
        assert out["classes"] == {"exit": "1:1140"} and out["addresses"] == {"exit": ["10.0.0.7"]}
        assert list(t.table.applied) == [5]
        p = _fault_cmd(tmp_path, "undo", "--id", "5")
        assert p.returncode == 0 and json.loads(p.stdout[len(shaper.REPLY):])["undone"], p.stderr
        assert t.table.applied == {} and not (tmp_path / "faults" / "5.json").exists()
    finally:
        stop.set()
        th.join()
    p = _fault_cmd(tmp_path, "apply", "--id", "6", "--peer", "exit", "--partition", "--timeout", "0.5")
    assert p.returncode == 1 and "did not acknowledge the apply within 0.5 s" in p.stderr
    p = _fault_cmd(tmp_path, "apply", "--id", "6", "--peer", "exit")
    assert p.returncode == 2 and "--rate-bps or --partition" in p.stderr


def _tree(ex: list[str]) -> tuple[set[str], set[str]]:
    show = lambda what: subprocess.run(ex + ["tc", what, "show", "dev", "eth0"],  # noqa: E731
                                       capture_output=True, text=True).stdout
    return shaper.tree_summary(show("class"), show("filter"))


@pytest.mark.integration
def test_fault_commands_on_a_real_veth_drop_then_leave_the_tree_as_it_was(tmp_path):
    """The shaper's tree (classes, peer filters, isolation) on a veth; a partition toward
    the peer drops its packets (the drop class counts them), a rate fault gets a class of
    that rate; after both are undone the classes and filters are those from before."""
    pod, peer = f"tb-sfp-{uuid.uuid4().hex[:6]}", f"tb-sfq-{uuid.uuid4().hex[:6]}"
    for ns in (pod, peer):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], check=True)
    ex = ["ip", "netns", "exec", pod]

    def batch(cmds):
        if cmds:
            proc = subprocess.run(ex + ["tc", "-batch", "-"], input="\n".join(cmds) + "\n",
                                  capture_output=True, text=True)
            if proc.returncode:
                raise shaper.TcError(proc.stderr.strip())
    try:
        subprocess.run(ex + ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "p0", "netns", peer], check=True)
        subprocess.run(ex + ["ip", "addr", "add", "10.9.0.1/24", "dev", "eth0"], check=True)
        subprocess.run(ex + ["ip", "link", "set", "eth0", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", peer, "ip", "addr", "add", "10.9.0.2/24", "dev", "p0"], check=True)
        subprocess.run(["ip", "netns", "exec", peer, "ip", "link", "set", "p0", "up"], check=True)
        # A permanent neighbour: ARP (not IP) would pass any IP filter and count as received.
        mac = subprocess.run(
            ["ip", "netns", "exec", peer, "cat", "/sys/class/net/p0/address"], capture_output=True, text=True,
            check=True).stdout.strip()
        subprocess.run(ex + ["ip", "neigh", "replace", "10.9.0.2", "lladdr", mac, "dev", "eth0", "nud", "permanent"],
                       check=True)
        specs = {"guard": LinkSpec(rate_bps=4_000_000)}
        cmds, ids = shaper.classes("eth0", specs)
        batch(cmds + shaper.isolation("eth0", shaper.DEFAULT_ALLOW))
        batch(shaper.filters("eth0", {"10.9.0.2": ids["guard"]}, {}))
        before = _tree(ex)
        dns = {"rel-guard.ns.svc.cluster.local": {"10.9.0.2"}, "rel-exit.ns.svc.cluster.local": {"10.9.0.3"}}
        p = _plan()
        table = shaper.FaultTable("eth0", tmp_path, specs,
                                  lambda x: shaper.node_peer_names("rel", "ns", "cluster.local", p.scenario, p, x),
                                  lambda x: shaper.peer_group(p, x), batch=batch)
        step = lambda: table.step({"10.9.0.1"}, resolver=lambda n: set(dns.get(n, ())))  # noqa: E731
        _request(tmp_path, 0, peers=["guard"], partition=True, rate_bps=None)
        _request(tmp_path, 1, peers=["exit"], rate_bps=1_000_000, partition=False)
        step()
        assert table.filter_error is None and all(not a["error"] for a in table.applied.values())
        cls, flt = _tree(ex)
        assert "pref 1 ip -> 1:fff 0a090002/ffffffff" in flt and "pref 1 ip -> 1:1040 0a090003/ffffffff" in flt
        assert "htb 1:1040 rate 1Mbit" in cls, cls
        send = ("import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                "for _ in range(5): s.sendto(b'x'*100,(sys.argv[1],9))")
        rx = lambda: int(subprocess.run(["ip", "netns", "exec", peer, "cat", "/sys/class/net/p0/statistics/rx_packets"],  # noqa: E731
                                        capture_output=True, text=True, check=True).stdout)
        n0 = rx()
        subprocess.run(ex + [sys.executable, "-c", send, "10.9.0.2"], check=True)
        assert rx() - n0 == 0, "a partition lets nothing through"
        (tmp_path / "faults" / "0.json").unlink()
        (tmp_path / "faults" / "1.json").unlink()
        step()
        assert table.applied == {} and table.filter_error is None
        assert _tree(ex) == before
        n0 = rx()
        subprocess.run(ex + [sys.executable, "-c", send, "10.9.0.2"], check=True)
        assert rx() - n0 >= 5, "traffic passes again after the undo"
    finally:
        for ns in (pod, peer):
            subprocess.run(["ip", "netns", "del", ns], check=False)


class StubCtx:
    """The backend's link-fault context without a cluster: pods by node, and the shaper's
    replies (the exec itself is exercised on a real cluster, tests/e2e/test_faults_k8s.py)."""

    def __init__(self, p, fail: set[str] = frozenset()):
        from types import SimpleNamespace
        self.plan, self.fail, self.calls = p, fail, []
        self.pods = {n.name: SimpleNamespace(metadata=SimpleNamespace(name=f"rel-{n.group}-{n.index}", uid=f"u-{n.name}"))
                     for n in p.nodes}

    def node_pods(self):
        return dict(self.pods)

    def exec_shaper(self, pod, argv, what):
        from torbed.errors import RunFailed
        self.calls.append((pod, argv))
        if pod in self.fail:
            raise RunFailed(f"{what} in {pod}: the shaper did not acknowledge")
        peers = [argv[k + 1] for k, a in enumerate(argv) if a == "--peer"]
        return {"classes": {}, "addresses": {x: [] for x in peers}, "took_s": 0.01}


def test_backend_link_fault_visits_each_side_and_undo_skips_recreated_pods():
    from torbed.backends.k8s.faults import Link
    from torbed.errors import RunFailed
    p = _plan()
    ctx = StubCtx(p)
    f = _fault(target="middle0", partition=True)
    act = Link(0, f, ["middle0"])
    act.apply(ctx)
    peers = {pod: [argv[k + 1] for k, a in enumerate(argv) if a == "--peer"] for pod, argv in ctx.calls}
    assert len(peers) == len(p.nodes)
    assert peers["rel-middle-0"] == ["authority", "guard", "exit", "www", "bulk", "web"]
    assert all(v == ["middle"] for k, v in peers.items() if k != "rel-middle-0")   # its whole group
    assert all(argv[-1] == "--partition" and argv[argv.index("--id") + 1] == "0" for _, argv in ctx.calls)
    assert act.record["shaper"]["rel-guard-0"]["peers"] == ["middle"]
    # bulk1's pod recreated (another UID), web0's ended: only the others are asked to undo.
    from types import SimpleNamespace
    ctx.pods["bulk1"] = SimpleNamespace(metadata=SimpleNamespace(name="rel-bulk-1", uid="new"))
    del ctx.pods["web0"]
    ctx.calls.clear()
    done = act.undo(ctx, "duration")
    assert sorted(pod for pod, _ in ctx.calls) == sorted(set(peers) - {"rel-bulk-1", "rel-web-0"})
    assert all(argv[-3:] == ["undo", "--id", "0"] for _, argv in ctx.calls)
    assert done.endswith("ended or recreated since: rel-bulk-1, rel-web-0")
    # A pod that fails: the fault fails, and undo still visits every pod (it may have the request).
    ctx = StubCtx(p, fail={"rel-guard-0"})
    act = Link(1, _fault(between=["bulk", "guard"], rate="1mbit"), ["bulk0", "bulk1", "guard0"])
    with pytest.raises(RunFailed, match="rel-guard-0"):
        act.apply(ctx)
    assert [argv[-2:] for _, argv in ctx.calls] == [["--rate-bps", "1000000"]] * 3
    ctx.fail, ctx.calls = set(), []
    act.undo(ctx, "teardown")
    assert sorted(pod for pod, _ in ctx.calls) == ["rel-bulk-0", "rel-bulk-1", "rel-guard-0"]


def test_gate_samples_of_a_relay_pod_name_its_rate_limited_links_by_peer_group(tmp_path):
    """The sidecar's mechanism-gate samples (torbed.pods.shaper.gate_sources): the quickstart's
    middle0 shapes its 4 mbit link toward the guard group and 100 mbit toward the rest; its
    htb classes' backlog is recorded under <node>><group>, its send queues summed per peer
    group of the installed filters; the authorities' classes are not sampled."""
    from torbed.records import read_records
    p = _plan()
    s = scenario_mod.load(QUICKSTART)
    specs = shaper._link_specs(s, p, "middle")
    cmds, ids = shaper.classes("eth0", specs)
    # iproute2 6.1 prints htb class statistics as text even with -j
    tc_text = (f"class htb {ids['guard']} root prio 0 rate 4Mbit ceil 4Mbit burst 1600b cburst 1600b\n"
               " Sent 10 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)\n backlog 60000b 40p requeues 0\n\n"
               f"class htb {ids['authority']} root prio 0 rate 100Mbit ceil 100Mbit burst 1600b cburst 1600b\n"
               " Sent 10 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)\n backlog 9000b 6p requeues 0\n")
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, tc_text, "")

    tcp = tmp_path / "tcp"
    # sockets toward 10.0.0.13 (a guard pod) and 10.0.0.99 (an address no filter names)
    tcp.write_text("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
                   "   1: 0C00000A:1388 0D00000A:A028 01 0001E240:00000FA0 01:00000014 00000000  1000\n"
                   "   2: 0C00000A:98EF 6300000A:0050 01 00000100:00000000 00:00000000 00000000     0\n")
    sources, sockets = shaper.gate_sources(p, "middle", "middle0", "eth0", specs, ids, tmp_path / "rec",
                                           run=run, tcp=tcp)
    assert sockets is not None and len(sources) == 2
    sockets.peers = shaper.socket_peers({"10.0.0.13": ids["guard"], "10.0.0.20": ids["authority"]}, ids, p)
    assert sockets.peers == {"10.0.0.13": "guard"}
    for src in sources:
        src(1000.0)
        src.writer.close()
    shaped = read_records(tmp_path / "rec" / "shaper.jsonl")
    links = {ln["link"]: ln["rate_bps"] for ln in shaped[0]["links"]}
    assert links["middle0>guard"] == 4_000_000 and "middle0>authority" not in links
    assert set(links) == {f"middle0>{g}" for g in ids if g != "authority"}
    assert shaped[1] == {"type": "shaper", "t": 1000.0, "backlog": {"middle0>guard": 60000}, "senders": ["middle0"]}
    assert calls == [["tc", "-s", "-j", "class", "show", "dev", "eth0"]]
    assert read_records(tmp_path / "rec" / "sockets.jsonl") == [
        {"type": "sockets", "t": 1000.0, "send_q": {"middle0>guard": 0x1E240}, "senders": ["middle0"]}]
    # A client pod: no send queues (the relays' only, as locally); an authority: nothing.
    assert shaper.gate_sources(p, "web", "web0", "eth0", shaper._link_specs(s, p, "web"),
                               shaper.classes("eth0", shaper._link_specs(s, p, "web"))[1], tmp_path / "c")[1] is None
    assert shaper.gate_sources(p, "authority", "auth0", "eth0", {}, {}, tmp_path / "a") == ([], None)


def test_gate_records_name_the_node_as_the_pods_driver_does(monkeypatch):
    """A client Job's sidecar is given the completion index (chart: torbed.shaper "indexed"),
    so its records say web2 as the driver's do; a StatefulSet pod names itself by ordinal; a
    pod with neither (Locust's) keeps its name's suffix."""
    monkeypatch.setenv("POD_NAME", "rel-web-7xk2p")
    monkeypatch.setenv("TORBED_INDEX", "2")
    assert shaper._sender_name("web") == "web2"
    monkeypatch.delenv("TORBED_INDEX")
    monkeypatch.setenv("POD_NAME", "rel-middle-1")
    assert shaper._sender_name("middle") == "middle1"
    monkeypatch.setenv("POD_NAME", "rel-load-7xk2p")
    assert shaper._sender_name("load") == "load-7xk2p"
