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
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import shaping
from ..network import LinkSpec
from . import load_scenario, log, plan


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
        req = urllib.request.Request(f"{url.rstrip('/')}/shaped/{pod}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
        return True
    except (urllib.error.URLError, OSError):
        return False


def resolve(name: str) -> set[str]:
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)}
    except socket.gaierror:
        return set()


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
DEFAULT_ALLOW = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"]


def isolation(dev: str, allow: list[str]) -> list[str]:
    """Filters after the per-peer ones (prio 1): allowed ranges take the default class,
    the rest of IPv4 and IPv6 (but link-local/multicast, which neighbour discovery needs)
    is dropped."""
    # A class whose queue holds nothing drops what it is given; tc actions (act_gact) are not
    # in every kernel (not in this project's CI kernel), htb and pfifo are.
    cmds = [f"class add dev {dev} parent 1: classid {DROP_CLASS} htb rate 8kbit ceil 8kbit",
            f"qdisc add dev {dev} parent {DROP_CLASS} handle {DROP_CLASS.split(':')[1]}: pfifo limit 0"]
    cmds += [f"filter add dev {dev} parent 1: protocol ip prio 2 u32 match ip dst {net} flowid 1:1" for net in allow]
    cmds.append(f"filter add dev {dev} parent 1: protocol ip prio 3 u32 match u32 0 0 flowid {DROP_CLASS}")
    cmds += [f"filter add dev {dev} parent 1: protocol ipv6 prio 4 u32 match ip6 dst {net} flowid 1:1"
             for net in ("fe80::/10", "ff00::/8")]
    cmds.append(f"filter add dev {dev} parent 1: protocol ipv6 prio 5 u32 match u32 0 0 flowid {DROP_CLASS}")
    return cmds


def filters(dev: str, mapping: dict[str, str], previous: dict[str, str]) -> list[str]:
    """Replace the filters of ``previous`` by those of ``mapping`` (the kernel refuses to
    delete a filter chain that does not exist, so only delete what was installed)."""
    cmds = [f"filter del dev {dev} parent 1: prio 1"] if previous else []
    cmds += [f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dst {ip}/32 flowid {cid}"
             for ip, cid in sorted(mapping.items())]
    return cmds


def main(argv: list[str] | None = None) -> int:
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
    args = ap.parse_args(argv)
    s = load_scenario(args.scenario)
    p = plan(s)
    me = p.group_nodes(args.group)[0] if args.group != "authority" else p.by_role("authority")[0]
    specs: dict[str, LinkSpec] = {}
    # The load nodes too (links.pairs may name `load`): their headless Service lists them.
    for g in ["authority", *s.network.relays, *s.servers, *s.clients, *(["load"] if s.load else [])]:
        peer = p.by_role("authority")[0] if g == "authority" else p.group_nodes(g)[-1]
        if peer is me:  # a one-node group: no link to itself
            continue
        spec = p.link(me, peer)
        if spec != LinkSpec():
            specs[g] = spec
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
    try:
        tc_batch(cmds)
    except TcError as e:
        hint = (" (this node's kernel lacks sch_netem: links with delay, jitter or loss need it)"
                if "netem" in str(e).lower() or any(sp.needs_delay_emulation for sp in specs.values()) else "")
        log(f"shaper: cannot install the htb tree on {dev}: {e}{hint}")
        return 1
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
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    current: dict[str, str] = {}
    # The workload must not start before every shaped peer is classified: the results
    # service's start barrier waits for each shaper's report. (Cluster DNS caches answers,
    # typically 30 s, so a pod's record can show up that much after the pod.)
    url, pod = os.environ.get("TORBED_RESULTS_URL"), os.environ.get("POD_NAME", "")
    reported = not url
    while not stop:
        want: dict[str, str] = {}
        complete = True
        for g, cid in ids.items():
            found: set[str] = set()
            for name in peer_names(args.release, args.namespace, args.cluster_domain, s, g):
                found |= resolve(name) - own
            for ip in found:
                want.setdefault(ip, cid)
            complete &= len(found) >= expected_addresses(s, g, args.group)
        if want != current:
            try:
                tc_batch(filters(dev, want, current))
                added = sorted(set(want) - set(current))
                gone = sorted(set(current) - set(want))
                log(f"shaper: filters for {len(want)} peer address(es)"
                    + (f"; new {', '.join(added)}" if added else "") + (f"; gone {', '.join(gone)}" if gone else ""))
                current = want
            except TcError as e:
                log(f"shaper: updating filters failed: {e}")
        if complete and want == current and not reported:
            reported = report_complete(url, pod)
            if reported:
                log(f"shaper: every shaped peer classified ({len(current)} addresses); reported")
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
