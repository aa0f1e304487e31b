"""`helm test` of a release: did a transfer cross the private network?

Runs in the chart's test hook pod (templates/tests/transfer.yaml). It reads the clients'
records from the results service (the same transfers.jsonl `torbed run` fetches) until one
transfer has status ok and carried its whole file, then prints it (client, path, size,
time to last byte) and exits 0. It exits 1 when the deadline passes first, printing what it
saw instead: how many transfers, and the causes of the failed ones. Records of the warmup
count too: the question is whether the network carries traffic at all, not the measurement.

``--owner configmap/NAME`` first makes this pod a dependent (ownerReference) of that object of
the release, so `helm uninstall` (which deletes it) takes the pod along: the pod stays after
the test so `helm test --logs` can read it, and helm never deletes hook pods itself.

``--faults-not-run N`` (the chart passes the scenario's number of faults): the verdict, pass
or fail, says that a plain `helm install` ran none of them (they run on their timeline only
under `torbed run --backend k8s`), so a passed test is not read as "the network survived its
faults". NOTES.txt says the same at install.

``python -m torbed.pods.helmtest --results URL [--timeout S] [--owner KIND/NAME] [--faults-not-run N]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

from ..errors import EXIT_FAILED, EXIT_OK

POLL_S = 3.0


def crossed(records: list[dict]) -> dict | None:
    """The first transfer that carried its whole file, or None."""
    for r in records:
        if r.get("type") == "transfer" and r.get("status") == "ok" and r.get("bytes") == r.get("size") \
                and r.get("size"):
            return r
    return None


def summary(records: list[dict]) -> str:
    transfers = [r for r in records if r.get("type") == "transfer"]
    causes = Counter((r.get("error") or {}).get("cause", "?") for r in transfers if r.get("status") != "ok")
    return f"{len(transfers)} transfers, failed by cause: {dict(causes) or 'none'}"


def faults_note(n: int) -> str:
    """What the verdict adds for a scenario with ``n`` faults ('' for none)."""
    if n <= 0:
        return ""
    return (f"note: the scenario has {n} fault(s) and this release ran none of them: a plain `helm install` "
            "injects no faults (only `torbed run SCENARIO --backend k8s` applies them on their timeline), "
            "so this test checked the network without its faults")


def fetch(url: str) -> list[dict]:
    try:
        with urllib.request.urlopen(f"{url}/files/transfers.jsonl", timeout=10) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []      # no client has written a record yet
        raise
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass           # a line being appended: read again at the next poll
    return out


def own(owner: str) -> str:
    """Make this pod (POD_NAME) a dependent of ``configmap/NAME`` or ``secret/NAME``; what happened."""
    import os
    from .api import SA_DIR, Api, ApiError
    kind, _, name = owner.partition("/")
    kinds = {"configmap": ("configmaps", "ConfigMap"), "secret": ("secrets", "Secret")}
    if kind not in kinds or not name:
        raise SystemExit(f"--owner: '{owner}' is not configmap/NAME or secret/NAME")
    pod = os.environ.get("POD_NAME", "")
    try:
        api = Api((SA_DIR / "namespace").read_text().strip())
        obj = api._call("GET", f"/{kinds[kind][0]}/{name}")
        ref = {"apiVersion": "v1", "kind": kinds[kind][1], "name": name, "uid": obj["metadata"]["uid"]}
        api.patch("pods", pod, {"metadata": {"ownerReferences": [ref]}})
    except (ApiError, OSError, KeyError, SystemExit) as e:
        return f"warning: pod {pod} not tied to {owner} ({e}); it stays after helm uninstall"
    return f"pod {pod} goes with {owner} at helm uninstall"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="the results service's URL")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a transfer")
    ap.add_argument("--owner", default=None, help="configmap/NAME or secret/NAME of the release this pod goes with")
    ap.add_argument("--faults-not-run", type=int, default=0, metavar="N",
                    help="the scenario's number of faults, which a plain helm install does not run")
    args = ap.parse_args(argv)
    note = faults_note(args.faults_not_run)
    if args.owner:
        print(own(args.owner), flush=True)
    deadline = time.time() + args.timeout
    records: list[dict] = []
    last_error = ""
    while time.time() < deadline:
        try:
            records = fetch(args.results)
            last_error = ""
        except (OSError, urllib.error.URLError) as e:
            last_error = f"results service {args.results}: {e}"
        r = crossed(records)
        if r is not None:
            path = "-".join(h.get("node", "?") for h in (r.get("circuit") or {}).get("path", [])) or "tor's choice"
            print(f"ok: {r['client']} fetched {r['file']} ({r['size']} B) from {r['server']} through "
                  f"{path} in {r['ttlb_s']:.2f} s; {summary(records)}")
            if note:
                print(note)
            return EXIT_OK
        time.sleep(POLL_S)
    print(f"FAILED: no transfer crossed the network within {args.timeout:.0f} s; {summary(records)}"
          + (f"; {last_error}" if last_error else ""), file=sys.stderr)
    if note:
        print(note, file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
