"""The client's parts that need no broker: queue allocation, routes to queues, fault
avoidance, messages, what a send puts on the wire, and the timeouts it accepts.

The coroutine tests run on Trio, asyncio and uvloop (``anyio_backend``, tests/conftest.py)."""

from __future__ import annotations

import math
import zlib

import anyio
import attrs
import pytest
from anyio.abc import SocketAttribute
from hypothesis import given
from hypothesis import strategies as st

from hamq.client import InvalidArgumentError, Message, Producer, PullConsumer
from hamq.client.config import client_config
from hamq.client.controller_calls import ask_controllers, broker_epochs
from hamq.client.instance import ClientInstance
from hamq.client.message import COMPRESSION_ZLIB, inflate
from hamq.client.rebalance import allocate_average
from hamq.client.route_cache import LatencyFaultTolerance, publish_info, subscribe_queues
from hamq.protocol import RemotingCommand, RequestCode
from hamq.protocol.bodies import BrokerData, MessageQueue, QueueData, TopicRouteData
from hamq.protocol.message import SYSFLAG_COMPRESSED, MessageFormatError
from hamq.protocol.record import StoredMessage
from hamq.remoting import RemotingTimeoutError

pytestmark = pytest.mark.anyio


@given(st.integers(0, 40), st.integers(1, 12), st.data())
def test_average_allocation_splits_every_queue_once(
    queue_count: int, member_count: int, data: st.DataObject
) -> None:
    queues = list(range(queue_count))
    members = sorted(f"c{i}" for i in range(member_count))
    shares = [allocate_average(queues, members, m) for m in members]
    assert sorted(q for share in shares for q in share) == queues
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first members get the extra ones
    stranger = data.draw(st.text(min_size=1).filter(lambda t: t not in members))
    assert allocate_average(queues, members, stranger) == []


def route(*brokers: tuple[str, int, int, bool]) -> TopicRouteData:
    """(name, write queues, perm, has a master) per broker."""
    return TopicRouteData(
        queue_datas=[QueueData(name, n, n, perm) for name, n, perm, _ in brokers],
        broker_datas=[
            BrokerData("C", name, {0: f"10.0.0.{i}:10911"} if master else {1: "10.0.0.9:10911"})
            for i, (name, _, _, master) in enumerate(brokers)
        ],
    )


def test_publish_queues_skip_brokers_without_a_master_or_write_permission() -> None:
    info = publish_info(
        "T", route(("b", 2, 6, True), ("a", 3, 6, True), ("c", 4, 6, False), ("d", 1, 4, True))
    )
    assert [(q.broker_name, q.queue_id) for q in info.queues] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
        ("b", 1),
    ]
    template = publish_info("New", route(("a", 8, 7, True)), template_queue_nums=4)
    assert template.from_template and len(template.queues) == 4
    assert all(q.topic == "New" for q in template.queues)
    readable = subscribe_queues("T", route(("a", 2, 4, True), ("b", 1, 2, True)))
    assert readable == [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1)]


def test_selection_goes_round_robin_and_avoids_the_broker_that_failed() -> None:
    info = publish_info("T", route(("a", 2, 6, True), ("b", 2, 6, True)))
    picks = [info.select() for _ in range(8)]
    assert sorted(set(picks), key=str) == sorted(info.queues, key=str)  # all used
    assert all(info.select(last_broker="a").broker_name == "b" for _ in range(8))
    assert all(info.select(available=lambda b: b != "b").broker_name == "a" for _ in range(8))
    # nothing else left: the failed broker is tried again rather than nothing
    only = publish_info("T", route(("a", 1, 6, True)))
    assert only.select(last_broker="a").broker_name == "a"


def test_latency_fault_tolerance_follows_javas_table() -> None:
    faults = LatencyFaultTolerance(enabled=True)
    faults.update("a", 0.1, now=100.0, failed=False)
    assert faults.available("a", 100.0)  # fast: never avoided
    faults.update("a", 0.6, now=100.0, failed=False)
    assert not faults.available("a", 129.9) and faults.available("a", 130.0)  # >= 550 ms: 30 s
    faults.update("b", 0.0, now=100.0, failed=True)
    assert not faults.available("b", 129.0) and faults.available("b", 130.0)
    off = LatencyFaultTolerance(enabled=False)
    off.update("a", 20.0, now=0.0, failed=True)
    assert off.available("a", 0.0)


def test_messages_carry_tags_keys_and_delay_as_properties() -> None:
    message = Message("T", "text", tags="t", keys="k1 k2", delay_level=3, wait_store_msg_ok=False)
    assert message.body == b"text" and message.keys == ("k1", "k2")
    assert message.wire_properties() == {
        "TAGS": "t",
        "KEYS": "k1 k2",
        "DELAY": "3",
        "WAIT": "false",
    }
    with pytest.raises(InvalidArgumentError, match="bytes or str"):
        Message("T", 5)  # type: ignore[arg-type]


def stored(body: bytes, sys_flag: int) -> StoredMessage:
    return StoredMessage(
        "T", 0, 0, 0, 0, sys_flag, 0, "127.0.0.1:1", 0, "127.0.0.1:2", 0, 0, body, {}, "X"
    )


def test_compressed_bodies_are_inflated_and_unknown_compression_is_named() -> None:
    text = b"hello " * 1000
    zipped = zlib.compress(text)
    assert inflate(stored(zipped, SYSFLAG_COMPRESSED)).body == text  # old clients: type 0
    assert inflate(stored(zipped, SYSFLAG_COMPRESSED | COMPRESSION_ZLIB)).body == text
    plain = stored(b"plain", 0)
    assert inflate(plain) is plain
    with pytest.raises(MessageFormatError, match="compressed with LZ4"):
        inflate(stored(b"?", SYSFLAG_COMPRESSED | 0x100))
    with pytest.raises(MessageFormatError, match="does not inflate"):
        inflate(stored(b"not zlib", SYSFLAG_COMPRESSED))


def test_a_batch_is_said_by_the_request_not_guessed_from_its_properties() -> None:
    """The trap: ``batch`` was ``not properties``, so a single message without
    properties would go as SEND_BATCH_MESSAGE, and a batch given properties as one
    message."""
    producer = Producer("PG", "127.0.0.1:1")
    queue = MessageQueue("T", "broker-a", 0)
    single = producer._request(Message("T", b"x", flag=7))
    batch = producer._batch_request([Message("T", b"a"), Message("T", b"b")])
    assert not single.batch and batch.batch
    bare = attrs.evolve(single, properties={})
    assert not bare.batch
    command = producer._command(queue, bare)
    assert command.code == RequestCode.SEND_MESSAGE_V2 and command.body == b"x"
    with_properties = attrs.evolve(batch, properties={"WAIT": "false"})
    assert with_properties.batch
    assert producer._command(queue, with_properties).code == RequestCode.SEND_BATCH_MESSAGE
    assert producer._command(queue, single).code == RequestCode.SEND_MESSAGE_V2


@pytest.mark.parametrize("timeout_s", [0, 0.0, -1.0, math.nan])
async def test_a_timeout_that_is_not_positive_is_refused_not_read_as_the_default(
    timeout_s: float,
) -> None:
    """None asks for the default; 0 (or less) is a mistake named before anything is
    sent, never a send that gives up at once nor a pull that waits the default 3 s."""
    message = Message("T", b"x")
    named = r"timeout_s .* is not a positive number of seconds"
    async with Producer("PG", "127.0.0.1:1") as producer:
        with pytest.raises(InvalidArgumentError, match=named):
            await producer.send(message, timeout_s=timeout_s)
        with pytest.raises(InvalidArgumentError, match=named):
            await producer.send_batch([message], timeout_s=timeout_s)
        with pytest.raises(InvalidArgumentError, match=named):
            await producer.send_async(message, lambda result, error: None, timeout_s=timeout_s)
    async with PullConsumer("G", "127.0.0.1:1") as consumer:
        with pytest.raises(InvalidArgumentError, match=named):
            await consumer.pull(MessageQueue("T", "broker-a", 0), 0, timeout_s=timeout_s)
    with pytest.raises(InvalidArgumentError, match=named):
        await ask_controllers(["127.0.0.1:1"], RequestCode.HEART_BEAT, timeout_s=timeout_s)
    with pytest.raises(InvalidArgumentError, match=named):
        await broker_epochs("127.0.0.1:1", timeout_s=timeout_s)


async def test_a_request_given_no_time_left_times_out_at_once() -> None:
    """``ClientInstance.invoke(..., 0)`` is a deadline already passed (the producer's
    last try may come to it), not the config's request_timeout_s: a peer that never
    answers must not hold it for 30 s."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener:  # accepts (the kernel's backlog) and never answers
        addr = f"127.0.0.1:{listener.extra(SocketAttribute.local_port)}"
        config = client_config("127.0.0.1:1", request_timeout_s=30.0)
        async with ClientInstance(config) as instance:
            request = RemotingCommand.request(RequestCode.HEART_BEAT)
            with anyio.fail_after(5):
                with pytest.raises(RemotingTimeoutError):
                    await instance.invoke(addr, request, 0)
                with pytest.raises(RemotingTimeoutError):
                    await instance.invoke(
                        addr, RemotingCommand.request(RequestCode.HEART_BEAT), 0.2
                    )
