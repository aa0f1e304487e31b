"""Parsing of control-port events with canned lines (stem), as the collectors and driver see them."""

import threading

import stem.response

from torbed.client.driver import Driver
from torbed.collectors import cellstats_record, parse_metrics


def event(line: str):
    msg = stem.response.ControlMessage.from_str(line + "\r\n", "EVENT")
    return msg


RELAY_CELL_STATS = ("650 CELL_STATS InboundQueue=3221225472 InboundConn=12 InboundAdded=relay:1,create2:1 "
                    "InboundRemoved=relay:41,create2:1 InboundTime=relay:6970,create2:0 "
                    "OutboundQueue=2147483649 OutboundConn=15 OutboundAdded=relay:2 "
                    "OutboundRemoved=relay:2 OutboundTime=relay:0")


def test_cellstats_record_at_relay():
    rec = cellstats_record(event(RELAY_CELL_STATS), {"relay": "middle0", "variant": "kist", "rep": 0, "group": "middle"})
    assert rec["type"] == "cellstats" and rec["relay"] == "middle0"
    assert rec["circuit"] == "12:3221225472"
    assert rec["inbound"]["removed"] == {"relay": 41, "create2": 1}
    assert rec["inbound"]["time_ms"]["relay"] == 6970
    assert rec["outbound"]["conn"] == "15"
    waited = sum(rec["inbound"]["time_ms"].values()) / sum(rec["inbound"]["removed"].values())
    assert abs(waited - 6970 / 42) < 1e-9


def test_cellstats_record_origin_circuit():
    rec = cellstats_record(event("650 CELL_STATS ID=14 OutboundQueue=19403 OutboundConn=15 "
                                 "OutboundAdded=create_fast:1,relay_early:2 OutboundRemoved=create_fast:1,relay_early:2 "
                                 "OutboundTime=create_fast:0,relay_early:0"), {})
    assert rec["circuit"] == "14"
    assert rec["inbound"] is None
    assert rec["outbound"]["removed"] == {"create_fast": 1, "relay_early": 2}


def test_parse_metrics():
    text = ("# HELP tor_relay_load_tcp_exhaustion_total Total number of times we ran out of TCP ports\n"
            "# TYPE tor_relay_load_tcp_exhaustion_total counter\n"
            "tor_relay_load_tcp_exhaustion_total 0\n"
            'tor_relay_circuits_total{state="opened"} 3\n'
            'tor_relay_traffic_bytes{direction="read"} 1.5e+06\n')
    m = parse_metrics(text)
    assert m == {"tor_relay_load_tcp_exhaustion_total": 0.0, 'tor_relay_circuits_total{state="opened"}': 3.0,
                 'tor_relay_traffic_bytes{direction="read"}': 1.5e6}


class RecordingController:
    """Stands in for the control connection: records what the driver asks tor to do."""

    def __init__(self):
        self.attached, self.closed = [], []

    def attach_stream(self, stream_id, circ_id):
        self.attached.append((stream_id, circ_id))

    def close_stream(self, stream_id):
        self.closed.append(stream_id)


def make_driver(tmp_path):
    d = Driver({"seed": 1, "client": "web0", "output": str(tmp_path / "t.jsonl")})
    d.controller = RecordingController()
    return d


def test_driver_attaches_new_stream_by_source_port(tmp_path):
    d = make_driver(tmp_path)
    ev, state = threading.Event(), {}
    d.pending[40001] = ("7", ev, state)
    d._on_stream(event("650 STREAM 24 NEW 0 10.77.0.16:80 SOURCE_ADDR=127.0.0.1:40001 PURPOSE=USER"))
    d._on_stream(event("650 STREAM 25 NEW 0 10.77.0.16:80 SOURCE_ADDR=127.0.0.1:40999 PURPOSE=USER"))
    assert d.controller.attached == [("24", "7")]
    d._on_stream(event("650 STREAM 26 NEWRESOLVE 0 example.invalid:0 SOURCE_ADDR=127.0.0.1:40001 PURPOSE=USER"))
    assert d.controller.attached[-1] == ("26", "7")
    assert not ev.is_set()


def test_driver_detached_stream_is_a_typed_error(tmp_path):
    d = make_driver(tmp_path)
    ev, state = threading.Event(), {}
    d.pending[40002] = ("9", ev, state)
    d._on_stream(event("650 STREAM 30 NEW 0 10.77.0.16:80 SOURCE_ADDR=127.0.0.1:40002 PURPOSE=USER"))
    # Later events carry no SOURCE_ADDR: the driver must follow the stream id.
    d._on_stream(event("650 STREAM 30 DETACHED 9 10.77.0.16:80 REASON=END REMOTE_REASON=DESTROY"))
    assert ev.is_set()
    assert state["error"][0] == "stream_detached"
    assert "DESTROY" in state["error"][1]
    assert d.controller.closed == ["30"]


def test_driver_circuit_failure_fails_waiting_streams(tmp_path):
    from torbed.client.driver import Circuit
    d = make_driver(tmp_path)
    d.circuit = Circuit(id="9", path=[], build_s=0.1)
    ev, state = threading.Event(), {}
    d.pending[40003] = ("9", ev, state)
    path = "$" + "A" * 40 + "~guard0,$" + "B" * 40 + "~middle0"
    d._on_circ(event(f"650 CIRC 9 CLOSED {path} PURPOSE=GENERAL REASON=DESTROYED REMOTE_REASON=CHANNEL_CLOSED"))
    assert not d.circuit.alive
    assert state["error"][0] == "circuit_failed"
    assert ev.is_set()


class _ListeningController:
    def __init__(self):
        self.listeners = []

    def add_event_listener(self, fn, event_type):
        self.listeners.append((fn, event_type))


def test_collector_records_carry_the_tor_session_and_a_reconnect_starts_a_new_one(monkeypatch):
    """A restarted tor numbers its channels from 1 again: the collector's records say which
    tor (``session``, when the collector attached) they came from."""
    from torbed.collectors import RelayCollector

    class Writer:
        def __init__(self):
            self.recs = []

        def write(self, rec):
            self.recs.append(rec)

    w = Writer()
    c = RelayCollector({"name": "middle0", "group": "middle", "control": {}},
                       {"variant": "kist", "rep": 0, "collect": ["cellstats"]}, {"cellstats": w})
    c.controller = _ListeningController()
    now = [1000.0]
    monkeypatch.setattr("torbed.collectors.time.time", lambda: now[0])
    c._listen()
    c.controller.listeners[0][0](event(RELAY_CELL_STATS))
    now[0] = 2000.0
    c.controller = _ListeningController()
    c._listen()
    c.controller.listeners[0][0](event(RELAY_CELL_STATS))
    assert [r["session"] for r in w.recs] == [1000.0, 2000.0]
    assert w.recs[0]["inbound"]["conn"] == w.recs[1]["inbound"]["conn"] == "12"
