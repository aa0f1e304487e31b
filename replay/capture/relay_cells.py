"""The relay cell-timing log and its trace from a torbed run (Torchestra's experiment 3 input).

    python replay/capture/relay_cells.py RUN_DIR LOG.csv.gz TRACE.jsonl.gz [--relay middle0] [--duration 60]

Reads the relay's CELL_STATS records (cellstats.jsonl of the run's first repetition), writes
the per-cell log (time,connection,circuit,direction; cells of each 1 s event spread evenly
over its second: CELL_STATS counts cells per second, tor logs no per-cell times) and converts
its busiest connection to a trace, each circuit on a circuit of its own, as the paper
replayed the connection with the most cells and circuits. Only metadata is logged: circuit
and connection numbers and times (as the paper did), nothing of the cells' content.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torbed.replay import convert  # noqa: E402
from torbed.replay.trace import write  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("log", type=Path)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--relay", default="middle0")
    ap.add_argument("--duration", type=float, default=60.0, help="keep this many seconds after the warm-up")
    args = ap.parse_args(argv)
    rep = next(sorted(args.run_dir.glob("*/rep-0")).__iter__())
    meta = json.loads((rep / "meta.json").read_text())
    t0 = meta["t_workload_start"] + meta["warmup_s"]
    rows = [r for r in convert.cell_log_from_cellstats(rep / "cellstats.jsonl", args.relay)
            if t0 <= r[0] < t0 + args.duration]
    rows = [(round(t - t0, 6), c, circ, d) for t, c, circ, d in rows]   # times from the log's start
    run = json.loads((args.run_dir / "run.json").read_text())
    header = (f"cell-timing log of relay {args.relay} in torbed run {args.run_dir.name} "
              f"(scenario {run['name']}, variant {meta['variant']}, tor {run.get('tor_version')}); "
              f"{args.duration:g} s after the warm-up; from CELL_STATS (1 s grain, cells spread evenly)")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "cells.csv"
        convert.write_cell_log(rows, plain, header=header)
        args.log.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=9, mtime=0))
        trace = convert.from_cell_log(plain, "busiest", meta={
            "source": header, "tool": "replay/capture/relay_cells.py + torbed.replay.convert.from_cell_log",
            "licence": "CC0-1.0", "origin": "captured by the torbed project from a relay of its own testbed "
                                           "under synthetic load (replay/capture/relay-load.yaml)"})
    write(trace, args.trace)
    print(f"wrote {args.log} ({len(rows)} cells) and {args.trace}: {len(trace.flows)} circuits, "
          f"{trace.duration:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
