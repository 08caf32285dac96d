"""Where a push consumer's retry goes when the broker that stored the message cannot
take it back: to its broker group's current master (by broker name) when the store host
is a slave now, else through a producer to ``%RETRY%group`` as a new message
(RocketMQ's fallback). Brokers and a nameserver run in this process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from hamq.broker import BrokerNode
from hamq.client import (
    AdminClient,
    ConsumeResult,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from hamq.protocol.message import PROPERTY_RETRY_TOPIC
from tests.support.brokers import (
    SMALL_STORE,
    broker_config,
    running_nameserver,
)
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow

#: delay levels of a second each: a sent-back message comes back quickly
FAST_RETRY = {"message_delay_level": "1s 1s 1s 1s 1s 1s", **SMALL_STORE}


@attrs.define
class Running:
    node: BrokerNode
    scope: trio.CancelScope
    stopped: trio.Event

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(20):
            await self.stopped.wait()


async def start_broker(nursery: trio.Nursery, store_dir: Path, **overrides: Any) -> Running:
    node = BrokerNode(broker_config(store_dir, **overrides))
    running = Running(node, trio.CancelScope(), trio.Event())

    async def serve(*, task_status: trio.TaskStatus[int]) -> None:
        try:
            with running.scope:
                await node.run(task_status=task_status)
        finally:
            running.stopped.set()

    await nursery.start(serve)
    return running


def retry_once_handler(
    deliveries: list[MessageExt], first_seen: trio.Event, go_on: trio.Event
) -> Callable[[list[MessageExt]], Awaitable[ConsumeResult]]:
    """RECONSUME_LATER for the first delivery (once ``go_on`` is set), then SUCCESS."""

    async def handle(messages: list[MessageExt]) -> ConsumeResult:
        deliveries.extend(messages)
        if len(deliveries) == 1:
            first_seen.set()
            await go_on.wait()
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    return handle


def assert_retried(deliveries: list[MessageExt], topic: str) -> None:
    first, again = deliveries[0], deliveries[1]
    assert again.body == first.body and again.msg_id == first.msg_id
    assert again.topic == topic  # (shown with its original topic)
    assert again.properties.get(PROPERTY_RETRY_TOPIC) == topic
    assert first.reconsume_times == 0 and again.reconsume_times == 1  # from %RETRY%G


async def test_a_retry_goes_to_the_new_master_when_the_store_host_is_a_slave(
    tmp_path: Path,
) -> None:
    """Master A and slave B of broker-a; a message is stored on A; then B's store
    serves as master and A's as slave at A's old address: the message's store host
    refuses the send-back (SERVICE_NOT_AVAILABLE), the group's master takes it."""
    deliveries: list[MessageExt] = []
    first_seen, swapped = trio.Event(), trio.Event()
    async with running_nameserver() as (_, ns), trio.open_nursery() as nursery:
        common: dict[str, Any] = {"namesrv_addrs": [ns], "metadata_sync_interval_s": 0.5}
        a = await start_broker(nursery, tmp_path / "a", store=FAST_RETRY, **common)
        b = await start_broker(
            nursery, tmp_path / "b", broker_id=1, store={"role": "SLAVE", **FAST_RETRY}, **common
        )
        assert a.node.ha_service is not None
        await wait_for(a.node.ha_service.transfer.available)
        async with Producer("PG", ns) as producer:
            await producer.send(Message("Swapped", b"retry me"))
        consumer = PushConsumer("G", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Swapped")
        async with consumer.consuming(retry_once_handler(deliveries, first_seen, swapped)):
            with trio.fail_after(20):
                await first_seen.wait()
            old_address = a.node.address
            port = a.node.ctx.port
            await wait_for(
                lambda: b.node.store.commitlog_max_offset == a.node.store.commitlog_max_offset
            )
            # the slave has copied the topics and the group (the metadata sync)
            await wait_for(
                lambda: (
                    {"Swapped", "%RETRY%G"} <= set(b.node.ctx.topics.table)
                    and "G" in b.node.ctx.subscriptions.table
                )
            )
            await a.stop()
            await b.stop()
            await start_broker(nursery, tmp_path / "b", store=FAST_RETRY, **common)
            demoted = await start_broker(
                nursery,
                tmp_path / "a",
                broker_id=1,
                listen_port=port,
                store={"role": "SLAVE", **FAST_RETRY},
                **common,
            )
            assert demoted.node.address == old_address == deliveries[0].store_host
            swapped.set()
            await wait_for(lambda: len(deliveries) >= 2, 30)
        nursery.cancel_scope.cancel()
    assert_retried(deliveries, "Swapped")
    # CONSUMER_SEND_MSG_BACK's copy (the new master took it), not a new message
    assert deliveries[1].born_timestamp == deliveries[0].born_timestamp


async def test_a_retry_goes_through_a_producer_when_no_broker_takes_the_send_back(
    tmp_path: Path,
) -> None:
    """broker-a stored the message and is gone when the handler gives up: the retry is
    sent to %RETRY%G as a new message (RocketMQ's fallback), here to broker-b."""
    deliveries: list[MessageExt] = []
    first_seen, gone = trio.Event(), trio.Event()
    async with running_nameserver() as (_, ns), trio.open_nursery() as nursery:
        a = await start_broker(nursery, tmp_path / "a", namesrv_addrs=[ns], store=FAST_RETRY)
        await start_broker(
            nursery, tmp_path / "b", namesrv_addrs=[ns], broker_name="broker-b", store=FAST_RETRY
        )
        async with AdminClient(ns) as admin:
            await admin.create_topic("Fallback", 1)
        async with Producer("PG", ns) as producer:
            await producer.send(
                Message("Fallback", b"retry me"), queue=MessageQueue("Fallback", "broker-a", 0)
            )
        consumer = PushConsumer("G", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Fallback")
        async with consumer.consuming(retry_once_handler(deliveries, first_seen, gone)):
            with trio.fail_after(20):
                await first_seen.wait()
            await a.stop()
            gone.set()
            await wait_for(lambda: len(deliveries) >= 2, 30)
        assert consumer.sent_back == 1
        nursery.cancel_scope.cancel()
    assert_retried(deliveries, "Fallback")
    assert deliveries[1].born_timestamp > deliveries[0].born_timestamp  # a new message
