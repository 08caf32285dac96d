"""Producers and consumers against real brokers on loopback (in this process).

Every test runs on Trio, asyncio and uvloop (``anyio_backend``, tests/conftest.py): the
client in the test's own event loop, the brokers and nameservers (Trio only) in Trio
threads of their own (tests/support/backends.py), whose internals a test reads through
``broker.call``."""

from __future__ import annotations

import collections
import threading
import time
import zlib
from pathlib import Path

import anyio
import pytest

from hamq.broker import BrokerNode
from hamq.client import (
    AdminClient,
    BrokerError,
    ConsumeResult,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageQueue,
    NameServerUnavailableError,
    NoRouteError,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendError,
    SendResult,
    SendStatus,
    hash_selector,
)
from hamq.client.blocking import Producer as BlockingProducer
from hamq.client.blocking import PushConsumer as BlockingPushConsumer
from hamq.protocol import ResponseCode
from hamq.protocol.message import SYSFLAG_COMPRESSED
from tests.support.backends import BrokerThread, broker_thread, nameserver_thread
from tests.support.timing import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


class Collector:
    """A push consumer handler that records what it was given."""

    def __init__(self) -> None:
        self.messages: list[MessageExt] = []

    def __call__(self, messages: list[MessageExt]) -> ConsumeResult:
        self.messages.extend(messages)
        return ConsumeResult.SUCCESS

    def bodies(self) -> list[bytes]:
        return [m.body for m in self.messages]


async def pulled_past_the_end(broker: BrokerThread, *consumers: PushConsumer) -> None:
    """Until each queue of ``consumers`` (all the broker serves) is taken to its end and
    pulled past it: the handler had every message up to the queue's end, and the queue's
    next pull waits at the broker, which found nothing after it (a held pull). What a
    test waits for before saying a message did not come twice: one delivered again
    (pulled again, an offset gone back) would have come by then."""
    queues = [(consumer, queue) for consumer in consumers for queue in consumer.assigned]

    def look(node: BrokerNode) -> tuple[int, list[int]]:
        ends = [node.store.max_offset_in_queue(q.topic, q.queue_id) for _, q in queues]
        return node.statistics().held_pulls, ends

    async def past_the_end() -> bool:
        held, ends = await broker.call(look)
        handled = [consumer.consume_offsets(q.topic).get(q) for consumer, q in queues]
        return held == len(queues) and handled == ends

    await wait_for(past_the_end, 60, what="every queue pulled past its end")


async def test_ten_thousand_messages_reach_each_group_once_and_in_queue_order(
    tmp_path: Path,
) -> None:
    total = 10_000
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        await broker.create_topic("Big", 4)
        stored: dict[tuple[int, int], bytes] = {}
        counter = iter(range(total))

        async with Producer("PG", ns) as producer:

            async def sender() -> None:
                for i in counter:
                    body = f"message {i}".encode()
                    result = await producer.send(Message("Big", body))
                    assert result.status is SendStatus.SEND_OK
                    stored[(result.queue.queue_id, result.queue_offset)] = body

            async with anyio.create_task_group() as tasks:
                for _ in range(16):
                    tasks.start_soon(sender)
        assert len(stored) == total
        assert {q for q, _ in stored} == {0, 1, 2, 3}

        groups = {"G1": Collector(), "G2": Collector()}
        consumers = []
        for group in groups:
            consumer = PushConsumer(group, ns, consume_from="FIRST_OFFSET", pull_batch_size=64)
            consumer.subscribe("Big")
            consumers.append(consumer)
        async with (
            consumers[0].consuming(groups["G1"]),
            consumers[1].consuming(groups["G2"]),
        ):
            await wait_for(lambda: all(len(c.messages) >= total for c in groups.values()), 60)
            await pulled_past_the_end(broker, *consumers)  # a message twice would be here
        for collector in groups.values():
            assert len(collector.messages) == total  # each exactly once
            per_queue: dict[int, list[int]] = collections.defaultdict(list)
            for m in collector.messages:
                assert stored[(m.queue_id, m.queue_offset)] == m.body
                per_queue[m.queue_id].append(m.queue_offset)
            for offsets in per_queue.values():
                assert offsets == list(range(len(offsets)))  # queue order, no gaps
        # the group's progress is committed at the end
        committed = await broker.call(lambda node: node.ctx.offsets.query("G1", "Big", 0))
        assert committed == sum(1 for q, _ in stored if q == 0)


async def test_two_consumers_split_the_queues_and_one_takes_over_when_the_other_leaves(
    tmp_path: Path,
) -> None:
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        await broker.create_topic("Shared", 4)
        first, second = Collector(), Collector()
        a = PushConsumer("G", ns, consume_from="FIRST_OFFSET")
        b = PushConsumer("G", ns, consume_from="FIRST_OFFSET")
        for consumer in (a, b):
            consumer.subscribe("Shared")

        def topic_queues(consumer: PushConsumer) -> set[int]:
            return {q.queue_id for q in consumer.assigned if q.topic == "Shared"}

        async with Producer("PG", ns) as producer, a.consuming(first):
            assert topic_queues(a) == {0, 1, 2, 3}
            async with b.consuming(second):
                # told by the broker, both rebalance at once
                await wait_for(lambda: len(topic_queues(a)) == 2 and len(topic_queues(b)) == 2)
                assert topic_queues(a).isdisjoint(topic_queues(b))
                for i in range(200):
                    await producer.send(Message("Shared", f"both {i}"))
                await wait_for(lambda: len(first.messages) + len(second.messages) >= 200)
                assert {m.queue_id for m in first.messages} <= topic_queues(a)
                assert {m.queue_id for m in second.messages} <= topic_queues(b)
            # b left (offsets committed, unregistered): a takes everything over
            await wait_for(lambda: topic_queues(a) == {0, 1, 2, 3})
            for i in range(100):
                await producer.send(Message("Shared", f"after {i}"))
            await wait_for(
                lambda: sum(1 for body in first.bodies() if body.startswith(b"after")) >= 100
            )
        received = set(first.bodies()) | set(second.bodies())
        assert received == {f"both {i}".encode() for i in range(200)} | {
            f"after {i}".encode() for i in range(100)
        }


async def test_ordered_messages_stay_in_order_per_sharding_key(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        await broker.create_topic("Orders", 4)
        async with Producer("PG", ns) as producer:
            for step in range(30):
                for order in range(8):
                    result = await producer.send(
                        Message("Orders", f"{order}:{step}"), hash_selector, f"order-{order}"
                    )
                    assert result.queue == hash_selector(
                        await producer.queues("Orders"), Message("Orders", b"x"), f"order-{order}"
                    )
        seen: dict[str, list[int]] = collections.defaultdict(list)
        failed_once: set[str] = set()

        async def handle(messages: list[MessageExt]) -> ConsumeResult:
            order, step = messages[0].body.decode().split(":")
            if step == "7" and order not in failed_once:  # a hiccup: retried in place
                failed_once.add(order)
                return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
            seen[order].append(int(step))
            return ConsumeResult.SUCCESS

        consumer = PushConsumer(
            "OG", ns, consume_from="FIRST_OFFSET", orderly=True, suspend_current_queue_s=0.05
        )
        consumer.subscribe("Orders")
        async with consumer.consuming(handle):
            await wait_for(lambda: sum(len(s) for s in seen.values()) >= 240, 30)
            queue = MessageQueue("Orders", "broker-a", 0)

            def owner(node: BrokerNode) -> str | None:
                return node.ctx.locks.owner("OG", queue, node.ctx.clock())

            assert await broker.call(owner) == consumer.client_id
        assert all(steps == list(range(30)) for steps in seen.values())
        assert len(seen) == 8
        assert await broker.call(owner) is None  # unlocked at the end


#: delay levels of one second each, so that retries and delays take seconds of real time
ONE_SECOND_LEVELS = {"message_delay_level": " ".join(["1s"] * 18)}


async def test_a_delayed_message_is_delivered_after_its_level(tmp_path: Path) -> None:
    async with broker_thread(tmp_path, store=ONE_SECOND_LEVELS) as broker:
        ns = broker.namesrv
        await broker.create_topic("Later", 1)
        got = Collector()
        consumer = PushConsumer("DG", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Later")
        async with consumer.consuming(got), Producer("PG", ns) as producer:
            sent_at, sent_at_ms = anyio.current_time(), time.time_ns() // 1_000_000
            await producer.send(Message("Later", b"in a second", delay_level=3))
            await producer.send(Message("Later", b"now"))
            await wait_for(lambda: len(got.messages) == 1, 10)
            assert got.bodies() == [b"now"]
            await wait_for(lambda: len(got.messages) == 2, 10)
            waited = anyio.current_time() - sent_at
        delayed = got.messages[1]
        assert delayed.body == b"in a second"
        assert waited >= 1.0
        assert "DELAY" not in delayed.properties
        # stored again (under its real topic) when due, by the broker's clock
        assert delayed.store_timestamp - sent_at_ms >= 1000


async def test_failed_messages_are_retried_then_dead_lettered(tmp_path: Path) -> None:
    async with broker_thread(tmp_path, store=ONE_SECOND_LEVELS) as broker:
        ns = broker.namesrv
        await broker.create_topic("Work", 1)
        attempts: list[tuple[str, int]] = []

        def handle(messages: list[MessageExt]) -> ConsumeResult:
            for m in messages:
                attempts.append((m.topic, m.reconsume_times))
                if m.body == b"poison":
                    return ConsumeResult.RECONSUME_LATER
            return ConsumeResult.SUCCESS

        consumer = PushConsumer("RG", ns, consume_from="FIRST_OFFSET", max_reconsume_times=2)
        consumer.subscribe("Work")
        async with consumer.consuming(handle), Producer("PG", ns) as producer:
            await producer.send(Message("Work", b"poison", keys="p1"))
            await producer.send(Message("Work", b"fine"))
            started = anyio.current_time()
            await wait_for(
                lambda: broker.call(lambda node: node.ctx.topics.get("%DLQ%RG") is not None), 30
            )
            # retried after delay levels 3 and 4 (a second each here)
            assert anyio.current_time() - started >= 2
        # delivered once and retried twice, shown under its own topic each time
        assert sorted(attempts) == [("Work", 0), ("Work", 0), ("Work", 1), ("Work", 2)]
        async with PullConsumer("inspect", ns) as puller:
            [dlq] = await puller.queues("%DLQ%RG")
            result = await puller.pull(dlq, 0)
        assert result.status is PullStatus.FOUND
        [dead] = result.messages
        assert dead.body == b"poison"
        assert dead.properties["RETRY_TOPIC"] == "Work"
        assert dead.reconsume_times == 3


async def test_the_producer_keeps_sending_when_a_nameserver_dies(tmp_path: Path) -> None:
    async with nameserver_thread() as second, nameserver_thread() as first:
        addrs = [first.addr, second.addr]
        async with (
            broker_thread(tmp_path, namesrv_addrs=addrs),
            Producer("PG", addrs) as producer,
        ):
            producer.instance._namesrv_index = 0
            assert (await producer.send(Message("A", b"1"))).status is SendStatus.SEND_OK
            await first.stop()  # the nameserver in use goes away
            for topic in ("B", "C"):  # new topics: their routes must be looked up
                result = await producer.send(Message(topic, b"2"))
                assert result.status is SendStatus.SEND_OK
            assert producer.instance.namesrv_addr == second.addr
            await producer.instance.refresh_routes()  # the periodic refresh works too


async def test_a_broker_restart_keeps_messages_and_committed_offsets(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        async with Producer("PG", ns) as producer:
            for i in range(100):
                await producer.send(Message("Kept", f"old {i}"))
        got = Collector()
        consumer = PushConsumer("KG", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Kept")
        async with consumer.consuming(got):
            await wait_for(lambda: len(got.messages) == 100)
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        async with Producer("PG", ns) as producer:
            for i in range(20):
                await producer.send(Message("Kept", f"new {i}"))
        again = Collector()
        consumer = PushConsumer("KG", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Kept")
        async with consumer.consuming(again):
            # (bounded loosely: on a loaded machine a rebalance after the restart is slow;
            # what came is named if they do not all come)
            await wait_for(
                lambda: len(again.messages) >= 20,
                30,
                what=lambda: f"{len(again.messages)} of 20 new ones: {sorted(again.bodies())}",
            )
            # an old message delivered again (its committed offset lost in the restart)
            # would be here by then
            await pulled_past_the_end(broker, consumer)
        assert sorted(again.bodies()) == sorted(f"new {i}".encode() for i in range(20))
        async with PullConsumer("fresh", ns) as puller:
            kept = 0
            for queue in await puller.queues("Kept"):
                kept += len((await puller.pull(queue, 0, max_nums=1024)).messages)
        assert kept == 120


async def test_send_variants_and_what_consumers_see(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        await broker.create_topic("V", 2)
        async with Producer("PG", ns) as producer:
            big = bytes(range(256)) * 40  # 10 KiB: goes compressed
            one = await producer.send(
                Message("V", big, tags="big", keys=["k1", "k2"], properties={"p": "v"}),
                queue=MessageQueue("V", "broker-a", 1),
            )
            assert one.queue.queue_id == 1
            batch = await producer.send_batch(
                [Message("V", f"b{i}", tags="batch") for i in range(5)],
                queue=MessageQueue("V", "broker-a", 0),
            )
            assert len(batch.msg_id.split(",")) == 5
            called: list[SendResult | None] = []
            done = anyio.Event()

            def callback(result: SendResult | None, error: BaseException | None) -> None:
                called.append(result)
                done.set()  # (a callback runs in the producer's loop)

            await producer.send_async(Message("V", b"async", tags="a"), callback)
            await producer.send_oneway(Message("V", b"oneway", tags="o"))
            with anyio.fail_after(5):
                await done.wait()
            assert called[0] is not None and called[0].status is SendStatus.SEND_OK

        stored = await broker.call(
            lambda node: node.store.look_message_by_offset(int(one.offset_msg_id[16:], 16))
        )  # on disk: compressed, flagged
        assert stored.sys_flag & SYSFLAG_COMPRESSED and zlib.decompress(stored.body) == big

        async with PullConsumer("PC", ns) as puller:
            await wait_for(
                lambda: broker.call(
                    lambda node: (
                        node.store.max_offset_in_queue("V", 0)
                        + node.store.max_offset_in_queue("V", 1)
                        == 8
                    )
                )
            )
            everything = []
            for queue in await puller.queues("V"):
                everything += (await puller.pull(queue, 0)).messages
            by_tags = {m.tags: m for m in everything}
            assert by_tags["big"].body == big  # inflated for the consumer
            assert by_tags["big"].keys == ["k1", "k2"] and by_tags["big"].properties["p"] == "v"
            assert by_tags["big"].msg_id == one.msg_id
            assert sum(1 for m in everything if m.tags == "batch") == 5
            assert {b"async", b"oneway"} <= {m.body for m in everything}
            queue0 = MessageQueue("V", "broker-a", 0)
            only_batch = await puller.pull(queue0, 0, "batch")
            assert {m.tags for m in only_batch.messages} == {"batch"}
            # long polling from the consumer's side: answered when a message comes
            caught_up = await puller.max_offset(queue0)
            async with anyio.create_task_group() as tasks:
                results: list[object] = []

                async def wait_pull() -> None:
                    results.append(await puller.pull(queue0, caught_up, wait_s=20))

                tasks.start_soon(wait_pull)
                await wait_for(lambda: broker.call(lambda node: node.statistics().held_pulls == 1))
                async with Producer("PG2", ns) as producer:
                    await producer.send(Message("V", b"late"), queue=queue0)
            [late] = results
            assert [m.body for m in late.messages] == [b"late"]  # type: ignore[attr-defined]
            await puller.commit_offset(queue0, 3)
            assert await puller.committed_offset(queue0) == 3


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("bad topic", b"x"), "may only contain"),
        (Message("x" * 128, b"x"), "is 128 characters, over 127"),
        (Message("T", b""), "body to topic T is empty"),
        (Message("T", b"x" * 70_000), "exceeds the maximum 65536 bytes"),
        (Message("T", b"x", properties={"TAGS": "a"}), "set through the Message's own field"),
        (Message("T", b"x", properties={"a": "b\x01"}), "\\\\x01"),
        (Message("T", b"x", delay_level=300), "delay_level 300"),
        (Message("TBW102", b"x"), "system topic TBW102"),
    ],
)
async def test_bad_messages_are_refused_before_sending(
    threaded_broker: BrokerThread, message: Message, error: str
) -> None:
    async with Producer("PG", threaded_broker.namesrv, max_message_size=65536) as producer:
        with pytest.raises(InvalidArgumentError, match=error):
            await producer.send(message)


async def test_refusals_and_failures_name_their_cause(tmp_path: Path) -> None:
    async with broker_thread(
        tmp_path, auto_create_topic_enable=False, store={"max_message_bytes": 1024}
    ) as broker:
        ns = broker.namesrv
        async with Producer("PG", ns, send_timeout_s=2) as producer:
            # sent through TBW102's route, as RocketMQ does, and refused by the broker
            with pytest.raises(SendError, match=r"topic\[Unknown\] not exist") as info:
                await producer.send(Message("Unknown", b"x"))
            cause = info.value.__cause__
            assert isinstance(cause, BrokerError) and cause.code == ResponseCode.TOPIC_NOT_EXIST
            await broker.create_topic("Small", 1)
            with pytest.raises(SendError) as refused:
                await producer.send(Message("Small", b"x" * 2000))
            illegal = refused.value.__cause__
            assert isinstance(illegal, BrokerError) and illegal.code == ResponseCode.MESSAGE_ILLEGAL
            assert "over max_message_bytes 1024" in str(refused.value)
            assert len(refused.value.attempts) == 1  # not a retriable refusal

            def nowhere(queues: list[MessageQueue], message: Message, arg: object) -> MessageQueue:
                return MessageQueue("Small", "broker-z", 0)

            with pytest.raises(InvalidArgumentError, match="not one of the topic's queues"):
                await producer.send(Message("Small", b"x"), nowhere)
            with pytest.raises(InvalidArgumentError, match="sharding key"):
                await producer.send(Message("Small", b"x"), hash_selector, 1.5)
    async with Producer("PG", "127.0.0.1:1", send_timeout_s=2) as lost:
        with pytest.raises(SendError) as unreachable:
            await lost.send(Message("T", b"x"))
        assert isinstance(unreachable.value.__cause__, NameServerUnavailableError)
        assert "127.0.0.1:1" in str(unreachable.value)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Producer("PG", "nohost"), "nameserver address 'nohost'"),
        (lambda: Producer("PG", []), "no nameserver address"),
        (lambda: Producer("", "127.0.0.1:9876"), "producer group is empty"),
        (lambda: Producer("PG", "127.0.0.1:9876", compress_level=11), "compress_level 11"),
        (lambda: PushConsumer("G", "127.0.0.1:9876", consume_from="soon"), "consume_from 'soon'"),
        (lambda: PushConsumer("G", "127.0.0.1:9876", pull_batch_size=0), "pull_batch_size 0"),
        (lambda: PushConsumer("bad group", "127.0.0.1:9876"), "may only contain"),
        (
            lambda: PushConsumer("G", "127.0.0.1:9876", consume_from="TIMESTAMP"),
            "consume_timestamp_ms",
        ),
    ],
)
def test_bad_client_settings_are_named(make: object, error: str) -> None:
    with pytest.raises(InvalidArgumentError, match=error):
        make()  # type: ignore[operator]


async def test_a_consumer_needs_a_subscription_and_a_handler() -> None:
    consumer = PushConsumer("G", "127.0.0.1:9876")
    with pytest.raises(InvalidArgumentError, match="subscribe to a topic"):
        await consumer.run(Collector())
    with pytest.raises(InvalidArgumentError, match="may only contain"):
        consumer.subscribe("no such topic")


async def test_the_blocking_facade_sends_and_consumes(threaded_broker: BrokerThread) -> None:
    ns = threaded_broker.namesrv

    def blocking_program() -> list[bytes]:
        with BlockingProducer("PG", ns) as producer:
            for i in range(10):
                assert producer.send(Message("Plain", f"m{i}")).status is SendStatus.SEND_OK
        got: list[bytes] = []
        all_in = threading.Event()

        def handle(messages: list[MessageExt]) -> None:
            got.extend(m.body for m in messages)
            if len(got) >= 10:
                all_in.set()

        consumer = BlockingPushConsumer("BG", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Plain")
        consumer.start(handle)
        try:
            assert all_in.wait(10), got  # (no event loop in this thread)
            assert {q.topic for q in consumer.assigned} == {"Plain", "%RETRY%BG"}
        finally:
            consumer.shutdown()
        return got

    got = await anyio.to_thread.run_sync(blocking_program)
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(10))


async def test_sends_go_to_another_broker_when_one_is_down(tmp_path: Path) -> None:
    async with nameserver_thread() as nameserver:
        ns = nameserver.addr
        async with (
            broker_thread(tmp_path / "a", namesrv_addrs=[ns], broker_name="a") as a,
            broker_thread(tmp_path / "b", namesrv_addrs=[ns], broker_name="b"),
        ):
            async with AdminClient(ns) as admin:

                async def both_registered() -> bool:
                    return len(await admin.all_broker_addrs()) == 2

                async def both_route() -> bool:
                    try:
                        route = await admin.topic_route("Both")
                    except NoRouteError:
                        return False
                    return {b.broker_name for b in route.broker_datas} == {"a", "b"}

                # a broker registers with the nameserver (once up, and its topics once
                # changed) in the background: the producer must find both in the route
                await wait_for(both_registered)
                await admin.create_topic("Both", 2)
                await wait_for(both_route)
            async with Producer("PG", ns, latency_fault_tolerance=True) as producer:
                queues = await producer.queues("Both")
                assert {q.broker_name for q in queues} == {"a", "b"}
                await a.stop()  # broker a goes away; the producer's route still lists it
                results = [await producer.send(Message("Both", f"m{i}")) for i in range(20)]
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert {r.queue.broker_name for r in results} == {"b"}
        # a failed once and is then avoided for a while
        assert not producer.faults.available("a", anyio.current_time())


async def test_where_a_new_group_starts(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        await broker.create_topic("From", 1)

        async def broker_clock() -> int:
            return await broker.call(lambda node: node.ctx.clock())

        async with Producer("PG", ns) as producer:
            for i in range(3):
                await producer.send(Message("From", f"old {i}"))
            # the boundary: a time (the broker's clock, ms) after every old message's
            # store time; "recent" is stored at or after it
            stored_by_ms = await broker_clock()

            async def later() -> bool:
                return await broker_clock() > stored_by_ms

            await wait_for(later)
            boundary_ms = await broker_clock()
            await producer.send(Message("From", b"recent"))
            results: dict[str, Collector] = {}
            for name, options in {
                "first": {"consume_from": "FIRST_OFFSET"},
                "last": {"consume_from": "LAST_OFFSET"},
                "stamp": {"consume_from": "TIMESTAMP", "consume_timestamp_ms": boundary_ms},
            }.items():
                collector = results[name] = Collector()
                consumer = PushConsumer(f"G-{name}", ns, **options)  # type: ignore[arg-type]
                consumer.subscribe("From")
                async with consumer.consuming(collector):
                    await producer.send(Message("From", f"live {name}"))
                    live = f"live {name}".encode()

                    def arrived(c: Collector = collector, body: bytes = live) -> bool:
                        return body in c.bodies()

                    await wait_for(arrived)
        assert results["first"].bodies() == [b"old 0", b"old 1", b"old 2", b"recent", b"live first"]
        assert results["last"].bodies() == [b"live last"]  # only what came after it joined
        assert results["stamp"].bodies()[:1] == [b"recent"]


async def test_leaving_the_producer_waits_for_async_sends(tmp_path: Path) -> None:
    async with broker_thread(tmp_path, store={"flush_disk_type": "SYNC_FLUSH"}) as broker:
        outcomes: list[SendResult | None] = []

        def callback(result: SendResult | None, error: BaseException | None) -> None:
            outcomes.append(result)

        async with Producer("PG", broker.namesrv) as producer:
            for i in range(300):
                await producer.send_async(Message("Async", f"m{i}"), callback)
        assert len(outcomes) == 300  # every callback ran before the block ended
        assert all(r is not None and r.status is SendStatus.SEND_OK for r in outcomes)
