"""Link shaping: tc (per-destination htb classes, netem leaves) or the userspace linkemu.

With tc, each node shapes its own egress: for every destination whose link has properties,
an htb class at the link's rate (a u32 filter on the destination address selects it) and,
when the link has delay/jitter/loss, a netem qdisc under the class. Links are symmetric, so
both directions of a pair are shaped, each by its sender. Unshaped traffic takes the default
class (no limit that matters: 10gbit).

Kernels without sch_netem (and scenarios with ``links.emulator: linkemu``) use linkemu
instead (``torbed.backends.local.emulator``): it replaces the switch's bridge and applies every property,
rate included, so no tc is set up then.

Public API:

- ``probe_kernel() -> KernelCaps`` which qdiscs this kernel has (tested in a throwaway netns)
- ``choose_shaper(plan, caps) -> str`` "none" | "htb" | "htb+netem" | "linkemu"; raises
  ``ShapingError`` when ``links.emulator: tc`` asks for what the kernel cannot do
- ``tc_batch(plan, node, netem=bool) -> str`` the tc batch file for one node's eth0 (or for
  a relay's second address, ``Plan.endpoints()``: its eth1)
- ``shaped_classes(plan, node) -> [(minor, destination, LinkSpec)]`` its htb classes; the
  destinations are ``Plan.endpoints()``, so a peer's second address is a class of its own
- ``torbed plan``'s shaper line is the local backend's (``torbed.backends.local.plan_lines``)
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass

from .network import LinkSpec, Node, Plan, owner
from .errors import InputError

UNLIMITED = "10gbit"

# Per-pair htb classes do not scale past a few hundred nodes on this kernel (6.x). Every htb
# class gets its own filter block, and binding a block goes through the flow-offload code,
# which keeps every block on the machine in one list and searches it linearly before adding
# the new one (flow_indr_dev_setup_offload; seen with perf: 96 % of tc's time). So the cost of
# one more class grows with all classes of all namespaces, and a network of N nodes has
# N*(N-1) of them. Measured here (tc only, quiet machine): 164 nodes (26,700 classes) 4.1 s,
# 234 nodes (54,500) 14.9 s, 301 nodes (90,300) 77-104 s with the last classes taking 12 ms
# each; 751 nodes had 290 namespaces done after 5.5 min. Above this many shaped node pairs,
# "auto" takes linkemu, whose link table is the default plus the exceptions.
HTB_MAX_SHAPED_PAIRS = 30_000


class ShapingError(InputError):
    """The scenario asks for link properties this machine cannot emulate."""


@dataclass(frozen=True)
class KernelCaps:
    htb: bool
    netem: bool
    detail: str = ""


def _probe_qdisc(args: str) -> tuple[bool, str]:
    """Try a qdisc on a veth in a private network namespace that vanishes afterwards."""
    unshare = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--net"]
    script = f"ip link add tbprobe type veth peer name tbprobe1 && ip link set tbprobe up && tc qdisc add dev tbprobe root {args}"
    try:
        p = subprocess.run(unshare + ["sh", "-c", script], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return p.returncode == 0, (p.stderr or p.stdout).strip()


@functools.lru_cache(maxsize=1)
def probe_kernel() -> KernelCaps:
    htb, htb_err = _probe_qdisc("handle 1: htb default 1")
    netem, netem_err = _probe_qdisc("netem delay 1ms")
    detail = "" if netem else f"netem: {netem_err or 'unavailable'}"
    if not htb:
        detail += f"; htb: {htb_err}"
    return KernelCaps(htb=htb, netem=netem, detail=detail)


def tc_limitation(plan: Plan, caps: KernelCaps) -> str | None:
    """Why tc cannot shape this plan's links on this kernel (None: it can)."""
    specs = [plan.default_link, *plan.group_links.values()]
    if plan.needs_delay_emulation():
        if not caps.netem:
            return f"the links ask for delay, jitter or loss and this kernel has no sch_netem ({caps.detail})"
        if any(s.needs_delay_emulation and (s.queue_bytes or s.queue_s) for s in specs):
            return "netem cannot bound the queue of a delayed link ('queue' with delay/jitter/loss)"
    elif not caps.htb:
        return f"the links set rates and this kernel has no sch_htb ({caps.detail})"
    pairs = plan.shaped_pair_count()
    if pairs > HTB_MAX_SHAPED_PAIRS:
        return (f"the links shape {pairs:,} node pairs, one htb class each, and above "
                f"{HTB_MAX_SHAPED_PAIRS:,} the kernel's cost per class grows with every class on the machine "
                f"(minutes at 300 nodes)")
    return None


def linkemu_reason(plan: Plan, caps: KernelCaps) -> str | None:
    """Why choose_shaper picks linkemu for this plan, in words (None: tc can shape it and
    nothing asks for linkemu)."""
    if plan.scenario.links.emulator == "linkemu":
        return "requested by links.emulator"
    if any(f.kind == "link" for f in plan.scenario.faults):
        return "link faults change links at run time"
    return tc_limitation(plan, caps)


def choose_shaper(plan: Plan, caps: KernelCaps) -> str:
    mode = plan.scenario.links.emulator
    if mode == "linkemu":
        return "linkemu"
    if any(f.kind == "link" for f in plan.scenario.faults):
        # Link faults change links while the run goes on: linkemu's runtime changes do that.
        if mode == "tc":
            raise ShapingError("links.emulator is 'tc', but the scenario has link faults, which the local backend "
                               "applies through linkemu's runtime link changes. Use 'links.emulator: auto' or linkemu.")
        return "linkemu"
    if not plan.shaped_pair_count():
        return "none"
    why = tc_limitation(plan, caps)
    if why is None:
        return "htb+netem" if plan.needs_delay_emulation() else "htb"
    if mode == "tc":
        kernel = "" if "htb class" in why else ", or a kernel with sch_netem (modprobe sch_netem)"
        raise ShapingError(f"links.emulator is 'tc', but {why}. Use 'links.emulator: auto' (or linkemu) "
                           f"for torbed's userspace link emulator{kernel}.")
    return "linkemu"


def _netem_args(spec: LinkSpec) -> str:
    args = []
    if spec.delay_s:
        args.append(f"delay {spec.delay_s * 1000:.3f}ms")
        if spec.jitter_s:
            # netem's default (no table) is uniform; the tables give sigma = jitter.
            dist = spec.jitter_dist or "normal"
            args.append(f"{spec.jitter_s * 1000:.3f}ms" + ("" if dist == "uniform" else f" distribution {dist}"))
    if spec.loss and spec.loss_burst and spec.loss_burst > 1 and spec.loss < 1:
        # Simple Gilbert: bursts last 1/r packets, the bad state's share p/(p+r) is the loss.
        r = 1 / spec.loss_burst
        p = spec.loss * r / (1 - spec.loss)
        args.append(f"loss gemodel {p * 100:.4f}% {r * 100:.4f}%")
    elif spec.loss:
        args.append(f"loss random {spec.loss * 100:.4f}%")
    return " ".join(args)


def _burst(rate_bps: int) -> int:
    # At least a few MTUs, and ~2 ms worth of data at high rates, so htb is exact at low
    # rates without throttling fast links to HZ granularity.
    return max(4 * 1514, rate_bps // 8 // 500)


# `ip link set dev eth0 ...` arguments that stop TCP and the veth from building frames larger
# than one MTU (segmentation offload), so htb and netem see the packets a real link carries:
# a bounded bfifo counts bytes, and a 64 KB offloaded frame is dropped whole by a queue smaller
# than that (tried: a 12,500-byte queue at 2 mbit gave one TCP flow 11.6 kB/s, a 70 kB one 240).
ONE_FRAME_PER_SKB = ("gso_max_segs", "1", "gso_max_size", "1514")


def class_lines(dev: str, minor: int, spec: LinkSpec) -> list[str]:
    """The htb class 1:<minor> of one shaped link, with netem (delay/jitter/loss) or a
    bounded drop-tail queue under it. Used per destination node here and per peer group by
    the Kubernetes shaper (torbed.pods.shaper)."""
    rate = f"{spec.rate_bps}bit" if spec.rate_bps else UNLIMITED
    burst = _burst(spec.rate_bps) if spec.rate_bps else 1514 * 64
    cid = f"1:{minor:x}"
    lines = [f"class add dev {dev} parent 1: classid {cid} htb rate {rate} ceil {rate} burst {burst} cburst {burst}"]
    if spec.needs_delay_emulation:
        # A deep queue: netem's default 1000 packets would drop at high delay x rate.
        lines.append(f"qdisc add dev {dev} parent {cid} handle {minor:x}: netem limit 100000 {_netem_args(spec)}")
    elif spec.rate_bps and (spec.queue_bytes or spec.queue_s):
        limit = spec.queue_bytes or max(1514, int(spec.queue_s * spec.rate_bps / 8))
        lines.append(f"qdisc add dev {dev} parent {cid} handle {minor:x}: bfifo limit {limit}")
    return lines


def tc_batch(plan: Plan, node: Node, dev: str = "eth0", netem: bool = False) -> str:
    """tc batch commands that shape ``node``'s egress toward every shaped destination."""
    lines = [f"qdisc add dev {dev} root handle 1: htb default 1",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {UNLIMITED}"]
    for minor, dst, spec in shaped_classes(plan, node):
        if spec.needs_delay_emulation and not netem:
            raise ShapingError(f"{node.name} -> {dst.name}: delay/jitter/loss needs netem")
        cid = f"1:{minor:x}"
        lines += class_lines(dev, minor, spec)
        lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dst {dst.address}/32 flowid {cid}")
    return "\n".join(lines) + "\n"


def shaped_classes(plan: Plan, node: Node) -> list[tuple[int, Node, LinkSpec]]:
    """(htb minor number, destination, link) of every class ``tc_batch`` gives ``node``:
    what the mechanism gate reads back (torbed.gates: class 1:<minor> is node -> destination)."""
    out, minor = [], 2
    me = owner(node)[0]
    for dst in plan.endpoints():
        if owner(dst)[0] == me:     # itself, and a relay's two addresses never talk
            continue
        spec = plan.link(node, dst)
        if spec == LinkSpec():
            continue
        out.append((minor, dst, spec))
        minor += 1
    return out
