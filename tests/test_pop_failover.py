"""Pop consumption across a failover, with real processes: 3 nameservers embedding the
controllers and a group of 3 controller-mode brokers (allAckInSyncStateSet).

A group pops 20 messages and acks half; the master is killed (-9). After the election
the unacked half comes back once each (attempt 2, after its invisible time), the acked
half never; so does a restart of the old master as a slave change nothing.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio

from hamq.client import AdminClient, Message, Producer, SendStatus, SimpleConsumer
from hamq.client.errors import ClientError
from hamq.client.simple_consumer import attempt
from hamq.remoting import RemotingError
from tests.support.autoswitch import autoswitch_cluster
from tests.support.brokers import create_topic

pytestmark = [pytest.mark.slow]

TOPIC = "popped"


async def test_popped_messages_come_back_once_and_acked_ones_never_after_a_master_kill(
    tmp_path: Path,
) -> None:
    config = {"all_ack_in_sync_state_set": True, "metadata_sync_interval_s": 0.5}
    async with autoswitch_cluster(tmp_path, broker_config=config) as cluster:
        state = await cluster.wait_in_sync(3)
        old_master = cluster.broker_at(state["masterAddress"])
        assert old_master is not None
        await create_topic(cluster.namesrv, TOPIC, 2)
        async with AdminClient(cluster.namesrv) as admin:
            addrs = [b.address for b in cluster.brokers]

            async def everywhere() -> bool:
                return len(await admin._topic_configs(addrs, TOPIC)) == len(addrs)

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
            await old_master.start()
            await cluster.wait_in_sync(3, timeout_s=60)
            assert await consumer.receive(32, invisible_s=60, await_s=2) == []
