"""Circuits known by their client at every hop (analysis/circuits.py), from canned control-port
events as the driver and the relay collectors record them: the client's CELL_STATS and CIRC
events (circuits.jsonl), the relays' CELL_STATS (cellstats.jsonl)."""

import json

import stem.response

from analysis import circuits
from torbed.client.driver import Driver
from torbed.collectors import cellstats_record
from torbed.records import read_records

FP = {"guard0": "A" * 40, "middle0": "B" * 40, "exit0": "C" * 40}
NAMES = {fp: name for name, fp in FP.items()}


def event(line: str):
    return stem.response.ControlMessage.from_str(line + "\r\n", "EVENT")


def relay(name: str, line: str, t: float = 100.0) -> dict:
    rec = cellstats_record(event("650 CELL_STATS " + line), {"relay": name, "group": name[:-1], "variant": "v",
                                                            "rep": 0, "session": 1.0})
    rec["t"] = t
    return rec


def middle_hop(inq, inconn, outq, outconn, cells=10):
    return (f"InboundQueue={inq} InboundConn={inconn} InboundRemoved=relay:{cells} InboundTime=relay:{cells * 20} "
            f"OutboundQueue={outq} OutboundConn={outconn} OutboundRemoved=relay:1 OutboundTime=relay:0")


def exit_hop(inq, inconn, cells=10):
    return f"InboundQueue={inq} InboundConn={inconn} InboundRemoved=relay:{cells} InboundTime=relay:{cells * 5}"


class _Ctl:
    def close(self):
        pass


def client_records(tmp_path, client, group, circuits_):
    """Run the driver's event handlers on canned CIRC BUILT and client CELL_STATS events;
    ``circuits_``: [(circuit ID, client channel id, circuit id on it)]."""
    d = Driver({"seed": 1, "client": client, "group": group, "variant": "v", "rep": 0,
                "output": str(tmp_path / client / "transfers.jsonl")})
    d.controller = _Ctl()
    path = ",".join(f"${FP[n]}~{n}" for n in ("guard0", "middle0", "exit0"))
    for cid, conn, q in circuits_:
        d._on_circ(event(f"650 CIRC {cid} BUILT {path} PURPOSE=GENERAL"))
        for _ in range(2):   # one link record per circuit, however many events
            d._on_cellstats(event(f"650 CELL_STATS ID={cid} OutboundQueue={q} OutboundConn={conn} "
                                  f"OutboundRemoved=create2:1,relay_early:2 OutboundTime=create2:0,relay_early:0"))
    d._on_cellstats(event("650 CELL_STATS InboundQueue=5 InboundConn=1 InboundRemoved=relay:1 InboundTime=relay:0"))
    return _read(d, tmp_path, client)


def _read(d, tmp_path, client):
    d.circuit_log.close()
    recs = read_records(tmp_path / client / "circuits.jsonl")
    for r in recs:
        r["t"] = 100.0      # the relays' canned events' time
    return recs


def network(tmp_path):
    """web0 and bulk0 through guard0 -> middle0 -> exit0. The circuit ids collide across
    channels: web0's circuit 7 and bulk0's circuit 3 both use id 1000 toward the guard; the
    guard uses id 2000 toward the middle for one of each (on two different channels), and the
    middle uses id 3000 toward the exit on both of its channels to exit0."""
    web = client_records(tmp_path, "web0", "web", [("7", "2", "1000"), ("8", "2", "1001"), ("9", "2", "1002")])
    bulk = client_records(tmp_path, "bulk0", "bulk", [("3", "4", "1000"), ("4", "4", "1100"), ("5", "4", "1101")])
    cs = [
        # guard0: web0's channel is 11 there, bulk0's is 12; toward the middle channels 20 and 21
        relay("guard0", middle_hop(1000, 11, 2000, 20)),       # web0 circ 7
        relay("guard0", middle_hop(1001, 11, 2001, 20)),       # web0 circ 8
        relay("guard0", middle_hop(1002, 11, 2002, 21)),       # web0 circ 9 (second channel to the middle)
        relay("guard0", middle_hop(1000, 12, 2000, 21)),       # bulk0 circ 3: same ids, other channels
        relay("guard0", middle_hop(1100, 12, 2100, 21)),       # bulk0 circ 4
        relay("guard0", middle_hop(1101, 12, 2101, 20)),       # bulk0 circ 5
        # middle0: the guard's channel 20 is 31 here, 21 is 32; toward exit0 channels 40, 41
        relay("middle0", middle_hop(2000, 31, 3000, 40)),
        relay("middle0", middle_hop(2001, 31, 3001, 40)),
        relay("middle0", middle_hop(2002, 32, 3002, 41)),
        relay("middle0", middle_hop(2000, 32, 3000, 41)),
        relay("middle0", middle_hop(2100, 32, 3100, 41)),
        relay("middle0", middle_hop(2101, 31, 3101, 40)),
        # exit0: the middle's 40 is 51, 41 is 52
        *[relay("exit0", exit_hop(q, c)) for q, c in ((3000, 51), (3001, 51), (3002, 52), (3000, 52),
                                                        (3100, 52), (3101, 51))],
        # a relay's own circuit (guard0 -> middle0), and one the middle sees from a tor
        # without a collector (an authority)
        relay("guard0", "ID=4 OutboundQueue=2200 OutboundConn=20 OutboundRemoved=create2:1 OutboundTime=create2:0"),
        relay("middle0", exit_hop(2200, 31, cells=1)),
        relay("middle0", exit_hop(777, 90, cells=2)),
    ]
    transfers = [{"client": "web0", "circuit": {"id": c}} for c in ("7", "8", "9")] + \
                [{"client": "bulk0", "circuit": {"id": c}} for c in ("3", "4", "5")]
    return cs, web + bulk, transfers


def test_driver_records_each_circuit_link_once_with_its_path(tmp_path):
    recs = client_records(tmp_path, "web0", "web", [("7", "2", "1000")])
    assert [r["event"] for r in recs] == ["built", "link"]
    built, link = recs
    assert built["path"] == [FP["guard0"], FP["middle0"], FP["exit0"]] and built["purpose"] == "GENERAL"
    assert (link["id"], link["conn"], link["queue"]) == ("7", "2", "1000")
    assert link["group"] == "web" and link["client"] == "web0" and link["type"] == "client_circuit"


def test_streams_name_the_workload_circuits_when_tor_chose_the_path(tmp_path):
    d = Driver({"seed": 1, "client": "web0", "group": "web", "variant": "v", "rep": 0,
                "output": str(tmp_path / "web0" / "transfers.jsonl"), "workload": {"address": "10.77.0.16"}})
    d.controller = _Ctl()
    d._on_stream(event("650 STREAM 30 SUCCEEDED 2 10.77.0.13.$" + "A" * 40 + ".exit:5000 PURPOSE=USER"))
    d._on_stream(event("650 STREAM 31 SUCCEEDED 12 10.77.0.16:80 SOURCE_ADDR=127.0.0.1:40001 PURPOSE=USER"))
    d._on_stream(event("650 STREAM 32 SUCCEEDED 3 10.77.0.12:7000 PURPOSE=DIR_FETCH"))
    d._on_stream(event("650 STREAM 33 SENTCONNECT 12 10.77.0.16:80 PURPOSE=USER"))
    recs = _read(d, tmp_path, "web0")
    assert [(r["event"], r["id"], r["stream"]) for r in recs] == [("stream", "12", "31")]
    assert circuits.attribute([], recs).workload == {("web0", "12")}


def test_every_hop_of_every_client_circuit_is_labelled_despite_colliding_ids(tmp_path):
    cs, cc, transfers = network(tmp_path)
    att = circuits.attribute(cs, cc, transfers, names=NAMES)
    labels = {(r["relay"], r["inbound"]["queue"] if r["inbound"] else r["circuit"],
               r["inbound"]["conn"] if r["inbound"] else None): att.label_of(r) for r in cs}
    expect = {"web0": {"7": [("guard0", "1000", "11"), ("middle0", "2000", "31"), ("exit0", "3000", "51")],
                       "9": [("guard0", "1002", "11"), ("middle0", "2002", "32"), ("exit0", "3002", "52")]},
              "bulk0": {"3": [("guard0", "1000", "12"), ("middle0", "2000", "32"), ("exit0", "3000", "52")],
                        "5": [("guard0", "1101", "12"), ("middle0", "2101", "31"), ("exit0", "3101", "51")]}}
    for client, circs in expect.items():
        for cid, hops in circs.items():
            for pos, hop in zip(("guard", "middle", "exit"), hops):
                lb = labels[hop]
                assert (lb.node, lb.circuit, lb.position, lb.relay) == (client, cid, pos, hop[0]), (hop, lb)
                assert lb.group == ("web" if client == "web0" else "bulk")
    assert att.workload == {("web0", "7"), ("web0", "8"), ("web0", "9"), ("bulk0", "3"), ("bulk0", "4"),
                            ("bulk0", "5")}
    client_hops = [lb for lb in att.labels.values() if lb.origin == "client"]
    assert len(client_hops) == 18 and not att.ambiguous and not att.mismatched
    # the relay's own circuit is labelled as such, the authority's is not labelled at all
    own = labels[("middle0", "2200", "31")]
    assert own.origin == "relay" and own.node == "guard0" and own.position == "hop0"
    assert labels[("middle0", "777", "90")] is None
    assert att.summary()["client"] == 18
    cov = circuits.coverage(att, cs, data_cells=2)
    assert (cov["workload_circuits"], cov["workload_complete"]) == (6, 6)
    assert (cov["data_hops"], cov["data_hops_unlabelled"]) == (19, 1)     # the authority's circuit


def test_a_tie_between_channels_is_left_unlabelled_not_guessed(tmp_path):
    # Two clients, one circuit each, with the same id toward the guard, seen at the same time:
    # nothing tells the guard's two channels apart.
    web = client_records(tmp_path, "web0", "web", [("7", "2", "1000")])
    bulk = client_records(tmp_path, "bulk0", "bulk", [("3", "4", "1000")])
    cs = [relay("guard0", exit_hop(1000, 11)), relay("guard0", exit_hop(1000, 12))]
    att = circuits.attribute(cs, web + bulk)
    assert all(att.label_of(r) is None for r in cs)
    assert att.ambiguous
    # Seen far apart in time, the ids no longer collide.
    for r in bulk:
        r["t"] += 600
    cs[1]["t"] += 600
    att = circuits.attribute(cs, web + bulk)
    assert [att.label_of(r).node for r in cs] == ["web0", "bulk0"]


def test_a_restarted_relay_numbers_channels_again_and_sessions_keep_them_apart(tmp_path):
    web = client_records(tmp_path, "web0", "web", [("7", "2", "1000"), ("8", "2", "1001")])
    before = relay("guard0", exit_hop(1000, 11))
    after = relay("guard0", exit_hop(1000, 11))
    after["session"] = 2.0
    assert circuits.hop_key(before) != circuits.hop_key(after)
    # web0's channel carried 1000 and 1001 to the first session's channel 11
    att = circuits.attribute([before, relay("guard0", exit_hop(1001, 11)), after], web)
    assert att.label_of(before).node == "web0" and att.label_of(after) is None


def test_a_chain_that_leaves_the_clients_path_is_not_labelled(tmp_path):
    web = client_records(tmp_path, "web0", "web", [("7", "2", "1000")])
    cs = [relay("middle0", exit_hop(1000, 11))]     # the client said its first hop is guard0
    att = circuits.attribute(cs, web, names=NAMES)
    assert att.label_of(cs[0]) is None and att.mismatched


def test_position_names():
    assert [circuits.position_name(i, 3) for i in range(3)] == ["guard", "middle", "exit"]
    assert circuits.position_name(0, 1) == "guard" and circuits.position_name(1, None) == "hop1"
    assert json.dumps(circuits.position_name(2, 4)) == '"middle2"'
