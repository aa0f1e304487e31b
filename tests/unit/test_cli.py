"""CLI conventions: --version, the help lists every command, --json where a script reads
a table, errors as one line with the exit code of torbed.errors."""

from __future__ import annotations

import json
import re

import pytest

from torbed import __version__, cli


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"torbed {__version__}"


def test_top_level_help_lists_every_command(capsys):
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"validate", "plan", "run", "report", "compare", "capture", "trace", "variants"} <= set(commands)
    described = set(re.findall(r"^    ([a-z-]+)", cli.__doc__, re.M))
    assert described == set(commands), f"cli docstring and subcommands differ: {described ^ set(commands)}"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for c in commands:
        assert c in out


def test_variants_json(capsys):
    assert cli.main(["variants", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    families = {v["family"]: v for v in data["variants"]}
    assert {"vanilla", "ewma", "kist", "kistlite"} <= set(families)
    assert families["ewma"]["parameters"] == ["halflife"]
    assert families["vanilla"]["patches"] and isinstance(families["vanilla"]["built"], bool)
    assert families["torchestra"]["presets"]["exp1"] == {"heavy_threshold": 1.4, "idle_multiplier": 0.18}
    assert families["ewma"]["presets"] == {}


def test_plan_json_says_what_a_backend_cannot_run(tmp_path, capsys, repo):
    assert cli.main(["plan", str(repo / "scenarios" / "quickstart.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unsupported"] == {}, "quickstart runs on every backend"
    text = (repo / "scenarios" / "quickstart.yaml").read_text()
    f = tmp_path / "d.yaml"
    f.write_text(text.replace("default: {rate: 100mbit}", "default: {rate: 100mbit, delay: 5ms}"))
    assert cli.main(["plan", str(f), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "links.delay" in data["unsupported"]["k8s"]


def test_bad_arguments_are_input_errors(tmp_path, capsys, repo):
    q = str(repo / "scenarios" / "quickstart.yaml")
    assert cli.main(["run", q, "--variant", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--variant nope" in err[0]
    assert cli.main(["run", q, "--duration", "5q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--duration" in err[0] and "5q" in err[0]
    # --warmup is checked like the file's measure.warmup (shorter than the duration).
    assert cli.main(["run", q, "--warmup", "30s", "--duration", "20s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--warmup" in err[0] and "not shorter than duration 20s" in err[0]
    assert cli.main(["plan", q, "--variant", "nope"]) == 2


def test_starting_torbed_does_not_load_the_report_libraries():
    """Every `torbed` command builds the whole parser; scipy and matplotlib (the report's) took
    ~2 s of a `torbed run` before it did anything, so they load only in the commands that use
    them. A fresh interpreter, since this test session has imported them already."""
    import subprocess
    import sys
    code = ("import sys; from torbed import cli; cli.build_parser(); "
            "print(sorted(m for m in ('scipy', 'matplotlib', 'torbed.analysis.report') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout


def test_aa_default_repetitions_are_the_tests_minimum():
    from torbed.analysis import cli as analysis_cli, stats
    assert analysis_cli.AA_REPETITIONS == stats.MIN_REPS
