"""Reading a tor patch's text in variant tests (the patches are our own C)."""

from __future__ import annotations

import re
from pathlib import Path


def c_format(patch: Path, pattern: str) -> str:
    """The format string of the patch's log call that starts with ``pattern``: the C string
    literal pieces of the call joined (lines of an added file start with '+')."""
    text = patch.read_text()
    i = text.rindex("log_", 0, text.index(pattern))
    call = text[i:text.index(");", i)].replace('%"PRIu64', '%u"')
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call))
