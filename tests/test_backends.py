"""The test runner's own guarantees: an anyio test runs on the event loop its id names,
every other coroutine test on Trio under pytest-trio, and the Trio servers the client
tests talk to (tests/support/backends.py) start, answer and stop within bounded waits.

The first two guard against a false green: with pytest-trio's trio_mode on, an anyio
test's [asyncio] copy ran on Trio and passed (tests/conftest.py says why)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio
import trio
import trio.testing

from hamq.client import Message, Producer, PullConsumer, PullStatus, SendStatus
from tests.support.backends import (
    BrokerThread,
    TrioThread,
    broker_thread,
    in_trio_thread_async,
    nameserver_thread,
    trio_only,
)
from tests.support.timing import wait_for


@pytest.mark.anyio
async def test_an_anyio_test_runs_on_the_loop_its_id_names(
    anyio_backend_name: str, anyio_backend_options: dict[str, Any]
) -> None:
    assert sniffio.current_async_library() == anyio_backend_name
    if anyio_backend_name == "trio":
        trio.lowlevel.current_task()  # raises outside a Trio run
        return
    loop = asyncio.get_running_loop()  # raises outside an asyncio loop
    if anyio_backend_options.get("use_uvloop"):
        import uvloop

        assert isinstance(loop, uvloop.Loop)
    else:
        assert type(loop).__module__.startswith("asyncio")


def test_anyio_tests_run_on_trio_asyncio_and_uvloop(request: pytest.FixtureRequest) -> None:
    """Every backend is collected (uvloop is a dev dependency: skipped only if absent)."""
    ids = {
        item.name.rsplit("[", 1)[1].rstrip("]")
        for item in request.session.items
        if item.name.startswith("test_an_anyio_test_runs_on_the_loop_its_id_names[")
    }
    if ids:  # (not when -k left that test out)
        assert ids == {"trio", "asyncio", "uvloop"}


async def test_an_unmarked_coroutine_test_runs_on_trio_under_pytest_trio(
    request: pytest.FixtureRequest,
) -> None:
    assert sniffio.current_async_library() == "trio"
    trio.lowlevel.current_task()
    assert request.node.get_closest_marker("trio") is not None
    assert request.node.get_closest_marker("anyio") is None


@pytest.fixture
async def trio_fixture_value() -> AsyncIterator[str]:
    """An async fixture of a Trio test: pytest-trio runs it, in the test's Trio run."""
    await trio.lowlevel.checkpoint()
    yield sniffio.current_async_library()


async def test_a_trio_tests_async_fixtures_still_run_under_pytest_trio(
    trio_fixture_value: str,
) -> None:
    assert trio_fixture_value == "trio"


async def test_virtual_time_still_works_for_trio_tests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started = time.monotonic()
    await trio.sleep(3600)
    assert time.monotonic() - started < 5


@pytest.mark.anyio
@trio_only
async def test_trio_only_narrows_an_anyio_test_to_trio(anyio_backend: object) -> None:
    assert anyio_backend == "trio"
    trio.lowlevel.current_task()


# ---------------------------------------------------------------- servers in a thread


@pytest.mark.anyio
async def test_a_client_on_each_loop_sends_and_pulls_through_a_broker_in_a_thread(
    threaded_broker: BrokerThread,
) -> None:
    with anyio.fail_after(30):
        await threaded_broker.create_topic("InThread", 1)
        async with Producer("PG", threaded_broker.namesrv) as producer:
            sent = await producer.send(Message("InThread", b"across threads"))
        assert sent.status is SendStatus.SEND_OK
        assert sent.queue.broker_name == await threaded_broker.call(lambda n: n.config.broker_name)
        stored = await threaded_broker.call(lambda n: n.store.max_offset_in_queue("InThread", 0))
        assert stored == 1
        async with PullConsumer("CG", threaded_broker.namesrv) as consumer:
            result = await consumer.pull(sent.queue, 0)
        assert result.status is PullStatus.FOUND
        assert [m.body for m in result.messages] == [b"across threads"]


@pytest.mark.anyio
async def test_a_broker_thread_stops_mid_test_and_a_second_stop_does_nothing(
    tmp_path: Path,
) -> None:
    async with nameserver_thread() as ns, broker_thread(tmp_path, namesrv_addrs=[ns.addr]) as b:
        assert b.namesrv == ns.addr
        thread = b.thread
        await b.stop()
        with pytest.raises(AssertionError, match="is not running"):
            await b.call(lambda n: n.address)
    await b.stop()  # and leaving the block did nothing more
    assert thread.value is not None


@asynccontextmanager
async def failing_to_start() -> AsyncIterator[None]:
    raise OSError("address in use (a server that cannot start)")
    yield  # pragma: no cover


@asynccontextmanager
async def slow_to_stop() -> AsyncIterator[None]:
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(0.3)


@asynccontextmanager
async def crashing_while_serving() -> AsyncIterator[None]:
    async def crash() -> None:
        await trio.sleep(0.05)
        raise RuntimeError("the server crashed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(crash)
        yield


@pytest.mark.anyio
async def test_a_server_that_cannot_start_fails_the_test_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match="failed to start") as info:
        async with in_trio_thread_async("a doomed server", failing_to_start):
            pass
    assert isinstance(info.value.__cause__, OSError)
    assert time.monotonic() - started < 5  # not the start timeout


@pytest.mark.anyio
async def test_a_server_thread_that_does_not_stop_in_time_is_reported() -> None:
    thread = TrioThread("a stuck server", slow_to_stop)
    await anyio.to_thread.run_sync(thread.start)
    with pytest.raises(AssertionError, match=r"a stuck server did not stop within 0\.1 s"):
        await anyio.to_thread.run_sync(thread.stop, 0.1)
    await anyio.to_thread.run_sync(thread.stop)  # it does end, later


@pytest.mark.anyio
async def test_a_server_that_crashes_while_serving_fails_the_test_at_its_end() -> None:
    with pytest.raises(AssertionError, match="a crashing server failed") as info:
        async with in_trio_thread_async("a crashing server", crashing_while_serving) as thread:
            await wait_for(lambda: not thread._thread.is_alive(), 5)
            with pytest.raises(AssertionError, match="is not running"):
                await thread.call(lambda: None)
    assert "the server crashed" in repr(info.value.__cause__)


@pytest.mark.anyio
async def test_wait_for_polls_on_every_loop_and_names_what_it_waited_for() -> None:
    seen: list[int] = []

    async def grows() -> bool:
        seen.append(1)
        return len(seen) >= 3

    assert await wait_for(grows, 5, every_s=0.001)
    with pytest.raises(AssertionError, match=r"not within 0\.05 s: nothing"):
        await wait_for(lambda: False, 0.05, what="nothing")
