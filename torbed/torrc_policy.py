"""Which extra torrc lines a scenario may give a relay group (``network.relays.<group>.torrc``).

torbed writes those lines last in each relay's torrc, so they override everything before
them (on the local backend tor runs as a uid of its own, torbed.backends.local.toruser: a
second layer, not a reason to check less). They are checked before anything starts,
against tor's own option list (data/tor-<version>-options.txt, from ``tor
--list-torrc-options`` of the pinned tor) and an allow-list of what researchers tune:

- an option on ``ALLOWED`` (schedulers, circuits, connections, buffers, bandwidth, DoS
  defences, directory timing) is accepted;
- an option torbed sets itself, or one that names host paths, ports, addresses, control
  interfaces, identity, users or processes, is refused with the reason (``refusal``);
- an option a group's patched tor adds (named in its variant's torrc fragment, e.g.
  ``CircSwitch``) is accepted when every variant the group runs has it;
- any other option tor knows is refused as not on the allow-list; a name tor does not know
  is refused as unknown (tor would refuse it too, but only once the network starts; it
  would also take an abbreviation like ``DataDir`` for ``DataDirectory``, so names must be
  written in full).

Lines are read as tor reads them: option names case-insensitive, ``+``/``/`` prefixes,
``#`` comments, a backslash at the end of a line continuing it. What tor reads in
surprising ways is refused rather than guessed at: control characters and white space
other than spaces, tabs and newlines, comments on or inside continued lines, quoted
values, names that are not plain option names.

The Helm chart makes the same checks from files/torrc-policy.yaml (``policy_file()``,
written by ``torbed chart-files``) in templates/_validate.tpl; both read the lines that
torbed writes (``extra_lines``), so the checks see what tor will see.

Public API:

- ``problems(text, bandwidth_set=False, variant_options=None) -> list[str]``  one message per refused line
- ``variant_options(family) -> dict[str, str]``  options a variant family's patched tor adds
- ``extra_lines(text) -> list[str]``  the lines torbed appends to a relay's torrc
- ``tor_options() -> dict[str, str]``  tor's options by lower-case name
- ``ALLOWED``: {option: what it tunes}, the documented allow-list
- ``refusal(name) -> str | None``  why a known option is refused (None: allowed)
- ``policy_file() -> str``  the chart's files/torrc-policy.yaml
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

import yaml

from . import constants

OPTIONS_FILE = Path(__file__).resolve().parent / "data" / f"tor-{constants.TOR_VERSION}-options.txt"

# Characters refused anywhere in the field: control characters (but tab and newline) and
# white space tor does not treat as such. Python's str.strip/splitlines and Go's TrimSpace
# (the chart) would cut lines at some of them where tor does not, so with them refused all
# three split and trim the lines the same way.
BAD_CHAR_RANGES = [(0x00, 0x08), (0x0b, 0x1f), (0x7f, 0x9f), (0xa0, 0xa0), (0x1680, 0x1680),
                   (0x2000, 0x200a), (0x2028, 0x2029), (0x202f, 0x202f), (0x205f, 0x205f), (0x3000, 0x3000)]
_BAD_CHARS = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in BAD_CHAR_RANGES) + "]")
# An option name, with tor's prefixes: '+' appends to the option's earlier lines, '/' clears it.
NAME_RE = r"^[+/]?[A-Za-z0-9_]+$"

# The allow-list: options that change how a relay schedules, queues and forwards traffic,
# and nothing else. Each with what it tunes (docs/torrc.md shows this table).
ALLOWED: dict[str, str] = {
    # Schedulers (what the variants compare).
    "Schedulers": "scheduler types, in order of preference",
    "KISTSchedRunInterval": "KIST's run interval",
    "KISTSockBufSizeFactor": "KIST's socket buffer size factor",
    "CircuitPriorityHalflife": "EWMA circuit priority half-life",
    # Connections and sockets.
    "ConstrainedSockets": "small kernel socket buffers",
    "ConstrainedSockSize": "their size",
    "ConnLimit": "minimum file descriptors",
    "KeepalivePeriod": "connection keepalive period",
    "ConnectionPadding": "link padding",
    "ReducedConnectionPadding": "less link padding",
    "CircuitPadding": "circuit padding",
    "ReducedCircuitPadding": "less circuit padding",
    "DisableOOSCheck": "out-of-sockets handling",
    # Circuits and cell processing.
    "CircuitBuildTimeout": "circuit build timeout",
    "LearnCircuitBuildTimeout": "learned build timeouts",
    "CircuitStreamTimeout": "stream attach timeout",
    "CircuitsAvailableTimeout": "how long predicted circuits are kept",
    "MaxCircuitDirtiness": "circuit reuse time",
    "NewCircuitPeriod": "new circuit period",
    "MaxClientCircuitsPending": "pending circuits",
    "MaxOnionQueueDelay": "onion-skin queue delay",
    "NumCPUs": "worker threads for onion skins",
    # Memory and buffers.
    "MaxMemInQueues": "memory for queued cells before the OOM handler",
    "TokenBucketRefillInterval": "token bucket refill interval",
    # Bandwidth.
    "BandwidthRate": "relay token bucket rate (unless the group sets 'bandwidth')",
    "BandwidthBurst": "relay token bucket burst (unless the group sets 'bandwidth')",
    "RelayBandwidthRate": "rate of relayed traffic",
    "RelayBandwidthBurst": "burst of relayed traffic",
    "MaxAdvertisedBandwidth": "advertised bandwidth",
    "PerConnBWRate": "per-connection rate (consensus parameter otherwise)",
    "PerConnBWBurst": "per-connection burst",
    "CountPrivateBandwidth": "count traffic on private addresses",
    # DoS defences (a testbed's clients share a few addresses).
    **{name: "DoS defence" for name in (
        "DoSCircuitCreationBurst", "DoSCircuitCreationDefenseTimePeriod", "DoSCircuitCreationDefenseType",
        "DoSCircuitCreationEnabled", "DoSCircuitCreationMinConnections", "DoSCircuitCreationRate",
        "DoSConnectionConnectBurst", "DoSConnectionConnectDefenseTimePeriod", "DoSConnectionConnectRate",
        "DoSConnectionDefenseType", "DoSConnectionEnabled", "DoSConnectionMaxConcurrentCount",
        "DoSRefuseSingleHopClientRendezvous", "DoSStreamCreationBurst", "DoSStreamCreationDefenseType",
        "DoSStreamCreationEnabled", "DoSStreamCreationRate")},
    # Directory traffic and consensus timing.
    "DirCache": "serve directory documents",
    "MaxConsensusAgeForDiffs": "consensus diffs kept",
    "FetchDirInfoEarly": "fetch directory information early",
    "FetchDirInfoExtraEarly": "fetch it extra early",
    "FetchUselessDescriptors": "fetch every descriptor",
    "UseMicrodescriptors": "microdescriptors",
    "DownloadExtraInfo": "fetch extra-info documents",
    "TestingServerDownloadInitialDelay": "first directory download delay (relays)",
    "TestingServerConsensusDownloadInitialDelay": "first consensus download delay (relays)",
    "TestingClientDownloadInitialDelay": "first directory download delay (clients)",
    "TestingClientConsensusDownloadInitialDelay": "first consensus download delay (clients)",
    "TestingDirConnectionMaxStall": "stalled directory connection timeout",
    "TestingClientMaxIntervalWithoutRequest": "retry interval of directory requests",
    "TestingMinTimeToReportBandwidth": "when a relay first reports its bandwidth",
    # Statistics and log detail (the log itself is torbed's).
    "CellStatistics": "cell statistics in extra-info",
    "ConnDirectionStatistics": "connection direction statistics",
    "HeartbeatPeriod": "heartbeat log period",
    "MainloopStats": "main loop statistics in the heartbeat",
    "LogTimeGranularity": "log timestamp granularity",
    "LogMessageDomains": "log message domains",
    "SafeLogging": "address scrubbing in logs",
    "ProtocolWarnings": "protocol warnings in the log",
}

PATH = ("names a host path: tor would read or write it with the rights it runs with (its own user on the "
        "local backend, root in its container on Kubernetes); torbed keeps every node's files in its data "
        "directory")
PORT = "binds a port or address; torbed assigns every node's addresses and ports (and shapes only those)"
CONTROL = "changes the control interface torbed's driver and collectors attach through"
IDENTITY = "changes the relay's identity or keys, which torbed generates and the authorities vote on"
PROCESS = "changes the user, the process or the programs tor runs (torbed starts it as its own user)"
ROLE = "changes the node's role in the network, which the scenario decides (exit, guard, the authorities)"
AUTHORITY = "a directory authority's option: a relay group's lines reach relays only, and torbed configures the authorities"
LOG = ("torbed sets each node's log (notice level, in its run directory); a Log line would name a host path or "
       "send the log elsewhere")
OUTSIDE = "sends traffic or requests outside the private network"
INTERNAL = "one of tor's internal options (leading __)"
COLLECT = "torbed's collectors need it on (per-circuit queue and connection bandwidth events)"
INCLUDE = "%include reads another file of the host; torbed includes its own fragments"
NOT_ALLOWED = "not on torbed's allow-list of options researchers tune (docs/torrc.md)"

_REFUSED: dict[str, str] = {
    **dict.fromkeys(("User", "RunAsDaemon", "PidFile", "Sandbox", "NoExec", "KeepBindCapabilities",
                     "DisableDebuggerAttachment", "DisableAllSwap", "HardwareAccel", "AccelName", "AccelDir",
                     "ServerTransportPlugin", "ClientTransportPlugin", "ServerTransportOptions"), PROCESS),
    **dict.fromkeys(("ControlPort", "ControlSocket", "CookieAuthentication", "CookieAuthFile",
                     "CookieAuthFileGroupReadable", "HashedControlPassword", "ControlPortWriteToFile",
                     "ControlSocketsGroupWritable", "ControlPortFileGroupReadable"), CONTROL),
    **dict.fromkeys(("ORPort", "DirPort", "SocksPort", "DNSPort", "NATDPort", "TransPort", "HTTPTunnelPort",
                     "ExtORPort", "MetricsPort", "MetricsPortPolicy", "Address", "AddressDisableIPv6",
                     "OutboundBindAddress", "OutboundBindAddressExit", "OutboundBindAddressOR",
                     "OutboundBindAddressPT", "ServerTransportListenAddr", "SocksPolicy", "DirPolicy",
                     "UnixSocksGroupWritable", "TransProxyType"), PORT),
    **dict.fromkeys(("Nickname", "ContactInfo", "MyFamily", "FamilyId", "FamilyKeyDirectory", "OfflineMasterKey",
                     "SigningKeyLifetime", "KeyDirectory", "SSLKeyLifetime", "TestingLinkCertLifetime",
                     "TestingAuthKeyLifetime", "TestingLinkKeySlop", "TestingAuthKeySlop",
                     "TestingSigningKeySlop"), IDENTITY),
    **dict.fromkeys(("DirAuthority", "AlternateDirAuthority", "AlternateBridgeAuthority", "FallbackDir",
                     "UseDefaultFallbackDirs", "AuthoritativeDirectory", "V3AuthoritativeDirectory",
                     "BridgeAuthoritativeDir", "VersioningAuthoritativeDirectory", "BridgeRelay",
                     "BridgeDistribution", "ExitRelay", "ExitPolicy", "ExitPolicyRejectPrivate",
                     "ExitPolicyRejectLocalInterfaces", "ReducedExitPolicy", "IPv6Exit", "ClientOnly",
                     "TestingTorNetwork", "AssumeReachable", "AssumeReachableIPv6", "PublishServerDescriptor",
                     "DisableNetwork", "UseBridges", "Bridge"), ROLE),
    **dict.fromkeys(("Log", "SyslogIdentityTag", "TruncateLogFile"), LOG),
    **dict.fromkeys(("HTTPProxy", "HTTPProxyAuthenticator", "HTTPSProxy", "HTTPSProxyAuthenticator", "Socks4Proxy",
                     "Socks5Proxy", "Socks5ProxyUsername", "Socks5ProxyPassword", "TCPProxy",
                     "ServerDNSTestAddresses", "ServerDNSDetectHijacking"), OUTSIDE),
    **dict.fromkeys(("TestingEnableCellStatsEvent", "TestingEnableConnBwEvent"), COLLECT),
    "ConsensusParams": "the authorities vote the consensus parameters: set network.consensus_params",
    "ConfluxEnabled": ("torbed turns conflux off on every node (it splits streams over two circuits and confounds "
                       "scheduler comparisons); set network.consensus_params cfx_enabled to change it network-wide"),
}


def _rule(name: str) -> str | None:
    """Refusals by the shape of a name (checked after _REFUSED)."""
    if name.startswith("__"):
        return INTERNAL
    if re.search(r"File|(Dir|Directory)(GroupReadable)?$|GroupReadable$|GroupWritable$", name):
        return PATH
    if name.endswith("Port"):
        return PORT
    if name.startswith(("AuthDir", "V3Auth", "TestingV3Auth", "TestingDirAuth", "TestingAuthDir", "TestingMinExitFlag", "TestingMinFastFlag",
                        "MinMeasuredBWs", "Recommended", "MinimalAccepted")):
        return AUTHORITY
    return None


@functools.cache
def tor_options() -> dict[str, str]:
    """Every option of the pinned tor, by lower-case name (tor matches names case-insensitively)."""
    names = [ln.strip() for ln in OPTIONS_FILE.read_text().splitlines()]
    return {n.lower(): n for n in names if n and not n.startswith("#")}


def refusal(name: str) -> str | None:
    """Why an option tor knows is refused (its canonical spelling); None when it is allowed."""
    if name in _REFUSED:
        return _REFUSED[name]
    rule = _rule(name)
    if rule:
        return rule
    return None if name in ALLOWED else NOT_ALLOWED


def variant_options(family: str, variants_dir: Path = constants.VARIANTS_DIR) -> dict[str, str]:
    """Options named in a variant family's torrc fragment that stock tor lacks (its patches
    add them), by lower-case name."""
    from .variants import _read_family
    out = {}
    for line in _read_family(family, variants_dir)["torrc"].splitlines():
        m = re.match(r"\s*([A-Za-z0-9_]+)", line)
        if m and m.group(1).lower() not in tor_options():
            out[m.group(1).lower()] = m.group(1)
    return out


def extra_lines(text: str) -> list[str]:
    """The lines torbed appends to a relay's torrc for a group's ``torrc:`` (each stripped)."""
    return [ln.strip() for ln in text.strip().splitlines()]


def _unknown(key: str) -> str:
    msg = f"unknown option '{key}' (tor {constants.TOR_VERSION} has no option of that name; write names in full)"
    known = tor_options()
    prefix = sorted(n for low, n in known.items() if low.startswith(key.lower()) and not low.startswith("__"))
    if prefix:
        return msg + (f"; it begins {', '.join(prefix[:3])}{', ...' if len(prefix) > 3 else ''} "
                      "(tor takes abbreviations and aliases)")
    close = difflib.get_close_matches(key.lower(), list(known), n=1)
    return msg + (f"; did you mean {known[close[0]]}?" if close else "")


def problems(text: str, bandwidth_set: bool = False, variant_options: dict[str, str] | None = None) -> list[str]:
    """One message per refused line of a group's extra torrc ("line N: 'LINE': why").
    ``bandwidth_set``: the group sets ``bandwidth`` (then BandwidthRate/Burst are its).
    ``variant_options``: options every variant the group runs adds (``variant_options``)."""
    bad = _BAD_CHARS.search(text)
    if bad:
        return [f"character U+{ord(bad.group()):04X} is not allowed (torrc lines take printable characters, "
                "spaces and tabs)"]
    out = []
    lines = extra_lines(text)
    continued = False      # the line before ended with a backslash: this one continues its value
    for n, line in enumerate(lines, 1):
        where = f"line {n}: '{line}'"
        if continued:
            if "#" in line:
                out.append(f"{where}: a comment inside a continued line (tor would read the lines after it "
                           "as part of the value); remove it")
            continued = line.endswith("\\")
            if continued and n == len(lines):
                out.append(f"{where}: the last line ends with a backslash (it continues onto nothing)")
            continue
        if not line or line.startswith("#"):
            continue
        key = re.match(r"[^ \t#]*", line).group()
        value = line[len(key):].split("#", 1)[0].strip(" \t")
        continued = line.endswith("\\")
        if continued and "#" in line:
            out.append(f"{where}: a comment on a continued line (tor would end the line at the comment); remove it")
            continue
        if continued and n == len(lines):
            out.append(f"{where}: the last line ends with a backslash (it continues onto nothing)")
            continue
        if key.startswith("%"):
            out.append(f"{where}: {INCLUDE}")
            continue
        if not re.fullmatch(NAME_RE, key):
            out.append(f"{where}: '{key}' is not an option name (letters, digits and _, after an optional + or /)")
            continue
        if value.startswith('"'):
            out.append(f"{where}: quoted values are not accepted (no option on the allow-list needs one)")
            continue
        low = key.lstrip("+/").lower()
        if low in (variant_options or {}):
            continue
        name = tor_options().get(low)
        if name is None:
            out.append(f"{where}: {_unknown(key.lstrip('+/'))}")
            continue
        why = refusal(name)
        if why is None and bandwidth_set and name in ("BandwidthRate", "BandwidthBurst"):
            why = "this group's 'bandwidth' sets it; use one or the other"
        if why is not None:
            out.append(f"{where}: {name}: {why}")
    return out


def _go_class() -> str:
    """BAD_CHAR_RANGES as an RE2 character class (Go's regexp, the chart's regexMatch)."""
    def ch(c: int) -> str:
        return f"\\x{{{c:x}}}"
    return "[" + "".join(ch(lo) if lo == hi else f"{ch(lo)}-{ch(hi)}" for lo, hi in BAD_CHAR_RANGES) + "]"


def policy_file(note: str) -> str:
    """The chart's files/torrc-policy.yaml: every option tor knows, with its verdict."""
    options = {}
    for low, name in sorted(tor_options().items()):
        why = refusal(name)
        options[low] = {"name": name, "refused": why or ""}
    from .variants import list_families
    data = {"tor": constants.TOR_VERSION, "badChars": _go_class(), "nameRe": NAME_RE, "include": INCLUDE,
            "options": options, "variantOptions": {f: variant_options(f) for f in list_families()}}
    return (f"# {note}\n# torbed.torrc_policy: how templates/_validate.tpl checks network.relays.<group>.torrc.\n"
            + yaml.safe_dump(data, sort_keys=True, width=1000))
