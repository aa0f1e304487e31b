"""The run engine: one loop over variants x repetitions for every backend.

The engine owns what every run shares, so a backend only brings one repetition's network
up, measures and tears it down:

- the run directory: run.json (resolved scenario, seed, versions, host, status) and, per
  repetition, ``<variant>/rep-<k>/meta.json``, written at every stage so a crash or a
  Ctrl-C leaves a true record (status ``running`` only while torbed is alive);
- signals: SIGINT / SIGTERM raise ``Interrupted``; teardown runs with both ignored, so a
  second Ctrl-C cannot leave half a network behind; the run ends ``interrupted`` (exit 130);
- failures: a repetition that fails (any ``TorbedError``, or an OS error) is recorded with
  its reason and the run goes on; an unexpected exception is recorded, then re-raised;
- progress: one bar over variants x repetitions with the time left (stderr); backends
  report what they wait for through ``Repetition.status``.

Public API:

- ``Backend``: the protocol a backend implements (see its docstring), ``Capabilities``
- ``run(scenario, backend, run_root, console, variants=None, source=None, host_load=None, overrides=None) -> Path``
- ``resume(run_dir, scenario, backend, console, host_load=None) -> Path``: continue an interrupted
  run at its next unfinished (variant, repetition) (torbed/resume.py)
- ``Run``, ``Repetition``: what a backend is handed
- ``write_json(path, data)``: atomic JSON file write (run.json, meta.json, configs)
- ``unsupported(scenario, backend) -> [(feature, why)]``: what of a scenario a backend
  cannot do (``torbed plan`` prints it)
- ``link_node_names(scenario, fault) -> [(field, node)]``: single nodes a link fault names
  that share their pods' addresses with their group (Kubernetes: servers, load nodes)
- ``BACKENDS``, ``backend_module(name)``, ``backend_class(name)``: the backends by name
  (torbed/backends/__init__.py says what a backend's package provides)
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn

from . import __version__
from .errors import InputError, Interrupted, TorbedError
from .provenance import host_info, python_dependencies, utc_now
from .network import LOAD_GROUP
from .scenario import Scenario, group_sizes
from .variants import describe

# A feature a backend lacks: {feature: why}; features are named as in ``features_used``.
Capabilities = dict[str, str]

# The backends, each the package torbed.backends.<name>. The core reaches a backend only
# through this table, at run time: no core module imports one (tests/unit/test_layout.py).
# Imported on use: the k8s backend needs the kubernetes client, the local one root tools.
BACKENDS = ("local", "k8s")


def backend_module(name: str) -> ModuleType:
    """The backend's package: its options, ``create``, its subcommands (torbed/backends/__init__.py)."""
    return importlib.import_module(f"torbed.backends.{name}")


def backend_class(name: str) -> type:
    return backend_module(name).backend_class()


class Backend(Protocol):
    """One way to run a scenario's network (kind's provider pattern). The engine calls, in
    order: ``preflight`` once (before the run directory exists), ``start_run`` once, then
    for every variant x repetition ``prepare``, ``bring_up``, ``measure`` and, always,
    ``teardown``.

    - ``name``: "local", "k8s", ...; recorded in run.json and meta.json.
    - ``unsupported``: {feature: why} for features of ``features_used`` it cannot run.
    - ``bringup_estimate_s``: a first guess of bring-up + teardown, for the time left.
    - ``preflight(scenario) -> dict``: checks that need nothing started (privileges, tools,
      the cluster); returns run.json fields of its own (shaper, tor_version, host, ...).
      Raises InputError or RunFailed.
    - ``start_run(run)``: run-wide preparation (files, values) inside the signal handling.
    - ``finish_run(run)`` (optional): remove what ``start_run`` made for the whole run, after
      the last repetition, whatever the run's outcome; must not raise.
    - ``prepare(rep)``: this repetition's inputs (builds, keys, configuration); fills meta.
    - ``bring_up(rep)``: start everything and wait for evidence of readiness; sets
      ``rep.meta`` t_ready / ready_s (``rep.ready()``).
    - ``measure(rep)``: run the workload to its end; records land in ``rep.dir``.
    - ``teardown(rep)``: stop and remove everything this repetition started, whatever
      state it is in (also after a failed or interrupted prepare); records what it could
      not remove in ``rep.meta`` rather than raising.
    """

    name: str
    unsupported: Capabilities
    bringup_estimate_s: float

    def preflight(self, scenario: Scenario) -> dict: ...
    def start_run(self, run: "Run") -> None: ...
    def prepare(self, rep: "Repetition") -> None: ...
    def bring_up(self, rep: "Repetition") -> None: ...
    def measure(self, rep: "Repetition") -> None: ...
    def teardown(self, rep: "Repetition") -> None: ...


def features_used(s: Scenario) -> list[str]:
    """The scenario's features a backend might lack, by name."""
    used = {f"workload.{cg.workload.kind}" for cg in s.clients.values()}
    used |= {f"faults.{f.kind}" for f in s.faults}
    if any(f.kind == "link" and (f.delay or f.jitter or f.loss) for f in s.faults):
        used.add("faults.link.netem")
    if any(f.kind == "link" for f in s.faults):
        if any(link_node_names(s, f) for f in s.faults if f.kind == "link"):
            used.add("faults.link.node")
    if any(f.kind == "restart" and f.duration is not None and f.duration.seconds > 0 for f in s.faults):
        used.add("faults.restart.downtime")
    used |= {f"collect.{c}" for c in s.measure.collect}
    links = [s.links.default, *s.links.pairs]
    if any(link.delay or link.jitter or link.loss for link in links):
        used.add("links.delay")
    if s.placement:
        used.add("placement")
    if s.load is not None:
        used.add("load")
    if any(g.cpu != "native" or g.cpu_per_thread is not None for g in s.network.relays.values()):
        used.add("cpu")
    if any(g.weights for g in s.network.relays.values()):
        used.add("weights")
    if s.samples:
        used.add("samples")
    if any(g.second_address for g in s.network.relays.values()):
        used.add("second_address")
    if s.crossover is not None:
        used.add("crossover")
    return sorted(used)


def link_node_names(s: Scenario, f) -> list[tuple[str, str]]:
    """(field, name) for each single node a link fault names whose pod the shaper cannot
    tell apart from its group's other pods (servers behind one ClusterIP, load workers of
    a Deployment)."""
    sides = [("target", f.target)] if f.target is not None else \
        [(f"between[{k}]", side) for k, side in enumerate(f.between or [])]
    sizes = group_sizes(s)
    out = []
    for where, name in sides:
        if name in sizes or name == "authority":
            continue
        group = name.rstrip("0123456789")
        if group == LOAD_GROUP or (group in s.servers and sizes[group] > 1):
            out.append((where, name))
    return out


def unsupported(s: Scenario, backend: type | Backend) -> list[tuple[str, str]]:
    return [(f, backend.unsupported[f]) for f in features_used(s) if f in backend.unsupported]


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as JSON atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


@dataclass
class Run:
    scenario: Scenario
    run_dir: Path
    console: object
    variants: list[str]
    info: dict                          # run.json
    engine: "_Engine"
    state: dict = field(default_factory=dict)   # the backend's run-wide state

    def check(self) -> None:
        """Raise Interrupted if a signal came (in case a broad except swallowed it)."""
        self.engine.check()


@dataclass
class Repetition:
    run: Run
    variant: str
    index: int
    dir: Path
    meta: dict
    state: Any = field(default_factory=dict)    # the backend's per-repetition state (its own type)
    _block: Scenario | None = field(default=None, repr=False)

    @property
    def scenario(self) -> Scenario:
        # With a sampled network per block (scenario.samples), block k runs its own network.
        if not self.run.scenario.samples:
            return self.run.scenario
        if self._block is None:
            self._block = self.run.scenario.for_block(self.index)
        return self._block

    @property
    def console(self):
        return self.run.console

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def write_meta(self) -> None:
        write_json(self.dir / "meta.json", self.meta)

    def status(self, text: str) -> None:
        """What the repetition is doing or waiting for (the progress line); also the
        place a long wait notices a signal a broad except swallowed."""
        self.run.engine.status(text)
        self.run.engine.check()

    def ready(self, t0: float) -> None:
        """Record readiness: t_ready now, ready_s counted from ``t0``."""
        self.meta["t_ready"] = time.time()
        self.meta["ready_s"] = round(self.meta["t_ready"] - t0, 3)
        self.write_meta()


class _Engine:
    def __init__(self, console, total: int, estimate_s: float):
        self.console = console
        self.total = total
        self.estimate_s = estimate_s
        self.durations: list[float] = []
        self.t_rep = time.time()
        self.signalled: str | None = None
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[left]}"),
                                 TextColumn("[dim]{task.fields[status]}"), console=console, transient=False)
        self.task = self.progress.add_task("starting", total=total, left="", status="")

    # signals
    def on_signal(self, signum, frame):
        self.signalled = signal.Signals(signum).name
        raise Interrupted(self.signalled)

    def check(self) -> None:
        if self.signalled:
            raise Interrupted(self.signalled)

    # progress
    def begin(self, done: int, label: str) -> None:
        self.done = done
        self.t_rep = time.time()
        self.progress.update(self.task, description=label, completed=done)
        self.status("")

    def finish(self) -> None:
        self.durations.append(time.time() - self.t_rep)
        self.progress.update(self.task, completed=self.done + 1, status="")

    def status(self, text: str) -> None:
        per_rep = sum(self.durations) / len(self.durations) if self.durations else self.estimate_s
        elapsed = time.time() - self.t_rep
        left = (self.total - self.done - 1) * per_rep + max(0.0, per_rep - elapsed)
        self.progress.update(self.task, completed=self.done + min(0.99, elapsed / per_rep), status=text,
                             left=f"about {_fmt_left(left)} left")


def _fmt_left(s: float) -> str:
    s = int(s)
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def run(scenario: Scenario, backend: Backend, run_root: Path, console, variants: list[str] | None = None,
        source: str | Path | None = None, host_load: dict | None = None, overrides: dict | None = None) -> Path:
    """Run every variant x repetition of ``scenario`` on ``backend``; returns the run
    directory (status in its run.json: ok, partial, failed or interrupted). ``host_load``:
    the machine's load read before the run (torbed.hostload.measure), kept in run.json.
    ``overrides``: the command line's scenario overrides ({"repetitions": 5, "duration":
    "60s"}), recorded so ``resume`` can rebuild the same scenario. Raises Interrupted after
    cleanup on SIGINT/SIGTERM; InputError / RunFailed from preflight before anything exists."""
    from . import resume as resume_mod
    variants = variants or scenario.variants
    if scenario.crossover is not None and list(variants) != list(scenario.variants):
        raise InputError(f"--variant {','.join(variants)}: a crossover runs every arm in each repetition's network "
                         f"({', '.join(scenario.variants)}); it cannot run some of them")
    extra = backend.preflight(scenario)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = run_root / f"{scenario.name}-{stamp}"
    run_dir.mkdir(parents=True)
    info = {"schema": 1, "name": scenario.name, "scenario": scenario.model_dump(mode="json"),
            "seed": scenario.seed, "variants": variants,
            "baseline": scenario.baseline_variant if scenario.baseline_variant in variants else variants[0],
            "repetitions": scenario.repetitions, "backend": backend.name,
            "network_design": scenario.network_design,
            "torbed_version": __version__, "python_dependencies": python_dependencies(),
            "host": host_info(), "started": utc_now(), "finished": None, "status": "running",
            **({"source": str(source)} if source else {}),
            **({"host_load": host_load} if host_load is not None else {}), **extra}
    if scenario.crossover is not None:
        # One network per repetition runs every arm (torbed/crossover.py): its records go to
        # crossover/rep-<k> and are split into <arm>/rep-<k> when it ends.
        from . import crossover
        info["order"] = [[crossover.SOURCE, k] for k in range(scenario.repetitions)]
        info["crossover"] = {"build_variant": crossover.build_variant(scenario),
                             "period_s": scenario.crossover.period.seconds,
                             "washout_s": scenario.crossover.washout.seconds, "cycles": scenario.crossover.cycles,
                             "orders": [crossover.order(scenario, k) for k in range(scenario.repetitions)]}
    else:
        info["order"] = run_order(variants, scenario.repetitions, scenario.seed)
    # What --resume needs to continue this run exactly: the overrides, a fingerprint of the
    # scenario and variants, and one entry per session (this is the first).
    if source:
        info["source_resolved"] = str(Path(source).resolve())
    info["overrides"] = dict(overrides or {})
    info["fingerprint"] = resume_mod.fingerprint(scenario, variants)
    info["torbed_commit"] = resume_mod.git_commit()
    info["sessions"] = [resume_mod.session(host_load)]
    write_json(run_dir / "run.json", info)
    return _drive(scenario, backend, run_root, console, run_dir, info, variants, skip=set(), history={})


def resume(run_dir: Path, scenario: Scenario, backend: Backend, console, host_load: dict | None = None) -> Path:
    """Continue the run in ``run_dir`` at its next unfinished (variant, repetition) of run.json's
    ``order`` (torbed/resume.py: what is kept, discarded and recorded). ``scenario`` must be
    the run's (``resume.check_unchanged`` was called). Returns ``run_dir``."""
    from . import resume as resume_mod
    info = json.loads((run_dir / "run.json").read_text())
    variants = list(info["variants"])
    extra = backend.preflight(scenario)
    sessions = info["sessions"]
    last = sessions[-1]
    if last.get("status") == "running":
        # The previous session never wrote its end: killed, crashed or the power went.
        last.update(status="ended without a record (killed, crash or power loss)")
    done, partial = resume_mod.triage(run_dir, info)
    history: dict[tuple[str, int], list[dict]] = {}
    for v, k in partial:
        old_history = _old_history(run_dir / v / f"rep-{k}")
        history[(v, k)] = old_history + [resume_mod.discard(run_dir, v, k, len(sessions))]
    sess = resume_mod.session(host_load, resumed=True)
    sess["discarded"] = [f"{v}/rep-{k}" for v, k in partial]
    sess["kept"] = len(done)
    sess["preflight"] = extra
    sessions.append(sess)
    info.update(status="running", finished=None)
    write_json(run_dir / "run.json", info)
    console.print(f"resuming {run_dir.name}: session {len(sessions)}; {len(done)} repetition(s) kept, "
                  f"{len(partial)} unfinished discarded and run again"
                  + (f" ({', '.join(sess['discarded'])})" if partial else ""), highlight=False)
    return _drive(scenario, backend, run_dir.parent, console, run_dir, info, variants, skip=set(done),
                  history=history)


def _old_history(rep_dir: Path) -> list[dict]:
    try:
        h = json.loads((rep_dir / "meta.json").read_text()).get("history")
    except (OSError, ValueError):
        return []
    return list(h) if isinstance(h, list) else []


def _drive(scenario: Scenario, backend: Backend, run_root: Path, console, run_dir: Path, info: dict,
           variants: list[str], skip: set, history: dict) -> Path:
    """The loop over run.json's ``order`` (leaving out ``skip``: repetitions a resumed run
    keeps) inside the signal handling; ends the current session and the run in run.json."""
    from . import sequential
    planned = [(v, int(k)) for v, k in info["order"] if int(k) < int(info["repetitions"])]
    todo = [(v, k) for v, k in planned if (v, k) not in skip]
    session = info["sessions"][-1]
    engine = _Engine(console, len(todo), backend.bringup_estimate_s + scenario.measure.duration.seconds)
    r = Run(scenario=scenario, run_dir=run_dir, console=console, variants=variants, info=info, engine=engine)
    old = {s: signal.signal(s, engine.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    status = "failed"
    try:
        with engine.progress:
            backend.start_run(r)
            for i, (variant, k) in enumerate(todo):
                engine.begin(i, f"{variant} rep {k + 1}/{scenario.repetitions}")
                _repetition(backend, r, variant, k, history.get((variant, k)), len(info["sessions"]))
                session["ran"].append(f"{variant}/rep-{k}")
                engine.finish()
                engine.check()
                if sequential.block_complete(run_dir, info, k) and sequential.should_stop(run_dir, info, scenario, k,
                                                                                           console):
                    write_json(run_dir / "run.json", info)
                    break
        status = _run_status(run_dir, info)
    except Interrupted:
        status = "interrupted"
        raise
    finally:
        finish_run = getattr(backend, "finish_run", None)   # optional: what a backend keeps for the whole run
        if finish_run is not None:
            finish_run(r)
        for s, h in old.items():
            signal.signal(s, h)
        session.update(finished=utc_now(), status=status)
        info.update(finished=utc_now(), status=status)
        write_json(run_dir / "run.json", info)
        latest = run_root / f"{scenario.name}-latest"
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(run_dir.name)
    return run_dir


def _run_status(run_dir: Path, info: dict) -> str:
    """ok / partial / failed over every planned repetition's meta.json (those kept from an
    earlier session included)."""
    planned = [(v, int(k)) for v, k in info["order"] if int(k) < int(info["repetitions"])]
    bad = 0
    for v, k in planned:
        try:
            st = json.loads((run_dir / v / f"rep-{k}" / "meta.json").read_text()).get("status")
        except (OSError, ValueError):
            st = None
        bad += st != "ok"
    return "ok" if bad == 0 else "partial" if bad < len(planned) else "failed"


def run_order(variants: list[str], repetitions: int, seed: int) -> list[tuple[str, int]]:
    """The order repetitions run in: repetition k of every variant together (a block), the
    variants in a seeded random order within each block. Running all of one variant before
    the next would confound the comparison with anything that drifts during a run (the
    machine's load, a neighbour's build, thermal state); blocks spread it over the variants,
    and shuffling within blocks keeps "the variant that runs first" from being a constant.
    Recorded in run.json (``order``)."""
    rng = random.Random(f"order:{seed}")
    order = []
    for k in range(repetitions):
        block = list(variants)
        rng.shuffle(block)
        order += [(v, k) for v in block]
    return order


def _variant_specs(s: Scenario, variant: str) -> dict:
    names = [variant] + [rg.variant for rg in s.network.relays.values() if rg.variant]
    return {n: describe(n) for n in dict.fromkeys(names)}


def _repetition(backend: Backend, r: Run, variant: str, k: int, history: list[dict] | None = None,
                session: int = 1) -> dict:
    s = r.scenario
    rep_dir = r.run_dir / variant / f"rep-{k}"
    xo = None
    if s.crossover is not None and variant == "crossover":
        from . import crossover as xo
        variant = xo.build_variant(s)      # the build every arm runs on; rep_dir stays crossover/
    (rep_dir / "logs").mkdir(parents=True, exist_ok=True)
    meta = {"schema": 1, "variant": variant, "rep": k, "backend": backend.name, "status": "running",
            "error": None, "t_start": time.time(), "t_ready": None, "ready_s": None, "t_workload_start": None,
            "t_end": None, "warmup_s": s.measure.warmup.seconds, "duration_s": s.measure.duration.seconds,
            "faults": [], "session": session,
            # Every variant this repetition runs, with each parameter's value (a name such as
            # torchestra-exp1 stands for several), so the record does not depend on variant.yaml.
            "variant_specs": _variant_specs(s, variant),
            # The seed of the network this block ran (scenario.samples); null: the scenario's network.
            "network_sample_seed": s.samples[k % len(s.samples)].seed if s.samples else None,
            # Earlier attempts of this repetition discarded by a resume (torbed/resume.py).
            "history": list(history or [])}
    if xo is not None:
        meta["crossover"] = {"arms": list(s.variants), "periods": [p.to_dict() for p in xo.schedule(s, k)]}
    rep = Repetition(run=r, variant=variant, index=k, dir=rep_dir, meta=meta)
    rep.write_meta()
    try:
        backend.prepare(rep)
        rep.write_meta()
        backend.bring_up(rep)
        rep.write_meta()
        backend.measure(rep)
        r.check()
        meta["status"] = "ok"
        _judge_gates(rep, backend)
    except Interrupted as e:
        meta["status"], meta["error"] = "interrupted", f"interrupted by {e}"
        raise
    except TorbedError as e:
        _failed(rep, str(e))
    except OSError as e:   # the machine, not torbed: a full disk, a missing binary
        _failed(rep, f"{type(e).__name__}: {e}")
    except Exception as e:
        meta["status"], meta["error"] = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        # Teardown must not be cut short by a second Ctrl-C.
        old = {sg: signal.signal(sg, signal.SIG_IGN) for sg in (signal.SIGINT, signal.SIGTERM)}
        try:
            backend.teardown(rep)
        except Exception as e:  # recorded; the next repetition must still run
            meta.setdefault("teardown_errors", []).append(f"{type(e).__name__}: {e}")
        finally:
            if r.engine.signalled and meta["status"] in ("ok", "running"):
                meta["status"], meta["error"] = "interrupted", f"interrupted by {r.engine.signalled}"
            meta["t_end"] = meta["t_end"] or time.time()
            rep.write_meta()
            if xo is not None:
                _split_crossover(rep)
            for sg, h in old.items():
                signal.signal(sg, h)
    return meta


def _split_crossover(rep: Repetition) -> None:
    """A crossover repetition's records into one repetition per arm (torbed/crossover.py)."""
    from . import crossover
    s, k = rep.run.scenario, rep.index
    try:
        crossover.split(rep.run.run_dir, k, s, crossover.schedule(s, k))
    except Exception as e:  # noqa: BLE001 - the raw repetition stands; recorded
        rep.meta.setdefault("teardown_errors", []).append(f"crossover split: {type(e).__name__}: {e}")
        rep.write_meta()


def _mechanism(scenario) -> dict:
    """The scenario's ``measure.mechanism`` for the gates, with ``thread_cap`` (cores) when a
    CPU-bound target's relays have a per-thread CPU cap (``cpu_per_thread``): a thread held
    to its cap is as saturated as the cap lets it be."""
    m = scenario.measure.mechanism.model_dump()
    rg = scenario.network.relays.get(m.get("target") or "") if m.get("kind") == "cpu-bound" else None
    if rg is not None and rg.cpu_per_thread is not None:
        m["thread_cap"] = rg.cpu_per_thread.fraction
    return m


def _judge_gates(rep: Repetition, backend: Backend) -> None:
    """The mechanism gates' verdict on a measured repetition (torbed.analysis.gates), into
    meta.json ``gates`` and the console. A gate that cannot be judged is an error recorded
    beside it (``gates_error``; the report judges again), never a failed repetition."""
    from .analysis import gates
    try:
        g = rep.meta["gates"] = gates.evaluate(rep.dir, rep.meta, _mechanism(rep.scenario),
                                               not_measured=getattr(backend, "gates_not_measured", None))
    except Exception as e:   # noqa: BLE001 - the measurement stands; the report judges again
        rep.meta["gates_error"] = f"{type(e).__name__}: {e}"
        return
    verdict = "[green]valid[/green]" if g["valid"] else "[red]INVALID[/red]: " + "; ".join(g["invalid_reasons"])
    rep.console.log(f"mechanism gates: {verdict}")
    for name in ("queueing", "cpu", "completion"):
        rep.console.log(f"  {name}: {g[name]['status']}: {g[name].get('text', '')}")


def _failed(rep: Repetition, why: str) -> None:
    rep.meta["status"], rep.meta["error"] = "failed", why
    rep.console.print(f"[red]repetition failed[/red]: {why}", highlight=False)
