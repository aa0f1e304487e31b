"""Link shaping with tc: per-destination htb classes, netem leaves when the kernel has it.

Each node shapes its own egress: for every destination whose link has properties, an htb
class at the link's rate (a u32 filter on the destination address selects it) and, when the
link has delay/jitter/loss, a netem qdisc under the class. Links are symmetric, so both
directions of a pair are shaped, each by its sender. Unshaped traffic takes the default class
(no limit that matters: 10gbit).

Public API:

- ``probe_kernel() -> KernelCaps`` which qdiscs this kernel has (tested in a throwaway netns)
- ``choose_shaper(plan, caps) -> str`` "none" | "htb" | "htb+netem"; raises ``ShapingError``
  when the scenario needs delay/jitter/loss and the kernel has no netem
- ``tc_batch(plan, node, netem=bool) -> str`` the tc batch file for one node's eth0
- ``describe_shaper(plan) -> str`` one line for ``torbed plan``
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass

from .network import LinkSpec, Node, Plan

UNLIMITED = "10gbit"


class ShapingError(RuntimeError):
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


def choose_shaper(plan: Plan, caps: KernelCaps) -> str:
    shaped = bool(plan.shaped_pairs())
    if not shaped:
        return "none"
    if plan.needs_delay_emulation():
        if not caps.netem:
            raise ShapingError(
                "the scenario's links ask for delay, jitter or loss, but this kernel has no sch_netem "
                f"({caps.detail}). Remove delay/jitter/loss from 'links', or run on a kernel with "
                "netem (modprobe sch_netem); a userspace link emulator is planned for this case.")
        return "htb+netem"
    if not caps.htb:
        raise ShapingError(f"the scenario's links set rates, but this kernel has no sch_htb ({caps.detail})")
    return "htb"


def describe_shaper(plan: Plan) -> str:
    caps = probe_kernel()
    try:
        shaper = choose_shaper(plan, caps)
    except ShapingError as e:
        return f"[red]cannot run here[/red]: {e}"
    kernel = f"kernel: htb {'yes' if caps.htb else 'no'}, netem {'yes' if caps.netem else 'no'}"
    return f"{shaper} ({len(plan.shaped_pairs())} shaped node pairs; {kernel})"


def _netem_args(spec: LinkSpec) -> str:
    args = []
    if spec.delay_s:
        args.append(f"delay {spec.delay_s * 1000:.3f}ms")
        if spec.jitter_s:
            args.append(f"{spec.jitter_s * 1000:.3f}ms distribution normal")
    if spec.loss:
        args.append(f"loss random {spec.loss * 100:.4f}%")
    return " ".join(args)


def _burst(rate_bps: int) -> int:
    # At least a few MTUs, and ~2 ms worth of data at high rates, so htb is exact at low
    # rates without throttling fast links to HZ granularity.
    return max(4 * 1514, rate_bps // 8 // 500)


def tc_batch(plan: Plan, node: Node, dev: str = "eth0", netem: bool = False) -> str:
    """tc batch commands that shape ``node``'s egress toward every shaped destination."""
    lines = [f"qdisc add dev {dev} root handle 1: htb default 1",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {UNLIMITED}"]
    minor = 2
    for dst in plan.nodes:
        if dst is node:
            continue
        spec = plan.link(node, dst)
        if spec == LinkSpec():
            continue
        rate = f"{spec.rate_bps}bit" if spec.rate_bps else UNLIMITED
        burst = _burst(spec.rate_bps) if spec.rate_bps else 1514 * 64
        cid = f"1:{minor:x}"
        lines.append(f"class add dev {dev} parent 1: classid {cid} htb rate {rate} ceil {rate} "
                     f"burst {burst} cburst {burst}")
        if spec.needs_delay_emulation:
            if not netem:
                raise ShapingError(f"{node.name} -> {dst.name}: delay/jitter/loss needs netem")
            # A deep queue: netem's default 1000 packets would drop at high delay x rate.
            lines.append(f"qdisc add dev {dev} parent {cid} handle {minor:x}: netem limit 100000 {_netem_args(spec)}")
        lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dst {dst.address}/32 flowid {cid}")
        minor += 1
    return "\n".join(lines) + "\n"
