"""The brokers' side of failover under partitions, in network namespaces: the
nemesis harness's cluster (tests/support/nemesis.py: 3 controllers in nameservers,
broker-a of 3 and broker-b of 2, allAckInSyncStateSet), a fault held, and what the
brokers answer meanwhile.

- a master cut from the controllers and its slaves, which the client still reaches (or
  cut off together with the Raft leader, which has no majority then), loses its lease:
  it refuses sends saying so (SERVICE_NOT_AVAILABLE), never answers SEND_OK after the
  cut, and the producer finds the new master;
- a slave cut from everyone leaves the SyncStateSet, and while its connection lingers
  (nothing closed it) it is not taken back on its old ack: sends keep going SEND_OK; once
  it acks again it is back in the set.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from hamq.client import Message, MessageQueue, Producer, SendStatus
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import SendMessageRequestHeader
from hamq.protocol.send_fields import send_v2_fields
from hamq.remoting import RemotingClient, RemotingError
from tests.support import netns
from tests.support.nemesis import (
    TOPIC,
    Member,
    NemesisCluster,
    isolate_slave,
    master_with_leader,
    nemesis_cluster,
    split_master,
)
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NemesisCluster]:
    why = netns.unavailable()  # (here, not at collection: it may install packages)
    if why is not None:
        pytest.skip(why)
    async with nemesis_cluster(tmp_path) as cluster:
        with netns.entered(cluster.client):
            yield cluster


async def send_to(address: str, body: bytes) -> RemotingCommand | None:
    """One SEND_MESSAGE_V2 to queue 0 of the topic at ``address``, straight (no producer
    to look routes up and retry); its answer, None if none came within 6 s."""
    header = SendMessageRequestHeader(
        producer_group="partitions",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties="",
    )
    request = RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2, ext_fields=send_v2_fields(header), body=body
    )
    try:
        async with RemotingClient() as client:
            return await client.invoke(address, request, 6)
    except RemotingError:
        return None


def stored_at(offset_msg_id: str) -> str:
    """The IP address of the broker that stored a message (its offset message id's
    first 4 bytes)."""
    return ".".join(str(b) for b in bytes.fromhex(offset_msg_id[:8]))


async def controller_view(cluster: NemesisCluster, address: str) -> dict[str, Any]:
    """A broker's ``controller`` part of its HA status (replicas.py's status)."""
    async with RemotingClient() as client:
        response = await client.invoke(
            address, RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 3
        )
    view: dict[str, Any] = json.loads(response.body)["controller"]
    return view


@pytest.mark.parametrize("nemesis", [split_master, master_with_leader])
async def test_a_master_cut_off_says_it_lost_its_lease_and_acknowledges_nothing(
    cluster: NemesisCluster, nemesis: Callable[[NemesisCluster, random.Random], Awaitable[Any]]
) -> None:
    """Cut from the controllers and its slaves — or with the Raft leader on its side
    (master-with-leader: that leader still answers its heartbeats, but has no majority,
    so its answers do not renew the lease)."""
    old = await cluster.master("broker-a")
    assert old is not None
    before = await send_to(old.address, b"before")
    assert before is not None and before.code == ResponseCode.SUCCESS
    _, heal = await nemesis(cluster, random.Random(0))
    answers: list[RemotingCommand] = []
    with trio.fail_after(30):
        while True:
            answer = await send_to(old.address, b"during")
            if answer is not None:
                answers.append(answer)
                if answer.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                    break
    # split brain: nothing the cut-off master took was acknowledged
    assert all(a.code != ResponseCode.SUCCESS for a in answers), [a.code for a in answers]
    assert "lost its controller lease" in (answers[-1].remark or ""), answers[-1].remark
    # the controllers elect another master, which a producer finds and sends to
    async with Producer("partitions", cluster.namesrv, send_timeout_s=30) as producer:
        result = await producer.send(
            Message(TOPIC, b"after"), queue=MessageQueue(TOPIC, "broker-a", 0)
        )
    assert result.status is SendStatus.SEND_OK

    async def elected() -> Member | None:  # (a follower asked may apply it a beat later)
        master = await cluster.master("broker-a")
        return master if master is not None and master is not old else None

    new = await wait_for(elected, 10, every_s=0.05, what="the controllers naming a new master")
    assert stored_at(result.offset_msg_id) == new.host.ip != old.host.ip
    await heal()
    await cluster.wait_settled("broker-a")
    assert (await controller_view(cluster, old.address))["role"] == "SLAVE"


async def test_a_slave_that_stops_acking_leaves_the_set_and_is_not_taken_back_until_it_acks(
    cluster: NemesisCluster,
) -> None:
    master = await cluster.master("broker-a")
    assert master is not None
    (slave_name,), heal = await isolate_slave(cluster, random.Random(0))
    slave = cluster.member(slave_name)
    slave_id = next(
        r["brokerId"]
        for r in (await cluster.group_state("broker-a"))["inSyncReplicas"]
        if r["brokerAddress"] == slave.address
    )
    statuses: list[SendStatus] = []
    async with Producer("partitions", cluster.namesrv, send_timeout_s=30) as producer:

        async def send() -> None:
            statuses.append((await producer.send(Message(TOPIC, b"x"))).status)

        with trio.fail_after(30):  # it leaves the set (sends wait for it meanwhile)
            while slave_id in (await controller_view(cluster, master.address))["syncStateSet"]:
                await send()
        view = await controller_view(cluster, master.address)
        checks = view["syncStateChecks"]
        statuses.clear()
        # the master has looked at its slaves 4 times since, its silent slave still
        # connected with the ack it had: it joined nothing, and no send waited for it
        with trio.fail_after(30):
            while view["syncStateChecks"] < checks + 4:
                await send()
                view = await controller_view(cluster, master.address)
        slaves = await master_slaves(master.address)
        assert slave_id in slaves, "the silent slave's connection is still there"
        assert view["joining"] == [] and slave_id not in view["syncStateSet"], view
        assert statuses and set(statuses) == {SendStatus.SEND_OK}, statuses
        # healed, it acks again and is back in the set
        await heal()
        with trio.fail_after(60):
            while slave_id not in (await controller_view(cluster, master.address))["syncStateSet"]:
                await send()
    await cluster.wait_settled("broker-a")


async def master_slaves(address: str) -> dict[int, dict[str, Any]]:
    """The master's admitted slaves by broker id (its HA status)."""
    async with RemotingClient() as client:
        response = await client.invoke(
            address, RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 3
        )
    slaves = json.loads(response.body)["master"]["slaves"]
    return {s["broker_id"]: s for s in slaves}
