"""Timer messages across a failover, with real processes: 3 nameservers embedding the
controllers and a group of 3 controller-mode brokers (allAckInSyncStateSet).

Timer messages are sent due at spread times: some come due (and are delivered) before
the master is killed (-9), the rest after. A new master is elected; every timer message
acknowledged must reach its topic exactly once (none delivered before the kill comes
again, none waiting is lost), never before its time, and still once after the old
master comes back as a slave.
"""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import pytest

from hamq.client import AdminClient, Message, Producer, SendStatus
from tests.support.autoswitch import AutoswitchCluster, autoswitch_cluster
from tests.support.brokers import create_topic, topic_messages

pytestmark = [pytest.mark.slow]

TOPIC = "timed"


async def delivered(cluster: AutoswitchCluster) -> collections.Counter[str]:
    """UNIQ_KEY -> how many times the master holds it in TOPIC; each one's delivery is
    checked to be no earlier than its time."""
    messages = await topic_messages(cluster.namesrv, TOPIC, group="timer-check")
    for message in messages:
        assert message.store_timestamp >= int(message.properties["TIMER_OUT_MS"]), message
    return collections.Counter(m.properties["UNIQ_KEY"] for m in messages)


async def test_timer_messages_come_once_across_a_master_kill(tmp_path: Path) -> None:
    config = {"all_ack_in_sync_state_set": True, "metadata_sync_interval_s": 0.5}
    async with autoswitch_cluster(tmp_path, broker_config=config) as cluster:
        state = await cluster.wait_in_sync(3)
        old_master = cluster.broker_at(state["masterAddress"])
        assert old_master is not None
        # the topic on every broker first (the slaves copy it from the master), so that
        # the new master serves what it delivers
        await create_topic(cluster.namesrv, TOPIC, 2)
        async with AdminClient(cluster.namesrv) as admin:
            addrs = [b.address for b in cluster.brokers]

            async def everywhere() -> bool:
                return len(await admin._topic_configs(addrs, TOPIC)) == len(addrs)

            await cluster.wait_until("the topic on every broker", everywhere)
        sent: dict[str, float] = {}  # UNIQ_KEY -> when it is due (s since the epoch)
        start = time.time()
        async with Producer("timers", namesrv=cluster.namesrv, send_timeout_s=10) as producer:
            for i in range(40):
                # 10 due within a second and a half, 30 spread over 6 to 9 s from now
                due = start + (0.5 + 0.1 * i if i < 10 else 6 + 0.1 * i)
                result = await producer.send(Message(TOPIC, b"t%d" % i, deliver_at=due))
                assert result.status is SendStatus.SEND_OK, result
                sent[result.msg_id] = due
        early = {key for key, due in sent.items() if due < start + 2}

        async def early_delivered() -> bool:
            return early <= set(await delivered(cluster))

        await cluster.wait_until("the early ones delivered", early_delivered, timeout_s=30)
        assert time.time() < start + 6, "the kill must come before the rest are due"
        await old_master.kill(signal.SIGKILL)

        async def all_delivered() -> collections.Counter[str] | None:
            found = await delivered(cluster)
            return found if set(found) >= set(sent) else None

        found = await cluster.wait_until("every timer message", all_delivered, timeout_s=60)
        new_master = await cluster.master()
        assert new_master is not None and new_master is not old_master
        twice = {key: n for key, n in found.items() if n > 1}
        assert not twice, f"delivered more than once: {twice}"
        assert set(found) == set(sent)

        # the old master comes back as a slave: nothing is delivered again
        await old_master.start()
        await cluster.wait_in_sync(3, timeout_s=60)
        again = await delivered(cluster)
        assert again == found
