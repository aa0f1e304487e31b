"""The scenario model (apiVersion torbed/v1): strict decoding, defaults, validation.

A scenario file describes a private Tor network, its workload and the variants to compare.
It is decoded strictly (an unknown key is an error naming its path), defaulted, then
validated across fields, all before anything starts. The same file is a Helm values file.

Public API:

- ``load(path, variants_dir=VARIANTS_DIR) -> Scenario``  raises ``ScenarioError``
- ``parse(data, source="<data>", variants_dir=...) -> Scenario``  same, from a mapping
- ``json_schema() -> dict``  JSON Schema of the scenario (the chart's values.schema.json)
- ``ScenarioError``: ``.source`` (file), ``.problems`` [(field path, message)], str() lists all
- ``Scenario.warnings``: non-fatal advice (e.g. fewer than 3 authorities)
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr,
                      ValidationError, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from . import constants, resources, safeload, torrc_policy, units
from .variants import VariantError, load_variant
from .errors import InputError


class ScenarioError(InputError, ValueError):
    """A scenario that cannot be used. ``problems`` is a list of (field path, message)."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {path or '<top level>'}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))


# ---------------------------------------------------------------------------------------
# Unit-string field types: parsed once, here, into units.Size/Rate/Duration/Percent (str
# subclasses: the user's spelling round-trips through run.json and Helm values; every stage
# reads .bytes / .bps / .seconds / .fraction instead of parsing again).

def _checker(quantity: type[units.Quantity], pattern: str):
    def check(v: str) -> units.Quantity:
        return quantity(v)
    return Annotated[str, AfterValidator(check), Field(json_schema_extra={"pattern": pattern})]


Size = _checker(units.Size, r"^[0-9]+(\.[0-9]+)?\s*(B|KB|MB|GB|KiB|MiB|GiB)$")
Rate = _checker(units.Rate,
                r"^[0-9]+(\.[0-9]+)?\s*(bit|kbit|mbit|gbit|B/s|KB/s|MB/s|GB/s|KiB/s|MiB/s|GiB/s)$")
Duration = _checker(units.Duration, r"^[0-9]+(\.[0-9]+)?\s*(us|ms|s|m|h)$")
# 0% to 100% (units.parse_percent refuses more), spelt so the chart's schema refuses it too.
Percent = _checker(units.Percent, r"^(0*100(\.0+)?|0*[0-9]{1,2}(\.[0-9]+)?)\s*%$")

GROUP_NAME_RE = r"^[a-z][a-z0-9]{0,11}$"
GroupName = Annotated[str, Field(pattern=GROUP_NAME_RE)]
# "load" and "locust" name the background-load nodes (load<i> workers, locust0 master).
RESERVED_GROUPS = {"authority", "auth", "switch", "collector", "load", "locust"}


class Strict(BaseModel):
    """Base for every scenario object: unknown keys are errors that list the allowed keys."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data):
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    raise PydanticCustomError(
                        "unknown_key", "unknown key '{key}' (allowed: {allowed})",
                        {"key": str(key), "allowed": ", ".join(allowed)})
        return data


# ---------------------------------------------------------------------------------------
# Network

class RelayGroup(Strict):
    """A group of relays built from one variant."""
    count: int = Field(1, ge=1, le=1000, description="Number of relays in the group")
    variant: str | None = Field(None, description="Variant override for this group (default: the run's variant)")
    exit: bool = Field(False, description="Exit relays (policy accept *:*; isolation comes from the network)")
    guard: bool = Field(False, description="Authorities vote the Guard flag for these relays")
    bandwidth: Rate | None = Field(None, description="tor BandwidthRate/BandwidthBurst of each relay, e.g. '1MB/s'")
    weights: list[Annotated[int, Field(ge=1, le=10**9)]] | None = Field(
        None, description="Consensus weights the authorities vote for this group's relays, one per relay in node "
                          "order (units of a consensus' 'w Bandwidth=', as measured bandwidths in the authorities' "
                          "V3BandwidthsFile); set on every relay group or none, with 3 or more authorities. "
                          "Default: none (the authorities vote each relay's self-advertised bandwidth). On "
                          "Kubernetes the chart's key hook writes the file (docs/generate.md)")
    torrc: str = Field("", description="Extra torrc lines for this group (appended to the node fragment); only "
                                       "options on torbed's allow-list (docs/torrc.md)")
    cpu: Literal["native", "qemu"] = Field(
        "native", description="qemu: run this group's tor under qemu-user emulation (qemu-x86_64, no AES "
                              "instructions): every thread much slower, a slow CPU like a Raspberry Pi's, so the "
                              "relay's CPU binds before the rest of the network does; local backend only")
    cpu_per_thread: Percent | None = Field(
        None, description="A CPU cap on each thread of this group's tor, in percent of one core, e.g. '20%': a "
                          "multi-core CPU whose every core is that much slower (Engler & Goldberg's Raspberry "
                          "Pi inside a fast machine). Each thread gets a CFS quota of its own (cgroup v1 cpu, or "
                          "v2 in threaded mode) from the start of the workload; threads started later are capped "
                          "within 1 s. The caps are upper bounds: threads x cap must fit the host's idle cores. "
                          "Combines with cpu: qemu; local backend only")
    second_address: bool = Field(
        False, description="Give each relay of the group a second address on a link of its own (a second veth, "
                           "shaped as a node of its own with the group's link properties); a variant whose tor "
                           "opens a second connection to a peer (circswitch) binds that connection to it "
                           "(CircSwitchBindAddress), so the second connection of a pair crosses its own link. "
                           "Local backend only")


# The testbed's address range: inside one of RFC 1918's, /24 or larger. torbed's check below
# names what is wrong; the same rule as a pattern is what the chart's schema checks (the host
# bits, which a pattern cannot check, _validate.tpl checks).
PRIVATE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
SMALLEST_PREFIX = 24
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"


def _subnet_pattern() -> str:
    def prefixes(lo: int) -> str:
        return "(" + "|".join(str(n) for n in range(lo, SMALLEST_PREFIX + 1)) + ")"
    alternatives = []
    for net in map(ipaddress.IPv4Network, PRIVATE_RANGES):
        octets = str(net.network_address).split(".")
        fixed, rest = net.prefixlen // 8, net.prefixlen % 8
        parts = octets[:fixed]
        if rest:
            lo = int(octets[fixed])
            parts.append("(" + "|".join(str(n) for n in range(lo, lo + 2 ** (8 - rest))) + ")")
        parts += [_OCTET] * (4 - len(parts))
        alternatives.append(r"\.".join(parts) + "/" + prefixes(net.prefixlen))
    return "^(" + "|".join(alternatives) + ")$"


class Network(Strict):
    authorities: int = Field(3, ge=1, le=9, description="Directory authorities (3 or more recommended)")
    relays: dict[GroupName, RelayGroup] = Field(..., min_length=1, description="Relay groups by name")
    subnet: str = Field(constants.DEFAULT_SUBNET, json_schema_extra={"pattern": _subnet_pattern()},
                        description="Private IPv4 range of the testbed (RFC 1918), /24 or larger")
    consensus_params: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")], int] = Field(
        default_factory=dict,
        description="Consensus parameters the authorities vote (e.g. cc_alg: 0 for fixed SENDME windows)")


# ---------------------------------------------------------------------------------------
# Links

def _parse_queue(text: object) -> float:
    try:
        return units.parse_size(text)
    except ValueError:
        pass
    try:
        return units.parse_duration(text)
    except ValueError:
        raise ValueError(f"not a queue size: {text!r}; use a size ('64KB') or a time at the link rate ('50ms')") from None


def _check_queue(v: str) -> str:
    _parse_queue(v)
    return v


# A size or a time: the shaper decides which, so it stays a checked string.
QueueSize = Annotated[str, AfterValidator(_check_queue), Field(json_schema_extra={"pattern": r"^[0-9]+(\.[0-9]+)?\s*(B|KB|MB|GB|KiB|MiB|GiB|us|ms|s)$"})]


class Link(Strict):
    rate: Rate | None = Field(None, description="Rate limit in each direction, e.g. '10mbit'")
    delay: Duration | None = Field(None, description="One-way delay, e.g. '20ms' (needs netem or linkemu)")
    jitter: Duration | None = Field(None, description="Delay variation, e.g. '2ms' (needs netem or linkemu)")
    jitter_distribution: Literal["normal", "uniform", "pareto", "paretonormal"] | None = Field(
        None, description="Distribution of the jitter (default normal: jitter is its standard deviation; "
                          "uniform: +-jitter)")
    loss: Percent | None = Field(None, description="Random loss, e.g. '0.1%' (needs netem or linkemu)")
    loss_burst: float | None = Field(
        None, ge=1, description="Mean length of loss bursts in packets (Gilbert model); default 1: independent losses")
    queue: QueueSize | None = Field(
        None, description="Drop-tail queue of a rate-limited link: a size ('64KB') or a time at the link rate "
                          "('50ms'); default 1000 full-size packets (htb's pfifo on a veth)")


class LinkPair(Link):
    between: list[str] = Field(..., min_length=2, max_length=2,
                               description="Two group names (or 'authority'); the link is symmetric")


class Links(Strict):
    default: Link = Field(default_factory=Link, description="Properties of every link without an override")
    pairs: list[LinkPair] = Field(default_factory=list, description="Per group-pair overrides")
    emulator: Literal["auto", "tc", "linkemu"] = Field(
        "auto", description="Who shapes the links (local backend): tc (kernel htb, plus netem for "
                            "delay/jitter/loss), linkemu (torbed's userspace link emulator), or auto: tc when "
                            "the kernel can express the links, linkemu otherwise")


# ---------------------------------------------------------------------------------------
# Servers, clients, workloads

class ReplayServer(Strict):
    port: int = Field(constants.REPLAY_PORT, ge=1, le=65535, description="TCP port of the replay server")


class ServerGroup(Strict):
    count: int = Field(1, ge=1, le=100)
    port: int = Field(constants.HTTP_PORT, ge=1, le=65535, description="HTTP port")
    files: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")], Size] = Field(
        default_factory=dict, description="Generated files by name and size (seeded, checksummed)")
    replay: ReplayServer | None = Field(
        None, description="Also run a trace replay server (the far end of replay workloads), e.g. {port: 8000}")


class ThinkTime(Strict):
    distribution: Literal["constant", "exponential", "uniform"] = "exponential"
    mean: Duration = Field("5s", description="Mean pause (constant and exponential)")
    min: Duration | None = Field(None, description="Lower bound (uniform)")
    max: Duration | None = Field(None, description="Upper bound (uniform)")


class _Transfer(Strict):
    server: str | None = Field(None, description="Server group (default: the only one)")
    file: str = Field(..., description="File name from the server group's files")
    concurrency: int = Field(1, ge=1, le=64, description="Parallel transfers per client")
    timeout: Duration | None = Field(None, description="Per-transfer timeout (default: by size, as tornettools)")
    stallout: Duration = Field(
        "15s", description="A transfer whose stream receives no byte for this long (counted from the request, "
                           "then from each read) ends as an error with cause 'stall', and its circuit is closed. "
                           "15 s is tgen's built-in stallout (the tool whose timeouts 'timeout' follows): a live "
                           "circuit delivers cells far more often than that, even through a congested link, "
                           "while a stream whose relay vanished without END or DESTROY would otherwise wait out "
                           "the whole timeout (minutes for bulk files). No effect when not shorter than "
                           "'timeout'")


class BulkWorkload(_Transfer):
    kind: Literal["bulk"]


class FetchWorkload(_Transfer):
    kind: Literal["fetch"]
    repeat: int = Field(10, ge=1, le=1_000_000, description="Number of fetches per concurrent slot")
    pause: Duration = Field("0s", description="Constant pause between fetches")
    think: ThinkTime | None = Field(None, description="Random pause distribution (replaces pause)")


class ReplayWorkload(Strict):
    kind: Literal["replay"]
    server: str | None = Field(None, description="Server group with a replay server (default: the only one)")
    trace: str = Field(..., description="Trace file (torbed-trace JSON lines, .gz allowed); relative paths "
                                        "are looked up next to the scenario file, then in the repository")
    flows: list[str] | None = Field(None, min_length=1, description="Flow ids to replay (default: all)")
    distribute: Literal["split", "each"] = Field(
        "split", description="split: the group's clients share the flows (flows of one circuit key stay on "
                             "one client); each: every client replays every flow, client i starting i/count "
                             "of the trace's period later")
    loop: bool = Field(True, description="Start the trace again when it ends, until the measurement ends")
    gap: Duration = Field("1s", description="Pause between the end of the trace and its next loop")
    timeout: Duration = Field("60s", description="How long a flow may run past its recorded duration")


Workload = Annotated[Union[BulkWorkload, FetchWorkload, ReplayWorkload], Field(discriminator="kind")]
WORKLOAD_KINDS = ("bulk", "fetch", "replay")


class ClientGroup(Strict):
    count: int = Field(1, ge=1, le=1000)
    path: list[str] | None = Field(None, min_length=1, max_length=8,
                                   description="Relay groups of the circuit, entry first (default: tor chooses)")
    workload: Workload


# ---------------------------------------------------------------------------------------
# Background load (Locust users through tor)

class LoadRequest(Strict):
    """One kind of request of the background users' traffic mix."""
    weight: float = Field(..., ge=0, description="Relative share of the users' requests (connections)")
    size: Size = Field(..., description="Bytes each request downloads (a file generated on the load's server)")
    think: ThinkTime | None = Field(None, description="Pause after each such request (default: none)")


def _default_mix() -> dict:
    # McCoy et al. 2008 (exit traffic by protocol, as quoted by Tang & Goldberg 2010, sec. 3.1):
    # HTTP 92.45% of connections and 57.97% of bytes, BitTorrent 3.33% and 40.20%. Weights
    # are the connection shares; with 50 KiB pages and 1 MiB bulk downloads (torbed's
    # tgen-like sizes) the bytes split 57.5% / 42.5% between the two. Think time is
    # torbed's choice, not the paper's. docs/load.md has the derivation.
    return {"web": {"weight": 92.45, "size": "50KiB", "think": {"distribution": "exponential", "mean": "5s"}},
            "bulk": {"weight": 3.33, "size": "1MiB"}}


class Load(Strict):
    """Background users (Locust) whose circuits cross the relays while clients measure."""
    users: int = Field(10, ge=1, le=10000, description="Concurrent background users in all")
    spawn_rate: float = Field(1.0, gt=0, le=1000, description="Users started per second")
    workers: int = Field(1, ge=1, le=64, description="Load nodes; each runs its own tor and one Locust worker")
    path: list[str] | None = Field(None, min_length=3, max_length=3,
                                   description="Relay groups for entry, middle and exit (default: tor chooses)")
    server: str | None = Field(None, description="Server group the users fetch from (default: the only one)")
    start: Duration = Field("0s", description="When the users start, after the workload starts")
    stop: Duration | None = Field(None, description="When they stop, after the workload starts (default: its end)")
    mix: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,15}$")], LoadRequest] = Field(
        default_factory=_default_mix, min_length=1,
        description="Traffic mix by name (default: McCoy et al. 2008's HTTP/BitTorrent shares)")
    timeout: Duration = Field("120s", description="Per-request timeout (a request past it counts as a failure)")
    stats_interval: Duration = Field("2s", description="How often load.jsonl records Locust's statistics")


# ---------------------------------------------------------------------------------------
# Measurement, placement, faults

COLLECTORS = ("transfers", "cellstats", "relay_bw", "metrics")


class PrometheusCfg(Strict):
    enabled: bool = Field(True, description="Run a Prometheus server beside the network (local backend) "
                                            "scraping relays, drivers and collectors; its TSDB is kept in "
                                            "the run directory")
    scrape_interval: Duration = Field("5s", description="Scrape interval of every target (whole seconds, "
                                                        "at least 1 s; recorded in meta.json)")

    @field_validator("scrape_interval")
    @classmethod
    def _whole_seconds(cls, v):
        if v.seconds < 1 or v.seconds != int(v.seconds):
            raise ValueError(f"{v} is not a whole number of seconds >= 1s")
        return v


class Mechanism(Strict):
    """What the experiment's effect works through, so the mechanism gates (issue 36 item 1,
    docs/statistics.md "Mechanism gates") know what a valid repetition looks like."""
    kind: Literal["queueing", "cpu-bound"] = Field(
        "queueing", description="queueing: the variants differ in how relays queue cells, so no process may be "
                                "CPU-starved; cpu-bound: the variants differ in how fast the target relay "
                                "processes cells, so it must be CPU-saturated and nothing else starved")
    target: GroupName | None = Field(None, description="cpu-bound only (and required there): the relay group "
                                                       "whose CPU must be saturated")


class Measure(Strict):
    warmup: Duration = Field("30s", description="Start of the measured window after the network is ready")
    duration: Duration = Field("5m", description="Workload run time per repetition")
    collect: list[Literal["transfers", "cellstats", "relay_bw", "metrics"]] = Field(
        default_factory=lambda: list(COLLECTORS), description="Collectors to run")
    bw_interval: Duration = Field("500ms", description="Relay bandwidth sampling interval")
    metrics_interval: Duration = Field("10s", description="MetricsPort scrape interval")
    ready_timeout: Duration = Field("180s", description="Time allowed for the network to become ready")
    prometheus: PrometheusCfg = Field(default_factory=PrometheusCfg,
                                      description="Live metrics: Prometheus (see docs/observability.md)")
    mechanism: Mechanism = Field(default_factory=Mechanism,
                                 description="What the compared variants act through; the mechanism gates check "
                                             "it per repetition (docs/statistics.md)")


# Metrics a sequential design can stop on (analysis/metrics.py ids: METRIC[/SUBJECT]).
STOP_METRIC_PATTERN = (r"^((ttfb_s|ttlb_s|ttfb_stream_s|ttlb_stream_s)/[a-z0-9-]+:[A-Za-z0-9._-]+"
                       r"|circuit_build_s|relay_throughput_Bps/[a-z0-9-]+"
                       r"|cell_wait_ms/[a-z0-9-]+/(inbound|outbound)/(all|light|heavy))$")


class StopWhen(Strict):
    metric: str = Field(..., pattern=STOP_METRIC_PATTERN,
                        description="The primary comparison's metric, as summary.json names it: "
                                    "ttlb_s/CLIENTGROUP:FILE, ttfb_s/..., circuit_build_s, "
                                    "relay_throughput_Bps/RELAY, cell_wait_ms/RELAY/inbound|outbound/all|light|heavy")
    variant: str | None = Field(None, description="The variant compared with the baseline (default: the first "
                                                  "variant that is not the baseline)")
    ci_width_pct: float = Field(..., gt=0, le=1000,
                                description="Stop once the 95% interval of the % change (upper - lower, in "
                                            "percentage points) is narrower than this")


class Design(Strict):
    """A sequential design (issue 36 item 6): ``pilot`` blocks, then one block at a time until
    the primary comparison's 95% interval is narrower than ``stop_when.ci_width_pct`` or
    ``max_repetitions`` blocks have run (docs/statistics.md "Sequential designs")."""
    pilot: int = Field(..., ge=3, le=100, description="Blocks run before the stopping rule is first checked "
                                                      "(at least 3: a paired interval needs 2 degrees of freedom)")
    max_repetitions: int = Field(..., ge=3, le=100, description="The most blocks the run may take (the scenario's "
                                                                "repetitions is this)")
    stop_when: StopWhen


class Crossover(Strict):
    """A within-run crossover (issue 36 item 5; torbed/crossover.py): each repetition is one
    network whose relays switch between the variants (the arms) at run time, in periods."""
    period: Duration = Field(..., description="How long each arm runs before the relays switch to the next")
    washout: Duration = Field("5s", description="The first part of each period, not measured: the previous "
                                                "arm's queues and EWMA counts drain")
    cycles: int = Field(..., ge=1, le=50, description="Cycles per repetition, each one period per arm; the order "
                                                      "alternates (A B, B A, ...). measure.duration must be cycles "
                                                      "x arms x period")


class Placement(Strict):
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict] = Field(default_factory=list)
    affinity: dict = Field(default_factory=dict)


FAULT_KINDS = ("kill", "pause", "restart", "link", "cpu")
LINK_FAULT_FIELDS = ("delay", "jitter", "loss", "rate", "partition")


class Fault(Strict):
    """A fault injected during the workload (docs/faults.md). Process faults (kill, pause,
    restart, cpu) name a relay node or group in ``target``; link faults name either the two
    sides of the links they change (``between``) or a node/group whose every link changes
    (``target``)."""
    at: Duration = Field(..., description="Time after the workload starts")
    kind: Literal["kill", "pause", "restart", "link", "cpu"] = Field(
        ..., description="kill: SIGKILL a node's tor (it stays down); pause: SIGSTOP it (SIGCONT at the end); "
                         "restart: stop it and start it again after 'duration' (default at once); "
                         "link: change links (delay, jitter, loss, rate, partition); "
                         "cpu: a CPU quota on the node's tor (cgroup)")
    target: str | None = Field(None, description="A node ('middle0') or a group (all its nodes)")
    between: list[str] | None = Field(None, min_length=2, max_length=2,
                                      description="link only: two groups or nodes; the links between them change "
                                                  "(both directions)")
    duration: Duration | None = Field(None, description="How long the fault lasts before it is undone (default: "
                                                        "until the end of the workload; restart: the downtime)")
    delay: Duration | None = Field(None, description="link: one-way delay added to the link's own, e.g. '100ms'")
    jitter: Duration | None = Field(None, description="link: delay variation during the fault (replaces the link's)")
    loss: Percent | None = Field(None, description="link: random loss during the fault (replaces the link's)")
    rate: Rate | None = Field(None, description="link: rate limit during the fault (replaces the link's)")
    partition: bool = Field(False, description="link: drop every frame (100% loss) in both directions")
    cpu: Percent | None = Field(None, description="cpu: the CPU time the node's tor may use, in percent of one core "
                                                  "(e.g. '20%'; 1% .. 100%)")

    def end(self, run_s: float) -> float:
        """When the fault is undone, in seconds after the workload starts (kill: never, so
        the end of the run)."""
        if self.kind == "kill" or self.duration is None:
            return run_s if self.kind != "restart" else self.at.seconds
        return self.at.seconds + self.duration.seconds


# ---------------------------------------------------------------------------------------
# Provenance of a generated scenario (torbed generate)

class SourceDocument(Strict):
    """One input document of a generated scenario, identified by its digest."""
    kind: Literal["consensus", "server-descriptors"]
    path: str = Field(..., description="The file (or directory, or archive) as given to torbed generate")
    sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$",
                        description="SHA-256 of the file (a directory: of its files' names and digests, sorted)")
    entries: int = Field(..., ge=0, description="Relays (consensus) or descriptors it holds")
    valid_after: str | None = Field(None, description="consensus: its valid-after time (UTC)")
    published: str | None = Field(None, description="server descriptors: oldest .. newest published time")


class Generated(Strict):
    """How a scenario was generated: recorded for provenance (run.json keeps it), never
    used to run the network."""
    tool: str = Field(..., description="The generator and its version, e.g. 'torbed generate 0.1.0'")
    seed: int = Field(..., ge=0, description="Seed of the sampling")
    method: str = Field(..., description="What was sampled and how (one paragraph)")
    sources: list[SourceDocument] = Field(..., min_length=1)
    parameters: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")], Union[bool, int, float, str]] = Field(
        default_factory=dict, description="The generator's inputs and the budget it fitted to")


class SampledGroup(Strict):
    """One relay group as one block's sampled network has it (same name and count as in
    ``network.relays``; its own rate and weights)."""
    bandwidth: Rate = Field(..., description="BandwidthRate/BandwidthBurst of each relay in this block's network")
    weights: list[Annotated[int, Field(ge=1, le=10**9)]] = Field(
        ..., min_length=1, description="Consensus weights the authorities vote, one per relay in node order")


class NetworkSample(Strict):
    """One independently sampled network (torbed generate --networks): repetition k (block k)
    runs sample k mod len(samples), with the relay groups' rates and weights and the links
    of that sample (replacing links.pairs between the same groups); everything else is the
    scenario's."""
    seed: int = Field(..., ge=0, description="Seed this network was drawn with")
    relays: dict[GroupName, SampledGroup] = Field(..., min_length=1,
                                                   description="Every relay group of network.relays, by name")
    pairs: list[LinkPair] = Field(default_factory=list, description="links.pairs of this block's network")


# ---------------------------------------------------------------------------------------
# Scenario

class Scenario(Strict):
    apiVersion: Literal["torbed/v1"]
    name: str = Field(..., pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$",
                      description="Lowercase name (used in run directories and Helm release names)")
    description: str = ""
    seed: int = Field(1, ge=0, description="Seed of every random choice (recorded in run.json)")
    variants: list[str] = Field(..., min_length=1, description="Variants compared in one run")
    baseline: str | None = Field(None, description="Variant the others are compared with (default: the first)")
    repetitions: int = Field(1, ge=1, le=100)
    network: Network
    links: Links = Field(default_factory=Links)
    servers: dict[GroupName, ServerGroup] = Field(..., min_length=1)
    clients: dict[GroupName, ClientGroup] = Field(..., min_length=1)
    measure: Measure = Field(default_factory=Measure)
    placement: dict[str, Placement] = Field(default_factory=dict, description="Kubernetes only")
    faults: list[Fault] = Field(default_factory=list)
    load: Load | None = Field(None, description="Background users (Locust) through their own tors")
    generated: Generated | None = Field(None, description="Provenance of a scenario made by torbed generate "
                                                          "(sources, seed, method); not used to run it")
    samples: list[NetworkSample] = Field(
        default_factory=list, description="An independently sampled network per block (torbed generate --networks; "
                                          "Jansen, Tracey & Goldberg 2021): repetition k runs samples[k mod n]. "
                                          "Empty: every repetition runs network as written")
    crossover: Crossover | None = Field(
        None, description="Within-run crossover: every variant in one network per repetition, the relays switched "
                          "between them by SETCONF in periods (variants whose options all apply at run time: "
                          "vanilla, ewma-H, kist, kistlite). Local backend only (docs/statistics.md)")
    design: Design | None = Field(None, description="Sequential design: a pilot, then blocks until the primary "
                                                    "comparison's 95% interval is narrow enough or the maximum "
                                                    "is reached (repetitions = design.max_repetitions)")

    _warnings: list[str] = PrivateAttr(default_factory=list)
    _base_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _design_repetitions(cls, data):
        """With a design and no repetitions, repetitions is design.max_repetitions."""
        if isinstance(data, dict) and "repetitions" not in data and isinstance(data.get("design"), dict):
            m = data["design"].get("max_repetitions")
            if isinstance(m, int) and not isinstance(m, bool):
                data = {**data, "repetitions": m}
        return data

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    @property
    def baseline_variant(self) -> str:
        return self.baseline or self.variants[0]

    def load_server(self) -> str | None:
        """The server group the background users fetch from (None: no load)."""
        return None if self.load is None else self.load.server or next(iter(self.servers))

    def load_files(self) -> dict[str, units.Size]:
        """Files the background users fetch, added to their server's files: load-<mix name>."""
        return {} if self.load is None else {f"load-{n}": r.size for n, r in self.load.mix.items()}

    @property
    def network_design(self) -> str:
        """'network-per-block' (samples) or 'one-network'."""
        return "network-per-block" if self.samples else "one-network"

    def for_block(self, k: int) -> "Scenario":
        """The scenario repetition (block) ``k`` runs: with samples, sample k mod n's relay rates,
        weights and relay links; otherwise this scenario itself."""
        if not self.samples:
            return self
        smp = self.samples[k % len(self.samples)]
        relays = {g: rg.model_copy(update={"bandwidth": smp.relays[g].bandwidth, "weights": list(smp.relays[g].weights)})
                  for g, rg in self.network.relays.items()}
        own = {frozenset(p.between) for p in smp.pairs}
        pairs = [p for p in self.links.pairs if frozenset(p.between) not in own] + list(smp.pairs)
        out = self.model_copy(update={"network": self.network.model_copy(update={"relays": relays}),
                                      "links": self.links.model_copy(update={"pairs": pairs})})
        out._warnings, out._base_dir = self._warnings, self._base_dir
        return out

    def group_names(self) -> list[str]:
        return [*self.network.relays, *self.servers, *self.clients]

    def trace_path(self, trace: str) -> Path:
        """Where a replay workload's trace file is: absolute, else next to the scenario
        file, else in torbed's data (torbed.resources: the repository or the installed copy); failing those, a file of that name in a
        TORBED_TRACE_DIRS directory (pods: no repository there). The first that exists;
        the path in torbed's data otherwise."""
        p = Path(trace)
        if p.is_absolute() and p.exists():
            return p
        for base in (() if p.is_absolute() else (self._base_dir, resources.ROOT)):
            if base is not None and (Path(base) / p).exists():
                return (Path(base) / p).resolve()
        for d in constants.TRACE_DIRS:
            if (d / p.name).is_file():
                return d / p.name
        return p if p.is_absolute() else resources.ROOT / p


def _loc(loc: tuple) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        # pydantic inserts the union tag ('fetch') after 'workload'; readers never wrote it.
        if i > 0 and loc[i - 1] == "workload" and item in WORKLOAD_KINDS:
            continue
        if item == "[key]":  # pydantic's marker for an invalid mapping key; the key itself is named
            continue
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _message(err: dict) -> str:
    t = err["type"]
    if t == "missing":
        return "required field is missing"
    if t == "literal_error":
        return f"{err['msg'].replace('Input should be', 'must be')} (got {err.get('input')!r})"
    if t == "union_tag_invalid":
        return f"unknown workload kind {err['ctx'].get('tag')!r} (allowed: {', '.join(WORKLOAD_KINDS)})"
    if t == "union_tag_not_found":
        return f"'kind' is required (allowed: {', '.join(WORKLOAD_KINDS)})"
    if t == "string_pattern_mismatch":
        return f"{err.get('input')!r} does not match {err['ctx']['pattern']}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


def _sample_problems(s: Scenario) -> list[tuple[str, str]]:
    """Each block's network has exactly the relay groups of network.relays, a weight per
    relay, and links between relay groups only."""
    problems = []
    relays = s.network.relays
    if s.samples and not all(rg.weights for rg in relays.values()):
        problems.append(("samples", "a sampled network per block needs weights on every relay group of network.relays"))
    for i, smp in enumerate(s.samples):
        if set(smp.relays) != set(relays):
            problems.append((f"samples[{i}].relays", f"groups {', '.join(sorted(smp.relays))}; every block must have "
                                                     f"network.relays' groups: {', '.join(sorted(relays))}"))
            continue
        for g, sg in smp.relays.items():
            if len(sg.weights) != relays[g].count:
                problems.append((f"samples[{i}].relays.{g}.weights",
                                 f"{len(sg.weights)} weights for {relays[g].count} relays; give one per relay"))
        for j, p in enumerate(smp.pairs):
            if not set(p.between) <= {*s.group_names(), "authority"}:
                problems.append((f"samples[{i}].pairs[{j}].between", f"{p.between}: not groups of this scenario"))
    return problems


def _weight_problems(s: Scenario) -> list[tuple[str, str]]:
    """Voted consensus weights: one per relay, on every group or none, and enough
    authorities for tor to use them (a consensus takes measured bandwidths only when more
    than two authorities vote them: dirvote.c, "num_mbws > 2")."""
    relays = s.network.relays
    with_w = [g for g, rg in relays.items() if rg.weights is not None]
    problems = [(f"network.relays.{g}.weights", f"{len(rg.weights)} weights for {rg.count} relays; give one per relay")
                for g, rg in relays.items() if rg.weights is not None and len(rg.weights) != rg.count]
    if with_w and len(with_w) != len(relays):
        missing = [g for g in relays if g not in with_w]
        problems.append(("network.relays", f"weights are set on {', '.join(with_w)} but not on {', '.join(missing)}: "
                                           "set them on every relay group or none (an unmeasured relay's weight is "
                                           "capped at 20 when the others are measured)"))
    if with_w and s.network.authorities < 3:
        problems.append(("network.authorities", f"{s.network.authorities} authorities: relay weights need 3 or more "
                                                "(tor uses voted measurements only when more than two authorities "
                                                "vote them)"))
    return problems


def _semantics(s: Scenario, variants_dir: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Cross-field checks. Returns (problems, warnings)."""
    problems, seen = _group_name_problems(s)
    variant_problems = _variant_problems(s, variants_dir)
    problems += variant_problems
    if s.crossover is not None and not variant_problems:
        from . import crossover
        problems += crossover.check(s)
    if s.design is not None:
        problems += _design_problems(s)
    problems += _mechanism_problems(s)
    net_problems, warnings = _network_problems(s, variants_dir)
    problems += net_problems
    client_problems, client_warnings = _client_problems(s)
    problems += client_problems
    warnings += client_warnings
    problems += _server_problems(s)
    link_groups = set(seen) | {"authority"} | ({"load", "locust"} if s.load is not None else set())
    problems += _link_problems(s, link_groups)
    if s.load is not None:
        problems += _load_problems(s)
    problems += _measure_problems(s)
    # Placement and faults name groups (faults may also name nodes like 'middle0').
    for g in s.placement:
        if g not in link_groups:
            problems.append((f"placement.{g}", f"'{g}' is not a group (groups: {', '.join(sorted(link_groups))})"))
    problems += _fault_problems(s)
    return problems, warnings


def _group_name_problems(s: Scenario) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Group names share one namespace (links, placement and faults name them).
    Returns (problems, {group: the section that defines it})."""
    problems: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for kind, groups in (("network.relays", s.network.relays), ("servers", s.servers), ("clients", s.clients)):
        for g in groups:
            if g in RESERVED_GROUPS:
                problems.append((f"{kind}.{g}", f"'{g}' is reserved (reserved: {', '.join(sorted(RESERVED_GROUPS))})"))
            if g in seen:
                problems.append((f"{kind}.{g}", f"group name '{g}' is also used in {seen[g]}; names must be unique"))
            seen[g] = kind
    return problems, seen


def _variant_problems(s: Scenario, variants_dir: Path) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if len(set(s.variants)) != len(s.variants):
        problems.append(("variants", "variants must be unique"))
    named = [(f"variants[{i}]", v) for i, v in enumerate(s.variants)]
    named += [(f"network.relays.{g}.variant", rg.variant) for g, rg in s.network.relays.items()
              if rg.variant is not None]
    for field, v in named:
        try:
            load_variant(v, variants_dir)
        except VariantError as e:
            problems.append((field, str(e)))
    if s.baseline is not None and s.baseline not in s.variants:
        problems.append(("baseline", f"'{s.baseline}' is not one of variants ({', '.join(s.variants)})"))
    return problems


def _mechanism_problems(s: Scenario) -> list[tuple[str, str]]:
    """The mechanism the gates check."""
    problems: list[tuple[str, str]] = []
    mech, relays = s.measure.mechanism, s.network.relays
    if mech.kind == "cpu-bound" and mech.target is None:
        problems.append(("measure.mechanism.target", "cpu-bound needs the relay group whose CPU must be saturated"))
    elif mech.kind != "cpu-bound" and mech.target is not None:
        problems.append(("measure.mechanism.target", f"only a cpu-bound mechanism has a target (kind is {mech.kind})"))
    if mech.target is not None and mech.target not in relays:
        problems.append(("measure.mechanism.target", f"'{mech.target}' is not a relay group of network.relays "
                                                     f"({', '.join(relays)})"))
    return problems


def _subnet_problems(s: Scenario) -> list[tuple[str, str]]:
    try:
        if not re.fullmatch(r"[0-9.]+/(0|[1-9][0-9]?)", s.network.subnet):
            raise ValueError(f"'{s.network.subnet}': write it as ADDRESS/PREFIX, e.g. {constants.DEFAULT_SUBNET}")
        net = ipaddress.IPv4Network(s.network.subnet, strict=True)
    except ValueError as e:
        return [("network.subnet", f"not an IPv4 network: {e}")]
    if not any(net.subnet_of(ipaddress.IPv4Network(r)) for r in PRIVATE_RANGES) or net.prefixlen > SMALLEST_PREFIX:
        return [("network.subnet", f"'{s.network.subnet}' must be a private (RFC 1918: "
                 f"{', '.join(PRIVATE_RANGES)}) range of /{SMALLEST_PREFIX} or larger")]
    # Nodes take consecutive addresses from .FIRST_NODE_HOST up (network.plan).
    # Second addresses (network.relays.*.second_address) come after every first one.
    seconds = sum(rg.count for rg in s.network.relays.values() if rg.second_address)
    nodes, room = sum(group_sizes(s).values()), net.num_addresses - 1 - constants.FIRST_NODE_HOST
    if nodes + seconds > room:
        also = f" and {seconds} second addresses" if seconds else ""
        return [("network.subnet", f"'{s.network.subnet}' has room for {room} nodes (addresses "
                 f"from .{constants.FIRST_NODE_HOST} up); the scenario has {nodes}{also}: use a larger range")]
    return []


def binds_second_address(variant: str, variants_dir: Path = constants.VARIANTS_DIR) -> bool:
    """Does this variant's tor bind the second connection of a pair to the relay's second
    address (CircSwitchBindAddress; circswitch's own_path, e.g. circswitch-ownpath)?"""
    try:
        return load_variant(variant, variants_dir).parameters.get("own_path") == 1
    except VariantError:
        return False


def _second_address_problems(s: Scenario, variants_dir: Path) -> list[tuple[str, str]]:
    """A second address does something only for a variant that binds its second connection
    to it, and such a variant needs a relay group with a second address."""
    problems = []
    for g, rg in s.network.relays.items():
        names = [rg.variant] if rg.variant is not None else s.variants
        if rg.second_address and not any(binds_second_address(n, variants_dir) for n in names):
            problems.append((f"network.relays.{g}.second_address",
                             f"no variant this group runs ({', '.join(names)}) binds a connection to it; a "
                             f"variant with own_path 1 does (e.g. circswitch-ownpath)"))
    if any(rg.second_address for rg in s.network.relays.values()):
        # linkemu's runtime changes name nodes; <node>:second would keep its link.
        problems += [(f"faults[{i}].kind", "link faults do not change the links of a second address "
                                           "(network.relays.*.second_address) yet: a cut link would stay open there")
                     for i, f in enumerate(s.faults) if f.kind == "link"]
    else:
        for i, v in enumerate(s.variants):
            if binds_second_address(v, variants_dir):
                problems.append((f"variants[{i}]", f"{v} binds the second connection of a pair to a relay's "
                                                   f"second address, and no relay group has second_address: true"))
    return problems


def _network_problems(s: Scenario, variants_dir: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Subnet, authorities, each relay group's torrc lines, and an exit. Returns (problems, warnings)."""
    problems = _subnet_problems(s)
    warnings: list[str] = []
    relays = s.network.relays
    if s.network.authorities < 3:
        warnings.append(f"network.authorities: {s.network.authorities} authorities; 3 or more are recommended "
                        "(a consensus needs a majority; 1 gives no redundancy)")
    for g, rg in relays.items():
        # A patched tor's own options are accepted when every variant the group runs has them.
        families = set()
        for name in [rg.variant] if rg.variant is not None else s.variants:
            try:
                families.add(load_variant(name, variants_dir).family)
            except VariantError:
                pass       # reported by _variant_problems
        extra = None
        for fam in families:
            opts = torrc_policy.variant_options(fam, variants_dir)
            extra = opts if extra is None else {k: v for k, v in extra.items() if k in opts}
        problems += [(f"network.relays.{g}.torrc", msg)
                     for msg in torrc_policy.problems(rg.torrc, bandwidth_set=rg.bandwidth is not None,
                                                      variant_options=extra)]
    for g, rg in relays.items():
        if rg.cpu_per_thread is not None and not 0.01 <= rg.cpu_per_thread.fraction <= 1.0:
            problems.append((f"network.relays.{g}.cpu_per_thread",
                             f"{rg.cpu_per_thread} is outside 1%..100% of one core"))
    problems += _weight_problems(s) + _sample_problems(s) + _second_address_problems(s, variants_dir)
    if not any(rg.exit for rg in relays.values()):
        problems.append(("network.relays", "no relay group has 'exit: true'; clients cannot bootstrap without exits"))
    return problems, warnings


def _client_problems(s: Scenario) -> tuple[list[tuple[str, str]], list[str]]:
    """Each client group's path and workload. Returns (problems, warnings)."""
    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    for c, cg in s.clients.items():
        if cg.path is not None:
            p, w = _path_problems(s, c, cg.path)
            problems += p
            warnings += w
        problems += _workload_problems(s, c, cg)
    return problems, warnings


def _path_problems(s: Scenario, c: str, path: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    relays = s.network.relays
    problems: list[tuple[str, str]] = []
    for i, hop in enumerate(path):
        if hop not in relays:
            problems.append((f"clients.{c}.path[{i}]",
                             f"'{hop}' is not a relay group (relay groups: {', '.join(relays)})"))
    last = path[-1]
    if last in relays and not relays[last].exit:
        exits = [g for g, rg in relays.items() if rg.exit]
        problems.append((f"clients.{c}.path[{len(path) - 1}]",
                         f"a path must end at an exit group; '{last}' has no 'exit: true' "
                         f"(exit groups: {', '.join(exits) or 'none'})"))
    warnings = [f"clients.{c}.path: a one-hop path; tor builds one-hop circuits only to exits"] if len(path) < 2 else []
    return problems, warnings


def _think_problems(field: str, think) -> list[tuple[str, str]]:
    """A think-time distribution's own problems (a uniform one needs min <= max)."""
    if think is None or think.distribution != "uniform":
        return []
    if think.min is None or think.max is None:
        return [(field, "a uniform distribution needs 'min' and 'max'")]
    if think.min.seconds > think.max.seconds:
        return [(f"{field}.min", "min is larger than max")]
    return []


def _workload_problems(s: Scenario, c: str, cg: ClientGroup) -> list[tuple[str, str]]:
    """The workload's server and file exist, and its times and think-time fit together."""
    problems: list[tuple[str, str]] = []
    servers, wl = s.servers, cg.workload
    if not isinstance(wl, ReplayWorkload):
        for name in ("timeout", "stallout"):
            d = getattr(wl, name)
            if d is not None and d.seconds <= 0:
                problems.append((f"clients.{c}.workload.{name}", "must be longer than 0s"))
    server = wl.server
    if server is None:
        if len(servers) != 1:
            return problems + [(f"clients.{c}.workload.server",
                                f"required when there is more than one server group ({', '.join(servers)})")]
        server = next(iter(servers))
    if server not in servers:
        return problems + [(f"clients.{c}.workload.server",
                            f"'{server}' is not a server group (servers: {', '.join(servers)})")]
    if isinstance(wl, ReplayWorkload):
        return problems + _replay_problems(s, c, cg, wl, server)
    if not servers[server].files:
        return problems + [(f"clients.{c}.workload.server", f"server '{server}' has no files to download")]
    if wl.file not in servers[server].files:
        problems.append((f"clients.{c}.workload.file",
                         f"'{wl.file}' is not a file of server '{server}' (files: {', '.join(servers[server].files)})"))
    if isinstance(wl, FetchWorkload):
        if wl.think is not None and wl.pause != "0s":
            problems.append((f"clients.{c}.workload.think", "set either 'pause' or 'think', not both"))
        problems += _think_problems(f"clients.{c}.workload.think", wl.think)
    return problems


def _server_problems(s: Scenario) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for g, sg in s.servers.items():
        if not sg.files and sg.replay is None:
            problems.append((f"servers.{g}", "a server needs 'files' (HTTP) or 'replay' (replay server), or both"))
        if sg.replay is not None and sg.files and sg.replay.port == sg.port:
            problems.append((f"servers.{g}.replay.port", f"port {sg.port} is already the HTTP port"))
    return problems


def _link_problems(s: Scenario, link_groups: set[str]) -> list[tuple[str, str]]:
    """Pairs name groups once each and set something; each link's fields fit together."""
    problems: list[tuple[str, str]] = []
    pairs_seen: set[frozenset] = set()
    for i, pair in enumerate(s.links.pairs):
        for j, g in enumerate(pair.between):
            if g not in link_groups:
                problems.append((f"links.pairs[{i}].between[{j}]",
                                 f"'{g}' is not a group (groups: {', '.join(sorted(link_groups))})"))
        key = frozenset(pair.between)
        if key in pairs_seen:
            problems.append((f"links.pairs[{i}].between", f"{pair.between} is listed twice"))
        pairs_seen.add(key)
        if all(getattr(pair, f) is None for f in ("rate", "delay", "jitter", "jitter_distribution", "loss",
                                                      "loss_burst", "queue")):
            problems.append((f"links.pairs[{i}]", "an override sets none of rate, delay, jitter, loss, queue"))
    for path, link in [("links.default", s.links.default)] + [(f"links.pairs[{i}]", p) for i, p in enumerate(s.links.pairs)]:
        problems += _link_field_problems(s, path, link)
    return problems


def _link_field_problems(s: Scenario, path: str, link: Link) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if link.jitter is not None and link.delay is None:
        problems.append((f"{path}.jitter", "jitter needs a delay"))
    if link.jitter is not None and link.delay is not None and link.jitter.seconds > link.delay.seconds:
        problems.append((f"{path}.jitter", "jitter larger than the delay would reorder packets"))
    if link.rate is not None and link.rate.bps < 8000:
        problems.append((f"{path}.rate", f"{link.rate} is below 8kbit; tor cannot work that slowly"))
    if link.queue is not None and link.rate is None and s.links.default.rate is None:
        problems.append((f"{path}.queue", "a queue bounds the backlog of a rate-limited link: set a rate"))
    if link.loss_burst is not None and link.loss is None and s.links.default.loss is None:
        problems.append((f"{path}.loss_burst", "loss_burst shapes losses: set a loss"))
    if link.loss_burst is not None and (link.loss or s.links.default.loss or units.Percent("0%")).fraction >= 1.0:
        problems.append((f"{path}.loss_burst", "bursts are meaningless with 100% loss"))
    return problems


def _measure_problems(s: Scenario) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    m = s.measure
    if m.duration.seconds <= 0:
        problems.append(("measure.duration", "must be longer than 0s"))
    if m.warmup.seconds >= m.duration.seconds:
        problems.append(("measure.warmup", f"warmup {m.warmup} is not shorter than duration {m.duration}"))
    if m.bw_interval.seconds < 0.1:
        problems.append(("measure.bw_interval", "must be at least 100ms"))
    if len(set(m.collect)) != len(m.collect):
        problems.append(("measure.collect", "collectors must be unique"))
    return problems


def group_sizes(s: Scenario) -> dict[str, int]:
    """Every group that has nodes, with its node count (nodes are <group><index>)."""
    sizes = {"auth": s.network.authorities}
    sizes.update({g: rg.count for g, rg in s.network.relays.items()})
    sizes.update({g: sg.count for g, sg in s.servers.items()})
    sizes.update({g: cg.count for g, cg in s.clients.items()})
    if s.load is not None:
        sizes.update({"load": s.load.workers, "locust": 1})
    return sizes


def fault_nodes(s: Scenario, name: str, groups: dict[str, int] | None = None) -> list[str] | None:
    """The nodes a fault's target names: a group's nodes, or one node; None if neither.
    'authority' is the authorities' group (nodes auth0, auth1, ...)."""
    groups = groups if groups is not None else group_sizes(s)
    if name == "authority":
        name = "auth"
    if name in groups:
        return [f"{name}{i}" for i in range(groups[name])]
    m = re.fullmatch(r"([a-z][a-z0-9]*?)([0-9]+)", name)
    if m and m.group(1) in groups and int(m.group(2)) < groups[m.group(1)]:
        return [name]
    return None


def _fault_problems(s: Scenario) -> list[tuple[str, str]]:
    """Targets exist, fields fit the kind, times lie within the workload, and no two faults
    that overlap in time contradict each other on one node (or one link)."""
    problems: list[tuple[str, str]] = []
    run_s = s.measure.duration.seconds
    groups = group_sizes(s)
    # Per valid fault: (start, end, kind, nodes, (side A, side B) of 'between' or None, index)
    spans: list[tuple] = []
    for i, f in enumerate(s.faults):
        where = f"faults[{i}]"
        found = _fault_field_problems(f, where)
        if f.kind == "link":
            targets, nodes, sides = _link_fault_targets(s, f, where, groups)
            found += targets + _link_fault_value_problems(f, where)
        else:
            targets, nodes = _node_fault_target(s, f, where, groups)
            found += targets
            sides = None
        found += _fault_time_problems(s, f, where)
        if not found:
            # A restart's window is its downtime plus a moment to start again.
            end = f.end(run_s) + (1.0 if f.kind == "restart" else 0.0)
            spans.append((f.at.seconds, end, f.kind, nodes, sides, i))
        problems += found
    return problems + _fault_clashes(spans)


def _fault_field_problems(f: Fault, where: str) -> list[tuple[str, str]]:
    """Fields that apply to other kinds of fault only, and the cpu fault's quota."""
    problems: list[tuple[str, str]] = []
    link = f.kind == "link"
    for name in LINK_FAULT_FIELDS:
        if not link and (getattr(f, name) not in (None, False)):
            problems.append((f"{where}.{name}", f"'{name}' applies to link faults only (this fault is {f.kind})"))
    if not link and f.between is not None:
        problems.append((f"{where}.between", f"'between' applies to link faults only (this fault is {f.kind}); "
                         "use 'target'"))
    if f.kind != "cpu" and f.cpu is not None:
        problems.append((f"{where}.cpu", f"'cpu' applies to cpu faults only (this fault is {f.kind})"))
    if f.kind == "kill" and f.duration is not None:
        problems.append((f"{where}.duration", "a killed node stays down; use kind 'restart' with a duration "
                         "for a node that comes back"))
    if f.kind == "cpu":
        if f.cpu is None:
            problems.append((f"{where}.cpu", "required for cpu faults: the quota, e.g. '20%' of one core"))
        elif f.cpu.fraction < 0.01:
            problems.append((f"{where}.cpu", f"{f.cpu} is below 1% of a core (the kernel's smallest useful quota)"))
    return problems


def _link_fault_targets(s: Scenario, f: Fault, where: str, groups: dict[str, int]
                        ) -> tuple[list[tuple[str, str]], set[str], tuple[set[str], set[str]] | None]:
    """A link fault's nodes: every link of 'target', or those 'between' two sides.
    Returns (problems, nodes, (side A, side B) or None)."""
    if (f.target is None) == (f.between is None):
        return [(where, "a link fault needs either 'target' (every link of a node or group) "
                 "or 'between' (two groups or nodes), not both")], set(), None
    if f.between is None:
        ns = fault_nodes(s, f.target, groups)
        return ([] if ns is not None else [(f"{where}.target", _not_a_target(f.target, groups))]), set(ns or ()), None
    problems: list[tuple[str, str]] = []
    got = []
    for j, name in enumerate(f.between):
        ns = fault_nodes(s, name, groups)
        if ns is None:
            problems.append((f"{where}.between[{j}]", _not_a_target(name, groups)))
        got.append(set(ns or ()))
    if len(got) == 2 and got[0] & got[1]:
        problems.append((f"{where}.between", f"{f.between}: the two sides share node(s) "
                         f"{', '.join(sorted(got[0] & got[1]))}"))
    return problems, got[0] | got[1], (got[0], got[1])


def _link_fault_value_problems(f: Fault, where: str) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not any(getattr(f, name) not in (None, False) for name in LINK_FAULT_FIELDS):
        problems.append((where, "a link fault sets none of delay, jitter, loss, rate, partition"))
    if f.partition and any(getattr(f, n) is not None for n in ("delay", "jitter", "loss", "rate")):
        problems.append((f"{where}.partition", "a partition drops everything: set no delay, jitter, "
                         "loss or rate with it"))
    if f.jitter is not None and f.delay is None:
        problems.append((f"{where}.jitter", "jitter needs a delay in the same fault"))
    elif f.jitter is not None and f.jitter.seconds > f.delay.seconds:
        problems.append((f"{where}.jitter", "jitter larger than the delay would reorder packets"))
    if f.rate is not None and f.rate.bps < 8000:
        problems.append((f"{where}.rate", f"{f.rate} is below 8kbit; tor cannot work that slowly"))
    return problems


def _node_fault_target(s: Scenario, f: Fault, where: str, groups: dict[str, int]
                       ) -> tuple[list[tuple[str, str]], set[str]]:
    """A process or CPU fault's relay nodes. Returns (problems, nodes)."""
    relays = s.network.relays
    relay_groups = {g: n for g, n in groups.items() if g in relays}
    if f.target is None:
        return [(f"{where}.target", f"required for {f.kind} faults")], set()
    ns = fault_nodes(s, f.target, relay_groups)
    if ns is not None:
        return [], set(ns)
    base = _base(f.target)
    return [(f"{where}.target", f"'{f.target}' is not a relay group or relay node "
             f"(relay groups: {', '.join(relays)}; nodes are <group><index>, e.g. middle0"
             + (f"; group '{base}' has {relay_groups[base]} node(s))" if base in relay_groups else ")"))], set()


def _fault_time_problems(s: Scenario, f: Fault, where: str) -> list[tuple[str, str]]:
    run_s = s.measure.duration.seconds
    if f.at.seconds >= run_s:
        return [(f"{where}.at", f"{f.at} is after the end of the workload ({s.measure.duration})")]
    if f.duration is None or f.kind == "kill":
        return []
    if f.duration.seconds <= 0 and f.kind != "restart":
        return [(f"{where}.duration", "must be longer than 0s")]
    if f.at.seconds + f.duration.seconds > run_s:
        return [(f"{where}.duration", f"the fault would end at {f.at.seconds + f.duration.seconds:g} s, "
                 f"after the end of the workload ({s.measure.duration})")]
    return []


def _fault_clashes(spans: list[tuple]) -> list[tuple[str, str]]:
    """Overlapping faults that contradict each other. Process faults (kill, pause, restart)
    each decide whether the node's tor runs: two on one node at once contradict; a kill
    lasts to the end. Two CPU quotas on one node contradict, and a quota with a restart or
    kill (it holds the old process only); two link faults on one link."""
    problems: list[tuple[str, str]] = []
    process = {"kill", "pause", "restart"}
    for a in range(len(spans)):
        for b in range(a + 1, len(spans)):
            s0, e0, k0, n0, sides0, i0 = spans[a]
            s1, e1, k1, n1, sides1, i1 = spans[b]
            if not (s0 < e1 and s1 < e0):
                continue
            clash = None
            if k0 in process and k1 in process and n0 & n1:
                clash = f"node(s) {', '.join(sorted(n0 & n1))}: {k0} and {k1} at the same time"
            elif k0 == k1 == "cpu" and n0 & n1:
                clash = f"node(s) {', '.join(sorted(n0 & n1))}: two CPU quotas at the same time"
            elif {k0, k1} in ({"cpu", "restart"}, {"cpu", "kill"}) and n0 & n1:
                clash = f"node(s) {', '.join(sorted(n0 & n1))}: the CPU quota would not hold the new tor of a " \
                        "restart (or a killed one)"
            elif k0 == k1 == "link" and _links_meet(n0, sides0, n1, sides1):
                clash = "both change the same link(s) at the same time"
            if clash:
                problems.append((f"faults[{i1}]", f"overlaps faults[{i0}]: {clash}"))
    return problems


def _base(name: str) -> str:
    return re.sub(r"[0-9]+$", "", name)


def _not_a_target(name: str, groups: dict[str, int]) -> str:
    base = _base(name)
    if base in groups and base != name:
        return f"'{name}': group '{base}' has {groups[base]} node(s)"
    return (f"'{name}' is not a group or node (groups: {', '.join(sorted((set(groups) - {'auth'}) | {'authority'}))}"
            "; nodes are <group><index>, e.g. middle0, auth0)")


def _links_meet(n0: set, sides0, n1: set, sides1) -> bool:
    """Whether two link faults change a common link. A target's faults change every link of
    its nodes; 'between' changes the links from one side to the other."""
    if sides0 is None and sides1 is None:
        return True          # every link of one node and every link of another: their own link
    if sides0 is None:
        return bool(n0 & n1)
    if sides1 is None:
        return bool(n1 & n0)
    (a0, b0), (a1, b1) = sides0, sides1
    return bool((a0 & a1 and b0 & b1) or (a0 & b1 and b0 & a1))


def _load_problems(s: Scenario) -> list[tuple[str, str]]:
    ld, relays, servers = s.load, s.network.relays, s.servers
    problems = []
    for i, hop in enumerate(ld.path or []):
        if hop not in relays:
            problems.append((f"load.path[{i}]", f"'{hop}' is not a relay group (relay groups: {', '.join(relays)})"))
    if ld.path and ld.path[-1] in relays and not relays[ld.path[-1]].exit:
        problems.append(("load.path[2]", f"a path must end at an exit group; '{ld.path[-1]}' has no 'exit: true'"))
    server = ld.server
    if server is None and len(servers) != 1:
        problems.append(("load.server", f"required when there is more than one server group ({', '.join(servers)})"))
    elif (server or next(iter(servers))) not in servers:
        problems.append(("load.server", f"'{server}' is not a server group (servers: {', '.join(servers)})"))
    elif not servers[server or next(iter(servers))].files:
        problems.append(("load.server", f"server '{server or next(iter(servers))}' serves no HTTP files "
                         "(the users' files are added to its 'files')"))
    if ld.workers > ld.users:
        problems.append(("load.workers", f"{ld.workers} workers for {ld.users} users: some would run no user"))
    end = s.measure.duration.seconds
    if ld.start.seconds >= end:
        problems.append(("load.start", f"{ld.start} is not before the end of the workload ({s.measure.duration})"))
    if ld.stop is not None:
        if ld.stop.seconds <= ld.start.seconds:
            problems.append(("load.stop", f"{ld.stop} is not after load.start ({ld.start})"))
        elif ld.stop.seconds > end:
            problems.append(("load.stop", f"{ld.stop} is after the end of the workload ({s.measure.duration})"))
    if not any(r.weight > 0 for r in ld.mix.values()):
        problems.append(("load.mix", "every weight is 0: the users would send nothing"))
    for name, r in ld.mix.items():
        if r.size.bytes < 1:
            problems.append((f"load.mix.{name}.size", "must be at least 1B"))
        problems += _think_problems(f"load.mix.{name}.think", r.think)
    return problems


def _replay_problems(s: Scenario, c: str, cg: ClientGroup, wl: ReplayWorkload, server: str) -> list[tuple[str, str]]:
    """A replay workload needs a replay server and a readable trace holding its flows."""
    from .replay.trace import TraceError, read as read_trace
    where = f"clients.{c}.workload"
    problems = []
    if s.servers[server].replay is None:
        problems.append((f"{where}.server", f"server '{server}' has no replay server (add 'replay: {{}}' to it)"))
    path = s.trace_path(wl.trace)
    try:
        trace = read_trace(path)
    except TraceError as e:
        return problems + [(f"{where}.trace", str(e))]
    if not trace.flows:
        problems.append((f"{where}.trace", f"{path}: the trace has no flows"))
    ids = {f.id for f in trace.flows}
    for i, fid in enumerate(wl.flows or []):
        if fid not in ids:
            problems.append((f"{where}.flows[{i}]", f"no flow {fid!r} in {path} ({len(ids)} flows; "
                             f"`torbed trace info {wl.trace}` lists them)"))
    if wl.distribute == "split":
        keys = {f.circuit if f.circuit is not None else f"flow:{f.id}" for f in trace.flows
                if not wl.flows or f.id in wl.flows}
        if len(keys) < cg.count:
            problems.append((f"clients.{c}.count", f"{cg.count} clients share {len(keys)} circuit key(s) of the trace "
                             "(distribute: split gives each client whole circuits): some would be idle; "
                             "use fewer clients or distribute: each"))
    return problems


def parse(data: object, source: str = "<data>", variants_dir: Path = constants.VARIANTS_DIR,
          base_dir: Path | None = None) -> Scenario:
    """Decode, default and validate a scenario mapping. Raises ScenarioError. ``base_dir``:
    where relative trace paths are looked up first (the scenario file's directory)."""
    if not isinstance(data, dict):
        raise ScenarioError(source, [("", f"a scenario is a mapping, got {type(data).__name__}")])
    try:
        scenario = Scenario.model_validate(data)
        scenario._base_dir = base_dir
    except ValidationError as e:
        raise ScenarioError(source, [(_loc(err["loc"]), _message(err)) for err in e.errors()]) from None
    problems, warnings = _semantics(scenario, variants_dir)
    if problems:
        raise ScenarioError(source, problems)
    scenario._warnings.extend(warnings)
    return scenario


def _design_problems(s: Scenario) -> list[tuple[str, str]]:
    d, out = s.design, []
    if d.pilot > d.max_repetitions:
        out.append(("design.pilot", f"{d.pilot} is more than design.max_repetitions ({d.max_repetitions})"))
    if s.repetitions != d.max_repetitions:
        out.append(("repetitions", f"{s.repetitions}, but design.max_repetitions is {d.max_repetitions}: with a "
                                   f"design, repetitions is the maximum (leave it out or make them equal)"))
    if len(s.variants) < 2:
        out.append(("design", "a sequential design compares variants: the scenario needs at least two"))
    v = d.stop_when.variant
    if v is not None and (v not in s.variants or v == s.baseline_variant):
        out.append(("design.stop_when.variant", f"'{v}' must be one of variants other than the baseline "
                                                f"'{s.baseline_variant}'"))
    metric = d.stop_when.metric
    if "/" in metric and ":" in metric:
        group, file = metric.split("/", 1)[1].split(":", 1)
        cg = s.clients.get(group)
        if cg is None:
            out.append(("design.stop_when.metric", f"'{group}' is not a client group ({', '.join(s.clients)})"))
        elif getattr(cg.workload, "file", None) != file:
            out.append(("design.stop_when.metric", f"client group '{group}' fetches "
                                                   f"'{getattr(cg.workload, 'file', None)}', not '{file}'"))
    elif metric.startswith(("relay_throughput_Bps/", "cell_wait_ms/")):
        relay = metric.split("/")[1]
        if relay.rstrip("0123456789") not in s.network.relays:
            out.append(("design.stop_when.metric", f"'{relay}' is not a relay of network.relays "
                                                   f"({', '.join(s.network.relays)}; nodes are GROUP0, GROUP1, ...)"))
    return out


def load(path: str | Path, variants_dir: Path = constants.VARIANTS_DIR) -> Scenario:
    """Read a scenario YAML file. Raises ScenarioError naming the file (also for a file
    that is binary, not UTF-8, empty, enormous or nested absurdly deep: see safeload)."""
    path = Path(path)
    try:
        data = safeload.load_yaml(path, "scenario")
    except safeload.FileInputError as e:
        raise ScenarioError(str(path), [("", e.why)]) from None
    return parse(data, str(path), variants_dir, base_dir=path.resolve().parent)


def with_overrides(s: Scenario, source: str, **fields: object) -> Scenario:
    """The scenario with command-line overrides applied and validated like the file's own
    values (``repetitions=3``, ``measure.duration='60s'`` as ``measure__duration``).
    Raises ScenarioError naming the option."""
    data = s.model_dump(mode="json", exclude_none=True)
    for key, value in fields.items():
        if value is None:
            continue
        node = data
        *parents, last = key.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    try:
        out = parse(data, source, base_dir=s._base_dir)
    except ScenarioError as e:
        names = {k.replace("__", "."): "--" + k.split("__")[-1] for k in fields}
        raise ScenarioError(source, [(f"{names.get(p, p)}", m) for p, m in e.problems]) from None
    return out


def _close_maps(node: object) -> None:
    """Maps keyed by a pattern (group names, file names, consensus parameters) come out of
    pydantic as patternProperties alone, which lets a key outside the pattern (and its
    value, unchecked) through; close them, as every other object is closed."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for v in node.values():
            _close_maps(v)
    elif isinstance(node, list):
        for v in node:
            _close_maps(v)


def json_schema() -> dict:
    """JSON Schema (draft 2020-12) of a scenario; unknown keys are rejected everywhere."""
    schema = Scenario.model_json_schema()
    _close_maps(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "torbed scenario (apiVersion torbed/v1)"
    return schema
