"""Resuming a run directory (``torbed run --resume RUN_DIR``, issue 36 item 6).

A long design does not fit one sitting: Ctrl-C, a crash or a power loss stops it. The run
directory then holds every repetition that finished (meta.json status ``ok`` or ``failed``:
an attempt that ran to its end) and at most one that did not (``running`` after a crash,
``interrupted`` after a signal, or a directory without meta.json). Resuming keeps the
finished ones, moves the unfinished one aside (``discarded/``: its records would mix two
networks) and runs the rest of run.json's ``order`` - the order a straight run would have
used - so the records are those of a straight run plus an explicit history:

- run.json ``sessions``: one entry per ``torbed run`` / ``--resume`` invocation: started,
  finished, status, pid, host, torbed version and commit, host load, repetitions run and
  discarded;
- meta.json ``history`` of a re-run repetition: the discarded attempt(s) (session, status,
  error, times, where its files went).

What a resume refuses (InputError, exit 2, naming the file and field): a run.json without
the fingerprint (a run from before resume existed), a scenario file whose resolved content
changed (``fingerprint.scenario_sha256``: the first differing field is named), a variant
whose definition changed (``fingerprint.variants.<name>``), other variants than the run's,
and a run that already finished.

Public API:

- ``fingerprint(scenario, variants) -> dict``
- ``session(host_load=None) -> dict``: a new session entry (``finished``/``status`` None)
- ``git_commit() -> str | None``
- ``load_for_resume(run_dir) -> dict``: run.json, checked to be resumable
- ``check_unchanged(info, scenario, variants, run_json)``: raises InputError
- ``resumable(run_dir, variants=None) -> (info, scenario, variants)``: all of the above, as ``--resume`` checks
- ``triage(run_dir, info) -> (done, partial)``: repetitions to keep and to re-run
- ``discard(run_dir, variant, k, session_no) -> dict``: move one attempt aside, its history entry
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from . import __version__
from .errors import InputError
from .provenance import host_info, utc_now

# A repetition with one of these statuses ran to its end: kept on resume (a straight run
# keeps a failed repetition too and goes on).
FINISHED = ("ok", "failed")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _variant_digest(name: str) -> str:
    from .variants import load_variant
    v = load_variant(name)
    return _digest({"build_key": v.build_key, "torrc": v.torrc, "parameters": v.parameters, "env": v.env})


def fingerprint(scenario, variants: list[str]) -> dict:
    """What must not change between the sessions of one run: the resolved scenario (command-
    line overrides applied) and each variant in use (its build inputs, torrc, parameters)."""
    in_use = set(variants)
    for g in scenario.network.relays.values():
        if getattr(g, "variant", None):
            in_use.add(g.variant)
    return {"scenario_sha256": _digest(scenario.model_dump(mode="json")),
            "variants": {v: _variant_digest(v) for v in sorted(in_use)}}


def git_commit() -> str | None:
    """The commit of the torbed source tree this runs from (None outside a git checkout),
    with ``-dirty`` when it has uncommitted changes."""
    from .resources import CHECKOUT
    if CHECKOUT is None or not (CHECKOUT / ".git").exists():
        return None
    here = CHECKOUT
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) if sha else None


def session(host_load: dict | None = None, resumed: bool = False) -> dict:
    return {"started": utc_now(), "finished": None, "status": "running", "resumed": resumed, "pid": os.getpid(),
            "host": host_info(), "torbed_version": __version__, "torbed_commit": git_commit(),
            "host_load": host_load, "ran": [], "discarded": []}


def load_for_resume(run_dir: Path) -> dict:
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise InputError(f"{path}: missing: --resume takes a run directory made by `torbed run`")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot be read ({e})") from None
    for key in ("fingerprint", "order", "source", "variants", "sessions"):
        if key not in info:
            raise InputError(f"{path}: no '{key}': the run was made by a torbed without --resume "
                             f"(or without a scenario file); it cannot be resumed")
    last = info["sessions"][-1] if info["sessions"] else {}
    if last.get("status") == "running" and _alive(last):
        raise InputError(f"{path}: sessions[{len(info['sessions']) - 1}]: torbed (pid {last.get('pid')}) is still "
                         f"running this run on this host; stop it first (Ctrl-C) and resume then")
    if info.get("status") in ("ok", "partial", "failed") and not _todo(Path(run_dir), info):
        raise InputError(f"{path}: status '{info['status']}': every repetition of the run has finished, "
                         f"nothing to resume")
    return info


def _alive(sess: dict) -> bool:
    """Whether a session's torbed process still runs on this host (same hostname, pid alive
    and a torbed command line)."""
    pid = sess.get("pid")
    if not isinstance(pid, int) or (sess.get("host") or {}).get("hostname") != host_info()["hostname"]:
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"torbed" in cmd


def _first_difference(a, b, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return path or "(the whole scenario)"


def check_unchanged(info: dict, scenario, variants: list[str], run_json: Path) -> None:
    """Raise InputError when the scenario or a variant differs from when the run began."""
    if list(variants) != list(info["variants"]):
        raise InputError(f"{run_json}: variants: the run has {', '.join(info['variants'])}; "
                         f"--resume was given {', '.join(variants)}")
    now = fingerprint(scenario, variants)
    then = info["fingerprint"]
    if now["scenario_sha256"] != then.get("scenario_sha256"):
        field = _first_difference(info.get("scenario") or {}, scenario.model_dump(mode="json"))
        raise InputError(f"{info['source']}: {field}: changed since the run began (run.json "
                         f"fingerprint.scenario_sha256 differs); a resumed run must run the same scenario "
                         f"- start a new run instead")
    for v, d in now["variants"].items():
        if then.get("variants", {}).get(v) != d:
            raise InputError(f"{run_json}: fingerprint.variants.{v}: the variant's definition (build inputs, "
                             f"torrc or parameters) changed since the run began; start a new run instead")


def resumable(run_dir: Path, variants: list[str] | None = None) -> tuple[dict, object, list[str]]:
    """run.json, the run's own scenario (its file with the run's overrides) and the variants,
    once checked that ``torbed run --resume`` may continue it; raises InputError naming the
    file and field otherwise (what ``torbed run --resume`` prints)."""
    from . import scenario as scenario_mod
    run_json = Path(run_dir) / "run.json"
    info = load_for_resume(run_dir)
    source = info.get("source_resolved") or info["source"]
    if not Path(source).is_file():
        raise InputError(f"{run_json}: source: the scenario file '{source}' is gone; it is needed to resume")
    s = scenario_mod.load(source)
    ov = info.get("overrides") or {}
    s = scenario_mod.with_overrides(s, source, repetitions=ov.get("repetitions"), measure__duration=ov.get("duration"),
                                    measure__warmup=ov.get("warmup"), seed=ov.get("seed"))
    variants = list(variants or info["variants"])
    check_unchanged(info, s, variants, run_json)
    return info, s, variants


def _status(run_dir: Path, variant: str, k: int) -> str | None:
    meta = run_dir / variant / f"rep-{k}" / "meta.json"
    if not (run_dir / variant / f"rep-{k}").exists():
        return None
    try:
        return str(json.loads(meta.read_text()).get("status"))
    except (OSError, ValueError):
        return "unknown"


def _todo(run_dir: Path, info: dict) -> list[tuple[str, int]]:
    return [(v, k) for v, k in _planned(info) if _status(run_dir, v, k) not in FINISHED]


def _planned(info: dict) -> list[tuple[str, int]]:
    n = int(info["repetitions"])
    return [(v, int(k)) for v, k in info["order"] if int(k) < n]


def triage(run_dir: Path, info: dict) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(finished repetitions, in order; unfinished ones that left a directory: discard)."""
    done, partial = [], []
    for v, k in _planned(info):
        st = _status(run_dir, v, k)
        if st in FINISHED:
            done.append((v, k))
        elif st is not None:
            partial.append((v, k))
    return done, partial


def discard(run_dir: Path, variant: str, k: int, session_no: int) -> dict:
    """Move an unfinished attempt to discarded/session-<n>/<variant>/rep-<k>; returns its
    history entry (for the re-run's meta.json)."""
    src = run_dir / variant / f"rep-{k}"
    meta = {}
    try:
        meta = json.loads((src / "meta.json").read_text())
    except (OSError, ValueError):
        pass
    dest = run_dir / "discarded" / f"session-{session_no}" / variant / f"rep-{k}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))
    return {"session": session_no, "status": meta.get("status") or "unknown", "error": meta.get("error"),
            "t_start": meta.get("t_start"), "t_end": meta.get("t_end"),
            "moved_to": str(dest.relative_to(run_dir)),
            "why": "unfinished when its session stopped: discarded and run again from the start"}
