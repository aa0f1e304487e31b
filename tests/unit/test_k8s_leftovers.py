"""Which killed `torbed run --backend k8s` runs `torbed clean` acts on, and what a claim
records (torbed.backends.k8s.leftovers): owners are real processes, alive, exited, or a pid
whose start time does not match; the selector picks exactly the ConfigMaps the backend makes;
the claim names the releases still installed. The uninstall itself runs against the local
cluster in tests/e2e/test_k8s_killed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from torbed import constants
from torbed.backends.k8s import backend, leftovers
from torbed.backends.local.lifetime import process_start


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "STATE_DIR", tmp_path / "state")
    return tmp_path / "state"


def _matches(sel: str, labels: dict[str, str]) -> bool:
    """Equality-based label selector semantics (k=v,k2=v2): every term holds."""
    return all(labels.get(k) == v for k, _, v in (t.partition("=") for t in sel.split(",")))


def _claim(pid, start=None, **kw):
    return {"run_id": "r", "label": "r", "namespace": "default", "context": None, "owner_pid": pid,
            "owner_start": start, "_file": "/nonexistent", **kw}


@pytest.mark.parametrize("run_id", ["quickstart-20261127T025500Z", "x" * 80 + "-Run_1", "üñí"])
def test_the_selector_picks_the_runs_dashboards_and_no_other_runs(run_id):
    mine = backend.run_dashboards(run_id)
    other = backend.run_dashboards(run_id + "2")
    sel = leftovers.selector(leftovers.run_label(run_id))
    assert len(mine) == 3 and all(_matches(sel, cm["metadata"]["labels"]) for cm in mine)
    assert not any(_matches(sel, cm["metadata"]["labels"]) for cm in other)
    # A release's own dashboards (the chart's, managed by Helm) are never selected.
    assert not _matches(sel, {**mine[0]["metadata"]["labels"], "app.kubernetes.io/managed-by": "Helm"})
    label = leftovers.run_label(run_id)
    assert 1 <= len(label) <= 63 and label[0].isalnum() and label[-1].isalnum()


def test_a_claim_names_this_process_and_lives_while_it_does(state_dir, tmp_path):
    path = leftovers.write_claim("quickstart-20261127T025500Z", "lab", "ctx", tmp_path / "run")
    assert path == state_dir / "k8s" / "quickstart-20261127T025500Z.json"
    (claim,) = leftovers.read_claims()
    assert claim["owner_pid"] == os.getpid() and claim["owner_start"] == process_start(os.getpid())
    assert (claim["namespace"], claim["context"], claim["label"]) == ("lab", "ctx", "quickstart-20261127T025500Z")
    dead, live = leftovers.claims_to_clean([claim])
    assert (dead, live) == ([], [claim])
    assert leftovers.claims_to_clean([claim], force=True) == ([claim], [])
    leftovers.remove_claim(path)
    assert leftovers.read_claims() == []


def test_the_claim_names_the_releases_still_installed(state_dir, tmp_path):
    path = leftovers.write_claim("run-1", "lab", None, tmp_path / "run")
    leftovers.set_release(path, "quickstart-vanilla-0-ab12", tmp_path / "run" / "vanilla" / "rep-0")
    (claim,) = leftovers.read_claims()
    assert claim["releases"] == ["quickstart-vanilla-0-ab12"] and claim["rep_dir"].endswith("vanilla/rep-0")
    # Uninstalled: off the claim. One whose uninstall failed stays beside the next one.
    leftovers.release_gone(path, "quickstart-vanilla-0-ab12")
    assert leftovers.read_claims()[0]["releases"] == []
    leftovers.set_release(path, "quickstart-vanilla-1-cd34", tmp_path / "run" / "vanilla" / "rep-1")
    leftovers.set_release(path, "quickstart-ewma-0-ef56", tmp_path / "run" / "ewma" / "rep-0")
    (claim,) = leftovers.read_claims()
    assert claim["releases"] == ["quickstart-vanilla-1-cd34", "quickstart-ewma-0-ef56"]
    assert claim["rep_dir"].endswith("ewma/rep-0") and claim["owner_pid"] == os.getpid()
    # No claim (an unwritable state directory): nothing to update, no error.
    leftovers.set_release(None, "x", tmp_path)
    leftovers.release_gone(None, "x")


def test_clean_uninstalls_marks_killed_and_removes_the_claim(state_dir, tmp_path, monkeypatch):
    """A dead claim naming a release: the release is uninstalled (the backend's own Release,
    here with a helm and API stand-in), the repetition's meta.json and the run's run.json
    become 'killed', and the claim goes."""
    run = tmp_path / "run"
    rep = run / "vanilla" / "rep-0"
    rep.mkdir(parents=True)
    (rep / "meta.json").write_text(json.dumps({"status": "running"}))
    (run / "run.json").write_text(json.dumps({"status": "running", "sessions": [{"status": "running"}]}))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path = leftovers.write_claim("run", "lab", None, run)
    leftovers.set_release(path, "quickstart-vanilla-0-ab12", rep)
    claim = json.loads(path.read_text()) | {"owner_pid": gone.pid, "owner_start": None}
    path.write_text(json.dumps(claim))
    uninstalled = []

    class StandIn:
        ApiException = Exception

        def __init__(self, ns, ctx):
            self.ns = ns
            self.core = self

        def list_namespaced_config_map(self, ns, label_selector):
            return type("L", (), {"items": []})()

    monkeypatch.setattr(backend, "Cluster", StandIn)
    monkeypatch.setattr(leftovers, "_uninstall", lambda cluster, release, console: uninstalled.append((cluster.ns, release)))
    console = Console(record=True, width=300)
    out = leftovers.clean(console)
    assert out == {"runs": 1, "releases": 1, "configmaps": 0, "live": 0, "failed": []}
    assert uninstalled == [("lab", "quickstart-vanilla-0-ab12")] and not path.exists()
    meta, info = json.loads((rep / "meta.json").read_text()), json.loads((run / "run.json").read_text())
    assert meta["status"] == info["status"] == info["sessions"][-1]["status"] == "killed"
    assert "uninstalled release quickstart-vanilla-0-ab12" in meta["error"] == info["killed"]
    # A release that stays: the claim stays too, for the next clean.
    path2 = leftovers.write_claim("run2", "lab", None, run)
    leftovers.set_release(path2, "stuck-0-0000", rep)
    path2.write_text(json.dumps(json.loads(path2.read_text()) | {"owner_pid": gone.pid, "owner_start": None}))
    monkeypatch.setattr(leftovers, "_uninstall", lambda cluster, release, console: "pods still terminating")
    out = leftovers.clean(console)
    assert out["failed"] == [str(path2)] and path2.exists() and out["runs"] == 0
    assert "stuck-0-0000: pods still terminating" in console.export_text()


def test_owners_gone_or_replaced_are_cleaned_live_ones_are_not():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    other = subprocess.Popen(["sleep", "30"])
    try:
        claims = {"gone": _claim(gone.pid),
                  "reused": _claim(os.getpid(), process_start(os.getpid()) + 1),   # same pid, another process
                  "live": _claim(other.pid, process_start(other.pid)),
                  "live-no-start": _claim(other.pid),
                  "no-pid": _claim(None)}
        dead, live = leftovers.claims_to_clean(list(claims.values()))
        assert [c for c in dead] == [claims["gone"], claims["reused"], claims["no-pid"]]
        assert live == [claims["live"], claims["live-no-start"]]
    finally:
        other.kill()
        other.wait()


def test_an_unreadable_claim_is_never_acted_on(state_dir):
    (state_dir / "k8s").mkdir(parents=True)
    (state_dir / "k8s" / "broken.json").write_text("{not json")
    (state_dir / "k8s" / "partial.json").write_text(json.dumps({"owner_pid": 1}))
    claims = leftovers.read_claims()
    assert len(claims) == 2
    assert leftovers.claims_to_clean(claims, force=True) == ([], claims)


def test_an_unwritable_state_directory_gives_no_claim(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(constants, "STATE_DIR", blocker)
    assert leftovers.write_claim("r", "default", None, tmp_path) is None


def test_clean_keeps_a_claim_whose_cluster_cannot_be_reached(state_dir, tmp_path, monkeypatch):
    """A dead owner, but no usable kubeconfig: the dashboards are not known to be gone, so the
    claim stays for a later clean, and the warning names the run and the file."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (state_dir / "k8s").mkdir(parents=True)
    f = state_dir / "k8s" / "r.json"
    f.write_text(json.dumps(_claim(gone.pid, _file=None) | {"run_id": "killed-run"}))
    console = Console(record=True, width=400)
    out = leftovers.clean(console)
    assert out == {"runs": 0, "releases": 0, "configmaps": 0, "live": 0, "failed": [str(f)]}
    assert f.exists()
    text = console.export_text()
    assert "run killed-run" in text and str(f) in text and "not all removed" in text


def test_clean_without_claims_touches_no_cluster(state_dir, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert leftovers.clean(Console(record=True)) == {"runs": 0, "releases": 0, "configmaps": 0, "live": 0,
                                                     "failed": []}


@pytest.mark.skipif(os.geteuid() != 0, reason="runs `torbed clean` as another user (setpriv), which needs root")
def test_torbed_clean_exits_1_while_a_killed_runs_cluster_is_unreachable():
    """The command itself, as an unprivileged user (so no local run is touched): a dead claim
    whose cluster cannot be reached is reported, kept, and the exit status says so."""
    import shutil
    import tempfile
    state = Path(tempfile.mkdtemp(prefix="torbed-k8s-claims-"))
    try:
        (state / "k8s").mkdir()
        claim = state / "k8s" / "gone.json"
        claim.write_text(json.dumps(_claim(2 ** 22 + 7, 1) | {"run_id": "gone-run", "label": "gone-run"}))
        for p in (state, state / "k8s", claim):
            p.chmod(0o777 if p.is_dir() else 0o666)
        env = {**os.environ, "TORBED_STATE": str(state), "KUBECONFIG": str(state / "no-kubeconfig"), "COLUMNS": "400"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-m", "torbed.cli", "clean"], env=env, capture_output=True, text=True,
                           timeout=120)
        out = " ".join((p.stdout + p.stderr).split())
        assert p.returncode == 1, out
        assert "run gone-run: what it left in namespace default was not all removed" in out
        assert "1 cluster(s) not reachable" in out
        assert claim.exists()
    finally:
        shutil.rmtree(state, ignore_errors=True)
