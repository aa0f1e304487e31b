"""The concrete network of a scenario for one variant: nodes, addresses, ports, paths, links.

Both backends start from a ``Plan``: the local backend gives every node a network namespace
with the planned address; the Kubernetes backend renders the same nodes as pods.

Public API:

- ``plan(scenario, variant) -> Plan``
- ``Plan.nodes`` (authorities, relays, servers, clients, in that order), ``Plan.node(name)``,
  ``Plan.by_role(role)``, ``Plan.group_nodes(group)``, ``Plan.link(a, b) -> LinkSpec``
- ``Node``: name, role, group, index, variant, address, ports; ``Node.nickname``; ``address2``:
  a relay's second address (``network.relays.<g>.second_address``), allocated after every
  first address
- ``Plan.endpoints()``: the nodes, then each second address as a node of its own for the
  shapers (``second_endpoint(node)``: name ``<node>:second``, group ``<group>:second``, whose
  links are the group's); ``owner(endpoint) -> (node name, device)`` (``eth0`` / ``eth1``)
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field, replace

from . import constants, units
from .scenario import Link, Scenario

ROLES = ("authority", "relay", "server", "client", "loadmaster", "loadworker")
# Roles whose node runs a tor (a load worker: a tor client beside its Locust worker).
TOR_ROLES = ("authority", "relay", "client", "loadworker")
LOAD_GROUP, LOAD_MASTER_GROUP = "load", "locust"
AUTHORITY_GROUP = "authority"


@dataclass(frozen=True)
class Node:
    name: str            # unique, e.g. auth0, middle0, web0, bulk1
    role: str            # authority | relay | server | client
    group: str           # scenario group ('authority' for authorities)
    index: int
    address: str
    variant: str | None = None   # relays: the scheduler variant; others use the stock build
    exit: bool = False
    guard: bool = False
    ports: dict = field(default_factory=dict)
    address2: str | None = None  # relays of a group with second_address: the second connection's address

    @property
    def nickname(self) -> str:
        return self.name  # group names are [a-z][a-z0-9]*, so node names are valid nicknames

    @property
    def runs_tor(self) -> bool:
        return self.role in TOR_ROLES

    def to_dict(self) -> dict:
        return asdict(self)


SECOND = ":second"            # suffix of a second address's endpoint (node and group names)
SECOND_DEV = "eth1"           # its device in the relay's namespace (the first address: eth0)


def second_endpoint(node: Node) -> Node:
    """``node``'s second address as a node of its own: what the shapers and gates see."""
    return replace(node, name=node.name + SECOND, group=node.group + SECOND, address=node.address2,
                   address2=None, ports={})


def owner(endpoint: Node) -> tuple[str, str]:
    """(node name, device in its namespace) of an endpoint of ``Plan.endpoints()``."""
    if endpoint.name.endswith(SECOND):
        return endpoint.name[:-len(SECOND)], SECOND_DEV
    return endpoint.name, "eth0"


@dataclass(frozen=True)
class LinkSpec:
    rate_bps: int | None = None
    delay_s: float | None = None
    jitter_s: float | None = None
    loss: float | None = None
    jitter_dist: str | None = None      # normal (default) | uniform | pareto | paretonormal
    loss_burst: float | None = None     # mean loss burst length in packets (Gilbert model)
    queue_bytes: int | None = None      # drop-tail limit of the rate queue, in bytes ...
    queue_s: float | None = None        # ... or in time at the link rate

    @property
    def needs_delay_emulation(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss)

    def describe(self) -> str:
        parts = []
        if self.rate_bps:
            parts.append(units.format_rate(self.rate_bps))
        if self.delay_s:
            parts.append(f"delay {units.format_duration(self.delay_s)}")
        if self.jitter_s:
            parts.append(f"jitter {units.format_duration(self.jitter_s)}")
        if self.jitter_dist:
            parts.append(f"jitter distribution {self.jitter_dist}")
        if self.loss:
            parts.append(f"loss {self.loss * 100:g}%")
        if self.loss_burst:
            parts.append(f"loss bursts of {self.loss_burst:g} packets")
        if self.queue_bytes:
            parts.append(f"queue {units.format_size(self.queue_bytes)}")
        if self.queue_s:
            parts.append(f"queue {units.format_duration(self.queue_s)}")
        return ", ".join(parts) or "unshaped"


def _linkspec(link: Link, base: LinkSpec | None = None) -> LinkSpec:
    base = base or LinkSpec()
    queue_bytes, queue_s = base.queue_bytes, base.queue_s
    if link.queue:
        try:
            queue_bytes, queue_s = units.parse_size(link.queue), None
        except ValueError:
            queue_bytes, queue_s = None, units.parse_duration(link.queue)
    return LinkSpec(
        rate_bps=link.rate.bps if link.rate else base.rate_bps,
        delay_s=link.delay.seconds if link.delay else base.delay_s,
        jitter_s=link.jitter.seconds if link.jitter else base.jitter_s,
        loss=link.loss.fraction if link.loss else base.loss,
        jitter_dist=link.jitter_distribution or base.jitter_dist,
        loss_burst=link.loss_burst or base.loss_burst,
        queue_bytes=queue_bytes,
        queue_s=queue_s,
    )


@dataclass
class Plan:
    scenario: Scenario
    variant: str
    nodes: list[Node]
    subnet: str
    control_address: str
    default_link: LinkSpec
    group_links: dict[frozenset, LinkSpec]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def by_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if n.role == role]

    def group_nodes(self, group: str) -> list[Node]:
        return [n for n in self.nodes if n.group == group]

    def variants_in_use(self) -> list[str]:
        return sorted({n.variant for n in self.nodes if n.variant})

    def endpoints(self) -> list[Node]:
        """The nodes, then every relay's second address as a node of its own (``second_endpoint``)."""
        return self.nodes + [second_endpoint(n) for n in self.nodes if n.address2]

    def link(self, a: Node, b: Node) -> LinkSpec:
        """Properties of the link between two nodes or endpoints (symmetric); a second
        address's links are its group's."""
        ga, gb = a.group.removesuffix(SECOND), b.group.removesuffix(SECOND)
        return self.group_links.get(frozenset((ga, gb)), self.default_link)

    def shaped_pairs(self) -> list[tuple[Node, Node, LinkSpec]]:
        """Every ordered (src, dst) node pair whose link has any property set."""
        out = []
        for a in self.nodes:
            for b in self.nodes:
                if a is not b:
                    spec = self.link(a, b)
                    if spec != LinkSpec():
                        out.append((a, b, spec))
        return out

    def shaped_pair_count(self) -> int:
        """len(shaped_pairs()), counted per group pair (shaped_pairs takes ~1 s at 750 nodes)."""
        sizes: dict[str, int] = {}
        for n in self.endpoints():
            sizes[n.group] = sizes.get(n.group, 0) + 1
        return sum(na * (nb - (ga == gb))
                   for ga, na in sizes.items() for gb, nb in sizes.items()
                   if self.group_links.get(frozenset((ga.removesuffix(SECOND), gb.removesuffix(SECOND))),
                                           self.default_link) != LinkSpec())

    def needs_delay_emulation(self) -> bool:
        return self.default_link.needs_delay_emulation or any(
            s.needs_delay_emulation for s in self.group_links.values())


def plan(scenario: Scenario, variant: str) -> Plan:
    """Lay out every node of ``scenario`` for one ``variant`` (deterministic)."""
    net = ipaddress.IPv4Network(scenario.network.subnet)
    hosts = net.hosts()
    control = str(next(hosts))
    base = int(net.network_address) + constants.FIRST_NODE_HOST
    nodes: list[Node] = []

    def add(name: str, role: str, group: str, index: int, **kw) -> None:
        address = ipaddress.IPv4Address(base + len(nodes))
        if address not in net or address == net.broadcast_address:
            raise ValueError(f"network.subnet {net} is too small for {len(nodes) + 1} nodes")
        nodes.append(Node(name=name, role=role, group=group, index=index, address=str(address), **kw))

    for i in range(scenario.network.authorities):
        add(f"auth{i}", "authority", AUTHORITY_GROUP, i,
            ports={"or": constants.OR_PORT, "dir": constants.DIR_PORT, "control": constants.CONTROL_PORT})
    for g, rg in scenario.network.relays.items():
        for i in range(rg.count):
            add(f"{g}{i}", "relay", g, i, variant=rg.variant or variant, exit=rg.exit, guard=rg.guard,
                ports={"or": constants.OR_PORT, "control": constants.CONTROL_PORT,
                       "metrics": constants.METRICS_PORT})
    for g, sg in scenario.servers.items():
        for i in range(sg.count):
            ports = {"http": sg.port} if sg.files else {}
            if sg.replay is not None:
                ports["replay"] = sg.replay.port
            add(f"{g}{i}", "server", g, i, ports=ports)
    for g, cg in scenario.clients.items():
        for i in range(cg.count):
            add(f"{g}{i}", "client", g, i,
                ports={"socks": constants.SOCKS_PORT, "control": constants.CONTROL_PORT})

    if scenario.load is not None:
        add(f"{LOAD_MASTER_GROUP}0", "loadmaster", LOAD_MASTER_GROUP, 0, ports={"master": constants.LOCUST_MASTER_PORT,
                                                                         "metrics": constants.LOCUST_METRICS_PORT})
        for i in range(scenario.load.workers):
            add(f"{LOAD_GROUP}{i}", "loadworker", LOAD_GROUP, i,
                ports={"socks": constants.SOCKS_PORT, "control": constants.CONTROL_PORT})

    nodes = _second_addresses(scenario, nodes, net, base)
    default = _linkspec(scenario.links.default)
    group_links = {frozenset(p.between): _linkspec(p, default) for p in scenario.links.pairs}
    return Plan(scenario=scenario, variant=variant, nodes=nodes, subnet=str(net),
                control_address=control, default_link=default, group_links=group_links)


def _second_addresses(scenario: Scenario, nodes: list[Node], net: ipaddress.IPv4Network, base: int) -> list[Node]:
    """Relays of groups with ``second_address`` get one each, numbered on after every node's first."""
    out, k = [], len(nodes)
    for n in nodes:
        if n.role == "relay" and scenario.network.relays[n.group].second_address:
            address = ipaddress.IPv4Address(base + k)
            if address not in net or address == net.broadcast_address:
                raise ValueError(f"network.subnet {net} is too small for {k + 1} addresses")
            n, k = replace(n, address2=str(address)), k + 1
        out.append(n)
    return out
