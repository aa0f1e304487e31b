"""OnionPerf export vs what tornettools' parse_onionperf reads (issue 24, part 4).

The reader below is written from tornettools' documented field definitions (its
parse_onionperf / util.tgen_stream_seconds_at_bytes, read for their meaning only): RTT =
(usecs-to-response - usecs-to-command) / 1e6; download time = payload_bytes_recv[size] -
usecs-to-command / 1e6; goodput (bits/s) between 512000 and 1048576 bytes and between
4194304 and 5242880 bytes, the seconds at B bytes taken from payload_bytes_recv[str(B)], else
payload_progress_recv[str(B / recvsize)]; failures from is_error / stream_info.error /
payload-bytes-recv < recvsize; circuit build times from tor.circuits.*.buildtime_seconds.
Each value is checked against the transfer record it came from.
"""

import json
import socket
import threading
from types import SimpleNamespace

import pytest

from torbed.client import driver

from .conftest import copy_golden

MIB = 1 << 20


def seconds_at_bytes(stream, num_bytes):
    es = stream.get("elapsed_seconds")
    if es is None:
        return None
    s = es["payload_bytes_recv"].get(str(num_bytes))
    if s is None:
        s = es["payload_progress_recv"].get(str(num_bytes / float(stream["stream_info"]["recvsize"])))
    return None if s is None else float(s)


def goodput_bps(stream, start, end):
    t0, t1 = seconds_at_bytes(stream, start), seconds_at_bytes(stream, end)
    if t0 is None or t1 is None or t1 <= t0:
        return None
    return (end - start) * 8.0 / (t1 - t0)


def at(record, nbytes):
    return next(t for b, t in record["progress"] if b == nbytes)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from torbed.analysis.report import report
    run_dir = copy_golden(tmp_path_factory.mktemp("op"))
    report(run_dir)
    return run_dir


def transfer_records(run_dir, variant, k):
    out = {}
    for line in (run_dir / variant / f"rep-{k}" / "transfers.jsonl").read_text().splitlines():
        try:
            t = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[(t["client"], t["slot"], t["seq"])] = t
    return out


def test_fields_tornettools_reads_have_the_records_meaning(exported):
    checked = {"rtt": 0, "download": 0, "goodput_1mib": 0, "goodput_5th_mib": 0, "errors": 0, "cbt": 0}
    for variant in ("vanilla", "ewma-66"):
        for k in (0, 1, 2):
            recs = transfer_records(exported, variant, k)
            doc = json.loads((exported / "report" / "onionperf" / f"{variant}-rep{k}.onionperf.analysis.json").read_text())
            for name, src in doc["data"].items():
                for sid, st in src["tgen"]["streams"].items():
                    slot_seq, client, _ = sid.split(":")
                    slot, seq = map(int, slot_seq.split("-"))
                    rec = recs[(client, slot, seq)]
                    assert int(st["stream_info"]["recvsize"]) == rec["size"]
                    if st["is_error"]:
                        code = st["stream_info"]["error"].upper()
                        stalled = (rec.get("error") or {}).get("cause") == "stall"
                        assert (code in ("TIMEOUT", "STALLOUT")) == (rec["status"] == "timeout" or stalled)
                        checked["errors"] += 1
                        continue
                    assert int(st["byte_info"]["payload-bytes-recv"]) >= rec["size"]
                    ti = st["time_info"]
                    cmd, rsp = int(ti["usecs-to-command"]), int(ti["usecs-to-response"])
                    assert cmd > 0 and rsp > 0
                    assert (rsp - cmd) / 1e6 == pytest.approx(rec["ttfb_s"], abs=2e-6)
                    checked["rtt"] += 1
                    dl = st["elapsed_seconds"]["payload_bytes_recv"][str(rec["size"])] - cmd / 1e6
                    assert dl == pytest.approx(rec["ttlb_s"], abs=2e-6)
                    checked["download"] += 1
                    if rec["size"] >= MIB:
                        want = (MIB - 512000) * 8 / (at(rec, MIB) - at(rec, 512000))
                        assert goodput_bps(st, 512000, MIB) == pytest.approx(want, rel=1e-4)
                        checked["goodput_1mib"] += 1
                    if rec["size"] >= 5 * MIB:
                        want = MIB * 8 / (at(rec, 5 * MIB) - at(rec, 4 * MIB))
                        assert goodput_bps(st, 4 * MIB, 5 * MIB) == pytest.approx(want, rel=1e-4)
                        # the fallback path tornettools documents: 4 MiB is 0.8 of 5 MiB
                        assert st["elapsed_seconds"]["payload_progress_recv"]["0.8"] == pytest.approx(
                            at(rec, 4 * MIB) - rec["t_start"], abs=2e-6)
                        checked["goodput_5th_mib"] += 1
                for c in src["tor"]["circuits"].values():
                    assert c["buildtime_seconds"] > 0
                    checked["cbt"] += 1
    assert all(n > 0 for n in checked.values()), checked


def test_progress_fraction_keys_are_spelled_as_tornettools_looks_them_up(exported):
    doc = json.loads((exported / "report" / "onionperf" / "vanilla-rep0.onionperf.analysis.json").read_text())
    st = next(s for s in doc["data"]["web0"]["tgen"]["streams"].values() if s["is_success"])
    keys = set(st["elapsed_seconds"]["payload_progress_recv"])
    assert keys == {str(k / 10) for k in range(1, 11)}
    vals = [st["elapsed_seconds"]["payload_progress_recv"][str(k / 10)] for k in range(1, 11)]
    assert vals == sorted(vals)


def test_driver_records_progress_marks_over_a_real_socket():
    """The client driver's receive loop, on a real socket pair carrying an HTTP response of
    5 MiB, records the arrival time at 500 KiB, 1 MiB, 4 MiB and 5 MiB and every tenth."""
    size = 5 * MIB
    body = bytes(range(256)) * (size // 256)
    import hashlib
    a, b = socket.socketpair()

    def serve():
        b.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for i in range(0, size, 100_000):
            b.sendall(body[i:i + 100_000])
        b.close()
    th = threading.Thread(target=serve)
    th.start()
    fake = SimpleNamespace(cfg={"workload": {"size": size, "sha256": hashlib.sha256(body).hexdigest()}})
    rec = {"t_first_byte": None, "t_last_byte": None, "bytes": 0}
    a.settimeout(5)
    driver.Driver._receive(fake, a, rec, deadline=1e18, state={})
    th.join()
    a.close()
    marks = [m for m, _ in rec["progress"]]
    assert marks == driver.progress_marks(size)
    assert {512000, MIB, 4 * MIB, 5 * MIB} <= set(marks)
    times = [t for _, t in rec["progress"]]
    assert times == sorted(times) and times[-1] == rec["t_last_byte"] and times[0] >= rec["t_first_byte"]
