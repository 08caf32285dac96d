"""Shared test settings: which event loop a test runs on, hypothesis profiles, virtual
time, small helpers.

Set HYPOTHESIS_PROFILE=thorough for a longer search than the CI default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from inspect import iscoroutinefunction
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings

from tests.support.backends import BACKENDS, BrokerThread, broker_thread_sync
from tests.support.tls import Pki, make_pki

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------- event loops
# Two plugins run coroutine tests. A test marked ``anyio`` (the client's tests:
# ``pytestmark = pytest.mark.anyio``) runs once per backend of ``anyio_backend`` below:
# Trio, asyncio and asyncio on uvloop, with ids [trio], [asyncio], [uvloop]. Every other
# coroutine test runs on Trio under pytest-trio (its fixtures, ``autojump_clock``), as
# before: it is marked ``trio`` here. pytest-trio's trio_mode is off (pyproject.toml):
# it marked *every* coroutine test ``trio``, anyio's too, and pytest-trio then ran each
# backend's copy on Trio, so an [asyncio] test passed without asyncio ever running
# (tests/test_backends.py guards against that coming back). For the same reason a test
# may not carry both marks; an anyio test that needs Trio takes
# ``tests.support.backends.trio_only`` instead.


@pytest.fixture(scope="module", params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The backends every anyio test runs on (module scope, as anyio's own fixture)."""
    return request.param


def _test_function(item: pytest.Item) -> Any:
    function = getattr(item, "obj", None)
    hypothesis = getattr(function, "hypothesis", None)
    return hypothesis.inner_test if hypothesis is not None else function


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mixed: list[str] = []
    for item in items:
        if not isinstance(item, pytest.Function) or not iscoroutinefunction(_test_function(item)):
            continue
        anyio_test = item.get_closest_marker("anyio") is not None
        if not anyio_test:
            item.add_marker(pytest.mark.trio)
        elif item.get_closest_marker("trio") is not None or "autojump_clock" in item.fixturenames:
            mixed.append(item.nodeid)
    if mixed:
        raise pytest.UsageError(
            "tests marked anyio that are also marked trio or use autojump_clock (Trio's "
            "virtual time): pytest-trio would run every backend's copy on Trio. Narrow the "
            "test with tests.support.backends.trio_only, or, for virtual time, leave it "
            "unmarked (a Trio test): " + ", ".join(mixed)
        )


@pytest.fixture
def threaded_broker(tmp_path: Path) -> Iterator[BrokerThread]:
    """A broker with its embedded nameserver, in a Trio thread of its own (store under
    tmp_path, default settings), for tests on any backend: ``.namesrv``, ``.address``,
    ``.call(fn)`` (``fn(node)`` in its thread), ``.create_topic(topic, queues)``.
    For other settings: ``async with broker_thread(tmp_path, **overrides)``
    (tests/support/backends.py)."""
    with broker_thread_sync(tmp_path / "threaded-broker") as broker:
        yield broker


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, server and client certificates and a stranger CA, as PEM files
    (tests/support/tls.py), for the TLS tests of a module."""
    return make_pki(tmp_path_factory.mktemp("pki"))


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


async def _no_connections(host: str, port: int, **_options: Any) -> Any:
    raise AssertionError(
        f"a real connection to {host}:{port} under virtual time: run this test on real "
        "time with bounded waits (tests/conftest.py says why)"
    )


@pytest.fixture
def autojump_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """pytest-trio's ``autojump_clock``, with worker-thread work run inline and real
    connections refused (see above)."""
    monkeypatch.setattr(trio.to_thread, "run_sync", _run_inline)
    monkeypatch.setattr(trio, "open_tcp_stream", _no_connections)  # the HA slave
    monkeypatch.setattr(anyio, "connect_tcp", _no_connections)  # clients
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------- figures tests report
# Some tests measure something worth seeing (acked messages in flight at a kill, the
# loss window of an async master); they hand a line to ``report`` and it is printed
# at the end of the run. The lines travel as the test's user properties, which
# pytest-xdist's workers send with their reports (``make test`` runs two workers).

_MEASURED = "measured"


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def add(line: str) -> None:
        request.node.user_properties.append((_MEASURED, f"{request.node.name}: {line}"))

    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for test_report in reports
        if getattr(test_report, "when", None) == "call"
        for key, value in getattr(test_report, "user_properties", ())
        if key == _MEASURED
    ]
    if lines:
        terminalreporter.section("measured by tests")
        for line in lines:
            terminalreporter.write_line(line)
