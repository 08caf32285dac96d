"""Shared test settings: hypothesis profiles, virtual time, small helpers.

Set HYPOTHESIS_PROFILE=thorough for a longer search than the CI default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------- virtual time
# MockClock(autojump_threshold=0) jumps to the next deadline whenever every task waits.
# A task waiting for a worker thread (an fsync, a file written atomically) counts as
# waiting, so while real work runs in a thread the clock leaps from deadline to deadline
# as fast as the loop can spin: one thread hop slowed by the GIL or a real fsync can pass
# hundreds of virtual seconds, and a bounded wait in virtual time times out by chance.
# Under virtual time, therefore, work meant for a worker thread runs inline (a disk that
# takes no time): the clock moves only when the program really waits. Bytes on a real
# socket are just as real (the kernel may deliver them a little later, and the clock
# leaps meanwhile), so connecting is refused under virtual time. Tests that need a real
# thread (a stuck fsync) or real network traffic run on real time with bounded waits.

T = TypeVar("T")


async def _run_inline(fn: Callable[..., T], *args: Any, **_options: Any) -> T:
    """``trio.to_thread.run_sync`` without the thread: ``fn(*args)`` here and now."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


async def _no_connections(host: str, port: int, **_options: Any) -> trio.SocketStream:
    raise AssertionError(
        f"a real connection to {host}:{port} under virtual time: run this test on real "
        "time with bounded waits (tests/conftest.py says why)"
    )


@pytest.fixture
def autojump_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """pytest-trio's ``autojump_clock``, with worker-thread work run inline and real
    connections refused (see above)."""
    monkeypatch.setattr(trio.to_thread, "run_sync", _run_inline)
    monkeypatch.setattr(trio, "open_tcp_stream", _no_connections)
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------- figures tests report
# Some tests measure something worth seeing (acked messages in flight at a kill, the
# loss window of an async master); they hand a line to ``report`` and it is printed
# at the end of the run.

_REPORTS: list[str] = []


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def add(line: str) -> None:
        _REPORTS.append(f"{request.node.name}: {line}")

    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORTS:
        terminalreporter.section("measured by tests")
        for line in _REPORTS:
            terminalreporter.write_line(line)
