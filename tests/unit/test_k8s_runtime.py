"""The programs of the chart's pods (torbed.pods), exercised for real outside a cluster:
the results service and the shipper over HTTP on loopback, key generation with the real
tor-gencert and tor, the shaper's tc tree in a throwaway network namespace."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from torbed import scenario as scenario_mod
from torbed.pods import Shipper, keygen, results, shaper
from torbed.network import plan

from tests.conftest import scratch_veth

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


@pytest.fixture
def service(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), results.make_handler(d))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield d, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_shipper_sends_whole_lines_once_in_order(service, tmp_path):
    d, url = service
    src = tmp_path / "out"
    src.mkdir()
    sh = Shipper(src, url, interval=3600)
    f = src / "transfers.jsonl"
    f.write_text('{"a": 1}\n{"b": 2}\n{"c": ')          # the last record is half written
    assert sh.ship()
    assert (d / "transfers.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n'
    with open(f, "a") as fh:
        fh.write('3}\n')
    assert sh.ship() and sh.ship()                       # a second round sends nothing twice
    assert (d / "transfers.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n{"c": 3}\n'


def test_shipper_keeps_what_the_service_did_not_take(tmp_path):
    src = tmp_path / "out"
    src.mkdir()
    (src / "cellstats.jsonl").write_text('{"x": 1}\n')
    # Nothing listens on this port yet: the round fails and the offset stays.
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    sh = Shipper(src, f"http://127.0.0.1:{port}", interval=3600)
    assert not sh.ship()
    d = tmp_path / "results"
    d.mkdir()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), results.make_handler(d))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        assert sh.ship()
        assert (d / "cellstats.jsonl").read_text() == '{"x": 1}\n'
    finally:
        srv.shutdown()
        srv.server_close()


def test_results_service_rejects_bad_names_and_partial_lines(service):
    import urllib.error
    import urllib.request
    d, url = service
    for path, body in (("/append/..%2fescape", b"x\n"), ("/append/a/b", b"x\n"), ("/append/ok.jsonl", b"partial")):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url + path, data=body, method="POST"))
        assert e.value.code == 400
    assert list(d.iterdir()) == []


def test_concurrent_appends_never_interleave(service, tmp_path):
    d, url = service
    shippers = []
    for w in range(4):
        src = tmp_path / f"w{w}"
        src.mkdir()
        (src / "all.jsonl").write_text("".join(json.dumps({"w": w, "i": i, "pad": "x" * 500}) + "\n" for i in range(200)))
        shippers.append(Shipper(src, url, interval=3600))
    threads = [threading.Thread(target=s.ship) for s in shippers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (d / "all.jsonl").read_text().splitlines()
    assert len(lines) == 800
    seen = [json.loads(line) for line in lines]          # every line parses: no interleaving
    for w in range(4):
        assert [r["i"] for r in seen if r["w"] == w] == list(range(200))


def test_keygen_makes_keys_that_match_the_identities(tmp_path, monkeypatch):
    data = yaml.safe_load(QUICKSTART.read_text())
    monkeypatch.setenv("TORBED_SCENARIO_JSON", json.dumps(data))
    monkeypatch.setenv("TORBED_VARIANT", "ewma-66")
    secret, identities = keygen.make(tmp_path / "work")
    fprs = json.loads(identities["fingerprints.json"])
    assert sorted(fprs) == ["auth0", "auth1", "auth2", "exit0", "guard0", "middle0"]
    # Each node's secret_id_key, put back into a data directory, gives the published fingerprint.
    for node in ("auth1", "middle0"):
        dd = tmp_path / f"check-{node}"
        (dd / "keys").mkdir(parents=True)
        for name, b64 in secret.items():
            if name.startswith(node + "."):
                (dd / "keys" / name[len(node) + 1:]).write_bytes(base64.b64decode(b64))
        dd.chmod(0o700)
        empty = tmp_path / "empty.torrc"
        empty.write_text("")
        subprocess.run(["tor", "--list-fingerprint", "-f", str(empty), "--defaults-torrc", str(empty),
                        "--DataDirectory", str(dd), "--ORPort", "5000", "--Nickname", node, "--Log", "err stderr"],
                       check=True, capture_output=True)
        assert (dd / "fingerprint").read_text().split()[1:] and \
            "".join((dd / "fingerprint").read_text().split()[1:]) == fprs[node]
    auth = [line.split() for line in identities["authorities.txt"].splitlines()]
    assert [a[0] for a in auth] == ["auth0", "auth1", "auth2"]
    assert all(a[2] == fprs[a[0]] and len(a[1]) == 40 for a in auth)
    assert "auth0.authority_certificate" in secret and "guard0.authority_certificate" not in secret
    vote = identities["vote.torrc"]
    assert f"TestingDirAuthVoteGuard {fprs['guard0']}\n" in vote
    assert f"TestingDirAuthVoteExit {fprs['exit0']}\n" in vote
    assert "ConsensusParams cc_alg=0 cfx_enabled=0" in vote
    assert "v3bw" not in identities and "V3BandwidthsFile" not in vote   # the quickstart has no weights


def test_keygen_writes_the_bandwidth_file_of_a_weighted_scenario(tmp_path, monkeypatch):
    """With weights the hook is where the relays' fingerprints first exist: it writes the
    authorities' bandwidth file beside their vote, one line per relay with its group's weight."""
    data = yaml.safe_load(QUICKSTART.read_text())
    weights = {"guard": 5000, "middle": 700, "exit": 123}
    for g, w in weights.items():
        data["network"]["relays"][g]["weights"] = [w]
    monkeypatch.setenv("TORBED_SCENARIO_JSON", json.dumps(data))
    monkeypatch.setenv("TORBED_VARIANT", "vanilla")
    _, identities = keygen.make(tmp_path / "work")
    fprs = json.loads(identities["fingerprints.json"])
    lines = identities["v3bw"].splitlines()
    assert abs(int(lines[0]) - time.time()) < 600          # the file's timestamp: now
    assert sorted(lines[1:]) == sorted(f"node_id=${fprs[g + '0']} bw={w}" for g, w in weights.items())
    assert "V3BandwidthsFile /etc/torbed/identities/v3bw\n" in identities["vote.torrc"]


def test_keygen_schedule_puts_the_first_valid_after_vote_lead_after_the_hook():
    for t_hook in (1795540000.0, 1795540003.7, 1795540009.99):
        identities = {"vote.torrc": "# vote\n"}
        sched = keygen.schedule(identities, t_hook)
        offset = sched["voting_offset_s"]
        assert json.loads(identities["schedule.json"]) == sched
        assert identities["vote.torrc"].splitlines()[-1] == f"TestingV3AuthVotingStartOffset {offset}"
        # tor's valid-after times are k * 10 + offset; one of them is vote_lead_s (less < 1 s)
        # after the hook, so the vote for it (4 s before) falls after the pods' start.
        target = [t for t in range(int(t_hook) + 1, int(t_hook) + 20) if t % 10 == offset]
        assert any(t_hook + keygen.VOTE_LEAD_S - 1 < t <= t_hook + keygen.VOTE_LEAD_S for t in target), (t_hook, offset)


def _quickstart_specs(group: str):
    s = scenario_mod.load(QUICKSTART)
    p = plan(s, "ewma-66")
    me = p.group_nodes(group)[0]
    out = {}
    for g in ["authority", *s.network.relays, *s.servers, *s.clients]:
        peer = p.by_role("authority")[-1] if g == "authority" else p.group_nodes(g)[-1]
        if peer is not me:
            out[g] = p.link(me, peer)
    return out


def test_shaper_tree_matches_the_scenario_links():
    cmds, ids = shaper.classes("eth0", _quickstart_specs("middle"))
    text = "\n".join(cmds)
    # quickstart: guard <-> middle at 4mbit, every other link at the 100mbit default.
    assert f"classid {ids['guard']} htb rate 4000000bit ceil 4000000bit" in text
    assert f"classid {ids['exit']} htb rate 100000000bit" in text
    assert len(set(ids.values())) == len(ids)
    first = shaper.filters("eth0", {"10.1.0.5": ids["guard"]}, {})
    assert len(first) == 1 and f"match ip dst 10.1.0.5/32 flowid {ids['guard']}" in first[0]
    again = shaper.filters("eth0", {"10.1.0.6": ids["guard"]}, {"10.1.0.5": ids["guard"]})
    assert again[0] == "filter del dev eth0 parent 1: prio 2" and "10.1.0.6/32" in again[1]


@pytest.mark.integration
def test_shaper_commands_are_accepted_by_the_kernel():
    """The same batch the sidecar runs, applied by real tc to a veth in a throwaway netns."""
    with scratch_veth("tb-shaper") as ex:
        cmds, ids = shaper.classes("eth0", _quickstart_specs("middle"))
        first = {"10.1.0.5": ids["guard"], "10.1.0.6": ids["exit"]}
        for batch in (cmds, shaper.filters("eth0", first, {}),
                      shaper.filters("eth0", {"10.1.0.7": ids["guard"]}, first)):
            proc = subprocess.run(ex + ["tc", "-batch", "-"], input="\n".join(batch) + "\n",
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
        shown = subprocess.run(ex + ["tc", "filter", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        # The second update replaced the first: only 10.1.0.7 is classified now.
        assert "0a010007" in shown and "0a010005" not in shown and "0a010006" not in shown
        classes = subprocess.run(ex + ["tc", "class", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert "rate 4Mbit" in classes


def _rx_packets(ns: str, dev: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/rx_packets"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


@pytest.mark.integration
def test_isolation_drops_egress_outside_the_allowed_ranges():
    """Two namespaces joined by a veth; the 'pod' side runs the shaper's tree. Traffic to the
    peer's private address passes; a route to a public address exists, but packets to it
    are dropped at the pod's interface (counted by the drop filter)."""
    pod, peer = f"tb-iso-{uuid.uuid4().hex[:6]}", f"tb-isp-{uuid.uuid4().hex[:6]}"
    for ns in (pod, peer):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        # No IPv6 neighbour discovery: its packets would count as received on the peer.
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], check=True)
    try:
        ex = ["ip", "netns", "exec", pod]
        subprocess.run(ex + ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "p0", "netns", peer], check=True)
        subprocess.run(ex + ["ip", "addr", "add", "10.9.0.1/24", "dev", "eth0"], check=True)
        subprocess.run(ex + ["ip", "link", "set", "eth0", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", peer, "ip", "addr", "add", "10.9.0.2/24", "dev", "p0"], check=True)
        subprocess.run(["ip", "netns", "exec", peer, "ip", "link", "set", "p0", "up"], check=True)
        subprocess.run(ex + ["ip", "route", "add", "default", "via", "10.9.0.2"], check=True)
        cmds, _ = shaper.classes("eth0", {})
        batch = cmds + shaper.isolation("eth0", shaper.DEFAULT_ALLOW)
        proc = subprocess.run(ex + ["tc", "-batch", "-"], input="\n".join(batch) + "\n", capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        send = ("import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                "for _ in range(5): s.sendto(b'x'*100,(sys.argv[1],9))")
        # The peer's side counts what arrives: private traffic does, public does not leave.
        before = _rx_packets(peer, "p0")
        subprocess.run(ex + [sys.executable, "-c", send, "10.9.0.2"], check=True)
        private = _rx_packets(peer, "p0") - before
        before = _rx_packets(peer, "p0")
        subprocess.run(ex + [sys.executable, "-c", send, "198.51.100.7"], check=True)
        public = _rx_packets(peer, "p0") - before
        assert private >= 5 and public == 0, (private, public)
        stats = subprocess.run(ex + ["tc", "-s", "class", "show", "dev", "eth0", "classid", shaper.DROP_CLASS],
                               capture_output=True, text=True).stdout
        assert int(stats.split("dropped ")[1].split(",")[0]) >= 5, stats
    finally:
        for ns in (pod, peer):
            subprocess.run(["ip", "netns", "del", ns], check=False)



@contextlib.contextmanager
def results_server(tmp_path, **kw):
    """A real results service on a loopback port; yields its URL."""
    d = tmp_path / "results"
    d.mkdir(exist_ok=True)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), results.make_handler(d, **kw))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()

def test_start_barrier_waits_for_every_client(tmp_path):
    import urllib.request
    with results_server(tmp_path, clients=2) as url:
        def post(path):
            with urllib.request.urlopen(urllib.request.Request(url + path, data=b"", method="POST")) as r:
                return json.loads(r.read())
        assert post("/ready/bulk0") == {"ready": 1, "of": 2, "shaped": 0, "shapers": 0}
        assert post("/ready/bulk0")["ready"] == 1          # reporting twice counts once
        with urllib.request.urlopen(url + "/start") as r:
            assert r.status == 204
        body = post("/ready/web0")
        assert body["ready"] == 2 and body["t_workload"] > body["t_all_ready"]
        from torbed.pods.bringup import wait_start
        import time as _t
        assert wait_start(url, node="web0", deadline=_t.time() + 5) == body["t_workload"]



def test_one_start_barrier_wait_for_clients_and_the_locust_master(tmp_path):
    """bringup.wait_start: a client reports itself ready first; the Locust master (not a
    client) only polls, for as long as its Locust runs."""
    import time as _t
    from torbed.pods.bringup import wait_start
    with results_server(tmp_path, clients=1) as url:
        assert wait_start(url, deadline=_t.time() + 0.5) is None                # nobody ready: the deadline passes
        assert wait_start(url, alive=lambda: False) is None                     # Locust ended
        t = wait_start(url, node="web0", deadline=_t.time() + 5)                # reports web0 ready: opens it
        assert t is not None and wait_start(url, alive=lambda: True, interval=0.5) == t

def test_start_barrier_also_waits_for_the_shapers(tmp_path):
    import urllib.request
    with results_server(tmp_path, clients=1, shapers=2) as url:
        assert shaper.report_complete(url, "tb-guard-0")
        with urllib.request.urlopen(urllib.request.Request(url + "/ready/web0", data=b"", method="POST")) as r:
            assert "t_workload" not in json.loads(r.read())     # one shaper still missing
        assert shaper.report_complete(url, "tb-middle-0")
        with urllib.request.urlopen(url + "/start") as r:
            assert r.status == 200



def test_shapers_find_each_other_through_the_results_service(tmp_path):
    """Announced addresses are listed per pod (a second announcement replaces the first);
    bad announcements are refused with 400 and change nothing."""
    import urllib.error
    import urllib.request
    with results_server(tmp_path, clients=1, shapers=2) as url:
        assert shaper.announced(url) == {}
        assert shaper.announce(url, "tb-guard-0", "guard", "10.244.0.7")
        assert shaper.announce(url, "tb-bulk-0-x1", "bulk", "10.244.0.8")
        assert shaper.announce(url, "tb-bulk-1-x2", "bulk", "10.244.0.9")
        assert shaper.announce(url, "tb-guard-0", "guard", "10.244.0.17")    # restarted: new address
        assert shaper.announced(url) == {"guard": {"10.244.0.17"}, "bulk": {"10.244.0.8", "10.244.0.9"}}
        for path, body in (("/peer/tb-x", b'{"group": "guard", "ip": "not-an-ip"}'),
                           ("/peer/tb-x", b'{"ip": "10.0.0.1"}'),
                           ("/peer/tb-x", b"[1, 2]"),
                           ("/peer/tb-x", b'{"group": "a b", "ip": "10.0.0.1"}'),
                           ("/peer/..", b'{"group": "guard", "ip": "10.0.0.1"}')):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(url + path, data=body, method="POST"))
            assert e.value.code == 400, path
        assert sum(len(v) for v in shaper.announced(url).values()) == 3
        assert shaper.announced("http://127.0.0.1:9") == {}                 # nobody there: nothing


def test_shaper_uses_announced_addresses_until_dns_lists_every_peer():
    ids = {"guard": "1:5", "bulk": "1:3"}
    expected = {"guard": 1, "bulk": 2}
    own = {"10.244.0.5"}
    settled: set[str] = set()
    # DNS still answers from a cache filled before the pods existed: nothing for bulk.
    want, complete = shaper.peer_table(ids, {"guard": {"10.244.0.7"}, "bulk": set()},
                                       {"bulk": {"10.244.0.8", "10.244.0.9", "10.244.0.5"}}, expected, settled, own)
    assert complete and want == {"10.244.0.7": "1:5", "10.244.0.8": "1:3", "10.244.0.9": "1:3"}
    assert settled == {"guard"}
    # Without the announcements the group is incomplete, as before this existed.
    want, complete = shaper.peer_table(ids, {"guard": {"10.244.0.7"}, "bulk": {"10.244.0.8"}}, {}, expected, set(), own)
    assert not complete and want == {"10.244.0.7": "1:5", "10.244.0.8": "1:3"}
    # Once DNS has the whole group, DNS alone decides: a stale announcement is dropped.
    want, complete = shaper.peer_table(ids, {"guard": {"10.244.0.7"}, "bulk": {"10.244.0.8", "10.244.0.10"}},
                                       {"bulk": {"10.244.0.8", "10.244.0.9"}}, expected, settled, own)
    assert complete and settled == {"guard", "bulk"}
    assert want == {"10.244.0.7": "1:5", "10.244.0.8": "1:3", "10.244.0.10": "1:3"}
    # ... also when DNS loses a pod later (a replaced Job pod): no announcement fills the gap.
    want, complete = shaper.peer_table(ids, {"guard": {"10.244.0.7"}, "bulk": {"10.244.0.8"}},
                                       {"bulk": {"10.244.0.9"}}, expected, settled, own)
    assert not complete and "10.244.0.9" not in want

def test_shaper_knows_how_many_addresses_each_peer_group_has():
    s = scenario_mod.load(QUICKSTART)
    assert shaper.expected_addresses(s, "authority", "middle") == 6     # 3 pods + 3 ClusterIPs
    assert shaper.expected_addresses(s, "www", "middle") == 2           # 1 pod + its ClusterIP
    assert shaper.expected_addresses(s, "bulk", "middle") == 2
    assert shaper.expected_addresses(s, "bulk", "bulk") == 1            # not itself
    loaded = scenario_mod.parse({**yaml.safe_load(QUICKSTART.read_text()), "load": {"users": 6, "workers": 3}},
                                "load.yaml")
    assert shaper.expected_addresses(loaded, "load", "middle") == 3     # the load pods (headless)
    assert shaper.expected_addresses(loaded, "load", "load") == 2


def test_both_backends_shape_a_link_with_the_same_class():
    """The local tc batch and the Kubernetes shaper render a link through one function."""
    from torbed import shaping
    s = scenario_mod.load(QUICKSTART)
    p = plan(s, "ewma-66")
    middle, guard = p.group_nodes("middle")[0], p.group_nodes("guard")[0]
    local = shaping.tc_batch(p, middle).splitlines()
    spec = p.link(middle, guard)
    cmds, ids = shaper.classes("eth0", {"guard": spec})
    assert shaping.class_lines("eth0", 2, spec)[0] in cmds
    assert any(line.endswith("rate 4000000bit ceil 4000000bit burst 6056 cburst 6056") for line in local)


def test_think_config_is_seconds():
    from torbed.client.driver import think_config
    from torbed.scenario import ThinkTime
    assert think_config(None) is None
    assert think_config(ThinkTime(distribution="uniform", mean="5s", min="500ms", max="2s")) == {
        "distribution": "uniform", "mean_s": 5.0, "min_s": 0.5, "max_s": 2.0}


def test_replay_container_replays_ships_cells_and_answers_the_clock(service, tmp_path):
    """torbed.pods.replayserver as the chart runs it (its scenario from the environment, the
    traces found by file name in TORBED_TRACE_DIRS): one flow of the SSH trace over TCP on
    loopback (no tor), clock exchanges over UDP on the same port number, and its upstream
    cells arriving at the results service."""
    import os
    import signal
    import socket
    import time

    from torbed.replay import clock, engine, wire
    from torbed.replay.trace import DOWN, UP, read
    d, url = service
    gopal = yaml.safe_load((REPO / "scenarios" / "gopal-heninger-2012-exp2.yaml").read_text())
    for cg in gopal["clients"].values():
        if cg["workload"]["kind"] == "replay":   # as in a pod: no such path, found by name
            cg["workload"]["trace"] = "/nowhere/" + Path(cg["workload"]["trace"]).name
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TORBED_SCENARIO_JSON": json.dumps(gopal), "TORBED_RESULTS_URL": url,
           "TORBED_VARIANT": "vanilla", "TORBED_TRACE_DIRS": str(REPO / "replay" / "traces"),
           "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "torbed.pods.replayserver", "--scenario", "/nonexistent",
                             "--group", "replay", "--port", str(port), "--results", str(tmp_path / "results")],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        probe = clock.Probe("127.0.0.1", port, timeout=0.5)
        deadline = time.time() + 30
        e = None
        while e is None and time.time() < deadline:
            e = probe.exchange(1)
        assert e is not None, "no clock answer"
        assert abs(e.offset) <= e.delay / 2 + 1e-4
        probe.close()

        trace = read(REPO / "replay" / "traces" / "ssh-session.trace.jsonl.gz")
        # The first 3 s of a flow with keystrokes: the server replays the whole flow, the
        # test sends and awaits only that much.
        flow = next(f for f in trace.flows if f.count(UP))
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(json.dumps({"trace": "ssh-session", "flow": flow.id, "client": "ssh0", "group": "ssh",
                                 "variant": "vanilla", "rep": 0, "t_measure": 0, "slack_s": 5}).encode() + b"\n")
        up = [p for p in flow.packets if p.direction == UP and p.t - flow.start <= 3.0]
        sent, _ = engine.send_packets(sock, up, time.time(), flow.start, threading.Event())
        parser, got, t_end = wire.Parser(), 0, time.time() + 3.0 + 5
        sock.settimeout(0.5)
        want = sum(len(wire.chunk_sizes(p.size)) for p in flow.packets if p.direction == DOWN and p.t - flow.start <= 3.0)
        while got < want and time.time() < t_end:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            got += len(parser.feed(data))
        sock.close()
        assert sent > 0 and got >= want
        deadline = time.time() + 15
        # The results service creates the file before the shipped lines land in it.
        path = d / "cells.jsonl"
        while time.time() < deadline and not (path.exists() and path.read_text().endswith("\n")):
            time.sleep(0.2)
        cells = [json.loads(x) for x in path.read_text().splitlines()]
        assert cells and all(c["direction"] == "u" and c["client"] == "ssh0" for c in cells)
        assert len(cells) <= sent
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "replay server replay: http-browsing" in err and "ssh-session" in err


def test_bringup_breakdown_adds_up_to_ready_time():
    import datetime as dt
    from types import SimpleNamespace as NS

    from torbed.backends.k8s.backend import _bringup_breakdown

    def cs(t):
        return NS(state=NS(running=NS(started_at=dt.datetime.fromtimestamp(t, dt.timezone.utc))))
    pods = [NS(status=NS(init_container_statuses=[cs(1012.0)], container_statuses=[cs(1013.5)])),
            NS(status=NS(init_container_statuses=None, container_statuses=[cs(1020.0), NS(state=NS(running=None))]))]
    meta = {"t_start": 1000.0, "t_installed": 1010.0, "t_ready": 1031.0}
    assert _bringup_breakdown(pods, meta) == {"install_s": 10.0, "containers_s": 10.0, "readiness_s": 11.0}
    # No container running yet (or clock skew): the parts still add up.
    assert _bringup_breakdown([], meta) == {"install_s": 10.0, "containers_s": 0.0, "readiness_s": 21.0}


def test_results_service_exports_what_it_received(service, tmp_path):
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    d, url = service
    src = tmp_path / "out"
    src.mkdir()
    (src / "transfers.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    assert Shipper(src, url, interval=3600).ship()
    urllib.request.urlopen(urllib.request.Request(url + "/ready/web0", data=b"", method="POST"))
    with urllib.request.urlopen(url + "/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        samples = {(s.name, s.labels.get("file")): s.value
                   for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
    assert samples[("torbed_results_appended_lines_total", "transfers.jsonl")] == 2
    assert samples[("torbed_results_appended_bytes_total", "transfers.jsonl")] == len('{"a": 1}\n{"b": 2}\n')
    assert samples[("torbed_results_clients_ready", None)] == 1
    assert samples[("torbed_results_workload_started", None)] == 1   # make_handler waits for no client by default
