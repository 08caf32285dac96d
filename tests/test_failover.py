"""Automatic failover with real processes: 3 nameservers embedding the
controllers, one group of 3 controller-mode brokers with allAckInSyncStateSet.

8 producers send all the time; the master is killed (-9), then the Raft leader among
the controllers too. A new master must be elected from the SyncStateSet and take the
sends; every message acknowledged (SEND_OK) before or after the kill must be on the
new master, once (a retried send may be stored twice under one UNIQ_KEY: counted and
reported); the old master, started again, must come back as a slave, cut the tail the
group never acknowledged (its log says so) and end byte-identical to the new master.

The producers run in the test's own loop, on Trio and on asyncio;
tests/support/autoswitch.py starts and kills the processes with AnyIO's API.
"""

from __future__ import annotations

import collections
import re
import signal
from pathlib import Path

import anyio
import pytest

from hamq.client import Message, Producer, SendStatus
from hamq.client.errors import ClientError
from tests.support.autoswitch import AutoswitchCluster, autoswitch_cluster
from tests.support.backends import trio_and_asyncio
from tests.support.brokers import topic_messages
from tests.support.ha import ha_status, log_prefix

# (not on uvloop as well: a cluster of 6 processes for each run; see trio_and_asyncio)
pytestmark = [pytest.mark.anyio, pytest.mark.slow, trio_and_asyncio]

TOPIC = "failover"
PRODUCERS = 8


class Sends:
    def __init__(self) -> None:
        self.acked: dict[str, bytes] = {}  # UNIQ_KEY -> body
        self.failed = 0
        self.not_ok: collections.Counter[str] = collections.Counter()
        self.first_ok_after: float | None = None
        self.kill_time: float | None = None
        self.killed: object = None


async def produce(cluster: AutoswitchCluster, k: int, sends: Sends, stop: anyio.Event) -> None:
    async with Producer(f"failover-{k}", namesrv=cluster.namesrv, send_timeout_s=10.0) as producer:
        i = 0
        while not stop.is_set():
            body = f"p{k}-{i}".encode()
            i += 1
            try:
                result = await producer.send(Message(TOPIC, body))
            except ClientError:
                sends.failed += 1
                continue
            if result.status is SendStatus.SEND_OK:
                sends.acked[result.msg_id] = body
                if (
                    sends.first_ok_after is None
                    and sends.killed is not None
                    and cluster.broker_stored(result.offset_msg_id) is not sends.killed
                ):
                    sends.first_ok_after = anyio.current_time()
            else:
                sends.not_ok[result.status.value] += 1


async def read_all(cluster: AutoswitchCluster) -> collections.Counter[str]:
    """UNIQ_KEY -> how many times the master stores it, over every queue of the topic."""
    stored = await topic_messages(cluster.namesrv, TOPIC, group="failover-check")
    return collections.Counter(m.properties["UNIQ_KEY"] for m in stored)


def recovered_end(log: str) -> int:
    """The log end a broker recovered at its last start ('commitlog [a, b)')."""
    ends = re.findall(r"commitlog \[\d+, (\d+)\)", log)
    return int(ends[-1]) if ends else -1


async def test_master_killed_new_master_elected_nothing_acknowledged_lost(
    tmp_path: Path,
) -> None:
    config = {"all_ack_in_sync_state_set": True}
    async with autoswitch_cluster(tmp_path, broker_config=config) as cluster:
        state = await cluster.wait_in_sync(3)
        old_master = cluster.broker_at(state["masterAddress"])
        assert old_master is not None
        old_epoch = state["masterEpoch"]

        sends = Sends()
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            for k in range(PRODUCERS):
                group.start_soon(produce, cluster, k, sends, stop)
            await cluster.wait_until("sends go through", lambda: _count(sends, 200))

            # kill -9 the master, then the Raft leader among the controllers
            sends.kill_time = anyio.current_time()
            sends.killed = old_master
            acked_before_kill = len(sends.acked)
            await old_master.kill(signal.SIGKILL)
            leader = await cluster.leader_nameserver()
            await leader.kill(signal.SIGKILL)

            new_state = await cluster.wait_until(
                "a new master",
                lambda: _new_master(cluster, old_master.address),
                timeout_s=30,
            )
            assert new_state["masterEpoch"] == old_epoch + 1
            await cluster.wait_until("sends resume", lambda: _resumed(sends), timeout_s=30)
            resumed = len(sends.acked)
            await cluster.wait_until(
                "more sends", lambda: _count(sends, resumed + 200), timeout_s=30
            )
            stop.set()
        failover_s = sends.first_ok_after - sends.kill_time  # type: ignore[operator]

        new_master = cluster.broker_at(new_state["masterAddress"])
        assert new_master is not None and new_master is not old_master

        # the old master comes back: a slave, its unacknowledged tail cut off
        await old_master.start()
        state = await cluster.wait_in_sync(3, timeout_s=60)
        assert state["masterAddress"] == new_master.address
        new_start = (await ha_status(new_master.address))["epochs"][-1][1]
        old_end = recovered_end(old_master.log().split("---- start 2")[-1])
        # (on loopback the slaves usually hold the master's last bytes too: a tail only
        # the old master has is there when its last transfers had not left it)
        truncated = max(0, old_end - new_start)
        if truncated:
            assert re.search(rf"truncating \[{new_start}, {old_end}\)", old_master.log())

        # every acknowledged message is on the new master
        seen = await read_all(cluster)
        missing = [key for key in sends.acked if key not in seen]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
        duplicates = sum(n - 1 for n in seen.values() if n > 1)

        # and every replica ends byte-identical to the master
        await cluster.wait_until("replicas caught up", lambda: _caught_up(cluster), timeout_s=30)
        ends = {b.name: await max_offset(b.address) for b in cluster.brokers}
        for broker in cluster.brokers:
            await broker.kill(signal.SIGTERM)
        length = max(ends.values())
        master_index = cluster.brokers.index(new_master)
        reference = log_prefix(cluster.broker_stores[master_index], length)
        for i, store in enumerate(cluster.broker_stores):
            assert log_prefix(store, length) == reference, f"broker-{i} differs"

        print(
            f"\nfailover: {acked_before_kill} acked before the kill, {len(sends.acked)} in "
            f"all; first SEND_OK {failover_s:.2f}s after kill -9; not ok "
            f"{dict(sends.not_ok)}; failed sends {sends.failed}; duplicates {duplicates}; "
            f"old master recovered to {old_end}, new epoch from {new_start}, "
            f"truncated {truncated} bytes"
        )


async def _count(sends: Sends, n: int) -> bool:
    return len(sends.acked) >= n


async def _resumed(sends: Sends) -> bool:
    return sends.first_ok_after is not None


async def _new_master(cluster: AutoswitchCluster, old: str) -> dict[str, object] | None:
    state = await cluster.group_state()
    address = state.get("masterAddress")
    return state if address and address != old else None


async def max_offset(address: str) -> int:
    status = await ha_status(address)
    side: dict[str, int] = status.get("master") or status["slave"]
    return side["max_offset"]


async def _caught_up(cluster: AutoswitchCluster) -> bool:
    return len({await max_offset(b.address) for b in cluster.brokers}) == 1
