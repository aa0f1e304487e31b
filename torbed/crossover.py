"""Within-run crossover (issue 36 item 5): every arm in one network, switched at run time.

A between-run comparison pays for each repetition's network twice: the arms run on networks
brought up separately, each with its own paths, guards, consensus and timing, and that
variation enters every paired difference. Where the arms differ only in options tor applies
at run time, one network can carry all of them: the relays switch by SETCONF/RESETCONF on
their control ports, in periods, and each repetition (block) compares the arms on the same
network, circuits and clients. Tang & Goldberg's round robin vs EWMA is such a pair: the
`vanilla` build's CircuitMuxPolicy (images/relay/variants/vanilla/README.md, A.2) and tor's
CircuitPriorityHalflife both apply on SETCONF to every open channel.

The scenario's ``crossover:`` section (``period``, ``washout``, ``cycles``) sets the design.
Each repetition runs ``cycles`` cycles of one period per arm after the warm-up; within a
repetition the cycles alternate the order (A B, B A, A B, ...: balanced against a linear
drift within the run), and each repetition's first order is a seeded shuffle (so no arm is
always first). The first ``washout`` of every period is not measured: queues and EWMA counts
left by the previous arm drain there. measure.duration is cycles x arms x period.

The engine runs each repetition once, as ``crossover/rep-<k>`` (its own records, logs and
torrc), on the build every arm can run on (the one patched arm's, or stock), and then splits
its records by period into ``<arm>/rep-<k>``, so the report's blocks and paired inference
work unchanged: block k pairs the arms' periods of network k. What goes into an arm:

- transfers that started in the measured part of one of its periods; one still running at
  that period's end is right-censored there (``status: cancelled``, ``t_censor``), since the
  rest of it ran under another arm;
- CELL_STATS, bandwidth, metrics and resource samples timed in those measured parts;
- every circuit record (circuits.jsonl: circuits are labelled by client, whenever built);
- the repetition's meta.json (gates included: one verdict for the network) with
  ``crossover`` saying where it came from and which spans it measured.

Families whose every option applies at run time say so in variant.yaml (``runtime_switch:
true``): vanilla, ewma, kist, kistlite. Local backend only.

Public API: ``SOURCE``, ``check(scenario) -> list[(field, problem)]``, ``build_variant(s)``,
``arm_options(variant) -> dict``, ``commands(arms) -> {arm: (setconf, resetconf)}``,
``schedule(s, k) -> list[Period]``, ``split(run_dir, k, s, periods)``, ``Switcher``.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SOURCE = "crossover"          # the raw repetitions' directory: crossover/rep-<k>
RECORDS = "crossover.jsonl"   # the switches as applied, in the raw repetition
# Timed record files split by period (key of the time field); circuits.jsonl is copied whole.
TIMED = {"cellstats.jsonl": "t", "relay_bw.jsonl": "t", "metrics.jsonl": "t", "resources.jsonl": "t"}
WHOLE = ("circuits.jsonl",)


@dataclass(frozen=True)
class Period:
    index: int
    arm: str
    start: float        # seconds after the workload start
    measured_from: float
    end: float

    def to_dict(self) -> dict:
        return asdict(self)


def arm_options(variant: str) -> dict[str, str]:
    """The torrc options a variant sets ({option: value}), from its variant.yaml torrc."""
    from .variants import load_variant
    out = {}
    for line in load_variant(variant).torrc.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition(" ")
            out[key] = value.strip()
    return out


def build_variant(s) -> str:
    """The arm whose build every arm runs on: the one with patches, else the first."""
    from .variants import load_variant
    patched = [v for v in s.variants if load_variant(v).patches]
    return patched[0] if patched else s.variants[0]


def commands(arms: list[str]) -> dict[str, tuple[dict[str, str], list[str]]]:
    """For each arm: the options to SETCONF and those to RESETCONF (set by another arm, not by
    this one: back to tor's default, which is what a relay of this arm runs with)."""
    opts = {a: arm_options(a) for a in arms}
    every = sorted({k for o in opts.values() for k in o})
    return {a: (opts[a], [k for k in every if k not in opts[a]]) for a in arms}


def check(s) -> list[tuple[str, str]]:
    """What makes a scenario's crossover section unrunnable, as (field, problem)."""
    c = s.crossover
    if c is None:
        return []
    from .variants import VariantError, load_variant
    problems = []
    if len(s.variants) < 2:
        problems.append(("crossover", "a crossover needs two or more variants (its arms)"))
        return problems
    try:
        vs = [load_variant(v) for v in s.variants]
    except VariantError:
        return problems   # the variants check names it
    for v in vs:
        if not v.runtime_switch:
            problems.append(("crossover", f"variant {v.name}: the {v.family} family's options do not all apply at "
                                          "run time (variant.yaml runtime_switch); crossover arms: vanilla, ewma-H, "
                                          "kist, kistlite"))
    patch_sets = {tuple(p.name for p in v.patches) for v in vs if v.patches}
    if len(patch_sets) > 1:
        problems.append(("crossover", f"arms with different patches ({', '.join(v.name for v in vs if v.patches)}) "
                                      "cannot share one build"))
    for g, rg in s.network.relays.items():
        if rg.variant:
            problems.append((f"network.relays.{g}.variant", "a crossover switches every relay between the arms: "
                                                           "no group may keep a variant of its own"))
        if rg.torrc:
            keys = {line.split()[0].lstrip("+/").lower() for line in rg.torrc.splitlines()
                    if line.strip() and not line.strip().startswith("#")}
            clash = sorted(k for v in vs for k in arm_options(v.name) if k.lower() in keys)
            if clash:
                problems.append((f"network.relays.{g}.torrc", f"sets {', '.join(dict.fromkeys(clash))}, which the "
                                                             "crossover's arms switch"))
    if c.washout.seconds >= c.period.seconds:
        problems.append(("crossover.washout", f"{c.washout.seconds:g} s leaves nothing of a {c.period.seconds:g} s "
                                              "period to measure"))
    want = c.cycles * len(s.variants) * c.period.seconds
    if abs(s.measure.duration.seconds - want) > 1e-6:
        problems.append(("measure.duration", f"{s.measure.duration.seconds:g} s; a crossover of {c.cycles} cycle(s) "
                                             f"x {len(s.variants)} arms x {c.period.seconds:g} s periods measures "
                                             f"{want:g} s: set measure.duration to {want:g}s"))
    return problems


def order(s, k: int) -> list[str]:
    """The arms' order in repetition k: a seeded shuffle, reversed every other cycle."""
    base = list(s.variants)
    random.Random(f"crossover:{s.seed}:{k}").shuffle(base)
    out = []
    for c in range(s.crossover.cycles):
        out += base if c % 2 == 0 else list(reversed(base))
    return out


def schedule(s, k: int) -> list[Period]:
    c = s.crossover
    w, p, wash = s.measure.warmup.seconds, c.period.seconds, c.washout.seconds
    return [Period(i, arm, w + i * p, w + i * p + wash, w + (i + 1) * p) for i, arm in enumerate(order(s, k))]


class Switcher:
    """Applies the arms on schedule: ``apply(period)`` sets every relay to that period's arm;
    ``tick(now)`` applies the next one when its time has come and returns when the one after
    is due. ``control(name)`` returns a stem Controller (authenticated) for a relay; the
    switches go to RECORDS. A relay that refuses is a failed repetition (RunFailed)."""

    def __init__(self, s, k: int, relays: list[str], control, out_dir: Path, t_work: float):
        self.periods = schedule(s, k)
        self.cmds = commands(list(s.variants))
        self.relays, self.control, self.t_work = relays, control, t_work
        self.path = Path(out_dir) / RECORDS
        self.next = 0
        self.ctl = {}

    def _ctl(self, name: str):
        if name not in self.ctl:
            self.ctl[name] = self.control(name)
        return self.ctl[name]

    def apply(self, period: Period) -> dict:
        from .errors import RunFailed
        setconf, reset = self.cmds[period.arm]
        t0, results = time.time(), {}
        for name in self.relays:
            try:
                ctl = self._ctl(name)
                if reset:
                    ctl.reset_conf(*reset)
                if setconf:
                    ctl.set_options(setconf)
                results[name] = "ok"
            except Exception as e:   # noqa: BLE001 - stem raises several kinds; all fail the switch
                results[name] = f"{type(e).__name__}: {e}"
        rec = {"type": "switch", "t": time.time(), "t_planned": self.t_work + period.start, "took_s":
               round(time.time() - t0, 4), "period": period.index, "arm": period.arm, "setconf": setconf,
               "resetconf": reset, "relays": results}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        bad = {n: r for n, r in results.items() if r != "ok"}
        if bad:
            raise RunFailed(f"crossover: switching to {period.arm} failed at " +
                            "; ".join(f"{n}: {r}" for n, r in sorted(bad.items())))
        return rec

    def first(self) -> dict:
        """The first period's arm, before the workload starts (the warm-up runs under it)."""
        self.next = 1
        return self.apply(self.periods[0])

    def tick(self, now: float) -> float | None:
        while self.next < len(self.periods) and now >= self.t_work + self.periods[self.next].start:
            self.apply(self.periods[self.next])
            self.next += 1
        return self.t_work + self.periods[self.next].start if self.next < len(self.periods) else None

    def close(self) -> None:
        for c in self.ctl.values():
            try:
                c.close()
            except Exception:   # noqa: BLE001 - closing a dead controller
                pass
        self.ctl = {}


def _spans(periods: list[Period], arm: str, t_work: float) -> list[tuple[float, float]]:
    return [(t_work + p.measured_from, t_work + p.end) for p in periods if p.arm == arm]


def _read(path: Path) -> list[dict]:
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass      # a line cut by a crash: the loader notes it in the raw repetition
    return out


def _write(path: Path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def split(run_dir: Path, k: int, s, periods: list[Period]) -> list[Path]:
    """Write ``<arm>/rep-<k>`` for every arm from ``crossover/rep-<k>`` (module docstring);
    returns the directories. Runs whatever the repetition's status (a failed one gives arms
    that say so)."""
    src = Path(run_dir) / SOURCE / f"rep-{k}"
    meta = json.loads((src / "meta.json").read_text())
    t_work = meta.get("t_workload_start")
    out = []
    for arm in s.variants:
        dst = Path(run_dir) / arm / f"rep-{k}"
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        spans = _spans(periods, arm, t_work) if isinstance(t_work, (int, float)) else []

        def inside(t, spans=spans) -> bool:
            return isinstance(t, (int, float)) and any(a <= t < b for a, b in spans)

        if (src / "transfers.jsonl").is_file():
            kept = []
            for t in _read(src / "transfers.jsonl"):
                start = t.get("t_start")
                span = next(((a, b) for a, b in spans if isinstance(start, (int, float)) and a <= start < b), None)
                if span is None or t.get("warmup") is True:
                    continue
                end = t.get("t_last_byte")
                if t.get("status") == "ok" and isinstance(end, (int, float)) and end > span[1]:
                    t = {**t, "status": "cancelled", "t_censor": span[1], "crossover_cut": True}
                elif t.get("status") == "cancelled":
                    tc = t.get("t_censor")
                    t = {**t, "t_censor": min(tc, span[1]) if isinstance(tc, (int, float)) else span[1]}
                kept.append(t)
            _write(dst / "transfers.jsonl", kept)
        for name, key in TIMED.items():
            if (src / name).is_file():
                _write(dst / name, [r for r in _read(src / name) if inside(r.get(key))])
        for name in WHOLE:
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)
        m = dict(meta)
        m["variant"] = arm
        m["crossover"] = {"source": f"{SOURCE}/rep-{k}", "build_variant": meta.get("variant"),
                          "period_s": s.crossover.period.seconds, "washout_s": s.crossover.washout.seconds,
                          "spans": [[a, b] for a, b in spans],
                          "order": [p.arm for p in periods]}
        try:
            from .variants import describe
            m["variant_specs"] = {arm: describe(arm)}
        except Exception:   # noqa: BLE001 - the record stands without it
            pass
        (dst / "meta.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
        out.append(dst)
    return out
