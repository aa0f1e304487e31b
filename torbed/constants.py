"""Constants shared by every stage: ports, paths, defaults, timeouts (one place, as tornettools does)."""

from __future__ import annotations

import os
from pathlib import Path

from . import resources

API_VERSION = "torbed/v1"

# Data files (chart, variants, scenarios, ...): torbed.resources finds them in a checkout or
# in the installed package. TORBED_VARIANTS_DIR points at other variant folders (the client
# image's copy).
VARIANTS_DIR = Path(os.environ.get("TORBED_VARIANTS_DIR") or resources.path("images/relay/variants"))
BUILD_SCRIPT = resources.path("images/relay/build-tor.sh")
SCENARIOS_DIR = resources.path("scenarios")
# Where pods look up replay traces by file name (the client image: traces shipped in it,
# and a ConfigMap of user traces mounted first); empty outside the image.
TRACE_DIRS = [Path(d) for d in os.environ.get("TORBED_TRACE_DIRS", "").split(os.pathsep) if d]

# Where slow builds (tor per variant) are cached, keyed by content hash.
CACHE_DIR = Path(os.environ.get("TORBED_CACHE", Path.home() / ".cache" / "torbed"))

# The tor every variant is built from: Debian's source package, pinned.
TOR_VERSION = "0.4.9.11"

# Ports. Every node has its own address, so every node uses the same port numbers.
OR_PORT = 5000
DIR_PORT = 7000
SOCKS_PORT = 9050
CONTROL_PORT = 9051
METRICS_PORT = 9035
DRIVER_METRICS_PORT = 9036     # measurement driver's Prometheus exporter (client address)
COLLECTOR_METRICS_PORT = 9037  # collectors' exporter (control plane)
HTTP_PORT = 80
REPLAY_PORT = 8000
LOCUST_MASTER_PORT = 5557     # Locust's default master port (workers connect to it)
LOCUST_METRICS_PORT = 9038    # Locust master's Prometheus exporter (torbed.load.metrics)
LOCUST_WEB_PORT = 8089        # Locust's web UI (Kubernetes: kubectl port-forward)

# Default private address range of the testbed (RFC 1918). .0.1 is the control plane
# (the switch namespace / collector), nodes are numbered from FIRST_NODE_HOST.
DEFAULT_SUBNET = "10.77.0.0/16"
FIRST_NODE_HOST = 10

# Fast voting: 10/2/2 s is the minimum tor accepts with TestingTorNetwork.
VOTING_INTERVAL = 10
VOTE_DELAY = 2
DIST_DELAY = 2
# Networks with more tors than this vote on a slower schedule until they are ready (local
# backend; torrc.voting_schedule): LARGE_VOTING = (interval, vote delay, dist delay) seconds.
LARGE_NETWORK_TORS = 200
LARGE_VOTING = (30, 6, 6)
# The torrc's voting interval of a large network whose first round the local backend holds
# until every descriptor is in (backends.local._held_first_round): 10 minutes, the placeholder
# round's valid-after time HELD_ROUND_LEAD seconds after the launch.
HELD_ROUND_INTERVAL = 600
HELD_ROUND_LEAD = 590
# The real rounds of a held network, from its first one on, until ready and after: every new
# consensus costs each directory cache the compression of both flavors (zlib, lzma, zstd) and
# a diff from every older consensus it keeps; with 300 caches on 2 cores, rounds every 30 s
# kept the machine saturated after the first consensus (a 750-tor run never became ready).
HELD_VOTING_INTERVAL = 300
# Directory caches keep (and diff from) the consensuses of this many voting intervals, not
# tor's default of 8192 hours (MaxConsensusAgeForDiffs; torrc.diff_max_age). At a testbed's
# 10-60 s rounds the default meant a diff from every consensus since the start at every new
# one: work per round that grows through a run. Tor's manual suggests keeping 3-4 hours on
# the real network (3-4 hourly rounds); the latest consensus must stay younger than this, or
# the cache drops it and can no longer serve it.
DIFF_ROUNDS_KEPT = 3
MIN_DIFF_MAX_AGE = 120

# Authority certificates: tor-gencert lifetime in months (recorded in meta.json).
AUTHORITY_CERT_MONTHS = 12

# Supervision.
READY_TIMEOUT = 180.0          # seconds until a network must be ready
STOP_GRACE = 5.0               # SIGTERM -> SIGKILL grace period
BW_INTERVAL = 0.5              # relay bandwidth sampling (seconds)

# Names of network namespaces and veths start with this so `torbed clean` finds leftovers.
NETNS_PREFIX = "tb-"
STATE_DIR = Path(os.environ.get("TORBED_STATE", "/run/torbed"))


def transfer_timeout(size_bytes: int) -> float:
    """Per-transfer timeout by file size, following tornettools/tgen's buckets
    (50 KiB: 15 s, 1 MiB: 60 s, 5 MiB: 120 s), extended linearly above 5 MiB at
    the 5 MiB bucket's rate so bulk files of any size get a proportional limit."""
    if size_bytes <= 51200:
        return 15.0
    if size_bytes <= 1048576:
        return 60.0
    if size_bytes <= 5242880:
        return 120.0
    return 120.0 * size_bytes / 5242880


# `uname -m` -> Kubernetes' (Go's) architecture names.
MACHINE_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "armv6l": "arm"}
