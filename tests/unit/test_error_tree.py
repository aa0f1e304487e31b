"""One exception tree (torbed.errors): the errors a user meets carry their exit code, which
torbed.cli.report maps once."""

from __future__ import annotations

import pytest

from torbed import errors


def _classes():
    from torbed.analysis import errors as analysis_errors
    from torbed.nightly.history import HistoryError
    from torbed.nightly.runner import NightlyBusy
    from torbed.nightly.spec import NightlyError
    from torbed.replay.pcap import PcapError
    from torbed.replay.trace import TraceError
    from torbed.scenario import ScenarioError
    from torbed.variants import VariantError
    bad_input = [analysis_errors.InputError, analysis_errors.RunDirError, analysis_errors.RecordError,
                 analysis_errors.UnknownVariantError, analysis_errors.ScenarioMismatchError, NightlyError,
                 PcapError, TraceError, ScenarioError, VariantError, errors.HostBusy]
    failed = [analysis_errors.AnalysisError, HistoryError, NightlyBusy, errors.RunFailed]
    return bad_input, failed


def test_every_error_is_in_the_tree_with_its_exit_code():
    bad_input, failed = _classes()
    for cls in bad_input:
        assert issubclass(cls, errors.InputError) and cls.exit_code == errors.EXIT_BAD_INPUT, cls
    for cls in failed:
        assert issubclass(cls, errors.TorbedError) and not issubclass(cls, errors.InputError), cls
        assert cls.exit_code == errors.EXIT_FAILED, cls


def test_exit_codes_are_defined_once():
    from torbed.analysis import cli as analysis_cli
    from torbed.nightly import runner
    from torbed.replay import cli as replay_cli
    for mod in (analysis_cli, replay_cli, runner):
        for name in ("EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_REGRESSION", "EXIT_INTERRUPTED"):
            if hasattr(mod, name):
                assert getattr(mod, name) is getattr(errors, name), (mod.__name__, name)
    assert len({errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_BAD_INPUT, errors.EXIT_REGRESSION,
                errors.EXIT_INTERRUPTED}) == 5


@pytest.mark.parametrize("error, code, shown", [
    (errors.InputError("a.yaml: links.x: bad\nb.yaml: y: worse"), 2, ["error a.yaml: links.x: bad", "error b.yaml: y: worse"]),
    (errors.RunFailed("tor exited"), 1, ["error tor exited"]),
    (errors.Interrupted("SIGINT"), 130, ["interrupted (SIGINT)"]),
])
def test_the_one_mapper(error, code, shown, capsys):
    from torbed.cli import report
    assert report(error) == code
    err = capsys.readouterr().err
    assert all(s in err for s in shown) and "Traceback" not in err
