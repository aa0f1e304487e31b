"""Builds what the integration tests run, before they run: `python -m tests.integration.prebuild`.

A stage of its own in hack/run-tests.sh, so the integration stage's time is the tests' time
and a cold machine's builds show up under their own name. Everything lands in the same
content-keyed caches the tests read (~/.cache/torbed/tor, ~/.cache/torbed/check), so a warm
machine passes through in a second:

- every variant family's tor (torbed.builds: the stock build and each patch set);
- the `build-tor.sh --check` builds (tor's unit tests with our patches, -Werror) of the
  patched variants whose tests assert on them (helpers.checked_build).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.integration.helpers import checked_build
from torbed import builds
from torbed.variants import list_families, load_variant

CHECKED = ("torchestra", "circswitch", "mtrelay")


def main() -> int:
    for family in [None, *list_families()]:
        t0 = time.time()
        b = builds.ensure(load_variant(family) if family else None)
        print(f"prebuild: tor {family or 'stock'} ({b.key}) {time.time() - t0:.0f} s", flush=True)
    for name in CHECKED:
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            checked_build(name, Path(tmp))
        print(f"prebuild: --check {name} {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
