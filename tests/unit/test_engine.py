"""The run engine (torbed.engine) against a scripted backend: run.json / meta.json at every
outcome, failures recorded with their reason, teardown always, signals -> interrupted.

The backend here is a test double of torbed's own Backend interface (what a repetition
does is scripted); the real backends are exercised by tests/integration (local) and
tests/e2e (Kubernetes). The Kubernetes backend's API error conversion is tested against a
real HTTP server with the real kubernetes client.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from rich.console import Console

from torbed import engine, scenario
from torbed.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, InputError, Interrupted, RunFailed, TorbedError
from tests.unit.test_scenario import BASE


def _scenario(repetitions: int = 2) -> scenario.Scenario:
    data = copy.deepcopy(BASE)
    data["repetitions"] = repetitions
    data["measure"] = {"warmup": "0s", "duration": "1s"}
    return scenario.parse(data, "t.yaml")


class Scripted:
    """Backend whose steps do what ``script[(variant, rep)]`` says: a step name -> an
    exception to raise (or a callable to run)."""

    name = "scripted"
    unsupported = {"workload.fetch": "scripted backends fetch nothing"}
    bringup_estimate_s = 1.0

    def __init__(self, script: dict | None = None):
        self.script = script or {}
        self.calls: list[tuple[str, str, int]] = []

    def preflight(self, s):
        return {"shaper": "none"}

    def start_run(self, run):
        self.calls.append(("start_run", "", -1))

    def _step(self, step, rep):
        self.calls.append((step, rep.variant, rep.index))
        action = self.script.get((rep.variant, rep.index, step))
        if callable(action) and not isinstance(action, type) and not isinstance(action, BaseException):
            action(rep)
        elif action is not None:
            raise action

    def prepare(self, rep):
        self._step("prepare", rep)

    def bring_up(self, rep):
        self._step("bring_up", rep)
        rep.status("waiting for nothing")
        rep.ready(rep.meta["t_start"])

    def measure(self, rep):
        self._step("measure", rep)
        (rep.dir / "transfers.jsonl").write_text('{"status": "ok"}\n')

    def teardown(self, rep):
        self._step("teardown", rep)


def _run(tmp_path, backend, s=None):
    return engine.run(s or _scenario(), backend, tmp_path / "runs", Console(stderr=True, quiet=True))


def _meta(run_dir: Path, variant: str, k: int) -> dict:
    return json.loads((run_dir / variant / f"rep-{k}" / "meta.json").read_text())


def test_every_repetition_runs_and_is_recorded(tmp_path):
    b = Scripted()
    run_dir = _run(tmp_path, b)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and info["backend"] == "scripted" and info["shaper"] == "none"
    assert info["variants"] == ["kist", "ewma-66"] and info["repetitions"] == 2
    # Python dependency versions, from the installed metadata.
    assert info["python_dependencies"]["pydantic"] and info["python_dependencies"]["stem"] == "1.8.2"
    assert info["finished"] and info["scenario"]["measure"]["duration"] == "1s"
    for v in ("kist", "ewma-66"):
        for k in (0, 1):
            m = _meta(run_dir, v, k)
            assert m["status"] == "ok" and m["error"] is None and m["ready_s"] is not None
            assert m["t_end"] >= m["t_start"] and m["duration_s"] == 1.0
    steps = [c[0] for c in b.calls if c[1] == "kist" and c[2] == 0]
    assert steps == ["prepare", "bring_up", "measure", "teardown"]
    assert (tmp_path / "runs" / "t-latest").resolve() == run_dir.resolve()


@pytest.mark.parametrize("step", ["prepare", "bring_up", "measure"])
def test_a_failed_repetition_says_why_and_the_run_goes_on(tmp_path, step):
    b = Scripted({("kist", 0, step): RunFailed("middle0 exited with status 1")})
    run_dir = _run(tmp_path, b)
    m = _meta(run_dir, "kist", 0)
    assert m["status"] == "failed" and m["error"] == "middle0 exited with status 1"
    assert ("teardown", "kist", 0) in b.calls, "teardown runs after any failure"
    assert _meta(run_dir, "kist", 1)["status"] == "ok"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "partial"


def test_an_api_error_in_a_repetition_ends_failed_with_its_reason(tmp_path):
    from torbed.backends.k8s.backend import KubernetesError
    b = Scripted({("ewma-66", 1, "measure"): KubernetesError("Kubernetes API: list pods of r: HTTP 403 Forbidden")})
    run_dir = _run(tmp_path, b)
    m = _meta(run_dir, "ewma-66", 1)
    assert m["status"] == "failed" and "HTTP 403 Forbidden" in m["error"]


def test_an_unexpected_exception_is_recorded_then_raised(tmp_path):
    b = Scripted({("kist", 0, "measure"): ZeroDivisionError("a bug")})
    with pytest.raises(ZeroDivisionError):
        _run(tmp_path, b)
    run_dir = next(d for d in (tmp_path / "runs").iterdir() if not d.is_symlink())
    m = _meta(run_dir, "kist", 0)
    assert m["status"] == "failed" and m["error"] == "ZeroDivisionError: a bug"
    assert ("teardown", "kist", 0) in b.calls
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


def test_every_repetition_failing_makes_a_failed_run(tmp_path):
    b = Scripted({(v, k, "bring_up"): RunFailed("no") for v in ("kist", "ewma-66") for k in (0, 1)})
    run_dir = _run(tmp_path, b)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


def test_teardown_errors_are_recorded_not_fatal(tmp_path):
    b = Scripted({("kist", 0, "teardown"): OSError("device busy")})
    run_dir = _run(tmp_path, b)
    m = _meta(run_dir, "kist", 0)
    assert m["status"] == "ok" and m["teardown_errors"] == ["OSError: device busy"]


@pytest.fixture
def sentinel_handlers():
    """Known SIGTERM/SIGINT handlers of the caller (torbed's CLI, a test runner...), installed
    before the run: the engine must put exactly these back, whatever the run's outcome."""
    def on_term(signum, frame):  # pragma: no cover - must never be called
        raise AssertionError("the caller's SIGTERM handler ran during the run")

    def on_int(signum, frame):  # pragma: no cover - must never be called
        raise AssertionError("the caller's SIGINT handler ran during the run")

    mine = {signal.SIGTERM: on_term, signal.SIGINT: on_int}
    before = {sg: signal.signal(sg, h) for sg, h in mine.items()}
    try:
        yield mine
    finally:
        for sg, h in before.items():
            signal.signal(sg, h)


def _assert_handlers_back(mine):
    for sg, h in mine.items():
        assert signal.getsignal(sg) is h, f"{sg.name}: {signal.getsignal(sg)!r} instead of the caller's handler"


def test_the_callers_signal_handlers_are_back_after_a_run(tmp_path, sentinel_handlers):
    seen = {}

    def look(rep):
        seen.update({sg: signal.getsignal(sg) for sg in sentinel_handlers})

    sc = _scenario(repetitions=1)
    first = engine.run_order(list(sc.variants), sc.repetitions, sc.seed)[0]
    _run(tmp_path, Scripted({(*first, "measure"): look}), sc)
    # The engine's own handlers were in place while it ran...
    assert seen and all(seen[sg] is not h for sg, h in sentinel_handlers.items()), seen
    # ...and the caller's are back afterwards.
    _assert_handlers_back(sentinel_handlers)


def test_sigterm_interrupts_tears_down_and_records(tmp_path, sentinel_handlers):
    def signal_self(rep):
        os.kill(os.getpid(), signal.SIGTERM)

    sc = _scenario()
    first = engine.run_order(list(sc.variants), sc.repetitions, sc.seed)[0]
    b = Scripted({(*first, "measure"): signal_self})
    with pytest.raises(Interrupted) as e:
        _run(tmp_path, b, sc)
    assert e.value.exit_code == EXIT_INTERRUPTED
    run_dir = next(d for d in (tmp_path / "runs").iterdir() if not d.is_symlink())
    m = _meta(run_dir, *first)
    assert m["status"] == "interrupted" and "SIGTERM" in m["error"]
    assert ("teardown", *first) in b.calls
    info = json.loads((run_dir / "run.json").read_text())
    order = [tuple(x) for x in info["order"]]
    later = order[1:]
    assert later and not any((run_dir / v / f"rep-{k}").exists() for v, k in later), \
        "no repetition starts after an interrupt"
    assert info["status"] == "interrupted"
    _assert_handlers_back(sentinel_handlers)


def test_an_interrupt_swallowed_by_a_broad_except_still_stops_the_run(tmp_path, sentinel_handlers):
    def swallow(rep):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except Exception:   # what a careless library might do
            pass

    b = Scripted({("kist", 0, "bring_up"): swallow})
    with pytest.raises(Interrupted):
        _run(tmp_path, b)
    run_dir = next(d for d in (tmp_path / "runs").iterdir() if not d.is_symlink())
    assert _meta(run_dir, "kist", 0)["status"] == "interrupted"
    assert [c for c in b.calls if c[0] == "measure"] == [], "rep.status() noticed the signal before measuring"
    _assert_handlers_back(sentinel_handlers)


def test_preflight_failure_creates_nothing(tmp_path):
    class NoGo(Scripted):
        def preflight(self, s):
            raise RunFailed("helm not found")

    with pytest.raises(RunFailed):
        _run(tmp_path, NoGo())
    assert not (tmp_path / "runs").exists()


def test_unsupported_features_by_backend():
    s = _scenario()
    assert engine.unsupported(s, Scripted) == [("workload.fetch", "scripted backends fetch nothing")]
    assert "workload.bulk" in engine.features_used(s) and "links.delay" not in engine.features_used(s)


def test_error_tree_exit_codes():
    from torbed.builds import BuildError
    from torbed.replay.pcap import PcapError
    from torbed.replay.trace import TraceError
    from torbed.shaping import ShapingError
    from torbed.backends.local.supervise import NodeFailed
    from torbed.variants import VariantError
    for cls in (scenario.ScenarioError, TraceError, PcapError, VariantError, ShapingError):
        assert issubclass(cls, InputError) and cls.exit_code == EXIT_BAD_INPUT, cls
    for cls in (BuildError, NodeFailed):
        assert issubclass(cls, RunFailed) and cls.exit_code == EXIT_FAILED, cls
    assert issubclass(Interrupted, TorbedError)


# ---------------------------------------------------------------------------------------
# The Kubernetes backend's API calls: the real kubernetes client against a real HTTP server
# that answers like an API server refusing everything but /version.

class _ApiServer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/version"):
            body, code = json.dumps({"major": "1", "minor": "33", "gitVersion": "v1.33.13", "gitCommit": "x",
                                     "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                                     "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}).encode(), 200
        else:
            body, code = b'{"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}', 403
        self.send_response(code, "Forbidden" if code == 403 else "OK")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def api_server(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
        "users": [{"name": "t", "user": {"token": "x"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield server
    server.shutdown()


def test_k8s_api_errors_become_run_failures(api_server):
    from torbed.backends.k8s.backend import Cluster, KubernetesError
    c = Cluster("default")
    assert c.server_version() == "v1.33.13"
    with pytest.raises(KubernetesError, match="list pods of r1: HTTP 403"):
        c.pods("r1")
    with pytest.raises(KubernetesError, match="read configmap r1-identities: HTTP 403"):
        c.configmap("r1-identities")
    assert "log unavailable" in c.log("p", "tor")
    api_server.shutdown()
    api_server.server_close()
    with pytest.raises(KubernetesError, match="list jobs of r1"):   # nobody listening: no answer at all
        c.jobs("r1")


def test_repetitions_run_in_shuffled_blocks_recorded_in_run_json(tmp_path):
    from torbed.engine import run_order
    order = run_order(["a", "b", "c"], 4, seed=5)
    # Block k holds repetition k of every variant; the orders inside blocks are not all alike.
    assert [sorted(order[3 * k:3 * k + 3]) for k in range(4)] == [[("a", k), ("b", k), ("c", k)] for k in range(4)]
    assert len({tuple(v for v, _ in order[3 * k:3 * k + 3]) for k in range(4)}) > 1
    assert run_order(["a", "b", "c"], 4, seed=5) == order          # seeded: the same run, the same order
    b = Scripted({})
    run_dir = _run(tmp_path, b)
    info = json.loads((run_dir / "run.json").read_text())
    ran = [(v, k) for (what, v, k) in b.calls if what == "bring_up"]
    assert ran == [tuple(x) for x in info["order"]]


def test_each_measured_repetition_is_judged_by_the_mechanism_gates(tmp_path, monkeypatch):
    run_dir = _run(tmp_path / "a", Scripted())
    g = _meta(run_dir, "kist", 0)["gates"]
    assert g["version"] == 1 and g["valid"] and g["mechanism"] == {"kind": "queueing", "target": None}
    assert g["completion"]["counts"]["completed"] == 1
    assert g["queueing"]["status"] == "not measured"      # the scripted backend samples nothing
    # A failed repetition is not judged; judging that fails is recorded and the repetition stands.
    run_dir = _run(tmp_path / "b", Scripted({("kist", 1, "measure"): RunFailed("boom")}))
    assert "gates" not in _meta(run_dir, "kist", 1)
    from torbed.analysis import gates

    def broken(*a, **k):
        raise ValueError("unreadable")
    monkeypatch.setattr(gates, "evaluate", broken)
    run_dir = _run(tmp_path / "c", Scripted())
    m = _meta(run_dir, "kist", 0)
    assert m["status"] == "ok" and m["gates_error"] == "ValueError: unreadable" and "gates" not in m
