"""The exceptions of torbed.analysis, a branch of torbed's one tree (torbed.errors).

    torbed.errors.TorbedError
      AnalysisError               anything this package raises on purpose (exit 1)
        InputError                the input is wrong (also a torbed.errors.InputError): exit 2
          RunDirError             not a run directory (no or unreadable run.json, ...)
          RecordError             a malformed record: carries the file and line number
          UnknownVariantError     --baseline (or a compare argument) names no variant of the run
          ScenarioMismatchError   compare: the two runs are of different scenarios

Anything else escaping a command (an OSError writing the report, a bug) is a failure: exit 1.
"""

from __future__ import annotations

from pathlib import Path

from .. import errors


class AnalysisError(errors.TorbedError):
    """Base class of the errors raised on purpose by torbed.analysis."""


class InputError(AnalysisError, errors.InputError):
    """The input (a run directory, an argument) is wrong; the CLI exits 2."""


class RunDirError(InputError):
    """The directory is not a usable run directory (e.g. run.json missing or not JSON)."""


class RecordError(InputError):
    """A record (a line of a JSON-lines file, or a JSON file) is malformed.

    Attributes: ``path`` (the file), ``line`` (1-based line number, or None for a whole
    JSON file), ``reason`` (what is wrong).
    """

    def __init__(self, path: str | Path, line: int | None, reason: str):
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {reason}")


class UnknownVariantError(InputError):
    """A variant name given by the user is not one of the run's variants."""


class ScenarioMismatchError(InputError):
    """compare: RUN_A and RUN_B were made from different scenarios (use --force to compare anyway)."""
