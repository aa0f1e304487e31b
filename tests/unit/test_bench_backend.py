"""make bench's bring-up part: figures beside their target and the previous result."""

from __future__ import annotations

import json

from rich.console import Console

from torbed.bench import backend as bb


def _run(ready: float, soak: float, rss: float) -> dict:
    return {"cmd_to_ready_s": ready, "setup_to_ready_s": ready - 1, "cmd_to_first_transfer_s": ready + 3,
            "rss_ready_mib": {"relay0": 20.0}, "rss_end_mib": {"relay0": rss}, "rss_peak_mib": {"relay0": rss},
            "cpu_pct_ready_to_end": {"relay0": 1.0}, "roles": {"relay0": "relay"}, "soak_s": soak}


def _render(t) -> str:
    c = Console(width=250, record=True)
    c.print(t)
    return c.export_text()


def test_every_run_the_target_verdict_and_the_previous_result(tmp_path):
    runs = [_run(7.0, 300, 40.0)] + [_run(r, 20, 25.0) for r in (7.5, 8.0, 11.0)]
    s = bb.summarize("quickstart", runs)
    assert s["cmd_to_ready_s"]["values"] == [7.0, 7.5, 8.0, 11.0]
    # After-soak figures only from the soaked run.
    assert s["relay_rss_end_mib"]["median"] == 40.0 and s["relay_rss_ready_mib"]["n"] == 4
    old = {"quickstart": {"summary": bb.summarize("quickstart", [_run(r, 300, 30.0) for r in (9.0, 10.0)])}}
    (tmp_path / "backend-20260101T000000Z.json").write_text(json.dumps(old))
    (tmp_path / "backend-20300101T000000Z.json").write_text("{}")   # a later file is not "previous"
    name, prev = bb.previous_results(tmp_path, "backend-20261123T000000Z.json")
    assert name == "backend-20260101T000000Z.json"
    text = _render(bb.table({"quickstart": {"summary": s}}, prev, name))
    assert "7.0 7.5 8.0 11.0" in text
    assert "MISSED: <= 8 s median, <= 10 s every run" in text     # median 7.75 but one run took 11 s
    assert "9.5 s (x0.82)" in text                                  # previous median 9.5 s
    ok = bb.summarize("quickstart", [_run(r, 300, 30.0) for r in (6.0, 7.0)])
    assert "met:" in _render(bb.table({"quickstart": {"summary": ok}}, {}, None))


def test_the_previous_result_is_each_networks_own_newest(tmp_path):
    q = {"quickstart": {"summary": bb.summarize("quickstart", [_run(9.0, 300, 30.0)])}}
    h = {"bench-100-relays": {"summary": bb.summarize("bench-100-relays", [_run(40.0, 300, 30.0)])}}
    (tmp_path / "backend-20260101T000000Z.json").write_text(json.dumps(q))
    (tmp_path / "backend-20260102T000000Z.json").write_text(json.dumps(h))
    (tmp_path / "backend-20260103T000000Z.json").write_text("{}")        # an empty (failed) bench
    (tmp_path / "backend-20260104T000000Z.json").write_text("not json")
    label, prev = bb.previous_results(tmp_path, "backend-20261123T000000Z.json")
    assert sorted(prev) == ["bench-100-relays", "quickstart"]
    assert prev["quickstart"]["summary"]["cmd_to_ready_s"]["median"] == 9.0
    assert "quickstart: backend-20260101T000000Z.json" in label
    assert "bench-100-relays: backend-20260102T000000Z.json" in label


def test_no_previous_results(tmp_path):
    assert bb.previous_results(tmp_path, "backend-x.json") == (None, {})


def test_the_bring_up_phases_are_summarised_in_order():
    runs = []
    for k in range(3):
        r = _run(10.0 + k, 20, 25.0)
        r["phases_s"] = {"network_ready": 1.0 + k, "tors_started": 1.5 + k, "authorities_listening": 1.9 + k,
                         "periodic_events_started": 2.0 + k, "descriptors_in": 2.1 + k, "first_valid_after": 6.0 + k,
                         "consensus_seen": 6.5 + k, "clients_online": 7.5 + k, "ready": 9.0 + k}
        runs.append(r)
    runs.append(_run(12.0, 20, 25.0))    # an older record without phases is left out of them
    s = bb.summarize("quickstart", runs)
    assert s["phases_s"]["first_valid_after"]["median"] == 7.0 and s["phases_s"]["ready"]["n"] == 3
    text = _render(bb.table({"quickstart": {"summary": s}}, {}, None))
    where = [text.index(f"setup -> {what}") for what in bb.PHASES.values()]
    assert where == sorted(where), where    # printed in the order the bring-up goes
    assert "7.0 s [6.0-8.0]" in text        # first valid-after: median [min-max]


def test_directory_traffic_until_ready_per_node_and_role():
    runs = []
    for k, relays in enumerate((100, 100)):
        r = _run(10.0, 20, 25.0)
        r["shaper"] = "linkemu"
        r["traffic_to_ready"] = {
            "by_role": {"authority": {"nodes": 3, "sent_bytes": 3 * 2**20 * (10 + k), "received_bytes": 3 * 2**20},
                        "relay": {"nodes": relays, "sent_bytes": relays * 50 * 2**10, "received_bytes": relays * 2**20}},
            "authority_files_bytes": {"cached-microdesc-consensus": 60 * 2**10, "cached-microdescs": 40 * 2**10}}
        runs.append(r)
    runs.append(_run(12.0, 20, 25.0))    # a run from before the traffic was recorded
    s = bb.summarize("bench-300-tors", runs)
    assert s["authority_sent_kib_to_ready"]["values"] == [10 * 1024.0, 11 * 1024.0]
    assert s["relay_received_kib_to_ready"]["median"] == 1024.0 and s["client_sent_kib_to_ready"]["n"] == 0
    text = _render(bb.table({"bench-300-tors": {"summary": s}}, {}, None))
    assert "authority sent / received per node until ready" in text and "10752.0 KiB [10240.0-11264.0]" in text
    assert "cached-microdesc-consensus at ready" in text and "60.0 KiB" in text
    assert "client sent / received" not in text and "linkemu" in text


def test_quickstart_alternates_with_the_classic_bring_up_and_is_compared_to_it():
    order = bb._order(["quickstart", "quickstart-classic", "bench-100-relays"],
                      {"quickstart": 3, "quickstart-classic": 2, "bench-100-relays": 1})
    assert order == [("quickstart", 0), ("quickstart-classic", 0), ("quickstart", 1), ("quickstart-classic", 1),
                     ("quickstart", 2), ("bench-100-relays", 0)]
    assert bb.ENV["quickstart-classic"] == {"TORBED_FAST_BRINGUP": "0"}
    fast = bb.summarize("quickstart", [_run(r, 20, 25.0) for r in (5.0, 6.0, 7.0)])
    classic = bb.summarize("quickstart-classic", [_run(r, 20, 25.0) for r in (11.0, 12.0)])
    text = _render(bb.table({"quickstart": {"summary": fast}, "quickstart-classic": {"summary": classic}}, {}, None))
    assert "vs quickstart-classic (this bench run)" in text and "x0.52" in text and "11.5 s" in text
