"""Transactions across an automatic failover, with real processes.

A group of 3 controller-mode brokers (allAckInSyncStateSet: a half message's SEND_OK
means every in-sync replica has it). A TransactionProducer commits some transactions
and rolls some back; then, in the middle of one — its half message acknowledged, its
local transaction done, its COMMIT not yet sent — the master is killed (-9). The
producer's END goes nowhere. The new master must ask the producer (check-back) and
store the committed message: in the end every committed transaction's message is in
the topic exactly once, and no rolled-back one is. "Nothing more is committed" is seen
after the new master's check loop had its chance: past the check time out, two more
passes (its metrics' ``hamq_broker_transaction_check_passes_total``), and the producer's
answers to what it asked then taken.
"""

from __future__ import annotations

import collections
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from hamq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import TopicConfigSerializeWrapper, decode_body
from hamq.protocol.headers import GetMaxOffsetRequestHeader, OffsetResponseHeader
from hamq.protocol.message import TRANS_HALF_TOPIC
from hamq.remoting import RemotingClient
from tests.support.autoswitch import AutoswitchCluster, Server, autoswitch_cluster
from tests.support.backends import trio_and_asyncio
from tests.support.brokers import create_topic, topic_messages
from tests.support.metrics import scrape, shows, value

pytestmark = [pytest.mark.anyio, pytest.mark.slow, trio_and_asyncio]

TOPIC = "tx-failover"
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE


class Ledger:
    """The producer's local transactions: what each one decided (the check-back's
    answer), and which one kills the master before its COMMIT is sent."""

    def __init__(self, cluster: AutoswitchCluster) -> None:
        self.cluster = cluster
        self.decided: dict[str, LocalTransactionState] = {}
        self.kill_in: str | None = None
        self.killed: Any = None
        self.checked: list[str] = []

    async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
        key = message.keys[0]
        self.decided[key] = ROLLBACK if arg == "rollback" else COMMIT
        if key == self.kill_in:
            master = await self.cluster.master()
            assert master is not None
            self.killed = master
            await master.kill(signal.SIGKILL)
        return self.decided[key]

    async def check(self, message: MessageExt) -> LocalTransactionState:
        key = message.keys[0]
        self.checked.append(key)
        return self.decided.get(key, ROLLBACK)


async def test_master_killed_mid_transaction_new_master_commits_it_once(tmp_path: Path) -> None:
    config = {
        "all_ack_in_sync_state_set": True,
        "transaction_timeout_s": 1.0,
        "transaction_check_interval_s": 0.5,
        "metadata_sync_interval_s": 0.5,
    }
    async with autoswitch_cluster(tmp_path, broker_config=config, metrics=True) as cluster:
        await cluster.wait_in_sync(3)
        # the topic exists before: a slave learns topics at its metadata sync, and a new
        # master serves pulls only of topics it knows
        await create_topic(cluster.namesrv, TOPIC)
        for broker in cluster.brokers:
            await cluster.wait_until(
                f"{broker.name} knows {TOPIC}", lambda b=broker: _knows(b.address, TOPIC)
            )
        ledger = Ledger(cluster)
        async with TransactionProducer(
            "tx-failover",
            cluster.namesrv,
            ledger,
            send_timeout_s=20.0,
            heartbeat_broker_interval_s=0.5,
            poll_name_server_interval_s=0.5,
        ) as producer:
            for i in range(6):
                arg = "rollback" if i % 3 == 2 else "commit"
                await producer.send_in_transaction(Message(TOPIC, f"b{i}", keys=f"k{i}"), arg)
            ledger.kill_in = "k-mid"
            result = await producer.send_in_transaction(
                Message(TOPIC, b"mid", keys="k-mid"), "commit"
            )
            assert result.local_transaction_state is COMMIT
            assert ledger.killed is not None
            await cluster.wait_until(
                "a new master", lambda: _new_master(cluster, ledger.killed.address), timeout_s=30
            )
            # the new master asks about what it cannot know, and commits what was committed
            await cluster.wait_until(
                "the check-back", lambda: _asked(ledger, "k-mid"), timeout_s=40
            )
            await cluster.wait_until(
                "the committed message",
                lambda: _stored(cluster, "k-mid"),
                timeout_s=20,
            )
            # past the time out of the copy the check put back, then two more passes
            # of the new master: it asked again about nothing (a check-back puts a copy
            # back before it asks), so nothing more can be committed
            new_master = await cluster.master()
            assert new_master is not None and new_master.metrics_port is not None
            halves = await _half_messages(new_master)
            assert halves >= 8  # (the seven sent, and the copy the check put back)
            await anyio.sleep(config["transaction_timeout_s"])
            await _more_passes(cluster, new_master.metrics_port)
            assert await _half_messages(new_master) == halves
        stored = collections.Counter(
            m.keys[0] for m in await topic_messages(cluster.namesrv, TOPIC)
        )
        committed = {k for k, state in ledger.decided.items() if state is COMMIT}
        rolled_back = set(ledger.decided) - committed
        assert {k: stored[k] for k in committed} == {k: 1 for k in committed}, stored
        assert not rolled_back & set(stored), stored
        print(f"\ntransactions across failover: stored {dict(stored)}; checked {ledger.checked}")


async def _more_passes(cluster: AutoswitchCluster, port: int) -> None:
    """Until the broker with metrics ``port`` completed two more check passes than it
    had (the first may have begun before), and dispatched what it stored meanwhile."""
    seen = value(await scrape(port), "hamq_broker_transaction_check_passes", "_total")
    await cluster.wait_until(
        "two more check passes",
        shows(port, "hamq_broker_transaction_check_passes", lambda n: n >= seen + 2, "_total"),
    )
    stored = value(await scrape(port), "hamq_broker_commitlog_offset", which="max")
    await cluster.wait_until(
        "what they stored dispatched",
        shows(port, "hamq_broker_commitlog_offset", lambda n: n >= stored, which="dispatched"),
    )


async def _half_messages(broker: Server) -> int:
    """How many half messages ``broker`` holds (its half queue's dispatched end)."""
    header = GetMaxOffsetRequestHeader(TRANS_HALF_TOPIC, 0)
    async with RemotingClient() as client:
        answer = await client.invoke(
            broker.address, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, header), 10
        )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return answer.header(OffsetResponseHeader).offset


async def _knows(address: str, topic: str) -> bool:
    """Whether the broker at ``address`` has ``topic`` (its topic config)."""
    async with RemotingClient() as client:
        answer = await client.invoke(
            address, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 10
        )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return topic in decode_body(TopicConfigSerializeWrapper, answer.body).topic_config_table


async def _new_master(cluster: AutoswitchCluster, old: str) -> bool:
    state = await cluster.group_state()
    address = state.get("masterAddress")
    return bool(address and address != old)


async def _asked(ledger: Ledger, key: str) -> bool:
    return key in ledger.checked


async def _stored(cluster: AutoswitchCluster, key: str) -> bool:
    return any(m.keys == [key] for m in await topic_messages(cluster.namesrv, TOPIC))
