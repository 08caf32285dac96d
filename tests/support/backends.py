"""What the client tests run on: Trio, asyncio and uvloop (anyio's pytest plugin), and
the Trio servers they talk to, each in a thread of its own.

The client runs natively on every AnyIO backend; the broker and the nameserver run on
Trio only, so a test on asyncio cannot host them in its own event loop. Every client
test therefore gets them from ``trio.run`` in a background thread (one code path on
every backend): real servers of this process on 127.0.0.1, free ports chosen at run
time, stopped cleanly at the end with bounded waits.

A test must not touch the servers' objects from its own loop: the server thread's Trio
loop owns them. ``BrokerThread.call`` runs a function on the broker node in that thread
(reading its offsets, locks, store), ``TrioThread.run`` runs a coroutine there (setup
through the Trio-only helpers of tests/support/brokers.py, e.g. ``create_topic``).

How tests are selected (tests/conftest.py): a coroutine test marked ``anyio`` runs once
per entry of ``BACKENDS``; every other coroutine test runs on Trio under pytest-trio,
as before.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
import pytest
import trio

from hamq.broker import BrokerNode
from nameserver import NameServer
from tests.support.brokers import create_topic, running_broker, running_nameserver

T = TypeVar("T")
R = TypeVar("R")

# ---------------------------------------------------------------- the event loops

#: what ``anyio_backend`` (tests/conftest.py) is parametrised over
BACKENDS = [
    pytest.param("trio", id="trio"),
    pytest.param("asyncio", id="asyncio"),
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
        ),
    ),
]

#: for a test in an anyio module that must run on Trio only (it uses Trio's own API):
#: anyio's way of narrowing a test's backends. (Never ``pytest.mark.trio`` on an anyio
#: test: pytest-trio would then run every backend's copy on Trio, tests/conftest.py.)
trio_only = pytest.mark.parametrize("anyio_backend", ["trio"])

#: for the slowest multi-process tests: Trio and asyncio, not uvloop as well (a third
#: run of a 10 s cluster test would add its time again; uvloop runs the other client
#: tests, and these tests' client code is the same on it as on asyncio)
trio_and_asyncio = pytest.mark.parametrize(
    "anyio_backend", [p for p in BACKENDS if p.id != "uvloop"]
)


# ---------------------------------------------------------------- Trio in a thread

#: bounded waits for a server thread to come up and to stop
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


class TrioThread(Generic[T]):
    """``trio.run`` in a daemon thread, inside an async context manager (a running
    broker, a nameserver) until ``stop``: what the manager yields is ``value``.

    ``start`` and ``stop`` block (bounded); an error of the thread's Trio run (at start,
    while serving, or at stop) is raised by ``start`` or ``stop``, so the test fails."""

    def __init__(self, name: str, open_cm: Callable[[], AbstractAsyncContextManager[T]]) -> None:
        self.name = name
        self._open = open_cm
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stopping: trio.Event | None = None
        self._value: T | None = None
        self._served = False  # (the value may be None)
        self._error: BaseException | None = None

    @property
    def value(self) -> T:
        assert self._served, f"{self.name} never ran"
        return self._value  # type: ignore[return-value]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> T:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise AssertionError(f"{self.name} did not start within {timeout_s:g} s")
        error, self._error = self._error, None
        if error is not None:
            raise AssertionError(f"{self.name} failed to start") from error
        return self.value

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Leave the context manager and end the thread (bounded). Idempotent."""
        token, stopping = self._token, self._stopping
        if token is not None and stopping is not None:
            try:
                trio.from_thread.run_sync(stopping.set, trio_token=token)
            except trio.RunFinishedError:
                pass  # already ended (an error, kept in _error)
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise AssertionError(f"{self.name} did not stop within {timeout_s:g} s")
        error, self._error = self._error, None
        if error is not None:
            raise AssertionError(f"{self.name} failed") from error

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` in the thread's Trio loop (from a worker thread of ours, so that
        the caller's loop, on whichever backend, keeps running meanwhile)."""
        return await anyio.to_thread.run_sync(
            functools.partial(trio.from_thread.run_sync, fn, *args, trio_token=self._live())
        )

    async def run(self, afn: Callable[..., Awaitable[R]], *args: Any) -> R:
        """``await afn(*args)`` in the thread's Trio loop."""
        return await anyio.to_thread.run_sync(
            functools.partial(trio.from_thread.run, afn, *args, trio_token=self._live())
        )

    def _live(self) -> trio.lowlevel.TrioToken:
        assert self._token is not None and self._thread.is_alive(), f"{self.name} is not running"
        return self._token

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as error:  # kept for start/stop to raise in the test
            self._error = error
        finally:
            self._ready.set()  # a start waiting on a server that failed wakes at once

    async def _serve(self) -> None:
        self._stopping = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        async with self._open() as value:
            self._value, self._served = value, True
            self._ready.set()
            await self._stopping.wait()


@contextmanager
def in_trio_thread(
    name: str, open_cm: Callable[[], AbstractAsyncContextManager[T]]
) -> Iterator[TrioThread[T]]:
    """A started ``TrioThread`` for a block of blocking code (a sync fixture)."""
    thread = TrioThread(name, open_cm)
    try:
        thread.start()
        yield thread
    finally:
        thread.stop()


@asynccontextmanager
async def in_trio_thread_async(
    name: str, open_cm: Callable[[], AbstractAsyncContextManager[T]]
) -> AsyncIterator[TrioThread[T]]:
    """A started ``TrioThread`` for an async block, on any backend: starting and
    stopping block a worker thread, not the caller's loop."""
    thread = TrioThread(name, open_cm)
    try:
        await anyio.to_thread.run_sync(thread.start)
        yield thread
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.stop)


# ---------------------------------------------------------------- brokers, nameservers


class BrokerThread:
    """A broker (tests/support/brokers.py's ``running_broker``) in a Trio thread, with
    its embedded nameserver unless it was given ``namesrv_addrs``."""

    def __init__(self, thread: TrioThread[BrokerNode]) -> None:
        self.thread = thread
        node = thread.value
        #: the broker's own address, and its nameservers' (``;``-joined, as clients take them)
        self.address: str = node.address
        self.namesrv: str = ";".join(node.namesrv_addrs)

    async def call(self, fn: Callable[[BrokerNode], R]) -> R:
        """``fn(node)`` in the broker's thread: the way to read its internals."""
        return await self.thread.call(fn, self.thread.value)

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        """brokers.py's ``create_topic`` (routed when it returns), run in the broker's
        thread."""
        await self.thread.run(create_topic, self.namesrv, topic, queues)

    async def stop(self) -> None:
        """Stop the broker now (bounded); ending the block does nothing more then."""
        await anyio.to_thread.run_sync(self.thread.stop)


class NameServerThread:
    """A nameserver (tests/support/brokers.py's ``running_nameserver``) in a Trio thread."""

    def __init__(self, thread: TrioThread[tuple[NameServer, str]]) -> None:
        self.thread = thread
        self.addr: str = thread.value[1]

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self.thread.stop)


@asynccontextmanager
async def broker_thread(store_dir: Path, **overrides: Any) -> AsyncIterator[BrokerThread]:
    """A broker in a Trio thread for the block (``running_broker``'s arguments)."""
    name = f"broker {overrides.get('broker_name', '')} in {store_dir}".replace("  ", " ")
    async with in_trio_thread_async(name, lambda: running_broker(store_dir, **overrides)) as t:
        yield BrokerThread(t)


@asynccontextmanager
async def nameserver_thread(**options: Any) -> AsyncIterator[NameServerThread]:
    """A nameserver in a Trio thread for the block (``running_nameserver``'s options)."""
    async with in_trio_thread_async("nameserver", lambda: running_nameserver(**options)) as t:
        yield NameServerThread(t)


@contextmanager
def broker_thread_sync(store_dir: Path, **overrides: Any) -> Iterator[BrokerThread]:
    """``broker_thread`` for blocking code: the ``threaded_broker`` fixture."""
    name = f"broker in {store_dir}"
    with in_trio_thread(name, lambda: running_broker(store_dir, **overrides)) as thread:
        yield BrokerThread(thread)
