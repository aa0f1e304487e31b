"""Key hook of the chart: ``create`` (pre-install); ``delete`` for a release installed before.

create: makes every authority's keys and certificate (tor-gencert) and every authority's and
relay's identity (tor --list-fingerprint), exactly as the local backend does (torbed.keys),
and stores them: private keys in the Secret <release>-keys (entries "<node>.<key file>"),
public identities in the ConfigMap <release>-identities:
  authorities.txt   "nickname v3ident fingerprint orport dirport" per authority
  fingerprints.json {node: RSA fingerprint}
  vote.torrc        what the authorities vote: consensus parameters, Guard/Exit by fingerprint,
                    TestingV3AuthVotingStartOffset (below) and, with weights, V3BandwidthsFile
  v3bw              only when the scenario's relay groups carry ``weights``: the authorities'
                    bandwidth file (torrc.bandwidth_file, the same the local backend writes), so
                    the consensus' ``w Bandwidth=`` are the scenario's weights; it needs every
                    relay's fingerprint, which exists first here
  schedule.json     {"t_hook", "vote_lead_s", "voting_offset_s"}: when the hook stored the
                    keys, and the voting offset every authority uses
A retried Job replaces what an earlier attempt made, so keys and identities always match.

The authorities' first vote is aligned with the pods' start, as the local backend aligns it
with its launch (torbed.backends.local.VOTE_LEAD): every authority reads the same offset, so
they agree, and its first valid-after time comes VOTE_LEAD_S after the hook stored the keys.
With tor's fixed offset 0 the first vote fell anywhere in the pods' start: before the relays
had uploaded their descriptors (a consensus without them, one 10 s round lost) or between
two authorities' starts (the later ones' votes rejected as too late, a round lost).

Helm does not own what a hook makes, so both are made dependents (ownerReferences) of Helm's
own record of the release, the Secret sh.helm.release.v1.<release>.v1 (or the ConfigMap of
that name under HELM_DRIVER=configmap), which exists from before the pre-install hooks until
`helm uninstall` deletes it: Kubernetes' garbage collector then deletes them. So uninstalling
runs no pod (a pre-delete hook did, and waited out helm's timeout when its image was gone).
With another storage driver (sql, memory) there is no such object: the hook says so and the
two stay until `kubectl delete secret,configmap -l torbed.io/generated=keygen,app.kubernetes.io/instance=<release>`.

delete: removes both (what the pre-delete hook of earlier chart versions ran).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import constants, keys, torrc
from . import IDENTITIES_DIR, env, load_scenario, log, plan
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, RunFailed
from .api import Api

GENERATED_LABEL = "torbed.io/generated"

# Seconds from the hook storing the keys to the first vote's valid-after time. Measured on
# the local cluster (quickstart): helm creates the pods within ~0.5 s of the hook's end, the
# last container starts 4.6-8.2 s after install, relays wait for the authorities' DirPorts and
# upload their descriptors ~1 s after they start; authorities vote VOTE_DELAY + DIST_DELAY
# (4 s) before valid-after. 14 puts that vote 9-10 s after the hook: after the relays'
# uploads in those runs; slower pods get the next interval, as with offset 0.
VOTE_LEAD_S = 14


def _labels() -> dict:
    return {"app.kubernetes.io/name": "torbed", "app.kubernetes.io/instance": env("TORBED_INSTANCE"),
            "app.kubernetes.io/managed-by": "torbed-keygen", GENERATED_LABEL: "keygen"}


def _node_keys(workdir: Path, n) -> tuple[str, str | None, dict[str, str]]:
    """(RSA fingerprint, authorities.txt line or None, secret entries) of one node."""
    datadir = workdir / n.name
    line = None
    if n.role == "authority":
        ak = keys.make_authority_keys(datadir, None, constants.DIR_PORT)
    fpr = keys.make_relay_identity(datadir, n.nickname)
    if n.role == "authority":
        line = f"{n.nickname} {ak.v3ident} {fpr} {constants.OR_PORT} {constants.DIR_PORT}"
    secret = {f"{n.name}.{f.name}": base64.b64encode(f.read_bytes()).decode()
              for f in sorted((datadir / "keys").iterdir())}
    return fpr, line, secret


def make(workdir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(secret data as base64 strings, configmap data) for the release's scenario. Each
    node's keys are independent (tor-gencert, tor --list-fingerprint): made in parallel."""
    s = load_scenario()
    p = plan(s)
    nodes = [n for n in p.nodes if n.role in ("authority", "relay")]
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        made = list(pool.map(lambda n: _node_keys(workdir, n), nodes))
    secret: dict[str, str] = {}
    fprs: dict[str, str] = {}
    auth_lines = []
    for n, (fpr, line, entries) in zip(nodes, made):
        fprs[n.name] = fpr
        if line:
            auth_lines.append(line)
        secret.update(entries)
    guards = [fprs[n.name] for n in p.by_role("relay") if n.guard]
    exits = [fprs[n.name] for n in p.by_role("relay") if n.exit]
    vote = torrc.authority_vote_lines(torrc.consensus_params(p), guards, exits)
    identities = {
        "authorities.txt": "\n".join(auth_lines) + "\n",
        "fingerprints.json": json.dumps(fprs, indent=1, sort_keys=True),
    }
    v3bw = torrc.bandwidth_file(p, torrc.Identities(fingerprints=fprs))
    if v3bw is not None:
        # tor reads the file at every vote; a file older than 3 days would be ignored as stale
        # (far beyond any run: the timestamp is the hook's).
        identities[torrc.BANDWIDTH_FILE] = v3bw
        vote += ["# The relays' consensus weights, from the scenario (torrc.bandwidth_file).",
                 f"V3BandwidthsFile {IDENTITIES_DIR / torrc.BANDWIDTH_FILE}"]
    identities["vote.torrc"] = "# Generated by the keygen hook.\n" + "\n".join(vote) + "\n"
    return secret, identities


def schedule(identities: dict[str, str], t_hook: float) -> dict:
    """Add the voting offset (see the module's docstring) to ``identities``; returns it."""
    sched = {"t_hook": round(t_hook, 3), "vote_lead_s": VOTE_LEAD_S,
             "voting_offset_s": int(t_hook + VOTE_LEAD_S) % constants.VOTING_INTERVAL}
    identities["vote.torrc"] += ("# The first vote aligned with the pods' start (torbed.pods.keygen).\n"
                                 f"TestingV3AuthVotingStartOffset {sched['voting_offset_s']}\n")
    identities["schedule.json"] = json.dumps(sched, sort_keys=True)
    return sched


def release_owner(api: Api, instance: str) -> list[dict]:
    """ownerReferences to Helm's record of the release's first revision, or [] when none is
    found. By name (Helm's storage drivers name it sh.helm.release.v1.<release>.v1), so the
    hook's Role reads that object and its own two, not every Secret in the namespace."""
    name = f"sh.helm.release.v1.{instance}.v1"
    for kind, k in (("secrets", "Secret"), ("configmaps", "ConfigMap")):
        obj = api.get(kind, name)
        if obj is not None:
            return [{"apiVersion": "v1", "kind": k, "name": name, "uid": obj["metadata"]["uid"]}]
    return []


def create() -> int:
    release = env("TORBED_RELEASE")
    api = Api(env("TORBED_NAMESPACE"))
    with tempfile.TemporaryDirectory(prefix="torbed-keygen-") as tmp:
        secret, identities = make(Path(tmp))
    sched = schedule(identities, time.time())
    log(f"keygen: {sum(1 for k in secret if k.endswith('.secret_id_key'))} identities, "
        f"{len(identities['authorities.txt'].splitlines())} authorities; authorities' voting offset "
        f"{sched['voting_offset_s']} s (first valid-after {VOTE_LEAD_S} s from now)")
    for kind, name in (("secrets", f"{release}-keys"), ("configmaps", f"{release}-identities")):
        api.delete(kind, name)  # a retried Job: start over, so keys and identities match
    owner = release_owner(api, env("TORBED_INSTANCE"))
    meta = {"labels": _labels(), **({"ownerReferences": owner} if owner else {})}
    api.create("secrets", {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                           "metadata": {"name": f"{release}-keys", **meta}, "data": secret})
    api.create("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": f"{release}-identities", **meta},
                              "data": identities})
    log(f"keygen: created secret {release}-keys and configmap {release}-identities, "
        + (f"deleted with helm's {owner[0]['kind']} {owner[0]['name']}" if owner else
           "but found no Helm release record (sh.helm.release.v1.<release>.v1) to tie them to: "
           "they stay after helm uninstall"))
    return EXIT_OK


def delete() -> int:
    api = Api(env("TORBED_NAMESPACE"))
    selector = f"app.kubernetes.io/instance={env('TORBED_INSTANCE')},{GENERATED_LABEL}=keygen"
    for kind in ("secrets", "configmaps"):
        api.delete_collection(kind, selector)
    log(f"cleanup: deleted secrets and configmaps matching {selector}")
    # `helm test`'s pod is kept after it ran (so `helm test --logs` can read it) and helm
    # does not remove hook pods at uninstall: this hook does.
    tests = f"app.kubernetes.io/instance={env('TORBED_INSTANCE')},app.kubernetes.io/component=test"
    api.delete_collection("pods", tests)
    log(f"cleanup: deleted pods matching {tests}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["create"], ["delete"]):
        print("usage: python -m torbed.pods.keygen create|delete", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return create() if argv[0] == "create" else delete()
    except RunFailed as e:   # ApiError, KeyGenerationError
        log(f"keygen: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
