"""The nightly definition file (apiVersion torbed/v1, kind Nightly).

Decoded strictly (an unknown key is an error naming its path), defaulted and validated
before anything runs; every scenario it names is loaded and checked too, so a misspelled
variant fails in the evening, not at 2 a.m.

Public API:

- ``NightlySpec`` (pydantic model), ``MatrixEntry``, ``Thresholds``
- ``load(path) -> NightlySpec``; raises ``NightlyError`` (a ScenarioError: file + field path)
- ``parse(data, source, base_dir) -> NightlySpec``
- ``COMPARE_KEYS``: what a history key can be made of
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from .. import resources, safeload, units
from ..scenario import Duration, Percent, ScenarioError, Strict, _loc, _message
from .. import scenario as scenario_mod

COMPARE_KEYS = ("scenario", "scenario_sha256", "variant", "tor_version", "torbed_version", "hardware", "backend", "host")
# Metrics for which larger is better; for every other metric (times, waits) smaller is.
HIGHER_IS_BETTER = ("relay_throughput_Bps",)
CRON_FIELD = r"(\*|[0-9,\-*/]+)"
MAX_BYTES = 1 << 20


class NightlyError(ScenarioError):
    """A nightly file that cannot be used (file, [(field path, message)])."""


class MatrixEntry(Strict):
    scenario: str = Field(description="scenario file (relative to the nightly file's directory)")
    variants: list[str] | None = Field(default=None, description="default: the scenario's variants")
    repetitions: int | None = Field(default=None, ge=1, le=100, description="default: the scenario's")
    duration: Duration | None = Field(default=None, description="override measure.duration")


class Thresholds(Strict):
    z: float = Field(default=3.0, gt=0, description="|z| of tonight's median against the lookback nights")
    p: float = Field(default=0.01, gt=0, lt=1, description="Mann-Whitney p-value, tonight's samples vs the lookback's")
    min_change: Percent = Field(default="5%", description="smallest relative change of the median worth a flag")


class NightlySpec(Strict):
    apiVersion: Literal["torbed/v1"]
    kind: Literal["Nightly"]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    schedule: str = Field(default="30 2 * * *", description="cron schedule (the Kubernetes CronJob's)")
    timeZone: str = Field(default="Etc/UTC", description="IANA time zone of the schedule")
    deadline: Duration = Field(default="4h", description="the whole matrix must finish within this")
    matrix: list[MatrixEntry] = Field(min_length=1)
    metrics: list[str] = Field(default_factory=lambda: ["ttlb_s/*", "ttfb_s/*", "relay_throughput_Bps/*"],
                               min_length=1, description="metric ids of the report (shell patterns)")
    lookback: int = Field(default=7, ge=2, le=365, description="earlier nights compared with tonight")
    min_history: int = Field(default=3, ge=2, description="nights needed before anything is flagged")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    compare_by: list[str] = Field(default_factory=lambda: ["scenario", "scenario_sha256", "variant", "tor_version",
                                                           "torbed_version", "hardware", "backend"],
                                  description="run fields that must match for nights to be compared; "
                                              "scenario is its name, scenario_sha256 its resolved content")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        parts = v.split()
        if len(parts) != 5 or not all(re.fullmatch(CRON_FIELD, p) for p in parts):
            raise ValueError(f"{v!r} is not a 5-field cron schedule (minute hour day month weekday)")
        return v

    @field_validator("compare_by")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        bad = [k for k in v if k not in COMPARE_KEYS]
        if bad:
            raise ValueError(f"unknown key(s) {', '.join(bad)} (allowed: {', '.join(COMPARE_KEYS)})")
        for must in ("scenario", "variant"):
            if must not in v:
                raise ValueError(f"must include '{must}': only like is compared with like")
        return v

    @property
    def deadline_s(self) -> float:
        return units.parse_duration(self.deadline)

    @property
    def min_change_fraction(self) -> float:
        return units.parse_percent(self.thresholds.min_change) / 100.0

    def tracks(self, metric_id: str) -> bool:
        return any(fnmatch.fnmatchcase(metric_id, pat) for pat in self.metrics)

    def scenario_path(self, entry: MatrixEntry) -> Path:
        """Relative paths: beside the nightly file first, then in torbed's own scenarios
        (so a definition mounted from a ConfigMap can name `scenarios/quickstart.yaml`)."""
        p = Path(entry.scenario)
        if p.is_absolute():
            return p
        here = (self._base_dir / p).resolve()
        if here.exists():
            return here
        shipped = (resources.ROOT / p).resolve()
        return shipped if shipped.exists() else here

    _base_dir: Path = Path(".")


def higher_is_better(metric_id: str) -> bool:
    return metric_id.split("/", 1)[0] in HIGHER_IS_BETTER


def parse(data: object, source: str = "<data>", base_dir: Path | None = None) -> NightlySpec:
    if not isinstance(data, dict):
        raise NightlyError(source, [("", f"a nightly file is a mapping, got {type(data).__name__}")])
    try:
        spec = NightlySpec.model_validate(data)
    except ValidationError as e:
        raise NightlyError(source, [(_loc(err["loc"]), _message(err)) for err in e.errors()]) from None
    spec._base_dir = base_dir or Path(".").resolve()
    problems: list[tuple[str, str]] = []
    if spec.min_history > spec.lookback:
        problems.append(("min_history", f"{spec.min_history} is more than lookback ({spec.lookback})"))
    for i, entry in enumerate(spec.matrix):
        path = spec.scenario_path(entry)
        try:
            s = scenario_mod.load(path)
        except ScenarioError as e:
            problems.append((f"matrix[{i}].scenario", f"{entry.scenario}: " + "; ".join(
                f"{p or '<top level>'}: {m}" for p, m in e.problems)))
            continue
        for v in entry.variants or []:
            if v not in s.variants:
                problems.append((f"matrix[{i}].variants", f"{v!r} is not among {entry.scenario}'s variants "
                                 f"({', '.join(s.variants)})"))
    if problems:
        raise NightlyError(source, problems)
    return spec


def load(path: str | Path) -> NightlySpec:
    """Read a nightly file (through torbed.safeload: bounded size and nesting, UTF-8 text).
    Raises NightlyError naming the file and the field."""
    path = Path(path)
    try:
        data = safeload.load_yaml(path, "nightly file", max_bytes=MAX_BYTES)
    except safeload.FileInputError as e:
        raise NightlyError(str(path), [("", e.why)]) from None
    return parse(data, str(path), base_dir=path.resolve().parent)
