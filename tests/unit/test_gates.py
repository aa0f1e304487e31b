"""torbed/gates.py: the mechanism gates' samples, on canned tc output and /proc files; the
scenario's measure.mechanism; the class numbers the samples map back to node pairs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from torbed import gates, network, scenario, shaping
from torbed.backends.local import gatesample
from tests.integration.helpers import small_scenario

DATA = Path(__file__).resolve().parents[1] / "data" / "gates"

# iproute2 6.1's `tc -s -j class show dev eth0` for htb: text, whatever -j says.
TC_TEXT = """class htb 1:1 root prio 0 rate 10Gbit ceil 10Gbit burst 0b cburst 0b
 Sent 90210 bytes 311 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
 lended: 311 borrowed: 0 giants: 0
 tokens: 15 ctokens: 15

class htb 1:2 root prio 0 rate 2Mbit ceil 2Mbit burst 6055b cburst 6055b
 Sent 4508132 bytes 2981 pkt (dropped 17, overlimits 4410 requeues 0)
 backlog 1514000b 1000p requeues 0
 lended: 2981 borrowed: 0 giants: 0
 tokens: -96750 ctokens: -96750

class htb 1:a root leaf a: prio 0 rate 2Mbit ceil 2Mbit burst 6055b cburst 6055b
 Sent 2000 bytes 2 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 15Kb 10p requeues 0
 lended: 2 borrowed: 0 giants: 0
 tokens: 252328 ctokens: 252328

class htb 1:b root prio 0 rate 2Mbit ceil 2Mbit burst 6055b cburst 6055b
 Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 1.5Mb 1039p requeues 0
"""

# The JSON form (newer iproute2 prints class statistics as JSON).
TC_JSON = json.dumps([
    {"class": "htb", "handle": "1:1", "root": True, "bytes": 90, "packets": 1, "drops": 0, "backlog": 0, "qlen": 0},
    {"class": "htb", "handle": "1:2", "root": True, "bytes": 4508132, "packets": 2981, "drops": 17,
     "backlog": 1514000, "qlen": 1000},
    {"class": "htb", "handle": "2:3", "bytes": 1, "drops": 0, "backlog": 7, "qlen": 1}])


def test_tc_text_and_json_give_the_same_classes():
    text = gates.parse_tc_classes(TC_TEXT)
    assert text[2] == {"backlog_bytes": 1514000, "backlog_packets": 1000, "drops": 17, "sent_bytes": 4508132}
    assert text[1]["backlog_bytes"] == 0
    assert text[0xa]["backlog_bytes"] == 15 * 1024 and text[0xa]["backlog_packets"] == 10
    assert text[0xb]["backlog_bytes"] == int(1.5 * 1024 * 1024)
    js = gates.parse_tc_classes(TC_JSON)
    assert js[2] == text[2] and set(js) == {1, 2}       # 2:3 is not under the root htb


def test_tc_output_captured_from_a_real_tc():
    # Captured on this machine (iproute2 6.1): three htb classes, one with a bfifo leaf.
    got = gates.parse_tc_classes((DATA / "tc-class-htb-6.1.txt").read_text())
    assert set(got) == {1, 2, 3} and all(c["backlog_bytes"] == 0 for c in got.values())


def test_a_malformed_size_is_an_error():
    with pytest.raises(ValueError):
        gates.parse_tc_classes("class htb 1:2 root\n backlog 12xb 1p\n")


def write_proc(root: Path, steal: int = 0, procs: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  1000 0 500 8000 100 0 0 {steal} 0 0\ncpu0 1 0 0 0 0 0 0 0 0 0\n"
                               "cpu1 1 0 0 0 0 0 0 0 0 0\n")
    (root / "loadavg").write_text("1.50 1.00 0.50 2/180 4242\n")
    for pid, (ut, st, sched, threads) in (procs or {}).items():
        d = root / str(pid)
        (d / "task").mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(f"{pid} (tor (x)) S 1 {pid} {pid} 0 -1 0 0 0 0 0 {ut} {st} 0 0 20 0 1 0 1 0 0\n")
        (d / "schedstat").write_text(sched)
        for tid, ticks in threads.items():
            (d / "task" / str(tid)).mkdir(exist_ok=True)
            (d / "task" / str(tid) / "stat").write_text(f"{tid} (tor) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0\n")
    return root


def test_proc_readers(tmp_path):
    proc = write_proc(tmp_path / "proc", steal=42, procs={7: (300, 100, "123456 7890 12\n", {7: 350, 8: 50})})
    host = gates.read_host(proc)
    assert host == {"busy": 1542, "total": 9642, "steal": 42, "cpus": 2, "load1": 1.5}
    p = gates.read_process(7, proc, threads=True)
    assert p == {"ticks": 400, "run_ns": 123456, "wait_ns": 7890, "slices": 12, "threads": {"7": 350, "8": 50}}
    assert gates.read_process(8, proc) is None                  # gone
    # With children: cutime + cstime (fields 16, 17) too, for torbed's own reaped tc and ss.
    (proc / "7" / "stat").write_text("7 (python3) S 1 7 7 0 -1 0 0 0 0 0 300 100 40 2 20 0 1 0 1 0 0\n")
    assert gates.read_process(7, proc, children=True)["ticks"] == 442
    assert gates.read_process(7, proc)["ticks"] == 400
    assert gates.parse_schedstat("1 2 3\n") == (1, 2, 3)


class ListWriter:
    def __init__(self):
        self.records = []
        self.closed = False

    def write(self, rec):
        self.records.append(rec)

    def close(self):
        self.closed = True


def test_htb_source_names_links_and_keeps_only_backlogged_ones():
    w = ListWriter()
    calls = []

    def run_tc(sender):
        calls.append(sender)
        return TC_TEXT if sender == "exit0" else "class htb 1:zz root\n"

    src = gates.HtbSource({("exit0", 2): "exit0>middle0", ("exit0", 1): "exit0>ignored",
                           ("guard0", 2): "guard0>client0"}, [{"link": "exit0>middle0", "rate_bps": 2_000_000}],
                          run_tc, w)
    src(100.0)
    assert w.records[0] == {"type": "shaper_links", "shaper": "htb", "links": [{"link": "exit0>middle0",
                                                                                 "rate_bps": 2_000_000}]}
    assert w.records[1] == {"type": "shaper", "t": 100.0, "backlog": {"exit0>middle0": 1514000},
                            "senders": ["exit0", "guard0"], "failed": ["guard0"]}
    assert calls == ["exit0", "guard0"] and len(src.errors) == 1 and src.errors[0].startswith("guard0")


def test_linkemu_source_announces_links_as_they_appear():
    w = ListWriter()
    answers = [{"backlog": {"links": []}},
               {"backlog": {"links": [{"src": "exit0", "dst": "middle0", "rate_bps": 2_000_000,
                                       "backlog_bytes": 25_000, "backlog_s": 0.1, "queue_drops": 0},
                                      {"src": "middle0", "dst": "exit0", "rate_bps": 2_000_000,
                                       "backlog_bytes": 0, "backlog_s": 0.0, "queue_drops": 0}]}}]
    src = gates.LinkemuSource("/nonexistent", w, request=lambda *a, **k: answers.pop(0))
    src(1.0)
    src(2.0)
    assert [r["type"] for r in w.records] == ["shaper_links", "shaper", "shaper_links", "shaper"]
    assert w.records[1]["backlog"] == {}
    assert [ln["link"] for ln in w.records[2]["links"]] == ["exit0>middle0", "middle0>exit0"]
    assert w.records[3] == {"type": "shaper", "t": 2.0, "backlog": {"exit0>middle0": 25_000}}


def test_cpu_source_and_sampler(tmp_path):
    proc = write_proc(tmp_path / "proc", procs={7: (300, 100, "1 2 3\n", {7: 350, 8: 50}),
                                               9: (10, 0, "4 5 6\n", {9: 10})})
    w = ListWriter()
    src = gates.CpuSource(lambda: {"target0": (7, "relay", "target"), "bulk0.driver": (9, "driver", "bulk"),
                                   "gone": (12345, "relay", "x")}, w, proc=proc, threads_of=("target0",))
    sampler = gates.Sampler(0.05, [src]).start()
    import time
    time.sleep(0.2)
    assert sampler.stop() == []
    assert len(w.records) >= 3 and w.closed
    rec = w.records[-1]
    assert rec["procs"]["target0"] == {"role": "relay", "group": "target", "pid": 7, "ticks": 400, "run_ns": 1,
                                       "wait_ns": 2, "slices": 3}
    assert rec["procs"]["bulk0.driver"]["role"] == "driver" and "gone" not in rec["procs"]
    assert rec["threads"] == {"target0": {"7": 350, "8": 50}} and rec["host"]["steal"] == 0


def test_a_failing_source_is_recorded_and_the_sampler_goes_on():
    def boom(now):
        raise RuntimeError("no tc")
    s = gates.Sampler(0.02, [boom]).start()
    import time
    time.sleep(0.05)
    errors = s.stop()
    assert errors and "no tc" in errors[0]


def test_shaped_classes_are_the_classes_tc_batch_makes():
    data = small_scenario("gates-classes", **{"links.pairs": [{"between": ["middle", "exit"], "rate": "2mbit"}]})
    plan = network.plan(scenario.parse(data, "x"), "kist")
    exit0 = next(n for n in plan.nodes if n.name == "exit0")
    batch = shaping.tc_batch(plan, exit0)
    for minor, dst, spec in shaping.shaped_classes(plan, exit0):
        assert f"classid 1:{minor:x} htb rate {spec.rate_bps}bit" in batch
        assert f"match ip dst {dst.address}/32 flowid 1:{minor:x}" in batch
    links, meta = gatesample.htb_links(plan)
    assert {"link": "exit0>middle0", "rate_bps": 2_000_000, "delay_s": 0.0} in meta
    assert not any(name.startswith("auth") or ">auth" in name for name in links.values())


def test_scenario_mechanism_is_strict():
    base = small_scenario("gates-mech")
    s = scenario.parse(base, "x")
    assert s.measure.mechanism.kind == "queueing" and s.measure.mechanism.target is None
    ok = scenario.parse({**base, "measure": {**base["measure"], "mechanism": {"kind": "cpu-bound",
                                                                             "target": "middle"}}}, "x")
    assert ok.measure.mechanism.target == "middle"
    for mech, want in [({"kind": "cpu-bound"}, "needs the relay group"),
                       ({"kind": "queueing", "target": "middle"}, "only a cpu-bound mechanism"),
                       ({"kind": "cpu-bound", "target": "nosuch"}, "not a relay group"),
                       ({"kind": "cpu"}, "measure.mechanism.kind"),
                       ({"kind": "queueing", "extra": 1}, "measure.mechanism: unknown key 'extra'")]:
        with pytest.raises(scenario.ScenarioError, match=want):
            scenario.parse({**base, "measure": {**base["measure"], "mechanism": mech}}, "x")


SS = """0      0       10.0.0.12:5000  10.0.0.11:41234
0      123456  10.0.0.12:5000  10.0.0.13:41000
113152 4000    10.0.0.12:39222 10.0.0.13:5000
0      77      10.0.0.12:39223 10.0.0.99:80
"""


def test_ss_send_queues_and_the_socket_source():
    assert gates.parse_ss_send_queues(SS) == {"10.0.0.11": 0, "10.0.0.13": 127456, "10.0.0.99": 77}
    w = ListWriter()
    src = gates.SocketSource(["exit0", "www0"], {"10.0.0.11": "guard0", "10.0.0.13": "middle0"},
                             lambda s: SS if s == "exit0" else (_ for _ in ()).throw(OSError("no ss")), w)
    src(5.0)
    assert w.records == [{"type": "sockets", "t": 5.0, "send_q": {"exit0>middle0": 127456},
                          "senders": ["exit0", "www0"], "failed": ["www0"]}]
    assert src.errors == ["www0: no ss"]
    # Two peers of one name (Kubernetes: the pods of a peer group) share the link: summed.
    w2 = ListWriter()
    gates.SocketSource(["exit0"], {"10.0.0.11": "middle", "10.0.0.13": "middle", "10.0.0.99": "middle"},
                       lambda s: SS, w2)(6.0)
    assert w2.records[0]["send_q"] == {"exit0>middle": 127456 + 77}


PROC_NET_TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0C00000A:1388 0D00000A:A028 01 0001E240:00000FA0 01:00000014 00000000  1000        0 2 1 0 20 4 30 10 -1
   2: 0C00000A:98EE 0D00000A:1388 01 0000004D:00000000 00:00000000 00000000  1000        0 3 1 0 20 4 30 10 -1
   3: 0C00000A:98EF 6300000A:0050 06 00000100:00000000 00:00000000 00000000     0        0 0 3 0 0 0 0 0 0
"""


def test_proc_net_tcp_send_queues_per_peer_established_only():
    # a listener and a TIME_WAIT socket (st 06) count for nothing; addresses in the kernel's
    # little-endian print on this machine (0D00000A is 10.0.0.13)
    assert gates.parse_proc_net_tcp(PROC_NET_TCP) == {"10.0.0.13": 0x1E240 + 0x4D}
    assert gates.parse_send_queues(PROC_NET_TCP) == gates.parse_proc_net_tcp(PROC_NET_TCP)
    assert gates.parse_send_queues(SS) == gates.parse_ss_send_queues(SS)


def test_proc_net_tcp_reads_the_queue_ss_reads_on_a_real_blocked_socket():
    """A real TCP connection whose receiver never reads: the bytes stuck in the sender's
    send queue, as /proc/self/net/tcp tells them and as ss tells them, are the same number."""
    import shutil
    import socket as so
    if not shutil.which("ss"):
        pytest.fail("ss (iproute2) is missing: make setup installs it")
    lst = so.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    snd = so.create_connection(lst.getsockname())
    rcv, _ = lst.accept()
    rcv.setsockopt(so.SOL_SOCKET, so.SO_RCVBUF, 4096)
    snd.setblocking(False)
    sent = 0
    try:
        while True:
            sent += snd.send(b"x" * 65536)
    except BlockingIOError:
        pass
    port = snd.getsockname()[1]
    try:
        # only the sender's socket: the listener's port is the peer of that one socket here
        mine = [ln for ln in Path("/proc/self/net/tcp").read_text().splitlines()[1:]
                if ln.split()[1].endswith(f":{port:04X}")]
        from_proc = gates.parse_proc_net_tcp("header\n" + "\n".join(mine))["127.0.0.1"]
        out = subprocess.run(["ss", "-Htn", "state", "established", f"sport = :{port}"],
                             capture_output=True, text=True, check=True).stdout
        from_ss = gates.parse_ss_send_queues(out)["127.0.0.1"]
        assert from_proc > 0 and from_proc == from_ss, (from_proc, from_ss, sent)
    finally:
        for s in (snd, rcv, lst):
            s.close()
