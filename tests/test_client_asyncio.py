"""What an asyncio program does to the client that a Trio one cannot: native cancellation
(``asyncio.wait_for``, ``Task.cancel``, as a web framework cancels a handler whose
caller went away), the client's tasks in ``asyncio.TaskGroup``, and push handlers: a
coroutine in the loop, a plain function in a worker thread.

The broker runs on Trio in a thread of its own (tests/support/backends.py); the client
runs in the test's asyncio loop (plain asyncio and uvloop).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hamq.client import ConsumeResult, Message, MessageExt, Producer, PushConsumer, SendStatus
from tests.support.backends import BrokerThread
from tests.support.timing import wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """asyncio only: the Trio side of these behaviours is Trio's own (tests/test_client.py)."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
        return ("asyncio", {"use_uvloop": True})
    return "asyncio"


async def test_a_send_cancelled_by_wait_for_leaves_the_producer_usable(
    threaded_broker: BrokerThread,
) -> None:
    await threaded_broker.create_topic("Cancelled", 2)
    async with Producer("PG", threaded_broker.namesrv) as producer:
        await producer.send(Message("Cancelled", b"warm-up"))  # route cached
        cut = 0
        for i in range(20):
            try:  # cut at many points of the send: before (0 s), during and after the answer
                send = producer.send(Message("Cancelled", b"c%d" % i))
                await asyncio.wait_for(send, i * 0.0001)
            except TimeoutError:
                cut += 1
        assert cut > 0
        result = await asyncio.wait_for(producer.send(Message("Cancelled", b"after")), 10)
        assert result.status is SendStatus.SEND_OK
        connections = producer.instance.remoting.connections.values()  # nothing leaked
        await wait_for(
            lambda: all(c.statistics().pending == 0 for c in connections),
            5,
            what="no request waits",
        )


async def test_a_consumer_task_cancelled_by_its_task_group_stops_cleanly(
    threaded_broker: BrokerThread,
) -> None:
    """The consumer runs as an asyncio task; cancelling the task stops it and commits."""
    await threaded_broker.create_topic("TaskGroup", 2)
    got: list[bytes] = []
    consumer = PushConsumer("TG", threaded_broker.namesrv, consume_from="FIRST_OFFSET")
    consumer.subscribe("TaskGroup")

    async def handle(messages: list[MessageExt]) -> ConsumeResult:
        got.extend(m.body for m in messages)
        return ConsumeResult.SUCCESS

    async def consume() -> None:
        async with consumer.consuming(handle):
            await asyncio.Event().wait()  # until cancelled

    async with Producer("PG", threaded_broker.namesrv) as producer, asyncio.TaskGroup() as tasks:
        task = tasks.create_task(consume())
        for i in range(10):
            await producer.send(Message("TaskGroup", b"m%d" % i))
        await wait_for(lambda: len(got) == 10, 20, what="10 consumed")
        task.cancel()
    assert task.cancelled()
    assert consumer.statistics().consumed == 10
    # the offsets were committed as it stopped: a new member of the group gets nothing old
    again: list[bytes] = []
    consumer = PushConsumer("TG", threaded_broker.namesrv, consume_from="FIRST_OFFSET")
    consumer.subscribe("TaskGroup")

    async def handle_again(messages: list[MessageExt]) -> None:
        again.extend(m.body for m in messages)

    async with consumer.consuming(handle_again), Producer("PG", threaded_broker.namesrv) as p:
        await p.send(Message("TaskGroup", b"new"))
        await wait_for(lambda: again == [b"new"], 20, what="only the new message")


async def test_an_async_handler_runs_in_the_loop_and_a_plain_one_in_worker_threads(
    threaded_broker: BrokerThread,
) -> None:
    await threaded_broker.create_topic("Handlers", 2)
    loop_thread = threading.get_ident()
    seen: dict[str, set[int]] = {"async": set(), "sync": set()}

    async def in_loop(messages: list[MessageExt]) -> None:
        seen["async"].add(threading.get_ident())

    def in_thread(messages: list[MessageExt]) -> None:
        seen["sync"].add(threading.get_ident())

    async with Producer("PG", threaded_broker.namesrv) as producer:
        for i in range(8):
            await producer.send(Message("Handlers", b"h%d" % i))
    for group, handler, kind in (("HA", in_loop, "async"), ("HS", in_thread, "sync")):
        consumer = PushConsumer(group, threaded_broker.namesrv, consume_from="FIRST_OFFSET")
        consumer.subscribe("Handlers")
        async with consumer.consuming(handler):
            await wait_for(lambda c=consumer: c.statistics().consumed == 8, 20, what=kind)
    assert seen["async"] == {loop_thread}
    assert seen["sync"] and loop_thread not in seen["sync"]
