"""Pop consumption and timer messages across a failover, with real processes: 3
nameservers embedding the controllers and a group of 3 controller-mode brokers
(allAckInSyncStateSet).

A group pops 20 messages and acks half, 10 timer messages wait; the master is killed
(-9). After the election the unacked half comes back once each (attempt 2, after its
invisible time), the acked half never, and every timer message is delivered once, not
before its time; a restart of the old master as a slave changes nothing.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from hamq.client import AdminClient, Message, MessageExt, Producer, SendStatus, SimpleConsumer
from hamq.client.errors import ClientError
from hamq.client.simple_consumer import attempt
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import PopMessageRequestHeader
from hamq.remoting import RemotingError
from tests.support.autoswitch import autoswitch_cluster
from tests.support.brokers import create_topic, invoke, topic_messages
from tests.support.timing import wait_for

pytestmark = [pytest.mark.slow]

TOPIC = "popped"
TIMED = "popped-timers"


def _all_timed(namesrv: str) -> Callable[[], Awaitable[list[MessageExt]]]:
    async def found() -> list[MessageExt]:
        messages = await topic_messages(namesrv, TIMED, group="timer-check")
        return messages if len(messages) >= 10 else []

    return found


async def test_popped_messages_come_back_once_and_acked_ones_never_after_a_master_kill(
    tmp_path: Path,
) -> None:
    config = {"all_ack_in_sync_state_set": True, "metadata_sync_interval_s": 0.5}
    async with autoswitch_cluster(tmp_path, broker_config=config) as cluster:
        state = await cluster.wait_in_sync(3)
        old_master = cluster.broker_at(state["masterAddress"])
        assert old_master is not None
        # a pop on a slave: refused as a send is (RocketMQ's clients pop from masters)
        slave = next(b for b in cluster.brokers if b is not old_master)
        header = PopMessageRequestHeader("popper", TOPIC, -1, 4, 30_000, 0, 0, 0)
        refused = await invoke(
            slave.address, RemotingCommand.request(RequestCode.POP_MESSAGE, header=header)
        )
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused
        await create_topic(cluster.namesrv, TOPIC, 2)
        await create_topic(cluster.namesrv, TIMED, 2)
        async with AdminClient(cluster.namesrv) as admin:
            addrs = [b.address for b in cluster.brokers]

            async def everywhere() -> bool:
                for topic in (TOPIC, TIMED):
                    if len(await admin._topic_configs(addrs, topic)) < len(addrs):
                        return False
                return True

            await cluster.wait_until("the topic on every broker", everywhere)
        async with Producer("pops", namesrv=cluster.namesrv, send_timeout_s=10) as producer:
            for i in range(20):
                result = await producer.send(Message(TOPIC, b"p%d" % i))
                assert result.status is SendStatus.SEND_OK
        async with SimpleConsumer("popper", cluster.namesrv, request_timeout_s=5) as consumer:
            consumer.subscribe(TOPIC)
            popped = []
            with trio.fail_after(30):
                while len(popped) < 20:
                    popped += await consumer.receive(32, invisible_s=6, await_s=1)
            popped_at = time.time()
            acked = {m.body for m in popped[:10]}
            for message in popped[:10]:
                await consumer.ack(message)  # (answered once on every in-sync replica)
        async with Producer("timers", namesrv=cluster.namesrv, send_timeout_s=10) as producer:
            for i in range(10):
                result = await producer.send(Message(TIMED, b"t%d" % i, deliver_after=3 + i / 10))
                assert result.status is SendStatus.SEND_OK
        await old_master.kill(signal.SIGKILL)

        async with SimpleConsumer("popper", cluster.namesrv, request_timeout_s=5) as consumer:
            consumer.subscribe(TOPIC)
            back: list = []  # type: ignore[type-arg]
            with trio.fail_after(60):
                while len(back) < 10:
                    try:
                        found = await consumer.receive(32, invisible_s=60, await_s=1)
                    except (ClientError, RemotingError):
                        await trio.sleep(0.2)  # (no master yet)
                        continue
                    back += found
            assert time.time() >= popped_at + 6 - 1  # (not before their time, give or take)
            assert sorted(m.body for m in back) == sorted(m.body for m in popped[10:])
            assert not acked & {m.body for m in back}
            assert all(attempt(m) == 2 for m in back)
            for message in back:
                await consumer.ack(message)
            timed = await wait_for(_all_timed(cluster.namesrv), 30)
            assert sorted(m.body for m in timed) == sorted(b"t%d" % i for i in range(10))
            assert all(m.store_timestamp >= int(m.properties["TIMER_OUT_MS"]) for m in timed)
            await old_master.start()
            await cluster.wait_in_sync(3, timeout_s=60)
            assert await consumer.receive(32, invisible_s=60, await_s=2) == []
