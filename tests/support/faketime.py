"""libfaketime for the clock tests: child processes whose wall clock is off.

``faketime_env("-1h")`` is this environment plus what runs a child with its wall clock
(CLOCK_REALTIME: ``time.time()``, what the store stamps messages with) an hour
behind: Debian's libfaketime preloaded with ``FAKETIME="-1h"``. Its monotonic clock
(CLOCK_MONOTONIC: Trio's clock) is left true (``FAKETIME_DONT_FAKE_MONOTONIC=1``; without
it libfaketime moves that clock by the offset as well), as on a machine whose clock
was set wrong. The library comes from ``install-faketime.sh`` beside this file, which
installs the Debian package when it is missing; when it cannot, the test is skipped
with the script's reason.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

INSTALL_SCRIPT = Path(__file__).with_name("install-faketime.sh")
#: how long installing the package may take (apt-get update included)
INSTALL_TIMEOUT_S = 600


@functools.cache
def _library() -> tuple[Path | None, str]:
    """(libfaketime's path, "") or (None, why it cannot be had); once per test run."""
    try:
        done = subprocess.run(
            ["sh", str(INSTALL_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{INSTALL_SCRIPT.name} did not run: {exc}"
    path = Path(done.stdout.strip()) if done.stdout.strip() else None
    if done.returncode != 0 or path is None or not path.is_file():
        return None, done.stderr.strip() or f"{INSTALL_SCRIPT.name} exited {done.returncode}"
    return path, ""


def faketime_env(offset: str) -> dict[str, str]:
    """This environment with the wall clock of children ``offset`` off (libfaketime's
    syntax: "-1h", "+30s"); skips the test, saying why, when libfaketime cannot be had."""
    library, why = _library()
    if library is None:
        pytest.skip(f"the clock test needs libfaketime: {why}")
    preload = " ".join(p for p in (str(library), os.environ.get("LD_PRELOAD", "")) if p)
    return {
        **os.environ,
        "LD_PRELOAD": preload,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
