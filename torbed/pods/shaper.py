"""Per-link shaping and egress isolation in a pod: htb classes per peer group on the pod's egress, as the local
backend's tc shaping does per destination node (torbed.shaping), selected by u32 filters on
the peers' addresses.

Peers' pod addresses exist only once the peers run and change when a pod is recreated, so
the shaper installs the classes once (then reports ready, which gates tor's start) and keeps
the filters in step with the groups' Service records: headless Services give pod addresses,
ClusterIP Services (authorities, servers) their virtual address, which is what a sender's
egress sees before the node translates it. Changes are logged.

Isolation: after the per-peer filters, packets to anything outside ``--allow`` (the private
ranges by default: where cluster pods and Services live) are dropped at the pod's own
interface, and so is IPv6 beyond link-local and multicast. The chart's NetworkPolicy does
the same only where the CNI enforces NetworkPolicy; this holds on any cluster, so an exit
relay (policy accept *:*) cannot reach outside the testbed whatever a client asks.

Link faults (docs/faults.md): the shaper is the one owner of the pod's tc tree, so a fault
is a request to it. ``python -m torbed.pods.shaper fault apply|undo`` (run by the backend
through the API's exec in this container) writes the wanted state to
``<state dir>/faults/<id>.json``, wakes the shaper (SIGUSR1) and waits for its
acknowledgement in ``<state dir>/applied.json``. The shaper gives a rate fault an htb class
per peer group (the group's queue setting, the fault's rate) and a partition the drop class,
and classifies the fault's peers' addresses into them with filters at a priority ahead of
the per-peer ones, resolved again every second like those: a peer pod recreated with a new
address stays under the fault. The state lives in the pod's emptyDir: a restarted shaper
puts the faults back, a recreated pod starts without them.

Filter priorities on ``1:``: 1 faults, 2 peers, 3-6 isolation.

Mechanism gates (torbed.gates, docs/statistics.md): once its filters are in, the sidecar
samples its pod once a second as the local backend samples each sender: the backlog of the
htb class toward each peer group a rate-limited link leads to (``shaper.jsonl``, links named
``<node>><group>``), and in a relay pod the pod's TCP send queues summed per peer group
(``sockets.jsonl``, from /proc/net/tcp of the shared network namespace), streamed to the
results service.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import shaping
from ..errors import EXIT_FAILED, EXIT_OK
from ..network import LinkSpec
from . import Shipper, load_scenario, log, node_name, plan, results_post


class TcError(RuntimeError):
    pass


def tc_batch(commands: list[str]) -> None:
    if not commands:
        return
    proc = subprocess.run(["tc", "-batch", "-"], input="\n".join(commands) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        raise TcError(proc.stderr.strip() or proc.stdout.strip())


def default_dev() -> str:
    out = subprocess.run(["ip", "-o", "route", "show", "default"], capture_output=True, text=True).stdout.split()
    return out[out.index("dev") + 1] if "dev" in out else "eth0"


def peer_names(release: str, ns: str, domain: str, s, group: str) -> list[str]:
    """DNS names whose A records are the addresses of a group's pods (and virtual IPs)."""
    def fq(name: str) -> str:
        return f"{release}-{name}.{ns}.svc.{domain}"
    if group == "authority":
        return [fq("auth")] + [fq(f"auth-{i}") for i in range(s.network.authorities)]
    if group in s.servers:
        return [fq(group), fq(f"{group}-pods")]
    return [fq(group)]


def expected_addresses(s, group: str, me_group: str) -> int:
    """How many addresses the peer group's names resolve to once every pod of it exists:
    its pods (but this one), plus the virtual IPs of ClusterIP Services."""
    if group == "authority":
        pods, virtual = s.network.authorities, s.network.authorities
    elif group in s.servers:
        pods, virtual = s.servers[group].count, 1
    elif group in s.network.relays:
        pods, virtual = s.network.relays[group].count, 0
    elif group == "load" and s.load is not None:   # the load nodes (headless <release>-load)
        pods, virtual = s.load.workers, 0
    else:
        pods, virtual = s.clients[group].count, 0
    return pods - (1 if group == me_group else 0) + virtual


def report_complete(url: str, pod: str) -> bool:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(results_post(f"{url.rstrip('/')}/shaped/{pod}"), timeout=5) as r:
            r.read()
        return True
    except (urllib.error.URLError, OSError):
        return False


def _exit_now(*_) -> None:
    """SIGTERM: the pod is being deleted (the kubelet stops a sidecar only then), and its
    network namespace with the tree goes with it: nothing to undo. Exit at once rather than
    at the end of the loop's round, whose DNS look-ups and calls to the results service
    (being deleted too) held every shaped pod until its grace period ran out (30 s for a
    client pod deleted mid-run, 10 s for a relay)."""
    raise SystemExit(EXIT_OK)


def resolve(name: str) -> set[str]:
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)}
    except socket.gaierror:
        return set()


def announce(url: str, pod: str, group: str, ip: str) -> bool:
    """Tell the results service this pod's group and address (GET /peers lists them)."""
    import urllib.error
    import urllib.request
    try:
        req = results_post(f"{url.rstrip('/')}/peer/{pod}", json.dumps({"group": group, "ip": ip}).encode(),
                           "application/json")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
        return True
    except (urllib.error.URLError, OSError):
        return False


def announced(url: str) -> dict[str, set[str]]:
    """{group: addresses} the shapers have announced; empty when the service cannot say."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/peers", timeout=5) as r:
            pods = json.loads(r.read()).get("pods") or {}
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    out: dict[str, set[str]] = {}
    for entry in pods.values():
        if isinstance(entry, dict) and entry.get("group") and entry.get("ip"):
            out.setdefault(str(entry["group"]), set()).add(str(entry["ip"]))
    return out


def peer_table(ids: dict[str, str], dns: dict[str, set[str]], others: dict[str, set[str]],
               expected: dict[str, int], settled: set[str], own: set[str]) -> tuple[dict[str, str], bool]:
    """The filters' {address: class id}, and whether every shaped group has all its addresses.

    A group whose DNS answer is complete is settled (added to ``settled``) and from then on
    classified by DNS alone; before that, the addresses its shapers announced are added."""
    want: dict[str, str] = {}
    complete = True
    for g, cid in ids.items():
        found = set(dns.get(g, set())) - own
        if g not in settled and len(found) >= expected[g]:
            settled.add(g)
        if g not in settled:
            found |= others.get(g, set()) - own
        for ip in found:
            want.setdefault(ip, cid)
        complete &= len(found) >= expected[g]
    return want, complete


def classes(dev: str, specs: dict[str, LinkSpec]) -> tuple[list[str], dict[str, str]]:
    """tc commands for the htb tree, and the class id of each shaped peer group."""
    cmds = [f"qdisc add dev {dev} root handle 1: htb default 1",
            f"class add dev {dev} parent 1: classid 1:1 htb rate {shaping.UNLIMITED}"]
    ids: dict[str, str] = {}
    for minor, (group, spec) in enumerate(sorted(specs.items()), start=2):
        cmds += shaping.class_lines(dev, minor, spec)
        ids[group] = f"1:{minor:x}"
    return cmds, ids


DROP_CLASS = "1:fff"
FAULT_PRIO, PEER_PRIO = 1, 2          # isolation: 3-6
# Fault classes 1:1000 and up, 0x40 minors per fault (one per peer group): clear of the
# peer groups' classes (1:2 ...) and of the drop class 1:fff; htb minors end at 0xffff.
FAULT_MINOR_BASE, FAULT_MINORS = 0x1000, 0x40
MAX_FAULT_ID = (0xffff - FAULT_MINOR_BASE) // FAULT_MINORS - 1
STATE_DIR = Path("/run/torbed/shaper")   # the chart's emptyDir (shaper-run)
# Before the command's JSON reply: output that is JSON as a whole comes back from the
# kubernetes client's exec as the repr of the decoded object, not as the text.
REPLY = "shaper-fault: "
DEFAULT_ALLOW = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"]


def isolation(dev: str, allow: list[str]) -> list[str]:
    """Filters after the per-peer ones (prio 2): allowed ranges take the default class,
    the rest of IPv4 and IPv6 (but link-local/multicast, which neighbour discovery needs)
    is dropped."""
    # A class whose queue holds nothing drops what it is given; tc actions (act_gact) are not
    # in every kernel (not in this project's CI kernel), htb and pfifo are.
    cmds = [f"class add dev {dev} parent 1: classid {DROP_CLASS} htb rate 8kbit ceil 8kbit",
            f"qdisc add dev {dev} parent {DROP_CLASS} handle {DROP_CLASS.split(':')[1]}: pfifo limit 0"]
    cmds += [f"filter add dev {dev} parent 1: protocol ip prio 3 u32 match ip dst {net} flowid 1:1" for net in allow]
    cmds.append(f"filter add dev {dev} parent 1: protocol ip prio 4 u32 match u32 0 0 flowid {DROP_CLASS}")
    cmds += [f"filter add dev {dev} parent 1: protocol ipv6 prio 5 u32 match ip6 dst {net} flowid 1:1"
             for net in ("fe80::/10", "ff00::/8")]
    cmds.append(f"filter add dev {dev} parent 1: protocol ipv6 prio 6 u32 match u32 0 0 flowid {DROP_CLASS}")
    return cmds


def filters(dev: str, mapping: dict[str, str], previous: dict[str, str], prio: int = PEER_PRIO) -> list[str]:
    """Replace the filters of ``previous`` by those of ``mapping`` at ``prio`` (the kernel
    refuses to delete a filter chain that does not exist, so only delete what was installed)."""
    cmds = [f"filter del dev {dev} parent 1: prio {prio}"] if previous else []
    cmds += [f"filter add dev {dev} parent 1: protocol ip prio {prio} u32 match ip dst {ip}/32 flowid {cid}"
             for ip, cid in sorted(mapping.items())]
    return cmds


# ---------------------------------------------------------------------------------------
# Link faults

def node_peer_names(release: str, ns: str, domain: str, s, p, peer: str) -> list[str]:
    """DNS names whose A records are the addresses of a fault's peer: a group (its Service
    records, as for the per-peer filters) or one node (its pod's own record: StatefulSet
    and indexed Job pods have ``<pod>.<governing Service>``; an authority also its ClusterIP).
    A node alone in its group is the group (servers' and Locust's pods have no record of
    their own; the backend refuses faults naming one node of a larger such group)."""
    groups = {n.group for n in p.nodes}
    if peer in groups:
        return peer_names(release, ns, domain, s, peer)
    n = p.node(peer)
    if len(p.group_nodes(n.group)) == 1 and n.group != "authority":
        return peer_names(release, ns, domain, s, n.group)
    if n.group == "authority":
        return [f"{release}-auth-{n.index}.{release}-auth.{ns}.svc.{domain}",
                f"{release}-auth-{n.index}.{ns}.svc.{domain}"]
    return [f"{release}-{n.group}-{n.index}.{release}-{n.group}.{ns}.svc.{domain}"]


def peer_group(p, peer: str) -> str:
    """The scenario group of a fault's peer (a group or a node name)."""
    return peer if peer in {n.group for n in p.nodes} else p.node(peer).group


def fault_classes(dev: str, req: dict, groups: list[str], specs: dict[str, LinkSpec]) -> tuple[list[str], dict[str, str]]:
    """tc commands for a fault's own classes, and the class each peer group's packets take:
    a partition sends them to the drop class; a rate fault to an htb class per peer group
    with the fault's rate and the group's link otherwise (its queue setting)."""
    if req.get("partition"):
        return [], {g: DROP_CLASS for g in groups}
    cmds, ids = [], {}
    for k, g in enumerate(sorted(set(groups))):
        minor = FAULT_MINOR_BASE + req["id"] * FAULT_MINORS + k
        cmds += shaping.class_lines(dev, minor, dataclasses.replace(specs.get(g, LinkSpec()), rate_bps=req["rate_bps"]))
        ids[g] = f"1:{minor:x}"
    return cmds, ids


def class_del(dev: str, classids) -> list[str]:
    """Deleting an htb leaf also deletes the queue under it."""
    return [f"class del dev {dev} classid {c}" for c in sorted(set(classids)) if c != DROP_CLASS]


def read_requests(state: Path) -> dict[int, dict]:
    """The faults wanted now: ``<state>/faults/<id>.json``, as written by ``fault apply``."""
    out = {}
    for f in sorted((state / "faults").glob("*.json")):
        try:
            req = json.loads(f.read_text())
            out[int(req["id"])] = req
        except (OSError, ValueError, KeyError, TypeError) as e:
            log(f"shaper: ignoring the fault request {f.name}: {e}")
    return out


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.replace(path)   # atomic: a reader never sees half a file


class FaultTable:
    """The link faults in force in this pod's tc tree, kept in step with the requests in
    the state directory and with the peers' addresses (``step``, once a loop iteration)."""

    def __init__(self, dev: str, state: Path, specs: dict[str, LinkSpec], names, group_of, batch=None,
                 fill=None):
        self.dev, self.state, self.specs = dev, state, specs
        self.names, self.group_of = names, group_of    # peer -> DNS names; peer -> its group
        # fill(peer, found) -> addresses: adds what DNS does not list yet (the addresses the
        # peers announced to the results service: see main's loop); None: DNS alone.
        self.fill = fill
        self.batch = batch or tc_batch
        self.applied: dict[int, dict] = {}   # id -> {"req", "classes": {group: classid}, "addresses", "error"}
        self.current: dict[str, str] = {}    # address -> class, installed at FAULT_PRIO
        self.filter_error: str | None = None

    def step(self, own: set[str], resolver=None) -> None:
        resolver = resolver or resolve
        wanted = read_requests(self.state)
        gone = [i for i, a in self.applied.items() if wanted.get(i, {}).get("nonce") != a["req"]["nonce"]]
        if gone:
            removed = [self.applied.pop(i) for i in gone]
            self._sync(own, resolver)   # the filters first: the kernel keeps a class a filter points to
            for a in removed:
                try:
                    self.batch(class_del(self.dev, a["classes"].values()))
                except TcError as e:
                    log(f"shaper: fault {a['req']['id']}: removing its classes failed: {e}")
                log(f"shaper: fault {a['req']['id']} undone")
        for i, req in sorted(wanted.items()):
            if i in self.applied:
                continue
            groups = [self.group_of(peer) for peer in req["peers"]]
            cmds, classes = fault_classes(self.dev, req, groups, self.specs)
            entry = {"req": req, "classes": classes, "addresses": {}, "error": None}
            try:
                self.batch(cmds)
            except TcError as e:
                entry["error"] = f"tc: {e}"
                entry["classes"] = {}
            self.applied[i] = entry
            what = "partition" if req.get("partition") else f"rate {req['rate_bps']} bit/s"
            log(f"shaper: fault {i} ({what}) toward {', '.join(req['peers'])}: "
                + (entry["error"] or f"classes {', '.join(f'{g} {c}' for g, c in sorted(classes.items()))}"))
        self._sync(own, resolver)
        _write_json(self.state / "applied.json", {
            "faults": {str(i): {"nonce": a["req"]["nonce"], "classes": a["classes"], "addresses": a["addresses"],
                                "error": a["error"]} for i, a in self.applied.items()},
            "filter_error": self.filter_error, "t": time.time()})

    def _sync(self, own: set[str], resolver) -> None:
        want: dict[str, str] = {}
        for i, a in sorted(self.applied.items()):
            if a["error"]:
                continue
            for peer in a["req"]["peers"]:
                found: set[str] = set()
                for name in self.names(peer):
                    found |= resolver(name) - own
                if self.fill is not None:
                    found = set(self.fill(peer, found)) - own
                a["addresses"][peer] = sorted(found)
                for ip in found:   # two faults never share a link (validated), so never an address
                    want.setdefault(ip, a["classes"][self.group_of(peer)])
        if want == self.current:
            return
        try:
            self.batch(filters(self.dev, want, self.current, FAULT_PRIO))
            self.current, self.filter_error = want, None
        except TcError as e:
            self.filter_error = f"tc: updating the fault filters failed: {e}"
            log(f"shaper: {self.filter_error}")


def tree_summary(class_show: str, filter_show: str) -> tuple[set[str], set[str]]:
    """A tc tree as ``tc class show`` and ``tc filter show`` print it, without the handles
    the kernel picks (they change whenever filters are replaced): classes as "htb <id>
    rate <rate>", filters as "pref <prio> <protocol> -> <class> <match>". What a test
    compares before a fault and after its undo."""
    classes = set()
    for line in class_show.splitlines():
        w = line.split()
        if w[:1] == ["class"] and "rate" in w:
            classes.add(f"{w[1]} {w[2]} rate {w[w.index('rate') + 1]}")
    filters, head = set(), None
    for line in filter_show.splitlines():
        w = line.split()
        flowid = [k for k, x in enumerate(w) if x.lstrip("*") == "flowid"]   # "*flowid": the class exists
        if w[:1] == ["filter"]:
            head = f"pref {w[w.index('pref') + 1]} {w[w.index('protocol') + 1]} -> {w[flowid[0] + 1]}" \
                if flowid else None
        elif w[:1] == ["match"] and head:
            filters.add(f"{head} {w[1]}")
    return classes, filters


def _ack(state: Path) -> dict:
    try:
        return json.loads((state / "applied.json").read_text())
    except (OSError, ValueError):
        return {}


def fault_command(argv: list[str]) -> int:
    """``fault apply|undo``: hand a fault to the running shaper and wait until its tc tree
    has it (or no longer has it). Prints the shaper's record (``REPLY`` + JSON); exit 1 on
    failure."""
    ap = argparse.ArgumentParser(prog="python -m torbed.pods.shaper fault",
                                 description="apply or undo a link fault through the running shaper")
    ap.add_argument("action", choices=["apply", "undo"])
    ap.add_argument("--id", type=int, required=True, help=f"the fault's index in the scenario (0 .. {MAX_FAULT_ID})")
    ap.add_argument("--peer", action="append", default=[], help="a group or node whose addresses the fault takes "
                    "(repeatable)")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--rate-bps", type=int, help="the links' rate while the fault lasts, bits per second")
    kind.add_argument("--partition", action="store_true", help="drop every packet to the peers")
    ap.add_argument("--state-dir", type=Path, default=STATE_DIR)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the shaper (default: 20)")
    args = ap.parse_args(argv)
    if not 0 <= args.id <= MAX_FAULT_ID:
        ap.error(f"--id: 0 .. {MAX_FAULT_ID}")
    if args.action == "apply" and (not args.peer or (args.rate_bps is None and not args.partition)):
        ap.error("apply needs --peer and --rate-bps or --partition")
    if args.rate_bps is not None and args.rate_bps <= 0:
        ap.error("--rate-bps: more than 0")
    req_file = args.state_dir / "faults" / f"{args.id}.json"
    nonce = os.urandom(8).hex()
    t0 = time.time()
    if args.action == "apply":
        req_file.parent.mkdir(parents=True, exist_ok=True)
        _write_json(req_file, {"id": args.id, "nonce": nonce, "peers": args.peer, "rate_bps": args.rate_bps,
                               "partition": args.partition})
    else:
        req_file.unlink(missing_ok=True)
    try:
        os.kill(int((args.state_dir / "pid").read_text()), signal.SIGUSR1)
    except (OSError, ValueError):
        pass   # the shaper looks at the requests every second anyway
    while True:
        ack = _ack(args.state_dir)
        entry = (ack.get("faults") or {}).get(str(args.id))
        if args.action == "undo" and ack and entry is None:
            print(REPLY + json.dumps({"id": args.id, "undone": True, "took_s": round(time.time() - t0, 3)}))
            return EXIT_OK
        if args.action == "apply" and entry and entry["nonce"] == nonce:
            err = entry["error"] or ack.get("filter_error")
            if err:
                req_file.unlink(missing_ok=True)
                print(f"fault {args.id}: {err}", file=sys.stderr)
                return EXIT_FAILED
            print(REPLY + json.dumps({"id": args.id, "classes": entry["classes"], "addresses": entry["addresses"],
                                      "took_s": round(time.time() - t0, 3)}))
            return EXIT_OK
        if time.time() - t0 > args.timeout:
            print(f"fault {args.id}: the shaper did not acknowledge the {args.action} within {args.timeout:g} s "
                  f"({args.state_dir / 'applied.json'})", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fault"]:
        return fault_command(argv[1:])
    args = _parser().parse_args(argv)
    s = load_scenario(args.scenario)
    p = plan(s)
    specs = _link_specs(s, p, args.group)
    dev = default_dev()
    cmds, ids = classes(dev, specs)
    allow = list(args.allow or DEFAULT_ALLOW)
    # The pod's own node: kubelet probes and the API server's proxy reach pods from it, and
    # the replies must get back (the node is not "outside" in any sense that matters here).
    host_ip = os.environ.get("HOST_IP")
    if host_ip:
        allow.append(f"{host_ip}/32")
    cmds += isolation(dev, allow)
    # A restarted sidecar finds its previous tree: start from a clean interface.
    subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
    # MTU-sized frames, as the local backend's htb gets (torbed.shaping.ONE_FRAME_PER_SKB: with
    # segmentation offload a bounded queue drops whole 64 KB frames).
    link = subprocess.run(["ip", "link", "set", "dev", dev, *shaping.ONE_FRAME_PER_SKB], capture_output=True, text=True)
    if link.returncode != 0:
        log(f"shaper: warning: cannot limit {dev} to one frame per packet ({link.stderr.strip()}): htb sees "
            "offloaded frames of up to 64 KB, and a bounded queue drops them whole")
    try:
        tc_batch(cmds)
    except TcError as e:
        hint = (" (this node's kernel lacks sch_netem: links with delay, jitter or loss need it)"
                if "netem" in str(e).lower() or any(sp.needs_delay_emulation for sp in specs.values()) else "")
        log(f"shaper: cannot install the htb tree on {dev}: {e}{hint}")
        return EXIT_FAILED
    for g, cid in sorted(ids.items()):
        log(f"shaper: {args.group} -> {g}: class {cid}, {specs[g].describe()}")
    own = set()
    try:
        own = {socket.gethostbyname(socket.gethostname())}
    except OSError:
        pass
    args.ready_file.parent.mkdir(parents=True, exist_ok=True)
    args.ready_file.write_text("htb and isolation installed\n")
    log(f"shaper: egress outside {', '.join(allow)} is dropped")
    signal.signal(signal.SIGTERM, _exit_now)
    wake_r = _wake_pipe()
    _shape(args, s, p, dev, specs, ids, own, wake_r)
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="torbed link shaper (a pod's native sidecar)")
    ap.add_argument("--scenario", type=Path, required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--release", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--cluster-domain", default="cluster.local")
    ap.add_argument("--ready-file", type=Path, required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--allow", action="append", default=None, metavar="CIDR",
                    help=f"egress allowed to this IPv4 range (repeatable; default {' '.join(DEFAULT_ALLOW)})")
    return ap


def _link_specs(s, p, group: str) -> dict[str, LinkSpec]:
    """Peer group -> the link from this pod's group to it, for every link that is shaped."""
    me = p.group_nodes(group)[0] if group != "authority" else p.by_role("authority")[0]
    specs: dict[str, LinkSpec] = {}
    # The load nodes too (links.pairs may name `load`): their headless Service lists them.
    for g in ["authority", *s.network.relays, *s.servers, *s.clients, *(["load"] if s.load else [])]:
        # The group's last node: not ``me`` (a group's first) unless the group has one node,
        # so an authority pod gets a class for the other authorities as well.
        peer = p.by_role("authority")[-1] if g == "authority" else p.group_nodes(g)[-1]
        if peer is me:  # a one-node group: no link to itself
            continue
        spec = p.link(me, peer)
        if spec != LinkSpec():
            specs[g] = spec
    return specs


def _carries_data(p, group: str) -> bool:
    """Does ``group`` hold nodes whose links carry the measured traffic (torbed.gates.DATA_ROLES)?"""
    from ..gates import DATA_ROLES
    return group != "authority" and any(n.role in DATA_ROLES for n in p.group_nodes(group))


def gate_sources(p, group: str, node: str, dev: str, specs: dict[str, LinkSpec], ids: dict[str, str], out: Path,
                 run=subprocess.run, tcp=Path("/proc/net/tcp")) -> tuple[list, object | None]:
    """The mechanism gates' samples this pod takes (torbed.gates, the local backend's samples
    per sender): the backlog of its htb class toward each peer group a rate-limited link
    leads to (``<node>><group>``: the sidecar shapes per peer group), and in a relay pod the
    kernel's TCP send queues of the pod (/proc/net/tcp: this container shares the pod's
    network namespace, so it lists tor's sockets) summed per peer group. Only between groups
    that carry the measured traffic. Returns the sources and the socket source (None: not a
    relay), whose ``peers`` ({address: group}) the caller keeps in step with the filters."""
    from .. import gates
    from ..records import RecordWriter
    if not _carries_data(p, group):
        return [], None
    links, meta = {}, []
    for g, cid in sorted(ids.items()):
        spec = specs[g]
        if not spec.rate_bps or not _carries_data(p, g):
            continue
        name = f"{node}>{g}"
        links[(node, int(cid.split(":", 1)[1], 16))] = name
        meta.append({"link": name, "rate_bps": spec.rate_bps, "delay_s": spec.delay_s or 0.0})
    def run_tc(_sender: str) -> str:
        r = run(["tc", "-s", "-j", "class", "show", "dev", dev], capture_output=True, text=True, timeout=5)
        if r.returncode:
            raise OSError(r.stderr.strip() or f"tc exited {r.returncode}")
        return r.stdout
    # Written without links too (its samples then cover no sender and cost no tc): a network
    # without a rate-limited link is judged "no shaper queue", as locally, not "not measured".
    sources: list = [gates.HtbSource(links, meta, run_tc, RecordWriter(out / "shaper.jsonl"))]
    sockets = None
    if any(n.role == "relay" for n in p.group_nodes(group)):
        sockets = gates.SocketSource([node], {}, lambda _sender: tcp.read_text(), RecordWriter(out / "sockets.jsonl"))
        sources.append(sockets)
    return sources, sockets


def socket_peers(current: dict[str, str], ids: dict[str, str], p) -> dict[str, str]:
    """{peer address: peer group} of the installed peer filters ({address: class id}), for
    the groups that carry the measured traffic."""
    group_of = {cid: g for g, cid in ids.items() if _carries_data(p, g)}
    return {addr: group_of[cid] for addr, cid in current.items() if cid in group_of}


def _sender_name(group: str) -> str:
    """This pod's node name (torbed.pods.node_name: a StatefulSet's ordinal, or the index a
    client Job's pod is given as TORBED_INDEX), or, for a pod with neither (Locust's), the
    group and the pod name's last part."""
    try:
        return node_name(group)
    except (ValueError, RuntimeError, SystemExit):
        return f"{group}-{os.environ.get('POD_NAME', '').rsplit('-', 1)[-1]}"


def _wake_pipe() -> int:
    """`fault apply|undo` wakes the loop with SIGUSR1: its write end of the pipe tells select.
    Returns the read end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    return wake_r


def _sleep(wake_r: int, interval: float) -> None:
    """``interval`` seconds, or less when a signal arrives (the pipe drained then)."""
    if select.select([wake_r], [], [], interval)[0]:
        while True:
            try:
                if not os.read(wake_r, 64):
                    break
            except BlockingIOError:
                break


def _shape(args: argparse.Namespace, s, p, dev: str, specs: dict[str, LinkSpec], ids: dict[str, str],
           own: set[str], wake_r: int) -> None:
    """Forever: keep the peer filters on the peers' current addresses, apply and undo faults."""
    state = args.ready_file.parent
    url, pod = os.environ.get("TORBED_RESULTS_URL"), os.environ.get("POD_NAME", "")

    def fill(peer: str, found: set[str]) -> set[str]:
        """A fault toward a group (or a node alone in its group) soon after the start: DNS may
        still answer from a cache filled before the pods existed, as for the peer filters."""
        group = peer_group(p, peer)
        if not url or (peer != group and len(p.group_nodes(group)) > 1) \
                or len(found) >= expected_addresses(s, group, args.group):
            return found
        return found | announced(url).get(group, set())

    faults = FaultTable(dev, state, specs, lambda peer: node_peer_names(args.release, args.namespace,
                                                                       args.cluster_domain, s, p, peer),
                        lambda peer: peer_group(p, peer), fill=fill)
    (state / "pid").write_text(f"{os.getpid()}\n")
    current: dict[str, str] = {}
    # The workload must not start before every shaped peer is classified: the results
    # service's start barrier waits for each shaper's report. (Cluster DNS caches answers,
    # typically 30 s, so a pod's record can show up that much after the pod.)
    reported = not url
    # Until DNS lists a group's every address, the addresses its shapers announce to the
    # results service count too (see torbed.pods.results: CoreDNS caches a name looked up
    # before its pods existed for up to 30 s). Once DNS has them all, DNS alone decides, as
    # later for a pod that comes back with a new address.
    announced_own = not (url and pod and own)
    settled: set[str] = set()
    expected = {g: expected_addresses(s, g, args.group) for g in ids}
    sockets = _start_gate_samples(args.group, p, dev, specs, ids, state, url)
    while True:
        if not announced_own:
            announced_own = announce(url, pod, args.group, sorted(own)[0])
        dns = {g: set().union(*(resolve(n) for n in peer_names(args.release, args.namespace, args.cluster_domain, s, g))) - own
               for g in ids}
        others = announced(url) if url and set(ids) - settled else {}
        want, complete = peer_table(ids, dns, others, expected, settled, own)
        if want != current:
            current = _update_filters(dev, want, current)
            if sockets is not None:
                sockets.peers = socket_peers(current, ids, p)
        # Requests of a previous shaper in this pod are put back at once (its tree was flushed).
        faults.step(own)
        if complete and want == current and not reported:
            reported = report_complete(url, pod)
            if reported:
                log(f"shaper: every shaped peer classified ({len(current)} addresses); reported")
        _sleep(wake_r, args.interval)


def _start_gate_samples(group: str, p, dev: str, specs: dict[str, LinkSpec], ids: dict[str, str], state: Path,
                        url: str | None):
    """The mechanism gates' samples (torbed.gates), once a second from here on; the results
    service gets them as they are written (the analysis keeps the measured window's). Returns
    the socket source (None: not a relay pod), whose peers the caller keeps in step."""
    # A directory of this process' own: a restarted sidecar must not send its predecessor's
    # records again (the Shipper's offsets start at zero).
    records = state / "records" / f"{int(time.time() * 1000)}-{os.getpid()}"
    node = _sender_name(group)
    sources, sockets = gate_sources(p, group, node, dev, specs, ids, records)
    if any(n.role == "server" for n in p.group_nodes(group)):
        # A server pod's CPU: the one container there that ships records samples the pod
        # (the chart shares its process namespace), as a relay's collector does.
        from . import cpusample
        sources.append(cpusample.source(records, node, group, "server"))
    if sources and url:
        from ..gates import SAMPLE_INTERVAL_S, Sampler
        Shipper(records, url).start()
        Sampler(SAMPLE_INTERVAL_S, sources).start()
        log(f"shaper: sampling {', '.join(type(x).__name__ for x in sources)} every {SAMPLE_INTERVAL_S:g} s")
    return sockets


def _update_filters(dev: str, want: dict[str, str], current: dict[str, str]) -> dict[str, str]:
    """The filters moved from ``current`` to ``want``; returns what is installed afterwards."""
    try:
        tc_batch(filters(dev, want, current))
    except TcError as e:
        log(f"shaper: updating filters failed: {e}")
        return current
    added = sorted(set(want) - set(current))
    gone = sorted(set(current) - set(want))
    log(f"shaper: filters for {len(want)} peer address(es)"
        + (f"; new {', '.join(added)}" if added else "") + (f"; gone {', '.join(gone)}" if gone else ""))
    return want

if __name__ == "__main__":
    sys.exit(main())
