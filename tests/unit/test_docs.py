"""The documentation stays true: its commands exist, its reference pages are in sync, the site builds.

- Every shell command in a fenced ``sh``/``bash``/``shell``/``console`` block of README.md and
  docs/**/*.md is checked without running it: a ``make X`` target exists in the Makefile, a
  ``torbed SUB ...`` parses with torbed's own argparse parser, a ``python -m MODULE`` module
  exists, a path into the repository (``scenarios/...``, ``hack/...``, ``charts/...``) exists,
  and a scenario named passes ``torbed validate``; a whole scenario shown in a ``yaml`` block
  is valid. A command that is an example, not a command,
  belongs in a block of another language (``text``).
- docs/reference/ is what ``torbed docs-ref`` generates from the sources.
- ``mkdocs build --strict`` succeeds (a broken link or anchor, a page missing from the nav fail),
  the same build ``make docs`` runs.
- README.md stays a front page.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
# Paths into the repository that a command may name; a word starting with one must exist.
REPO_DIRS = ("analysis/", "charts/", "docs/", "hack/", "images/", "replay/", "scenarios/", "tests/", "torbed/")
SEPARATORS = {"&&", "||", ";", "|", "&"}
PLACEHOLDER = re.compile(r"[<>$*{}\[\]]|\b[A-Z][A-Z_]{2,}\b")   # <name>, $VAR, globs, RUN_DIR


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fenced_blocks(text: str):
    """(language, line number of the block's first line, body) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i + 2
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        yield lang, start, "\n".join(lines[i + 1:j])
        i = j + 1


def shell_commands(body: str, first_line: int):
    """(line number, words) of each simple command in a shell block; comments, prompts,
    continuations and command separators handled."""
    logical: list[tuple[int, str]] = []
    pending, pending_line = "", 0
    for n, line in enumerate(body.splitlines(), first_line):
        if not pending:
            pending_line = n
            line = re.sub(r"^\s*[$#]\s+(?=\S)", "", line) if line.lstrip().startswith("$ ") else line
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append((pending_line, pending + line))
        pending = ""
    if pending:
        logical.append((pending_line, pending))
    for n, line in logical:
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        lex.commenters = "#"
        words: list[str] = []
        for tok in lex:
            if tok in SEPARATORS:
                if words:
                    yield n, words
                words = []
            else:
                words.append(tok)
        if words:
            yield n, words


def makefile_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_./-][A-Za-z0-9_./ -]*?)\s*::?(?!=)", line)
        if m and not line.startswith("\t"):
            targets.update(m.group(1).split())
    return targets


def _parse_torbed(args: list[str]) -> str | None:
    """None when torbed's parser accepts args, else its complaint."""
    from torbed.cli import build_parser
    if "--" in args:                     # as torbed.cli.main: what follows is another command's
        args = args[:args.index("--")]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):      # --help and --version exit 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def _validate(scenario: str) -> str | None:
    from torbed import cli
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["validate", scenario])
    return None if rc == 0 else f"torbed validate {scenario} exits {rc}"


def check_command(words: list[str], targets: set[str]) -> list[str]:
    """What is wrong with one documented command (empty: nothing)."""
    problems = []
    words = list(words)
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("sudo", "env", "time", "exec")):
        words.pop(0)                     # VAR=value prefixes, wrappers
    if not words or words[0] in ("export", "eval", "cd", "echo"):
        return problems
    cmd, args = words[0], words[1:]
    # Paths into the repository, bare or as an option's value (-f FILE, --x=FILE, KEY=FILE).
    for w in words:
        value = w.split("=", 1)[1] if "=" in w and not w.startswith(REPO_DIRS) else w
        # torbed/relay:vanilla-0.1.0 is an image, not a path
        if value.startswith(REPO_DIRS) and ":" not in value and not PLACEHOLDER.search(value):
            if not (ROOT / value).exists():
                problems.append(f"{value}: no such file in the repository")
            elif re.match(r"^scenarios/(?!nightly/).*\.ya?ml$", value):
                bad = _validate(str(ROOT / value))
                if bad:
                    problems.append(bad)
    name = cmd.rsplit("/", 1)[-1]
    if name == "make":
        for a in args:
            if not a.startswith("-") and "=" not in a and a not in targets:
                problems.append(f"make {a}: no such target in the Makefile")
    elif name == "torbed":
        bad = _parse_torbed(args)
        if bad:
            problems.append(f"torbed {' '.join(args)}: {bad}")
    elif re.match(r"^python3?(\.\d+)?$", name) and len(args) >= 2 and args[0] == "-m":
        mod = args[1]
        if mod.startswith("torbed") and importlib.util.find_spec(mod) is None:
            problems.append(f"python -m {mod}: no such module")
    return problems


def documented_commands():
    out = []
    for path in doc_files():
        for lang, start, body in fenced_blocks(path.read_text()):
            if lang in SHELL_LANGS:
                for n, words in shell_commands(body, start):
                    out.append(pytest.param(words, id=f"{path.relative_to(ROOT)}:{n}"))
    return out


COMMANDS = documented_commands()


def test_docs_have_commands():
    # The extraction itself works: the README's two set-up commands are found.
    ids = [p.id for p in COMMANDS]
    assert any(i.startswith("README.md:") for i in ids)
    assert ["make", "demo"] in [p.values[0] for p in COMMANDS]
    assert ["make", "test"] in [p.values[0] for p in COMMANDS]


@pytest.mark.parametrize("words", COMMANDS)
def test_documented_command(words):
    assert check_command(words, makefile_targets()) == [], " ".join(words)


@pytest.mark.parametrize("doc,wrong", [
    ("```sh\nmake demo-please\n```", "no such target"),
    ("```sh\n.venv/bin/torbed run scenarios/quickstart.yaml --repetitons 3\n```", "unrecognized arguments"),
    ("```sh\ntorbed valdate scenarios/quickstart.yaml\n```", "invalid choice"),
    ("```bash\nhack/no-such-script.sh up  # comment\n```", "no such file"),
    ("```sh\nmake setup && helm install qs charts/torbed -f scenarios/quickstrat.yaml\n```", "no such file"),
    ("```sh\npython -m torbed.no_such_module --help\n```", "no such module"),
    ("```console\n$ torbed plan \\\n    scenarios/quickstart.yaml --jsn\n```", "unrecognized arguments"),
])
def test_checker_finds_wrong_commands(doc, wrong):
    found = [p for _, start, body in fenced_blocks(doc) for _, words in shell_commands(body, start)
             for p in check_command(words, makefile_targets())]
    assert any(wrong in p for p in found), found


def test_checker_finds_invalid_scenario(tmp_path, monkeypatch):
    # Not written into the repository: the check is pointed at a copy of its layout instead.
    root = tmp_path / "repo"
    (root / "scenarios").mkdir(parents=True)
    (root / "scenarios" / "invalid.yaml").write_text((ROOT / "scenarios" / "quickstart.yaml").read_text()
                                                     .replace("repetitions: 1", "repetitions: 0"))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    assert any("torbed validate" in p for p in check_command(["torbed", "run", "scenarios/invalid.yaml"], set()))


def test_checker_accepts_good_commands():
    doc = ("```sh\nmake setup   # comment\nRUN=$(.venv/bin/torbed run scenarios/quickstart.yaml --repetitions 3)\n"
           "torbed report \"$RUN\" && torbed --version\ntorbed capture out.jsonl -- ssh host\n```")
    found = [p for _, start, body in fenced_blocks(doc) for _, words in shell_commands(body, start)
             for p in check_command(words, makefile_targets())]
    assert found == []


def scenario_examples():
    out = []
    for path in doc_files():
        for lang, start, body in fenced_blocks(path.read_text()):
            if lang in ("yaml", "yml") and body.lstrip().startswith("apiVersion: torbed/v1"):
                out.append(pytest.param(body, id=f"{path.relative_to(ROOT)}:{start}"))
    return out


@pytest.mark.parametrize("body", scenario_examples())
def test_documented_scenario_is_valid(body):
    # A whole scenario shown in the docs decodes and validates as `torbed validate` would.
    import yaml
    from torbed import scenario
    scenario.parse(yaml.safe_load(body), "example")


def test_reference_pages_in_sync():
    from torbed import docsref
    assert docsref.check() == [], "run `make docs-ref` (torbed docs-ref)"


def test_every_option_is_in_the_cli_reference():
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for sub in ("run", "report", "validate", "trace convert"):
        assert f"## torbed {sub}" in text


def test_every_scenario_field_is_in_the_reference():
    from torbed.scenario import Scenario
    text = (ROOT / "docs" / "reference" / "scenario.md").read_text()
    for field in Scenario.model_fields:
        assert f"| `{field}` |" in text
    assert "| `measure.prometheus.scrape_interval` |" in text


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, "README.md is a front page: move the detail into docs/"
    head = "\n".join(lines[:6])
    assert "make demo" in head and "make test" in head


@pytest.mark.timeout(120)
def test_site_builds_strict(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed: make setup installs it (pyproject's docs extra)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "scenario.html").exists()
