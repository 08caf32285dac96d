"""Pop consumption (hamq/broker/pop.py, processors/pop.py) through a broker: hamq's
SimpleConsumer and raw requests. Receive, ack (never again), not acked (again after the
invisible time, attempt 2), a changed invisible time, the DLQ after the group's
retries, two members never holding one message at once, and the refusals (a handle
that does not read, is forged, or was acked already). Real clocks: invisible times of a
second or less, every wait bounded."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest
import trio

from hamq.client import BrokerError, Message, Producer, SimpleConsumer
from hamq.client.simple_consumer import attempt, receipt_handle
from hamq.protocol import RequestCode, ResponseCode
from hamq.protocol.headers import AckMessageRequestHeader, PopMessageRequestHeader
from tests.support.brokers import create_topic, invoke, namesrv, running_broker, topic_messages
from tests.support.timing import wait_for


async def send(ns: str, topic: str, *bodies: bytes) -> None:
    async with Producer("PG", ns) as producer:
        for body in bodies:
            await producer.send(Message(topic, body))


async def receive_all(consumer: SimpleConsumer, count: int, **kwargs: object) -> list:  # type: ignore[type-arg]
    found: list = []  # type: ignore[type-arg]
    with trio.fail_after(20):
        while len(found) < count:
            found += await consumer.receive(32, await_s=2, **kwargs)  # type: ignore[arg-type]
    return found


async def test_received_messages_acked_never_come_again_the_rest_do_with_attempt_2(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Popped", 4)
        await send(ns, "Popped", *(b"m%d" % i for i in range(10)))
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Popped")
            first = await receive_all(consumer, 10, invisible_s=1.0)
            assert sorted(m.body for m in first) == sorted(b"m%d" % i for i in range(10))
            assert all(attempt(m) == 1 for m in first)
            for message in first[:6]:
                await consumer.ack(message)
            with pytest.raises(BrokerError, match=r"acked already|no message in flight"):
                await consumer.ack(first[0])
            # the 4 not acked come back once their second is up, attempt 2
            again = await receive_all(consumer, 4, invisible_s=5.0)
            assert sorted(m.body for m in again) == sorted(m.body for m in first[6:])
            assert all(attempt(m) == 2 and m.topic == "Popped" for m in again)
            for message in again:
                await consumer.ack(message)
            assert await consumer.receive(32, await_s=1.5) == []
            with pytest.raises(BrokerError, match=r"ran out|no message in flight"):
                await consumer.ack(first[7])  # (its time ran out: delivered again)


async def test_a_changed_invisible_time_holds_a_message_back_longer(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Changed", 1)
        await send(ns, "Changed", b"slow")
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Changed")
            [message] = await receive_all(consumer, 1, invisible_s=0.5)
            old = receipt_handle(message)
            await consumer.change_invisible_duration(message, 3.0)
            assert receipt_handle(message) != old
            started = time.monotonic()
            [back] = await receive_all(consumer, 1, invisible_s=10)
            assert time.monotonic() - started >= 2.0  # (not at the old time)
            assert back.body == b"slow" and attempt(back) == 2
            await consumer.ack(back)


async def test_past_the_groups_retries_a_message_goes_to_its_dlq(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Doomed", 1)
        group = node.ctx.subscriptions.find("G2")
        assert group is not None
        node.ctx.subscriptions.update(attrs.evolve(group, retry_max_times=2))
        await send(ns, "Doomed", b"bad")
        async with SimpleConsumer("G2", ns) as consumer:
            consumer.subscribe("Doomed")
            for n in (1, 2, 3):
                [message] = await receive_all(consumer, 1, invisible_s=0.3)
                assert attempt(message) == n
            dead = await wait_for(lambda: _found(ns, "%DLQ%G2"), 15)
            assert [m.body for m in dead] == [b"bad"]
            assert await consumer.receive(32, await_s=1.0) == []


async def _found(ns: str, topic: str) -> list:  # type: ignore[type-arg]
    try:
        return await topic_messages(ns, topic)
    except Exception:
        return []


async def test_two_members_never_hold_one_message_at_once(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Shared", 4)
        await send(ns, "Shared", *(b"s%d" % i for i in range(200)))
        seen: list[bytes] = []
        async with SimpleConsumer("G", ns) as a, SimpleConsumer("G", ns) as b:
            for c in (a, b):
                c.subscribe("Shared")

            async def member(consumer: SimpleConsumer) -> None:
                while len(seen) < 200:
                    for message in await consumer.receive(8, invisible_s=30, await_s=1):
                        seen.append(message.body)
                        await consumer.ack(message)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(member, a)
                    nursery.start_soon(member, b)
        assert sorted(seen) == sorted(b"s%d" % i for i in range(200))  # each once


async def test_bad_pops_and_acks_are_refused_naming_why(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns, addr = namesrv(node), node.address
        await create_topic(ns, "Raw", 1)

        def pop(**changes: object) -> PopMessageRequestHeader:
            values = dict(
                consumer_group="G",
                topic="Raw",
                queue_id=-1,
                max_msg_nums=4,
                invisible_time=1000,
                poll_time=0,
                born_time=0,
                init_mode=0,
            )
            values.update(changes)
            return PopMessageRequestHeader(**values)  # type: ignore[arg-type]

        from hamq.protocol import RemotingCommand

        async def ask(code: RequestCode, header: object) -> RemotingCommand:
            return await invoke(addr, RemotingCommand.request(code, header=header))

        too_many = await ask(RequestCode.POP_MESSAGE, pop(max_msg_nums=33))
        assert too_many.code == ResponseCode.INVALID_PARAMETER and "1..32" in too_many.remark
        no_topic = await ask(RequestCode.POP_MESSAGE, pop(topic="Nope"))
        assert no_topic.code == ResponseCode.TOPIC_NOT_EXIST
        empty = await ask(RequestCode.POP_MESSAGE, pop())
        assert empty.code == ResponseCode.POLLING_TIMEOUT
        bad_filter = await ask(RequestCode.POP_MESSAGE, pop(exp_type="SQL92", exp="a > 1"))
        assert bad_filter.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        malformed = await ask(
            RequestCode.ACK_MESSAGE,
            AckMessageRequestHeader("G", "Raw", 0, "not a handle", 0),
        )
        assert malformed.code == ResponseCode.INVALID_PARAMETER
        assert "receipt handle 'not a handle'" in malformed.remark
        await send(ns, "Raw", b"x")
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Raw")
            [message] = await receive_all(consumer, 1, invisible_s=30)
            handle = str(receipt_handle(message))
        forged = await ask(
            RequestCode.ACK_MESSAGE, AckMessageRequestHeader("Other", "Raw", 0, handle, 0)
        )
        assert forged.code == ResponseCode.NO_MESSAGE
        elsewhere = await ask(
            RequestCode.ACK_MESSAGE, AckMessageRequestHeader("G", "Raw", 0, handle, 5)
        )
        assert elsewhere.code == ResponseCode.INVALID_PARAMETER
        ok = await ask(RequestCode.ACK_MESSAGE, AckMessageRequestHeader("G", "Raw", 0, handle, 0))
        assert ok.code == ResponseCode.SUCCESS
        twice = await ask(
            RequestCode.ACK_MESSAGE, AckMessageRequestHeader("G", "Raw", 0, handle, 0)
        )
        assert twice.code == ResponseCode.NO_MESSAGE


async def test_a_batch_ack_as_java_sends_it_acks_each_message(tmp_path: Path) -> None:
    import base64
    import json

    from hamq.protocol import RemotingCommand

    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Batched", 1)
        await send(ns, "Batched", b"a", b"b", b"c")
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Batched")
            messages = await receive_all(consumer, 3, invisible_s=1.0)
        handles = [receipt_handle(m) for m in messages]
        first = handles[0]
        bits = sum(1 << (h.offset - first.ck_offset) for h in handles[:2])  # (a and b)
        body = {
            "acks": [
                {
                    "c": "G",
                    "t": "Batched",
                    "r": "0",
                    "q": 0,
                    "so": first.ck_offset,
                    "pt": first.pop_time,
                    "it": first.invisible_time,
                    "rq": first.revive_queue,
                    "b": base64.b64encode(bits.to_bytes(1, "little")).decode(),
                }
            ],
            "brokerName": first.broker_name,
        }
        request = RemotingCommand.request(
            RequestCode.BATCH_ACK_MESSAGE, body=json.dumps(body).encode()
        )
        answer = await invoke(node.address, request)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        again = await invoke(node.address, request)  # (nothing left in flight there)
        assert again.code == ResponseCode.NO_MESSAGE
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Batched")
            [back] = await receive_all(consumer, 1, invisible_s=30)  # (after its second)
            assert back.body == messages[2].body and attempt(back) == 2


async def test_consumer_progress_shows_a_pop_groups_lag_and_messages_in_flight(
    tmp_path: Path,
) -> None:
    from hamq.client import AdminClient

    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Watched", 1)
        await send(ns, "Watched", *(b"w%d" % i for i in range(5)))
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Watched")
            held = await receive_all(consumer, 5, invisible_s=60)
            await consumer.ack(held[0])
        async with AdminClient(ns) as admin:
            progress = await admin.consumer_progress("G", "Watched")
        [queue] = progress.queues
        assert (queue.broker_offset, queue.consumer_offset, queue.lag) == (5, 5, 0)
        assert queue.in_flight == 4
        assert queue.to_json()["inFlight"] == 4


def test_the_simple_consumer_on_asyncio_and_blocking(tmp_path: Path) -> None:
    import asyncio

    from hamq.client import blocking

    async def main() -> None:
        async with running_broker(tmp_path / "b") as node:
            ns = namesrv(node)
            await create_topic(ns, "Both", 1)
            await send(ns, "Both", b"one", b"two")

            async def on_asyncio() -> bytes:
                async with SimpleConsumer("G", ns) as consumer:
                    consumer.subscribe("Both")
                    [message] = await consumer.receive(1, 30, await_s=5)
                    await consumer.ack(message)
                    return message.body

            def blocking_run() -> bytes:
                with blocking.SimpleConsumer("G", ns) as consumer:
                    consumer.subscribe("Both")
                    [message] = consumer.receive(1, 30, await_s=5)
                    consumer.change_invisible_duration(message, 60)
                    consumer.ack(message)
                    return message.body

            first = await trio.to_thread.run_sync(lambda: asyncio.run(on_asyncio()))
            second = await trio.to_thread.run_sync(blocking_run)
            assert sorted([first, second]) == [b"one", b"two"]
            assert node.pops.state.in_flight("G", "Both", 0) == 0

    trio.run(main)


async def test_invisible_times_out_of_range_are_refused_naming_the_limit(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b", store={"timer_max_delay_s": 100}) as node:
        ns = namesrv(node)
        await create_topic(ns, "Limits", 1)
        await send(ns, "Limits", b"x")
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Limits")
            with pytest.raises(BrokerError, match=r"invisibleTime 101000 ms is not in 1\.\.100000"):
                await consumer.receive(1, 101, await_s=1)
            [message] = await consumer.receive(1, 30, await_s=5)
            with pytest.raises(BrokerError, match="timer_max_delay_s"):
                await consumer.change_invisible_duration(message, 1000)
            await consumer.ack(message)  # (the refused change changed nothing)


async def test_fifo_pop_keeps_order_under_nacks_and_locks_the_queue(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Ordered", 1)
        await send(ns, "Ordered", *(b"o%d" % i for i in range(8)))
        group = node.ctx.subscriptions.find("F")
        assert group is not None
        node.ctx.subscriptions.update(attrs.evolve(group, retry_max_times=1))
        acked: list[bytes] = []
        async with (
            SimpleConsumer("F", ns, fifo=True) as consumer,
            SimpleConsumer("F", ns, fifo=True) as other,
        ):
            consumer.subscribe("Ordered")
            other.subscribe("Ordered")
            first = await consumer.receive(4, 3.0, await_s=2)
            assert [m.body for m in first] == [b"o0", b"o1", b"o2", b"o3"]
            for message in first[:2]:
                await consumer.ack(message)
                acked.append(message.body)
            # o2 and o3 are not acked: the queue stays locked to them (3 s), for any member
            assert await other.receive(4, 30, await_s=0.3) == []
            again = await receive_all(other, 2, invisible_s=30)
            assert [m.body for m in again] == [b"o2", b"o3"]
            assert [attempt(m) for m in again] == [2, 2]
            await other.change_invisible_duration(again[1], 0.5)  # (o3: back soon)
            await other.ack(again[0])
            acked.append(again[0].body)
            # o3 is past the group's one retry when its time runs out: to the DLQ,
            # and the queue moves on in order
            rest = await receive_all(consumer, 4, invisible_s=30)
            assert [m.body for m in rest] == [b"o4", b"o5", b"o6", b"o7"]
            assert all(attempt(m) == 1 for m in rest)
            dead = await wait_for(lambda: _found(ns, "%DLQ%F"), 15)
            assert [m.body for m in dead] == [b"o3"]


async def test_a_fifo_pop_asked_again_with_its_attempt_id_gets_the_same_batch(
    tmp_path: Path,
) -> None:
    from hamq.protocol import RemotingCommand
    from hamq.protocol.record import decode_messages

    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Retried", 1)
        await send(ns, "Retried", b"r0", b"r1", b"r2")

        def pop(attempt_id: str) -> RemotingCommand:
            header = PopMessageRequestHeader(
                "F", "Retried", -1, 2, 30_000, 0, 0, 0, order=True, attempt_id=attempt_id
            )
            return RemotingCommand.request(RequestCode.POP_MESSAGE, header=header)

        first = await invoke(node.address, pop("a1"))
        again = await invoke(node.address, pop("a1"))
        other = await invoke(node.address, pop("a2"))
        assert first.code == again.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(first.body)] == [b"r0", b"r1"]
        assert [m.body for m in decode_messages(again.body)] == [b"r0", b"r1"]
        assert other.code == ResponseCode.POLLING_TIMEOUT  # (locked to the first attempt)


async def test_notification_and_polling_info(tmp_path: Path) -> None:
    from hamq.protocol import RemotingCommand
    from hamq.protocol.headers import (
        NotificationRequestHeader,
        NotificationResponseHeader,
        PollingInfoRequestHeader,
        PollingInfoResponseHeader,
    )

    async with running_broker(tmp_path / "b") as node:
        ns, addr = namesrv(node), node.address
        await create_topic(ns, "Noticed", 2)

        def notify(poll_ms: int) -> RemotingCommand:
            header = NotificationRequestHeader("N", "Noticed", -1, poll_ms, 0)
            return RemotingCommand.request(RequestCode.NOTIFICATION, header=header)

        empty = await invoke(addr, notify(0))
        assert not empty.header(NotificationResponseHeader).has_msg
        answers = []

        async def waiting_notification() -> None:
            answers.append(await invoke(addr, notify(10_000)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting_notification)
            info = PollingInfoRequestHeader("N", "Noticed", -1)

            async def held() -> int:
                asked = RemotingCommand.request(RequestCode.POLLING_INFO, header=info)
                return (await invoke(addr, asked)).header(PollingInfoResponseHeader).polling_num

            assert await wait_for(held, 10) >= 1  # (the notification waits)
            await send(ns, "Noticed", b"n")
        [answer] = answers
        assert answer.header(NotificationResponseHeader).has_msg


async def test_a_change_in_the_pops_own_millisecond_gets_a_handle_of_its_own(
    tmp_path: Path,
) -> None:
    """The new checkpoint of a changed invisible time is named by the message's offset
    and a pop time: at the pop's own millisecond it must not name the pop's checkpoint
    (whose first offset that message is) again. A frozen clock makes it that instant."""
    async with running_broker(tmp_path / "b", clock=lambda: 1_700_000_000_000) as node:
        ns = namesrv(node)
        await create_topic(ns, "Instant", 1)
        await send(ns, "Instant", b"i")
        async with SimpleConsumer("G", ns) as consumer:
            consumer.subscribe("Instant")
            [message] = await consumer.receive(1, 30, await_s=5)
            old = receipt_handle(message)
            await consumer.change_invisible_duration(message, 60)
            assert receipt_handle(message).pop_time > old.pop_time
            await consumer.ack(message)
            assert node.pops.state.in_flight("G", "Instant", 0) == 0


async def test_a_client_with_rocketmq_binary_headers_pops_in_json(tmp_path: Path) -> None:
    """Pop's codes do not fit the ROCKETMQ header's 16-bit code: those requests go as JSON."""
    from hamq.protocol import SerializeType

    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Binary", 1)
        await send(ns, "Binary", b"b")
        async with SimpleConsumer("G", ns, serialize_type=SerializeType.ROCKETMQ) as consumer:
            consumer.subscribe("Binary")
            [message] = await consumer.receive(1, 30, await_s=5)
            await consumer.ack(message)
        assert node.pops.state.in_flight("G", "Binary", 0) == 0


async def test_a_checkpoint_acked_in_time_is_retired_without_looking_in_the_index(
    tmp_path: Path,
) -> None:
    # a CK all acked while the broker followed it: when it falls due, its record says it
    # is done without the index look-up of its acks (1.3 ms a CK before: a burst of
    # pops falling due took a core for seconds)
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Retired", 2)
        await send(ns, "Retired", b"a", b"b", b"c", b"d")
        state = node.pops.state
        looked: list[str] = []
        look_up = state._look_up

        def counted(ck: object) -> None:
            looked.append(str(ck))
            look_up(ck)  # type: ignore[arg-type]

        state._look_up = counted  # type: ignore[method-assign]
        async with SimpleConsumer("retiring", ns) as consumer:
            consumer.subscribe("Retired")
            got = await receive_all(consumer, 4, invisible_s=1)
            await consumer.ack_many(got)
        await wait_for(lambda: state.finished, 10, what="the acked CKs known as done")
        await wait_for(lambda: not state.finished, 20, what="the CKs retired when due")
        assert looked == []
