#!/usr/bin/env python3
"""Generate tests/data/golden-run/: a small, deterministic, synthetic run directory
(docs/records.md, schema 1) for the torbed.analysis golden test.

    python tests/data/make_golden_run.py              rewrite tests/data/golden-run/
    python tests/data/make_golden_run.py --summary    also rewrite tests/data/golden-run.summary.json
                                                      (the expected `torbed report` output;
                                                      review its diff before committing)

What it holds (values chosen to look like a Tang & Goldberg experiment 1 in miniature):

- 2 variants (vanilla = baseline, ewma-66) x 3 repetitions (the fewest the report tests),
  warm-up 10 s, workload 90 s.
- clients: web0 fetches "small" (50 KiB) with 3 s pauses; bulk0 and bulk1 download "bulk"
  (5 MiB) back to back; ~30 transfers per repetition, those starting in the warm-up flagged.
  EWMA makes web transfers faster. One web timeout in vanilla rep 1, one circuit_failed
  in ewma-66 rep 0.
- cellstats at middle0: one light circuit (the web client's, active in ~45% of the seconds)
  and two heavy ones (the bulk clients'), one event per active circuit per second; guard0's
  records of the same circuits (1 ms per cell) and the clients' circuits.jsonl chain them to
  their clients;
  relayed circuits are named "<inbound conn>:<inbound circuit id>" as the collector does.
- relay_bw at guard0 and middle0 every 0.5 s for ~91 s.
- ewma-66 rep 1 crashed 40 s into the workload: meta status "failed", records stop there,
  and transfers.jsonl ends in a truncated record without newline.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "golden-run"
SUMMARY = HERE / "golden-run.summary.json"

SEED = 2024
VARIANTS = ["vanilla", "ewma-66"]
REPS = 3
WARMUP_S = 10.0
DURATION_S = 90.0
T_BASE = 1_700_000_000.0
CRASH = ("ewma-66", 1, 40.0)          # variant, rep, seconds into the workload
SMALL, BULK = 51200, 5242880
NODES = [
    ("guard0", "relay", "guard", 0, "10.77.0.10", True, False),
    ("middle0", "relay", "middle", 0, "10.77.0.11", False, False),
    ("exit0", "relay", "exit", 0, "10.77.0.12", False, True),
    ("www0", "server", "www", 0, "10.77.0.20", False, False),
    ("bulk0", "client", "bulk", 0, "10.77.0.30", False, False),
    ("bulk1", "client", "bulk", 1, "10.77.0.31", False, False),
    ("web0", "client", "web", 0, "10.77.0.32", False, False),
]


def fingerprint(name: str) -> str:
    return "".join(f"{(ord(c) * 37 + i * 11) % 256:02X}" for i, c in enumerate((name * 20)[:20]))


def dumps(rec: dict) -> str:
    return json.dumps(rec, sort_keys=True, separators=(",", ":"))


def r6(x: float) -> float:
    return round(x, 6)


def run_json() -> dict:
    return {
        "schema": 1, "name": "golden",
        "scenario": {"apiVersion": "torbed/v1", "name": "golden", "seed": 7, "variants": VARIANTS,
                     "repetitions": REPS,
                     "network": {"authorities": 3, "relays": {"guard": {"count": 1, "guard": True},
                                                              "middle": {"count": 1},
                                                              "exit": {"count": 1, "exit": True}}},
                     "links": {"default": {"rate": "100mbit"},
                               "pairs": [{"between": ["guard", "middle"], "rate": "4mbit"}]},
                     "servers": {"www": {"files": {"small": "50KiB", "bulk": "5MiB"}}},
                     "clients": {"bulk": {"count": 2, "path": ["guard", "middle", "exit"],
                                          "workload": {"kind": "bulk", "file": "bulk"}},
                                 "web": {"count": 1, "path": ["guard", "middle", "exit"],
                                         "workload": {"kind": "fetch", "file": "small", "pause": "3s"}}},
                     "measure": {"warmup": "10s", "duration": "90s",
                                 "collect": ["transfers", "cellstats", "relay_bw"]}},
        "seed": 7, "variants": VARIANTS, "baseline": "vanilla", "repetitions": REPS,
        "backend": "local", "shaper": "htb", "torbed_version": "0.1.0", "tor_version": "0.4.9.11",
        "host": {"hostname": "testhost", "kernel": "6.1.0-test", "cpus": 8, "memory_bytes": 17179869184,
                 "arch": "x86_64"},
        "started": "2023-11-14T22:13:20Z", "finished": "2023-11-14T22:40:00Z", "status": "partial"}


def meta_json(variant: str, rep: int, t0: float, crashed: bool) -> dict:
    return {
        "schema": 1, "variant": variant, "rep": rep,
        "status": "failed" if crashed else "ok",
        "error": f"relay middle0 exited unexpectedly (status 1) {CRASH[2]:.0f} s into the workload" if crashed else None,
        "t_start": r6(t0 - 21.0), "t_ready": r6(t0 - 3.0), "ready_s": 18.0, "t_workload_start": t0,
        "t_end": r6(t0 + (CRASH[2] if crashed else DURATION_S)), "warmup_s": WARMUP_S, "duration_s": DURATION_S,
        "builds": {variant: {"key": f"{variant}-0123abcd", "tor_sha256": "ab" * 32, "tor_version": "0.4.9.11"}},
        "authorities": [{"name": f"auth{i}", "v3ident": f"{i:040X}", "cert_expires": "2024-11-14"} for i in range(3)],
        "nodes": [{"name": n, "role": role, "group": g, "index": i, "address": a, "variant": variant if role == "relay" else None,
                   "exit": ex, "guard": gu, "ports": ({"socks": 9050, "control": 9051} if role == "client" else
                                                     {"http": 80} if role == "server" else {"or": 5000, "metrics": 9035}),
                   "fingerprint": fingerprint(n) if role == "relay" else None}
                  for n, role, g, i, a, gu, ex in NODES],
        "faults": []}


PROGRESS_BYTES = (10240, 20480, 51200, 102400, 204800, 512000, 1048576, 2097152, 4194304, 5242880,
                  9437184, 10485760)       # as torbed/client/driver.py records them


def progress(size: int, t_first: float, t_last: float) -> list[list]:
    """[[bytes, t], ...] at the driver's marks; the body arrives a little faster towards its
    end (slow start), deterministically so the random stream is not disturbed."""
    marks = sorted({b for b in PROGRESS_BYTES if b <= size} | {-(-size * k // 10) for k in range(1, 11)})
    return [[b, r6(t_first + (t_last - t_first) * (b / size) ** 0.8)] for b in marks]


def transfers(rng: random.Random, variant: str, rep: int, t0: float) -> tuple[list[dict], list[float]]:
    """All transfers of one repetition (uncut) in completion order, and their end times."""
    ewma = variant == "ewma-66"
    path = [{"node": n, "fingerprint": fingerprint(n)} for n in ("guard0", "middle0", "exit0")]
    out = []
    circ_id = 10 + 100 * rep
    fail_at = {("vanilla", 1): ("web0", 6, "timeout"), ("ewma-66", 0): ("web0", 4, "circuit_failed")}.get((variant, rep))
    for client, group, file, size, pause in (("web0", "web", "small", SMALL, 3.0),
                                             ("bulk0", "bulk", "bulk", BULK, 0.0),
                                             ("bulk1", "bulk", "bulk", BULK, 0.0)):
        t = t0 + rng.uniform(0.0, 0.5)
        seq = 0
        circuit = None
        while t < t0 + DURATION_S:
            rec = {"type": "transfer", "variant": variant, "rep": rep, "client": client, "group": group,
                   "workload": "fetch" if group == "web" else "bulk", "slot": 0, "seq": seq,
                   "server": "www0", "file": file, "size": size, "t_start": r6(t)}
            failing = fail_at and fail_at[0] == client and fail_at[1] == seq
            if failing and fail_at[2] == "circuit_failed":
                end = t + rng.uniform(1.0, 2.0)
                circuit = None
                rec.update(circuit=None, t_socks=None, t_request=None, t_first_byte=None, t_last_byte=None,
                           ttfb_s=None, ttlb_s=None, ttfb_stream_s=None, ttlb_stream_s=None, bytes=0,
                           status="error", error={"cause": "circuit_failed",
                                                  "detail": "building guard0-middle0-exit0: CIRC FAILED (TIMEOUT)"})
            else:
                build = 0.0
                if circuit is None:
                    build = rng.uniform(0.25, 0.9)
                    circ_id += 1
                    circuit = {"id": str(circ_id), "path": path, "build_s": r6(build)}
                t_socks = t + build + rng.uniform(0.15, 0.35)
                t_req = t_socks + 0.0008
                ttfb = rng.lognormvariate(math.log(0.45 if ewma else 0.62), 0.25)
                if group == "web":
                    ttlb = ttfb + rng.lognormvariate(math.log(0.55 if ewma else 1.25), 0.35)
                else:
                    ttlb = ttfb + rng.lognormvariate(math.log(21.0 if ewma else 20.0), 0.12)
                if failing:  # timeout: first byte arrived, the rest did not within 15 s
                    end = t + 15.0
                    rec.update(circuit=dict(circuit), t_socks=r6(t_socks), t_request=r6(t_req),
                               t_first_byte=r6(t_req + ttfb), t_last_byte=None, ttfb_s=r6(ttfb), ttlb_s=None,
                               ttfb_stream_s=r6(t_req + ttfb - t), ttlb_stream_s=None, bytes=12288,
                               status="timeout", error={"cause": "timeout", "detail": "no complete response in 15 s"})
                else:
                    end = t_req + ttlb
                    rec.update(circuit=dict(circuit), t_socks=r6(t_socks), t_request=r6(t_req),
                               t_first_byte=r6(t_req + ttfb), t_last_byte=r6(end), ttfb_s=r6(ttfb), ttlb_s=r6(ttlb),
                               ttfb_stream_s=r6(t_req + ttfb - t), ttlb_stream_s=r6(end - t), bytes=size,
                               status="ok", error=None, progress=progress(size, t_req + ttfb, end))
            rec["warmup"] = t < t0 + WARMUP_S
            out.append((end, rec))
            seq += 1
            t = end + pause + (rng.uniform(0.0, 0.2) if pause else 0.001)
    return [r for _, r in sorted(out, key=lambda x: x[0])], [e for e, _ in sorted(out, key=lambda x: x[0])]


def cellstats(rng: random.Random, variant: str, rep: int, t0: float, t_stop: float) -> list[dict]:
    ewma = variant == "ewma-66"
    circuits = [("light", 3, 7), ("heavy", 5, 7), ("heavy", 8, 7)]      # class, p_circ_id, conn
    wait = {("light", "inbound"): 22.0 if ewma else 140.0, ("heavy", "inbound"): 175.0 if ewma else 150.0,
            ("light", "outbound"): 2.0, ("heavy", "outbound"): 3.0}
    out = []
    for s in range(1, int(t_stop - t0) + 1):
        for cls, queue, conn in circuits:
            if cls == "light":
                if rng.random() > 0.45:
                    continue
                n_in, n_out = rng.randint(20, 80), rng.randint(0, 1)
            else:
                n_in, n_out = rng.randint(430, 520), rng.randint(3, 6)

            def side(n, d, q, c):
                w = wait[(cls, d)] * rng.uniform(0.7, 1.3)
                return {"queue": q, "conn": c, "added": {"relay": n}, "removed": {"relay": n},
                        "time_ms": {"relay": int(round(n * w))}}
            out.append({"type": "cellstats", "variant": variant, "rep": rep, "relay": "middle0", "group": "middle",
                        "t": r6(t0 + s + rng.uniform(0.0, 0.05)), "circuit": f"{conn}:{queue}",
                        "inbound": side(n_in, "inbound", queue, conn),
                        "outbound": side(n_out, "outbound", queue + 1000, conn + 1)})
    return out


CLIENT_OF_QUEUE = {3: ("web0", "web", 41), 5: ("bulk0", "bulk", 42), 8: ("bulk1", "bulk", 43)}


def client_side(variant: str, rep: int, t0: float, transfers_: list[dict], middle: list[dict]) -> tuple[list, list]:
    """guard0's CELL_STATS records of the three client circuits (mirroring middle0's, a
    constant 1 ms per cell, no randomness: the other golden records stay as they were) and the clients' circuits.jsonl
    (each client's first circuit, its id toward the guard), so the report knows every
    middle0 circuit by its client (analysis/circuits.py). guard0 reaches middle0 on its
    channel 20 (middle0's 7) with the circuit ids middle0 sees; client k's channel is 4k there."""
    first: dict[str, str] = {}
    for t in sorted(transfers_, key=lambda t: t["t_start"]):
        if t.get("circuit"):
            first.setdefault(t["client"], t["circuit"]["id"])
    guard = []
    for m in middle:
        q = m["inbound"]["queue"]
        client, _, conn = CLIENT_OF_QUEUE[q]
        guard.append({"type": "cellstats", "variant": variant, "rep": rep, "relay": "guard0", "group": "guard",
                      "t": r6(m["t"] - 0.02), "circuit": f"{conn}:{2000 + q}",
                      "inbound": {"queue": 2000 + q, "conn": conn, "added": m["inbound"]["added"],
                                  "removed": m["inbound"]["removed"],
                                  "time_ms": {"relay": sum(m["inbound"]["removed"].values())}},
                      "outbound": {"queue": q, "conn": 20, "added": m["outbound"]["added"],
                                   "removed": m["outbound"]["removed"],
                                   "time_ms": {"relay": sum(m["outbound"]["removed"].values())}}})
    circuits_ = []
    path = [fingerprint(n) for n in ("guard0", "middle0", "exit0")]
    for q, (client, group, _) in CLIENT_OF_QUEUE.items():
        if client not in first:
            continue
        base = {"type": "client_circuit", "variant": variant, "rep": rep, "client": client, "group": group,
                "t": r6(t0 + 0.5), "id": first[client]}
        circuits_ += [{**base, "event": "built", "purpose": "GENERAL", "build_flags": [], "path": path},
                      {**base, "event": "link", "conn": "2", "queue": str(2000 + q)}]
    return guard, circuits_


def relay_bw(rng: random.Random, variant: str, rep: int, t0: float, t_stop: float) -> list[dict]:
    out = []
    t = t0 - 1.0
    k = 0
    rate = {"guard0": 505_000.0, "middle0": 500_000.0}
    while True:
        t = t0 - 1.0 + 0.5 * (k + 1)
        if t > t_stop + 1e-9:
            break
        ramp = min(1.0, max(0.05, (t - t0) / 5.0))
        for relay in ("guard0", "middle0"):
            # EWMA slightly lower peak throughput; a burst 50-60 s into the workload.
            base = rate[relay] * (0.98 if variant == "ewma-66" else 1.0)
            burst = 1.15 if 50.0 <= t - t0 < 60.0 else 1.0
            written = int(base * burst * ramp * 0.5 * rng.uniform(0.85, 1.15))
            out.append({"type": "relay_bw", "variant": variant, "rep": rep, "relay": relay,
                        "group": relay[:-1], "t": r6(t + rng.uniform(0.0, 0.004)), "interval_s": 0.5,
                        "read": written + rng.randint(0, 2000), "written": written})
        k += 1
    return out


def write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(dumps(r) + "\n" for r in records) + tail)


def generate(out: Path = OUT) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps(run_json(), indent=2, sort_keys=True) + "\n")
    rng = random.Random(SEED)
    for vi, variant in enumerate(VARIANTS):
        for rep in range(REPS):
            t0 = T_BASE + 1000.0 * (vi * REPS + rep)
            crashed = (variant, rep) == CRASH[:2]
            t_stop = t0 + (CRASH[2] if crashed else DURATION_S)
            d = out / variant / f"rep-{rep}"
            (d / "logs").mkdir(parents=True)
            (d / "meta.json").write_text(json.dumps(meta_json(variant, rep, t0, crashed), indent=2, sort_keys=True) + "\n")
            recs, ends = transfers(rng, variant, rep, t0)
            tail = ""
            if crashed:
                done = [r for r, e in zip(recs, ends) if e <= t_stop]
                cut = recs[len(done)]
                tail = dumps(cut)[:70]          # the record being written when the run died
                recs = done
            write_jsonl(d / "transfers.jsonl", recs, tail)
            middle = cellstats(rng, variant, rep, t0, t_stop)
            guard, circuits_ = client_side(variant, rep, t0, recs, middle)
            write_jsonl(d / "cellstats.jsonl", middle + guard)
            write_jsonl(d / "circuits.jsonl", circuits_)
            write_jsonl(d / "relay_bw.jsonl", relay_bw(rng, variant, rep, t0, t_stop))
            (d / "logs" / "middle0.log").write_text("synthetic run: no tor log\n")


def write_summary() -> None:
    """Run `report` on a copy of the golden run and store its summary.json as the golden."""
    sys.path.insert(0, str(HERE.parent.parent))
    from torbed.analysis import report  # noqa: E402 - needs the package importable
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / OUT.name
        shutil.copytree(OUT, copy)
        report(copy)
        shutil.copy(copy / "report" / "summary.json", SUMMARY)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", action="store_true", help="also rewrite golden-run.summary.json")
    args = ap.parse_args(argv)
    generate()
    print(f"wrote {OUT}")
    if args.summary:
        write_summary()
        print(f"wrote {SUMMARY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
