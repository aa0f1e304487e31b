"""What a `torbed run --backend k8s` killed with SIGKILL leaves for `torbed clean` to remove:
the helm release of the repetition it was running, the run's Grafana dashboard ConfigMaps,
and records that still say "running".

Before anything is created in the cluster the backend writes a claim,
``<STATE_DIR>/k8s/<run label>.json``: the namespace and context, the run's label (every
dashboard carries ``torbed.io/run=<label>``), the run directory and its owner (this process'
pid and start time, so a reused pid is not mistaken for it). Before each ``helm install`` the
claim names the release and the repetition's directory (``set_release``); once the release is
uninstalled the name is taken off again (one whose uninstall failed stays on). ``finish_run`` removes the claim once the dashboards
are gone. `torbed clean` handles every claim whose owner is gone: uninstalls the release it
names (helm, then whatever helm left, as the backend's own teardown does), deletes the
dashboards by label, marks the repetition's meta.json and the run's run.json "killed" where
they still say "running", and removes the claim. A claim whose owner lives is left alone
(``--force``: cleaned too); one whose cluster cannot be reached is kept for the next clean.

Public API: ``run_label(run_id) -> str``, ``selector(label) -> str``, ``write_claim(...) ->
Path | None``, ``set_release(path, release, rep_dir)``, ``release_gone(path, release)``, ``remove_claim(path)``,
``read_claims() -> list[dict]``, ``claims_to_clean(claims, force) -> (dead, live)``,
``clean(console, force) -> dict``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ... import constants

MANAGED = "app.kubernetes.io/managed-by=torbed"
RUN_LABEL = "torbed.io/run"


def run_label(run_id: str) -> str:
    """The ``torbed.io/run`` label value of a run (a label value: at most 63 characters of
    [A-Za-z0-9_.-], alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[-63:].strip("-_.") or "run"


def selector(label: str) -> str:
    """The label selector of a run's dashboard ConfigMaps (and nothing else: a chart
    release's own dashboards are managed by Helm, not torbed)."""
    return f"{MANAGED},{RUN_LABEL}={label}"


def claim_dir() -> Path:
    return constants.STATE_DIR / "k8s"


def write_claim(run_id: str, namespace: str, context: str | None, run_dir: Path) -> Path | None:
    """Record that this process is about to create run ``run_id``'s dashboards; the path, or
    None when the state directory cannot be written (then a killed run's dashboards are left
    to the user, which the caller says)."""
    from ..local.lifetime import process_start
    label = run_label(run_id)
    path = claim_dir() / f"{label}.json"
    claim = {"run_id": run_id, "label": label, "namespace": namespace, "context": context,
             "run_dir": str(run_dir), "owner_pid": os.getpid(), "owner_start": process_start(os.getpid())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(claim, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError:
        return None
    return path


def _update(path: Path | None, change) -> None:
    if path is None:
        return
    path = Path(path)
    try:
        claim = json.loads(path.read_text())
        change(claim)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(claim, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
    except (OSError, ValueError):
        pass    # a claim that cannot be rewritten stays as it was


def set_release(path: Path | None, release: str, rep_dir: Path) -> None:
    """Name in the claim a release about to be installed, and its repetition's directory."""
    def change(claim):
        claim["releases"] = [r for r in claim.get("releases") or [] if r != release] + [release]
        claim["rep_dir"] = str(rep_dir)
    _update(path, change)


def release_gone(path: Path | None, release: str) -> None:
    """Take an uninstalled release off the claim (one whose uninstall failed stays on it)."""
    def change(claim):
        claim["releases"] = [r for r in claim.get("releases") or [] if r != release]
    _update(path, change)


def remove_claim(path: Path | None) -> None:
    if path is not None:
        Path(path).unlink(missing_ok=True)


def read_claims() -> list[dict]:
    """Every claim, with ``_file``; an unreadable one has no namespace (skipped by clean)."""
    out = []
    for f in sorted(claim_dir().glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            data = None
        out.append({**(data if isinstance(data, dict) else {}), "_file": str(f)})
    return out


def owner_alive(claim: dict) -> bool:
    """The claim's torbed still runs: its pid exists with the start time recorded."""
    from ..local.lifetime import process_start
    pid = claim.get("owner_pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    start = process_start(pid)
    return start is not None and (claim.get("owner_start") is None or start == claim["owner_start"])


def claims_to_clean(claims: list[dict], force: bool = False) -> tuple[list[dict], list[dict]]:
    """(claims to clean, claims left alone): a claim is cleaned when its owner is gone, or
    with ``force``; one without a namespace or label (unreadable) is never acted on."""
    dead, live = [], []
    for c in claims:
        if not c.get("namespace") or not c.get("label"):
            live.append(c)
        elif force or not owner_alive(c):
            dead.append(c)
        else:
            live.append(c)
    return dead, live


def _uninstall(cluster, release: str, console) -> str | None:
    """helm uninstall the release and sweep what helm left (backend.Release.uninstall); the
    problem, or None."""
    from .backend import Release, helm_binary
    rel = Release(cluster, helm_binary(), release, Path(os.devnull), "", 0, [], console)
    rel.installed = True
    return rel.uninstall()


def clean(console, force: bool = False) -> dict:
    """`torbed clean`'s Kubernetes part, for every dead claim: uninstall the release it names,
    delete the run's dashboards (by label selector), mark its records killed, remove the claim.
    Returns {"runs": cleaned, "releases": uninstalled, "configmaps": deleted, "live": left alone,
    "failed": [claims whose cluster could not be reached or whose release stayed: kept for a
    later clean]}."""
    dead, live = claims_to_clean(read_claims(), force)
    out = {"runs": 0, "releases": 0, "configmaps": 0, "live": len(live), "failed": []}
    if not dead:
        return out
    from ..local.lifetime import mark_killed, mark_run_killed
    from .backend import Cluster
    for c in dead:
        items: list = []
        try:
            cluster = Cluster(c["namespace"], c.get("context"))
            for release in c.get("releases") or []:
                err = _uninstall(cluster, release, console)
                if err:
                    raise RuntimeError(f"release {release}: {err}")
                release_gone(Path(c["_file"]), release)
                out["releases"] += 1
                console.log(f"uninstalled release {release} of killed Kubernetes run {c.get('run_id')} "
                            f"(namespace {c['namespace']})")
            items = cluster.core.list_namespaced_config_map(c["namespace"], label_selector=selector(c["label"])).items
            for cm in items:
                try:
                    cluster.core.delete_namespaced_config_map(cm.metadata.name, c["namespace"])
                except cluster.ApiException as e:
                    if e.status != 404:
                        raise
                out["configmaps"] += 1
        except Exception as e:    # noqa: BLE001 - any cluster failure: keep the claim, say why
            console.log(f"[yellow]warning[/yellow]: run {c.get('run_id')}: what it left in namespace "
                        f"{c['namespace']} was not all removed ({type(e).__name__}: {e}); kept its claim {c['_file']} "
                        "for the next clean")
            out["failed"].append(c["_file"])
            continue
        releases = c.get("releases") or []
        why = "torbed was killed; `torbed clean` " + (f"uninstalled release {', '.join(releases)}" if releases
                                                      else "removed what it left")
        marked = []
        if c.get("rep_dir"):
            marked = mark_killed(Path(c["rep_dir"]), why)
        elif c.get("run_dir"):
            # Between repetitions: no repetition runs, the run itself still says running.
            marked = mark_run_killed(Path(c["run_dir"]), why)
        remove_claim(Path(c["_file"]))
        out["runs"] += 1
        if items:
            console.log(f"removed {len(items)} dashboard ConfigMap(s) of killed Kubernetes run {c.get('run_id')} "
                        f"(namespace {c['namespace']})")
        if marked:
            console.log(f"marked killed: {', '.join(str(m) for m in marked)}")
    return out
