"""The producer's auto batch (hamq/client/auto_batch.py) against a real broker on loopback
(in a Trio thread of its own), on every backend: sends waiting behind others go as one
SEND_BATCH_MESSAGE, and each still gets its own result, its own failure and its own
time out."""

from __future__ import annotations

import collections
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from hamq.broker import BrokerNode
from hamq.client import (
    BrokerError,
    InvalidArgumentError,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    SendError,
    SendResult,
    SendStatus,
    hash_selector,
)
from hamq.client.auto_batch import Lane, Waiter, split_results
from hamq.protocol import ResponseCode
from hamq.protocol.message import BatchEntry
from tests.support.backends import BrokerThread, broker_thread

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def requests_and_messages(broker: BrokerThread, topic: str) -> tuple[int, int]:
    """How many send requests the broker answered SEND_OK, and how many messages of
    ``topic`` it stored."""

    def read(node: BrokerNode) -> tuple[int, int]:
        stats = node.ctx.stats
        answered = stats.sends["SEND_OK"].count if "SEND_OK" in stats.sends else 0
        counters = stats.topics.get(topic)
        return answered, counters.messages_in if counters else 0

    return await broker.call(read)


async def send_at_once(
    producer: Producer, messages: list[Message], **options: object
) -> list[SendResult | BaseException]:
    """Every message sent by a task of its own, all at once; each one's outcome."""
    outcomes: list[SendResult | BaseException] = [ValueError("not sent")] * len(messages)

    async def one(index: int) -> None:
        try:
            outcomes[index] = await producer.send(messages[index], **options)  # type: ignore[arg-type]
        except SendError as exc:
            outcomes[index] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tasks:
            for index in range(len(messages)):
                tasks.start_soon(one, index)
    return outcomes


async def test_sends_waiting_behind_others_go_as_batches_each_with_its_own_result(
    tmp_path: Path,
) -> None:
    async with broker_thread(tmp_path) as broker:
        await broker.create_topic("AB", 4)
        messages = [
            Message(
                "AB",
                f"m{i}".encode() * 50,
                tags=f"t{i % 3}",
                keys=[f"k{i}"],
                properties={"i": str(i)},
            )
            for i in range(400)
        ]
        async with Producer("PG", broker.namesrv) as producer:
            # the route cached first: sends started together before it is would each
            # look it up and may all start their round of the queues at the same one
            await producer.send(Message("AB", b"first"))
            outcomes = await send_at_once(producer, messages)
        requests, stored = await requests_and_messages(broker, "AB")
        assert stored == 401
        requests -= 1
        assert requests < 200  # most went in batches
        results = [o for o in outcomes if isinstance(o, SendResult)]
        assert len(results) == 400 and all(r.status is SendStatus.SEND_OK for r in results)
        assert len({r.msg_id for r in results}) == 400  # each its own UNIQ_KEY
        assert len({(r.queue, r.queue_offset) for r in results}) == 400
        assert len({r.offset_msg_id for r in results}) == 400

        # each result names where its own message is: by queue offset and by offset id
        async with PullConsumer("PC", broker.namesrv) as puller:
            stored_at = {}
            for queue in await puller.queues("AB"):
                offset = 0
                while True:
                    found = (await puller.pull(queue, offset, max_nums=32)).messages
                    if not found:
                        break
                    for m in found:
                        stored_at[(queue, m.queue_offset)] = m
                    offset = found[-1].queue_offset + 1
        for message, result in zip(messages, results, strict=True):
            there = stored_at[(result.queue, result.queue_offset)]
            assert there.body == message.body and there.msg_id == result.msg_id
            assert there.tags == message.tags and there.keys == list(message.keys)
            assert there.properties["i"] == message.properties["i"]
            assert there.offset_msg_id == result.offset_msg_id
        # a batch is one queue's; batches go round the queues as single sends do
        assert len({r.queue.queue_id for r in results}) >= 2


async def test_one_send_at_a_time_and_sends_that_cannot_batch_go_alone(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker:
        await broker.create_topic("Alone", 4)
        sent = 0

        async def one_request_each(count: int) -> None:
            nonlocal sent
            requests, _ = await requests_and_messages(broker, "Alone")
            assert requests == sent + count  # one request per message
            sent = requests

        async with Producer("PG", broker.namesrv) as producer:
            for i in range(12):
                await producer.send(Message("Alone", f"s{i}".encode()))
            await one_request_each(12)
            some = [Message("Alone", f"{i}".encode()) for i in range(40)]
            await send_at_once(producer, some, selector=hash_selector, arg=7)
            await one_request_each(40)
            await send_at_once(producer, [Message("Alone", b"x" * 5000) for _ in range(20)])
            await one_request_each(20)  # compressed
            await send_at_once(producer, [Message("Alone", b"d", delay_level=1) for _ in range(20)])
            await one_request_each(20)
        async with Producer("PG2", broker.namesrv, auto_batch=False) as plain:
            await send_at_once(plain, [Message("Alone", b"o") for _ in range(40)])
            await one_request_each(40)


async def test_a_refused_batch_is_sent_again_message_by_message(tmp_path: Path) -> None:
    # the broker takes bodies of 1 KiB at most, and refuses a whole batch holding a
    # larger one: each of its sends goes again alone, and only the large one fails
    async with broker_thread(tmp_path, store={"max_message_bytes": 1024}) as broker:
        await broker.create_topic("Small", 2)
        messages = [Message("Small", b"y" * 600) for _ in range(60)]
        messages[30] = Message("Small", b"z" * 2000)
        # properties too long for a batch entry (and for the broker): they go alone too
        messages[40] = Message("Small", b"y", properties={"big": "p" * 40_000})
        async with Producer("PG", broker.namesrv) as producer:
            outcomes = await send_at_once(producer, messages)
    failed = [i for i, o in enumerate(outcomes) if not isinstance(o, SendResult)]
    assert failed == [30, 40]
    too_long = outcomes[40]
    assert isinstance(too_long, SendError) and isinstance(too_long.__cause__, BrokerError)
    assert "properties of 40" in str(too_long)
    error = outcomes[30]
    assert isinstance(error, SendError) and isinstance(error.__cause__, BrokerError)
    assert error.__cause__.code == ResponseCode.MESSAGE_ILLEGAL
    assert "2000 bytes is over max_message_bytes 1024" in str(error)
    assert all(o.status is SendStatus.SEND_OK for o in outcomes if isinstance(o, SendResult))


async def test_cancelled_sends_leave_the_others_to_finish(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker:
        await broker.create_topic("Cx", 4)
        async with Producer("PG", broker.namesrv) as producer:
            done: collections.Counter[str] = collections.Counter()

            async def send(i: int, scope: anyio.CancelScope) -> None:
                with scope:
                    await producer.send(Message("Cx", f"c{i}".encode()))
                    done["sent"] += 1
                if scope.cancelled_caught:
                    done["cancelled"] += 1

            with anyio.fail_after(30):
                for _ in range(5):
                    scopes = [anyio.CancelScope() for _ in range(64)]
                    async with anyio.create_task_group() as tasks:
                        for i, scope in enumerate(scopes):
                            tasks.start_soon(send, i, scope)
                        await anyio.lowlevel.checkpoint()
                        for scope in scopes[::3]:  # leaders, waiting sends, sends alone
                            scope.cancel()
            assert done["sent"] + done["cancelled"] == 5 * 64
            assert done["cancelled"]
            # the producer's lanes are all free again: a send goes at once
            with anyio.fail_after(10):
                await producer.send(Message("Cx", b"after"))
            assert not producer._lanes


async def test_auto_batch_settings_are_checked() -> None:
    for options, error in (
        ({"auto_batch_in_flight": 0}, "auto_batch_in_flight 0 is below 1"),
        ({"auto_batch_max_bytes": 0}, "auto_batch_max_bytes 0 is below 1"),
        ({"auto_batch_max_bytes": 5000, "max_message_size": 4096}, "over max_message_size"),
    ):
        with pytest.raises(InvalidArgumentError, match=error):
            Producer("PG", "127.0.0.1:9876", **options)  # type: ignore[arg-type]


async def test_a_batch_result_is_split_per_send_as_rocketmq_splits_it() -> None:
    queue = MessageQueue("T", "broker-a", 2)
    batch = SendResult(SendStatus.FLUSH_SLAVE_TIMEOUT, "u1,u2,u3", "o1,o2,o3", queue, 40)
    second = split_results(batch, ["u1", "u2", "u3"])[1]
    assert (second.msg_id, second.offset_msg_id, second.queue_offset) == ("u2", "o2", 41)
    assert second.status is SendStatus.FLUSH_SLAVE_TIMEOUT and second.queue == queue
    assert second.transaction_id == "u2"
    # a broker naming one id for the batch (RocketMQ's batch consume queue): its figures
    one = SendResult(SendStatus.SEND_OK, "u1,u2,u3", "o1", queue, 40)
    third = split_results(one, ["u1", "u2", "u3"])[2]
    assert (third.msg_id, third.offset_msg_id, third.queue_offset) == ("u3", "o1", 40)


def waiter(uniq: str, size: int = 100) -> Waiter:
    return Waiter(BatchEntry(b"x"), uniq, size, 0.0, anyio.Event())


async def test_sends_woken_together_go_as_one_batch_not_as_lone_sends() -> None:
    lane = Lane(4)
    in_flight = [waiter(f"f{i}") for i in range(4)]
    for leader in in_flight:
        assert lane.free()
        lane.lead(leader)
        assert lane.take(leader, 1000) == [leader]
    assert not lane.free()
    # two batches end at once: their sends come back together; the first leads and
    # gathers, the others wait for it even though a place is still free
    lane.ended()
    lane.ended()
    first = waiter("a")
    assert lane.free()
    lane.lead(first)
    others = [waiter(f"b{i}") for i in range(12)]
    for other in others:
        assert not lane.free()
        lane.waiting.append(other)
    # it takes what fits (1000 bytes: itself and 9 more); the rest lead the next batch
    # in the place still free, woken at once
    assert lane.take(first, 1000) == [first, *others[:9]]
    assert lane.in_flight == 4 and lane.gathering and others[9].lead
    assert others[9].event.is_set() and list(lane.waiting) == others[10:]
    assert lane.take(others[9], 1000) == others[9:]
    assert not lane.gathering and not lane.waiting
    # a leader cancelled before it took anyone hands its place on
    lane.ended()
    gone = waiter("c")
    lane.lead(gone)
    late = waiter("d")
    lane.waiting.append(late)
    lane.abandoned()
    assert late.lead and late.event.is_set() and lane.in_flight == 4 and lane.gathering
