"""Timer messages through a broker: hamq's client (``deliver_at``, ``deliver_after``,
on Trio and asyncio, and the blocking facade), a raw SEND_MESSAGE_V2 as any RocketMQ
client sends it, the refusals' codes and remarks, and hamq's delivery mark that no
producer can forge. Real clocks, delivery times a second or two away, bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio

from hamq.client import Message, MessageExt, Producer, blocking
from hamq.client.errors import InvalidArgumentError, SendError
from hamq.protocol import RequestCode, ResponseCode
from hamq.protocol.message import TIMER_TOPIC, BatchEntry, encode_batch
from tests.support.brokers import (
    create_topic,
    invoke,
    namesrv,
    running_broker,
    send_request,
    topic_messages,
)
from tests.support.timing import wait_for


async def test_the_client_sends_timer_messages_delivered_once_at_their_time(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path / "b") as node:
        ns = namesrv(node)
        await create_topic(ns, "Later", 2)
        at = datetime.now(UTC) + timedelta(seconds=1.2)
        async with Producer("PG", ns) as producer:
            first = await producer.send(Message("Later", b"at", deliver_at=at))
            second = await producer.send(Message("Later", b"after", deliver_after=0.6))
        assert first.msg_id and second.msg_id
        assert node.store.max_offset_in_queue(TIMER_TOPIC, 0) == 2
        messages = await wait_for(stored_count(ns, "Later", 2), 15)
        by_body = {m.body: m for m in messages}
        assert by_body[b"at"].store_timestamp >= round(at.timestamp() * 1000)  # (to the ms)
        assert by_body[b"at"].msg_id == first.msg_id  # the id the producer was answered
        after = by_body[b"after"]
        assert after.store_timestamp >= int(after.properties["TIMER_OUT_MS"])
        assert after.properties["TIMER_DELAY_MS"] == "600"


def stored_count(ns: str, topic: str, count: int) -> Callable[[], Awaitable[list[MessageExt]]]:
    """A condition for ``wait_for``: ``topic``'s messages once it holds ``count``."""

    async def found() -> list[MessageExt]:
        messages = await topic_messages(ns, topic)
        return messages if len(messages) == count else []

    return found


def test_asyncio_and_the_blocking_producer_send_timer_messages(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_broker(tmp_path / "b") as node:
            ns = namesrv(node)
            await create_topic(ns, "Later", 1)

            def send_blocking() -> None:
                with blocking.Producer("PG", ns) as producer:
                    producer.send(
                        Message("Later", b"blocking", deliver_after=timedelta(seconds=0.3))
                    )

            async def on_asyncio() -> None:
                async with Producer("PG2", ns) as producer:
                    await producer.send(Message("Later", b"asyncio", deliver_at=time.time() + 0.3))

            await trio.to_thread.run_sync(send_blocking)
            await trio.to_thread.run_sync(lambda: asyncio.run(on_asyncio()))
            found = await wait_for(stored_count(ns, "Later", 2), 15)
            assert sorted(m.body for m in found) == [b"asyncio", b"blocking"]

    trio.run(main)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"deliver_at": datetime(2030, 1, 1)}, "has no time zone"),
        ({"deliver_at": "tomorrow"}, "deliver_at must be a number of seconds"),
        ({"deliver_after": -1}, "deliver_after -1 is not a positive time"),
        ({"deliver_after": float("nan")}, "deliver_after must be a number of seconds"),
    ],
)
def test_bad_delivery_times_are_refused_by_the_message(changes: dict, error: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgumentError, match=error):
        Message("T", b"x", **changes)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("T", b"x", deliver_at=time.time() + 9, deliver_after=1), "not both"),
        (Message("T", b"x", delay_level=2, deliver_after=1), "delay_level or a delivery time"),
        (Message("T", b"x", properties={"TIMER_DELIVER_MS": "1"}), "Message's own field"),
        (Message("T", b"x", properties={"HAMQ_TIMER_SOURCE": "1"}), "Message's own field"),
    ],
)
async def test_bad_timer_messages_are_refused_before_sending(message: Message, error: str) -> None:
    producer = Producer("PG", "127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match=error):
        await producer.send(message)
    with pytest.raises(InvalidArgumentError, match="batch cannot have a delivery time"):
        await producer.send_batch([Message("T", b"x", deliver_after=1)])


async def test_raw_sends_get_named_refusals_and_cannot_forge_a_delivery(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "b", store={"timer_max_delay_s": 100}) as node:
        ns, addr = namesrv(node), node.address
        await create_topic(ns, "Raw", 1)
        far = await invoke(addr, send_request("Raw", TIMER_DELAY_SEC="101"))
        assert far.code == ResponseCode.MESSAGE_ILLEGAL
        assert "past the broker's timer_max_delay_s 100s" in (far.remark or "")
        bad = await invoke(addr, send_request("Raw", TIMER_DELIVER_MS="12:00"))
        assert bad.code == ResponseCode.MESSAGE_ILLEGAL
        assert "TIMER_DELIVER_MS '12:00' is not a whole number" in (bad.remark or "")
        entries = [BatchEntry(b"1"), BatchEntry(b"2", properties="TIMER_DELAY_SEC\x015\x02")]
        batch = await invoke(
            addr, send_request("Raw", encode_batch(entries), code=RequestCode.SEND_BATCH_MESSAGE)
        )
        assert batch.code == ResponseCode.MESSAGE_ILLEGAL
        assert "a batch cannot hold timer messages" in (batch.remark or "")
        # a producer's mark is dropped: the timer message it names is still delivered
        timed = await invoke(addr, send_request("Raw", b"timed", TIMER_DELAY_MS="800"))
        assert timed.code == ResponseCode.SUCCESS
        forged = await invoke(addr, send_request("Raw", b"forged", HAMQ_TIMER_SOURCE="0"))
        assert forged.code == ResponseCode.SUCCESS
        found = await wait_for(stored_count(ns, "Raw", 2), 15)
        forged_copy, timed_copy = sorted(found, key=lambda m: m.body)
        assert "HAMQ_TIMER_SOURCE" not in forged_copy.properties
        assert timed_copy.properties["HAMQ_TIMER_SOURCE"] == "0"
        with pytest.raises(SendError, match="timer_max_delay_s 100s"):
            async with Producer("PG", ns, send_timeout_s=5) as producer:
                await producer.send(Message("Raw", b"x", deliver_after=200))
