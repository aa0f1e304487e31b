"""``torbed capture`` and ``torbed trace info|slice|merge|convert``.

    capture OUT [-i IFACE] [--netns NS] [--filter F] (--duration D | -- COMMAND ...)
        tcpdump headers only (snap length 128: no payload is kept) while a command runs
        (or for a duration), then convert the capture to a trace
    trace info TRACE [--json]              flows, circuits, packets, bytes, duration, metadata
    trace slice TRACE OUT [--start S] [--end S] [--flow ID]...
    trace merge OUT NAME=TRACE... [--offset S]...
    trace convert INPUT OUT --from pcap|cell-log|cellstats [options]

Exit codes: 0 ok, 1 failure (capture tool failed), 2 bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, InputError
from . import convert
from .trace import TraceError, info, merge, read, slice_trace, write

console = Console(stderr=True)


def _meta(args) -> dict:
    m = {}
    for k in ("source", "licence", "origin", "description"):
        v = getattr(args, k, None)
        if v:
            m[k] = v
    return m


def _guard(fn):
    """A file the command cannot read or write is bad input (exit 2): an InputError for the
    CLI's one mapper (torbed.cli.report), like TraceError and PcapError, which name the file."""
    def wrapped(args) -> int:
        from ..cli import report
        try:
            return fn(args)
        except InputError as e:
            return report(e)
        except OSError as e:
            return report(InputError(str(e)))
    return wrapped


@_guard
def cmd_info(args) -> int:
    t = read(args.trace)
    i = info(t)
    if args.json:
        print(json.dumps(i, indent=2, sort_keys=True))
        return EXIT_OK
    out = Console()
    out.print(f"[bold]{args.trace}[/bold]: {i['flows']} flows on {i['circuits']} circuit(s), "
              f"{i['duration_s']:.3f} s; down {i['packets']['down']} packets / {i['bytes']['down']} bytes, "
              f"up {i['packets']['up']} packets / {i['bytes']['up']} bytes")
    for k, v in sorted(t.meta.items()):
        out.print(f"  {k}: {v if not isinstance(v, (dict, list)) else json.dumps(v)}", highlight=False)
    tab = Table()
    for col in ("flow", "circuit", "start s", "end s", "pkts down", "bytes down", "pkts up", "bytes up"):
        tab.add_column(col)
    for f in i["per_flow"][: args.max_flows]:
        tab.add_row(f["flow"], str(f["circuit"]), f"{f['start']:.3f}", f"{f['end']:.3f}", str(f["packets_down"]),
                    str(f["bytes_down"]), str(f["packets_up"]), str(f["bytes_up"]))
    out.print(tab)
    if len(i["per_flow"]) > args.max_flows:
        out.print(f"... {len(i['per_flow']) - args.max_flows} more flows (--max-flows)")
    return EXIT_OK


@_guard
def cmd_slice(args) -> int:
    t = slice_trace(read(args.trace), args.start, args.end, args.flow or None)
    if not t.flows:
        raise TraceError(f"{args.trace}: nothing between {args.start} s and {args.end} s")
    write(t, args.out)
    console.print(f"wrote {args.out}: {len(t.flows)} flows, {t.duration:.3f} s")
    return EXIT_OK


@_guard
def cmd_merge(args) -> int:
    items = []
    for item in args.traces:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).name.split(".")[0], item
        items.append((name, read(path)))
    if args.offset and len(args.offset) != len(items):
        raise TraceError(f"--offset given {len(args.offset)} times for {len(items)} traces")
    t = merge(items, args.offset or None)
    write(t, args.out)
    console.print(f"wrote {args.out}: {len(t.flows)} flows from {len(items)} traces")
    return EXIT_OK


def _convert(args, src: Path):
    if args.from_ == "pcap":
        return convert.from_pcap(src, args.filter or "", args.circuit_by, args.min_bytes, _meta(args))
    if args.from_ == "cell-log":
        return convert.from_cell_log(src, args.connection, _meta(args), args.max_circuits)
    if not args.relay:
        raise TraceError("--from cellstats needs --relay (e.g. middle0)")
    rows = convert.cell_log_from_cellstats(src, args.relay)
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        tmp = Path(f.name)
    try:
        convert.write_cell_log(rows, tmp)
        meta = {"source": f"{src} relay {args.relay} (CELL_STATS, 1 s grain)", **_meta(args)}
        return convert.from_cell_log(tmp, args.connection, meta, args.max_circuits)
    finally:
        tmp.unlink()


@_guard
def cmd_convert(args) -> int:
    t = _convert(args, Path(args.input))
    write(t, args.out)
    console.print(f"wrote {args.out}: {len(t.flows)} flows, {t.duration:.3f} s")
    return EXIT_OK


class Tcpdump:
    """tcpdump on ``iface`` (inside ``netns`` if given), headers only (snap length 128), as a
    context manager: started and listening on enter, stopped (SIGINT, so it flushes) on exit."""

    def __init__(self, iface: str, out_pcap: Path, netns: str | None = None, bpf: str = "tcp"):
        self.iface, self.out, self.netns, self.bpf = iface, Path(out_pcap), netns, bpf
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        tcpdump = shutil.which("tcpdump")
        if not tcpdump:
            raise OSError("tcpdump not found: run `make setup` (hack/install-deps.sh installs it)")
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        err = self.out.with_suffix(".tcpdump.log")
        with open(err, "w") as ef:
            self.proc = subprocess.Popen(prefix + [tcpdump, "-i", self.iface, "-U", "--immediate-mode", "-s", "128", "-w", str(self.out),
                                                   self.bpf], stderr=ef, stdout=subprocess.DEVNULL)
        deadline = time.time() + 10
        while "listening on" not in err.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise OSError(f"tcpdump did not start: {err.read_text().strip()}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        time.sleep(0.2)   # the last packets' way through the capture buffer
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.out.with_suffix(".tcpdump.log").unlink(missing_ok=True)


def capture(iface: str, out_pcap: Path, command: list[str] | None, duration: float | None,
            netns: str | None = None, bpf: str = "tcp") -> int:
    """Capture while ``command`` runs (inside ``netns`` too) or for ``duration`` seconds.
    Returns the command's exit code (0 for a duration)."""
    with Tcpdump(iface, out_pcap, netns, bpf):
        if command:
            prefix = ["ip", "netns", "exec", netns] if netns else []
            return subprocess.run(prefix + command).returncode
        time.sleep(duration or 0)
        return 0


def cmd_capture(args) -> int:
    if os.geteuid() != 0:
        console.print("[red]error[/red] capturing needs root (tcpdump on an interface)")
        return EXIT_FAILED
    command = getattr(args, "argv_after_dashdash", None) or None
    if not command and not args.duration:
        console.print("[red]error[/red] give --duration or a command after --")
        return EXIT_BAD_INPUT
    out = Path(args.out)
    pcap = Path(args.keep_pcap) if args.keep_pcap else out.with_name(out.name + ".pcap")
    try:
        rc = capture(args.iface, pcap, command, args.duration, args.netns)
    except OSError as e:
        console.print(f"[red]error[/red] {e}", highlight=False)
        return EXIT_FAILED
    args.from_ = "pcap"
    try:
        t = _convert(args, pcap)
    except InputError as e:   # a capture we made but cannot convert: a failure, not bad input
        console.print(f"[red]error[/red] {e}", highlight=False)
        return EXIT_FAILED
    t.meta.setdefault("tool", "")
    t.meta["tool"] = f"tcpdump -s 128 on {args.iface}" + (f" in netns {args.netns}" if args.netns else "") \
        + " via torbed capture; " + t.meta["tool"]
    write(t, out)
    if not args.keep_pcap:
        pcap.unlink(missing_ok=True)
    console.print(f"wrote {out}: {len(t.flows)} flows, {t.duration:.3f} s (command exit {rc})")
    return EXIT_OK if rc == 0 else EXIT_FAILED


def _meta_args(p) -> None:
    p.add_argument("--source", help="what was captured (meta.source)")
    p.add_argument("--licence", help="licence of the trace (meta.licence)")
    p.add_argument("--origin", help="who made it, where (meta.origin)")
    p.add_argument("--description", help="free text (meta.description)")


def _pcap_args(p) -> None:
    p.add_argument("--filter", default="", help="flows to keep: 'host A', 'net CIDR', 'port N', 'server port N' "
                                               "joined by 'and'")
    p.add_argument("--circuit-by", default="server", choices=("server", "flow", "one"),
                   help="which flows share a circuit when replayed")
    p.add_argument("--min-bytes", type=int, default=1, help="drop flows with fewer payload bytes")


def register(sub, fmt) -> None:
    p = sub.add_parser("capture", formatter_class=fmt,
                       help="capture TCP flows with tcpdump (headers only) and convert them to a trace",
                       description="Run tcpdump (snap length 128: headers only) on an interface, optionally in a "
                                   "network namespace, while COMMAND runs (or for --duration), and write the "
                                   "matching TCP flows as a torbed trace.")
    p.add_argument("out", help="trace file to write (.jsonl or .jsonl.gz)")
    p.add_argument("-i", "--iface", default="any", help="interface to capture on")
    p.add_argument("--netns", default=None, help="network namespace to capture (and run COMMAND) in")
    p.add_argument("--duration", type=float, default=None, help="capture this many seconds (without COMMAND)")
    p.add_argument("--keep-pcap", default=None, metavar="FILE", help="keep the raw capture here")
    _pcap_args(p)
    _meta_args(p)
    # The command after `--` is split off by torbed.cli.main (args.argv_after_dashdash).
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("trace", formatter_class=fmt, help="inspect, slice, merge and convert replay traces")
    tsub = p.add_subparsers(dest="trace_command", required=True, metavar="SUBCOMMAND")
    q = tsub.add_parser("info", formatter_class=fmt, help="flows, circuits, packets, bytes and metadata of a trace")
    q.add_argument("trace")
    q.add_argument("--json", action="store_true")
    q.add_argument("--max-flows", type=int, default=30)
    q.set_defaults(func=cmd_info)
    q = tsub.add_parser("slice", formatter_class=fmt, help="a time window and/or some flows of a trace")
    q.add_argument("trace")
    q.add_argument("out")
    q.add_argument("--start", type=float, default=0.0, help="seconds from the trace start")
    q.add_argument("--end", type=float, default=None, help="seconds from the trace start (exclusive)")
    q.add_argument("--flow", action="append", default=None, help="keep this flow (repeatable)")
    q.set_defaults(func=cmd_slice)
    q = tsub.add_parser("merge", formatter_class=fmt, help="several traces as one (flow ids prefixed by NAME)")
    q.add_argument("out")
    q.add_argument("traces", nargs="+", metavar="NAME=TRACE")
    q.add_argument("--offset", type=float, action="append", default=None,
                   help="time shift of each trace, in order (repeatable)")
    q.set_defaults(func=cmd_merge)
    q = tsub.add_parser("convert", formatter_class=fmt, help="pcap/pcapng or a relay cell log -> trace")
    q.add_argument("input")
    q.add_argument("out")
    q.add_argument("--from", dest="from_", required=True, choices=("pcap", "cell-log", "cellstats"),
                   help="pcap: pcap or pcapng; cell-log: CSV time,connection,circuit,direction; "
                        "cellstats: a torbed run's cellstats.jsonl (needs --relay)")
    _pcap_args(q)
    q.add_argument("--connection", default="busiest", help="cell logs: the connection to replay")
    q.add_argument("--max-circuits", type=int, default=None, help="cell logs: keep the busiest circuits only")
    q.add_argument("--relay", default=None, help="cellstats: the relay (e.g. middle0)")
    _meta_args(q)
    q.set_defaults(func=cmd_convert)

