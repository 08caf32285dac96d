"""Pop consumption against a ``hamq broker`` process (the issue's list, as a person
using hamq's SimpleConsumer meets it): a message not acked comes back after its
invisible time with attempt 2, an acked one never; a changed invisible time; the DLQ
past the group's retries; FIFO order under nacks; two members never holding one message
at once. Real processes and clocks; invisible times of a second or less."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import trio

from hamq.client import AdminClient, Message, MessageExt, Producer, SimpleConsumer
from hamq.client.simple_consumer import attempt
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import SubscriptionGroupConfig, encode_body
from tests.support.brokers import create_topic, invoke, topic_messages
from tests.support.processes import broker_process
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with broker_process(tmp_path_factory.mktemp("pop-broker")) as addresses:
        yield addresses


async def fill(ns: str, topic: str, count: int, queues: int = 1) -> None:
    await create_topic(ns, topic, queues)
    async with Producer("PG", ns) as producer:
        for i in range(count):
            await producer.send(Message(topic, b"%s-%d" % (topic.encode(), i)))


async def receive(consumer: SimpleConsumer, count: int, invisible_s: float) -> list[MessageExt]:
    found: list[MessageExt] = []
    with trio.fail_after(20):
        while len(found) < count:
            found += await consumer.receive(32, invisible_s, await_s=2)
    return found


async def test_not_acked_comes_back_with_attempt_2_acked_never(
    broker: tuple[str, str],
) -> None:
    _, ns = broker
    await fill(ns, "P1", 6, queues=2)
    async with SimpleConsumer("g1", ns) as consumer:
        consumer.subscribe("P1")
        first = await receive(consumer, 6, invisible_s=1.0)
        popped_at = time.time()
        for message in first[:3]:
            await consumer.ack(message)
        back = await receive(consumer, 3, invisible_s=30)
        assert time.time() >= popped_at + 0.9
        assert sorted(m.body for m in back) == sorted(m.body for m in first[3:])
        assert [attempt(m) for m in back] == [2, 2, 2]
        for message in back:
            await consumer.ack(message)
        assert await consumer.receive(32, 30, await_s=2.5) == []
    # (proof that nothing waits to come back: no message of the group is in flight)
    async with AdminClient(ns) as admin:
        progress = await admin.consumer_progress("g1")
    assert progress.queues and all(q.in_flight == 0 for q in progress.queues)


async def test_a_changed_invisible_time_and_the_dlq(broker: tuple[str, str]) -> None:
    addr, ns = broker
    group = SubscriptionGroupConfig("g2", retry_max_times=1)
    request = RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=encode_body(group)
    )
    assert (await invoke(addr, request)).code == ResponseCode.SUCCESS
    await fill(ns, "P2", 1)
    async with SimpleConsumer("g2", ns) as consumer:
        consumer.subscribe("P2")
        [message] = await receive(consumer, 1, invisible_s=0.5)
        await consumer.change_invisible_duration(message, 2.0)
        changed_at = time.time()
        [again] = await receive(consumer, 1, invisible_s=0.5)
        assert time.time() >= changed_at + 1.9 and attempt(again) == 2
        # not acked again: past the group's one retry, to %DLQ%g2
        dead = await wait_for(_messages(ns, "%DLQ%g2"), 15)
        assert [m.body for m in dead] == [b"P2-0"]
        assert await consumer.receive(32, 30, await_s=1.5) == []


def _messages(ns: str, topic: str) -> Callable[[], Awaitable[list[MessageExt]]]:
    async def found() -> list[MessageExt]:
        try:
            return await topic_messages(ns, topic)
        except Exception:
            return []

    return found


async def test_fifo_keeps_order_under_nacks(broker: tuple[str, str]) -> None:
    _, ns = broker
    await fill(ns, "P3", 6)
    async with SimpleConsumer("g3", ns, fifo=True) as consumer:
        consumer.subscribe("P3")
        seen: list[bytes] = []
        with trio.fail_after(30):
            while len(seen) < 6:
                batch = await consumer.receive(3, 0.5, await_s=2)
                if batch:
                    await consumer.ack(batch[0])  # (the rest come back, in order)
                    seen.append(batch[0].body)
        assert seen == [b"P3-%d" % i for i in range(6)]


async def test_two_members_never_hold_one_message(broker: tuple[str, str]) -> None:
    _, ns = broker
    await fill(ns, "P4", 100, queues=4)
    seen: list[bytes] = []
    async with SimpleConsumer("g4", ns) as a, SimpleConsumer("g4", ns) as b:

        async def member(consumer: SimpleConsumer) -> None:
            consumer.subscribe("P4")
            while len(seen) < 100:
                for message in await consumer.receive(8, 30, await_s=1):
                    seen.append(message.body)
                    await consumer.ack(message)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(member, a)
                nursery.start_soon(member, b)
    assert sorted(seen) == sorted(b"P4-%d" % i for i in range(100))
