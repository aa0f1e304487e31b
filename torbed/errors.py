"""torbed's exception tree and exit codes: every error a user can meet carries its exit code.

    TorbedError (exit 1)
    +-- InputError (exit 2)    bad input: scenario, trace, pcap, values, arguments, a run
    |   |                      directory; raised before anything starts; the message names
    |   |                      the file and field
    |   +-- HostBusy (exit 2)  `torbed run --require-quiet` on a busy machine (torbed.hostload)
    +-- RunFailed (exit 1)     a run, build or repetition failed
    +-- Interrupted (exit 130) SIGINT or SIGTERM during a run; cleanup has happened

The CLI maps them once (``torbed.cli.main``, by ``exit_code``). Module errors subclass these:
ScenarioError, NightlyError, TraceError, PcapError, VariantError and the analysis' RunDirError,
RecordError, ... are InputErrors; BuildError, NodeFailed, NetnsError, KubernetesError,
HistoryError, NightlyBusy are RunFailed; torbed.analysis.errors.AnalysisError is the root of the
analysis' own. A caller catches the class it means, never a tuple of unrelated ones.

Exit codes (defined here only): 0 ok; 1 failed; 2 bad input; 3 ``torbed nightly`` flagged a
regression (a result, not an error: a failed run takes precedence); 130 interrupted.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_REGRESSION = 3
EXIT_INTERRUPTED = 130


class TorbedError(Exception):
    """Base of torbed's errors. ``exit_code``: what ``torbed`` exits with."""

    exit_code = EXIT_FAILED


class InputError(TorbedError):
    """Input that cannot be used (a file, a field, an argument). Exit 2."""

    exit_code = EXIT_BAD_INPUT


class HostBusy(InputError):
    """``torbed run --require-quiet`` and the machine is busy with something else (exit 2,
    before anything starts)."""


class RunFailed(TorbedError):
    """A run, a repetition or a build failed. Exit 1."""

    exit_code = EXIT_FAILED


class Interrupted(TorbedError):
    """SIGINT or SIGTERM during a run. Exit 130.

    The engine's signal handler raises it and also remembers the signal, so a broad
    ``except Exception`` deep in a backend cannot swallow it for good: the engine checks
    again between polls and repetitions."""

    exit_code = EXIT_INTERRUPTED
