"""Unit strings used in scenarios: sizes, rates, durations and percentages.

Scenario files spell quantities as strings ("300KB", "5MiB", "3mbit", "20ms", "15m",
"1%") so a reader never has to guess the unit. This module turns them into numbers.

Public API:

- ``parse_size(text) -> int``         bytes ("300KB" = 300000, "5MiB" = 5242880)
- ``parse_rate(text) -> int``         bits per second ("3mbit" = 3000000, "1MB/s" = 8000000)
- ``parse_duration(text) -> float``   seconds ("20ms" = 0.02, "15m" = 900.0)
- ``parse_percent(text) -> float``    fraction ("1%" = 0.01, "0.5%" = 0.005)
- ``format_size / format_rate / format_duration`` for human-readable output.
- ``Size``, ``Rate``, ``Duration``, ``Percent``: the user's string, parsed once. A scenario's
  unit fields hold these (str subclasses, so files, run.json and Helm values keep the
  user's spelling) and every stage reads the number: ``.bytes``, ``.bps``, ``.seconds``,
  ``.fraction``.

Every parser raises ``ValueError`` with a message that shows accepted spellings.
"""

from __future__ import annotations

import re

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?)\s*"

SIZE_UNITS = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3,
}
# tc's spelling: bit-based units for link rates; byte-based units with "/s".
RATE_UNITS = {
    "bit": 1, "kbit": 1000, "mbit": 1000**2, "gbit": 1000**3,
    "B/s": 8, "KB/s": 8 * 1000, "MB/s": 8 * 1000**2, "GB/s": 8 * 1000**3,
    "KiB/s": 8 * 1024, "MiB/s": 8 * 1024**2, "GiB/s": 8 * 1024**3,
}
DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

SIZE_EXAMPLES = "e.g. '300KB', '5MiB', '1GB' (units: " + ", ".join(SIZE_UNITS) + ")"
RATE_EXAMPLES = "e.g. '3mbit', '500kbit', '1MB/s' (units: " + ", ".join(RATE_UNITS) + ")"
DURATION_EXAMPLES = "e.g. '20ms', '5s', '15m' (units: " + ", ".join(DURATION_UNITS) + ")"
PERCENT_EXAMPLES = "e.g. '1%', '0.5%' (0% to 100%)"


def _split(text: object, units: dict[str, float], kind: str, examples: str) -> tuple[float, float]:
    if not isinstance(text, str):
        raise ValueError(f"{kind} must be a string with a unit, {examples}; got {text!r}")
    m = re.fullmatch(_NUMBER + r"(?P<unit>[A-Za-z/]+)", text.strip())
    if not m or m.group("unit") not in units:
        raise ValueError(f"not a {kind}: {text!r}; use {examples}")
    return float(m.group("num")), units[m.group("unit")]


def parse_size(text: object) -> int:
    """Return the number of bytes in a size string like '300KB' or '5MiB'."""
    num, mult = _split(text, SIZE_UNITS, "size", SIZE_EXAMPLES)
    return int(round(num * mult))


def parse_rate(text: object) -> int:
    """Return bits per second for a rate string like '3mbit' or '1MB/s'."""
    num, mult = _split(text, RATE_UNITS, "rate", RATE_EXAMPLES)
    return int(round(num * mult))


def parse_duration(text: object) -> float:
    """Return seconds for a duration string like '20ms', '5s' or '15m'."""
    num, mult = _split(text, DURATION_UNITS, "duration", DURATION_EXAMPLES)
    return num * mult


def parse_percent(text: object) -> float:
    """Return a fraction in [0, 1] for a percentage string like '1%'."""
    if not isinstance(text, str) or not re.fullmatch(_NUMBER + "%", text.strip()):
        raise ValueError(f"not a percentage: {text!r}; use {PERCENT_EXAMPLES}")
    value = float(text.strip()[:-1]) / 100.0
    if value > 1.0:
        raise ValueError(f"percentage above 100%: {text!r}")
    return value


def format_size(n: float) -> str:
    for unit, mult in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= mult:
            return f"{n / mult:.3g} {unit}"
    return f"{int(n)} B"


def format_rate(bps: float) -> str:
    for unit, mult in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= mult:
            return f"{bps / mult:.3g} {unit}"
    return f"{int(bps)} bit/s"


def format_duration(s: float) -> str:
    if s >= 60:
        return f"{s / 60:.3g} min"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1000:.3g} ms"


class Quantity(str):
    """A unit string as written, with its value parsed once (``.value``)."""

    parse = staticmethod(lambda text: float(text))

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.value = cls.parse(text)
        return obj

    def __reduce__(self):   # pickle/copy as the class, re-parsed
        return (type(self), (str(self),))


class Size(Quantity):
    parse = staticmethod(parse_size)

    @property
    def bytes(self) -> int:
        return self.value


class Rate(Quantity):
    parse = staticmethod(parse_rate)

    @property
    def bps(self) -> int:
        return self.value


class Duration(Quantity):
    parse = staticmethod(parse_duration)

    @property
    def seconds(self) -> float:
        return self.value


class Percent(Quantity):
    parse = staticmethod(parse_percent)

    @property
    def fraction(self) -> float:
        return self.value
