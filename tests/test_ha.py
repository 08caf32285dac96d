"""Master/slave replication in this process: copying, sync sends, restarts, divergence,
metadata sync, slave reads. (Crash tests with real processes: test_ha_process.py.)"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from hamq.broker import BrokerNode
from hamq.broker.slave_sync import SlaveSync
from hamq.client import (
    ConsumeResult,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    SendStatus,
)
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from hamq.remoting import RemotingClient, RemotingServer
from hamq.remoting.connection import Connection
from hamq.remoting.dispatch import Dispatcher
from hamq.store import MessageStore
from tests.support.brokers import pull_request, running_broker, running_nameserver
from tests.support.store import message
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow

PROTOCOLS = ["classic", "autoswitch"]


def log_bytes(store: MessageStore) -> bytes:
    out = bytearray()
    offset = store.commitlog_min_offset
    while offset < store.commitlog_max_offset:
        chunk = store.get_data(offset, 1 << 20)
        out += chunk
        offset += len(chunk)
    return bytes(out)


@asynccontextmanager
async def group(
    tmp_path: Path, protocol: str = "classic", role: str = "ASYNC_MASTER", **options: Any
) -> AsyncIterator[tuple[str, BrokerNode, BrokerNode]]:
    """A nameserver, a master and a slave: (nameserver address, master, slave)."""
    async with running_nameserver() as (_, ns):
        common = {"namesrv_addrs": [ns], "ha": {"protocol": protocol}, **options}
        async with (
            running_broker(tmp_path / "master", store={"role": role}, **common) as master,
            running_broker(
                tmp_path / "slave", broker_id=1, store={"role": "SLAVE"}, **common
            ) as slave,
        ):
            assert master.ha_service is not None
            await wait_for(master.ha_service.transfer.available)
            yield ns, master, slave


async def caught_up(master: BrokerNode, slave: BrokerNode) -> None:
    """The slave has the master's whole log, dispatched, and the master has its report of
    it (the report is on its way when the slave's store has the bytes)."""
    await wait_for(lambda: slave.store.commitlog_max_offset == master.store.commitlog_max_offset)
    await slave.store.wait_dispatched()
    service = master.ha_service
    if service is not None and service.active:
        end = master.store.commitlog_max_offset
        await wait_for(lambda: all(c.ack_offset >= end for c in service.connections))


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_slave_copies_the_master_byte_for_byte(tmp_path: Path, protocol: str) -> None:
    async with group(tmp_path, protocol) as (ns, master, slave), Producer("PG", ns) as producer:
        for i in range(300):
            await producer.send(Message("Copied", b"x" * (i * 37 % 3000 + 1), keys=[f"k{i}"]))
        await caught_up(master, slave)
        assert log_bytes(slave.store) == log_bytes(master.store)
        for queue_id in range(4):  # the slave built its own consume queues
            assert slave.store.max_offset_in_queue("Copied", queue_id) == (
                master.store.max_offset_in_queue("Copied", queue_id)
            )
        assert slave.store.query_message("Copied", "k7", 1)  # and its index
        status = master.ha_status()["master"]
        assert status["slaves"][0]["lag_bytes"] == 0 and status["slaves"][0]["in_sync"]
        assert slave.ha_status()["slave"]["state"] == "TRANSFER"
        # a slave takes no sends
        refused = await producer.instance.invoke(
            slave.address,
            producer.instance.request(310, body=b"x"),
        )
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "is a slave" in (refused.remark or "")


async def test_sync_master_waits_for_its_slave_and_says_when_there_is_none(tmp_path: Path) -> None:
    async with (
        running_nameserver() as (_, ns),
        running_broker(tmp_path / "m", namesrv_addrs=[ns], store={"role": "SYNC_MASTER"}) as master,
        Producer("PG", ns) as producer,
    ):
        alone = await producer.send(Message("Sync", b"no slave yet"))
        assert alone.status is SendStatus.SLAVE_NOT_AVAILABLE  # at once, and stored
        async with running_broker(
            tmp_path / "s", namesrv_addrs=[ns], broker_id=1, store={"role": "SLAVE"}
        ) as slave:
            assert master.ha_service is not None
            await wait_for(master.ha_service.transfer.available)
            results = [await producer.send(Message("Sync", f"m{i}")) for i in range(50)]
            assert {r.status for r in results} == {SendStatus.SEND_OK}
            # SEND_OK means the slave had it, to its last byte: the master's log ends with
            # the last message (nothing else was sent), and the slave's is no shorter
            last_start = int(results[-1].offset_msg_id[16:], 16)
            last_end = master.store.commitlog_max_offset
            assert last_end > last_start
            assert slave.store.commitlog_max_offset >= last_end
        async with PullConsumer("check", ns) as puller:
            kept = await puller.pull(alone.queue, alone.queue_offset, max_nums=1)
            assert kept.messages[0].body == b"no slave yet"


async def test_a_put_goes_to_the_slave_from_the_put_itself_and_what_waits_goes_in_order(
    tmp_path: Path,
) -> None:
    async with group(tmp_path, role="SYNC_MASTER") as (_ns, master, slave):
        assert master.ha_service is not None
        (connection,) = master.ha_service.connections
        store = master.store
        # a put's bytes are with the kernel when the put returns: no wait for the writer
        assert store.put_message_nowait(message("Pushed", body=b"now")).stored
        end = store.commitlog_max_offset
        assert connection.session.next_offset == end and connection.session.sent_end == end
        await caught_up(master, slave)
        # a socket that takes little at a time: what it does not take waits for the
        # writer, and the puts meanwhile follow it, never overtake it
        connection.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        left_over = 0
        for i in range(40):
            assert store.put_message_nowait(message("Pushed", body=bytes([i]) * 60_000)).stored
            left_over += connection.session.sending
        assert left_over  # (the partial path was taken)
        await caught_up(master, slave)
        assert log_bytes(slave.store) == log_bytes(master.store)
        # in one session: no transfer ever came at an offset other than the slave's end
        assert master.ha_service.connections == {connection}
        assert slave.ha_status()["slave"]["sessions"] == 1


async def test_a_restarted_slave_continues_from_its_own_end(tmp_path: Path) -> None:
    async with (
        running_nameserver() as (_, ns),
        running_broker(tmp_path / "m", namesrv_addrs=[ns]) as master,
        Producer("PG", ns) as producer,
    ):
        slave_dir = tmp_path / "s"
        async with running_broker(
            slave_dir, namesrv_addrs=[ns], broker_id=1, store={"role": "SLAVE"}
        ) as slave:
            for i in range(100):
                await producer.send(Message("Restart", f"first {i}"))
            await caught_up(master, slave)
            first_part = slave.store.commitlog_max_offset
        for i in range(100):
            await producer.send(Message("Restart", f"second {i}"))
        async with running_broker(
            slave_dir, namesrv_addrs=[ns], broker_id=1, store={"role": "SLAVE"}
        ) as slave:
            await caught_up(master, slave)
            assert slave.ha_client is not None
            # only what it did not have came over the wire
            assert slave.ha_client.bytes_received == master.store.commitlog_max_offset - first_part
            assert log_bytes(slave.store) == log_bytes(master.store)


async def _diverge(tmp_path: Path, ns: str, protocol: str) -> tuple[int, int]:
    """Broker a (master) and b (slave) share 20 messages; a writes 10 more alone.
    Returns (where they agree, where a's log ends)."""
    common = {"namesrv_addrs": [ns], "ha": {"protocol": protocol}}
    async with running_broker(tmp_path / "a", **common) as a, Producer("PG", ns) as producer:
        async with running_broker(
            tmp_path / "b", broker_id=1, store={"role": "SLAVE"}, **common
        ) as b:
            for i in range(20):
                await producer.send(Message("Div", f"shared {i}"))
            await caught_up(a, b)
            agreed = b.store.commitlog_max_offset
        for i in range(10):
            await producer.send(Message("Div", f"only on a {i}"))
        return agreed, a.store.commitlog_max_offset


async def test_autoswitch_truncates_a_slave_holding_an_old_masters_tail(tmp_path: Path) -> None:
    async with running_nameserver() as (_, ns):
        agreed, a_end = await _diverge(tmp_path, ns, "autoswitch")
        common = {"namesrv_addrs": [ns], "ha": {"protocol": "autoswitch"}}
        # now b is the master (a new epoch from where it ends) and a its slave
        async with running_broker(tmp_path / "b", **common) as b, Producer("PG", ns) as producer:
            for i in range(3):
                await producer.send(Message("Div", f"b's own {i}"))
            async with running_broker(
                tmp_path / "a", broker_id=1, store={"role": "SLAVE"}, **common
            ) as a:
                await caught_up(b, a)
                assert log_bytes(a.store) == log_bytes(b.store)  # a's tail [agreed, a_end) is gone
                assert a.epochs.entries == b.epochs.entries
                assert a.store.commitlog_max_offset != a_end
        assert [e.start_offset for e in b.epochs.entries][-1] == agreed


async def test_classic_refuses_a_slave_with_bytes_the_master_does_not_have(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_nameserver() as (_, ns):
        await _diverge(tmp_path, ns, "classic")
        common = {"namesrv_addrs": [ns]}
        async with (
            running_broker(tmp_path / "b", **common) as b,
            running_broker(tmp_path / "a", broker_id=1, store={"role": "SLAVE"}, **common) as a,
        ):
            await wait_for(lambda: "past this master's log end" in caplog.text)
            assert a.ha_client is not None and a.ha_client.last_error is not None
            assert b.ha_service is not None and not b.ha_service.transfer.available()
            assert "clear the slave's store or use ha_protocol = 'autoswitch'" in caplog.text
            a_end = a.store.commitlog_max_offset
            # the master grows past the slave's end: still refused (the end falls
            # inside one of its records), never counted as an ack
            async with Producer("PG", ns) as producer:
                while b.store.commitlog_max_offset <= a_end + 2000:
                    result = await producer.send(Message("Div", b"b" * 997))
                    assert result.status is SendStatus.SEND_OK  # ASYNC_MASTER
            await wait_for(lambda: "inside a record of this master's log" in caplog.text)
            assert not b.ha_service.transfer.available()
            assert a.store.commitlog_max_offset == a_end  # nothing was appended to it


async def test_a_slave_copies_metadata_at_its_interval(tmp_path: Path) -> None:
    # real time: rounds every second here (10 s by default)
    async with (
        group(tmp_path, metadata_sync_interval_s=1.0) as (ns, master, slave),
        PullConsumer("G", ns) as puller,
        Producer("PG", ns) as producer,
    ):
        sync = slave.slave_sync
        assert sync is not None
        rounds = sync.rounds
        await producer.send(Message("Meta", b"x"))  # auto-creates the topic
        [queue] = [q for q in await puller.queues("Meta") if q.queue_id == 0]
        await puller.commit_offset(queue, 7)
        master.ctx.subscriptions.find("G2")
        changed = sync.rounds  # rounds finished once every change was made

        def copied() -> bool:
            return (
                slave.ctx.topics.get("Meta") is not None
                and slave.ctx.offsets.query("G", "Meta", 0) == 7
                and "G2" in slave.ctx.subscriptions.table
            )

        if sync.rounds == rounds:  # no round ended since the changes began
            assert not copied()  # a slave does not get them at once
        await wait_for(copied, 10)
        # but by the end of the next round: the one under way as the last change was
        # made may have read before it (+1), the one after reads all of them (+2; a
        # round counts itself right after it applies the last table). A slave that
        # missed a table in a round would need more rounds than that.
        assert sync.rounds - changed <= 2, (rounds, changed, sync.rounds)
        # an offset the slave has that is newer (committed there) stays
        slave.ctx.offsets.commit("G", "Meta", 0, 9)
        later = sync.rounds + 2
        await wait_for(lambda: sync.rounds >= later, 10)
        assert slave.ctx.offsets.query("G", "Meta", 0) == 9
        assert sync.last_round_ok


async def test_consumers_follow_the_master_to_the_slave_and_keep_going_without_it(
    tmp_path: Path,
) -> None:
    async with running_nameserver() as (_, ns):
        master_scope = trio.CancelScope()
        nodes: dict[str, BrokerNode] = {}
        ready, gone = trio.Event(), trio.Event()
        common: dict[str, Any] = {
            "namesrv_addrs": [ns],
            "slave_read_enable": True,
            "slave_read_lag_bytes": 0,
        }

        async def master() -> None:
            with master_scope:
                async with running_broker(tmp_path / "m", **common) as node:
                    nodes["master"] = node
                    ready.set()
                    await trio.sleep_forever()
            gone.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(master)
            await ready.wait()
            async with running_broker(
                tmp_path / "s", broker_id=1, store={"role": "SLAVE"}, **common
            ) as slave:
                async with Producer("PG", ns) as producer:
                    for i in range(100):
                        await producer.send(Message("Far", f"m{i}"))
                await caught_up(nodes["master"], slave)
                got: list[bytes] = []
                release = trio.Event()

                async def handle(messages: list[MessageExt]) -> ConsumeResult:
                    got.extend(m.body for m in messages)
                    if len(got) >= 50:
                        await release.wait()
                    return ConsumeResult.SUCCESS

                consumer = PushConsumer(
                    "FG", ns, consume_from="FIRST_OFFSET", persist_offset_interval_s=0.2
                )
                consumer.subscribe("Far")
                async with consumer.consuming(handle):
                    # behind the head (threshold 0): the master sends pulls to the slave
                    await wait_for(lambda: slave.store.statistics().messages_got > 0)
                    await wait_for(lambda: len(got) >= 50)
                    master_scope.cancel()  # the master goes away
                    await gone.wait()
                    release.set()
                    await wait_for(lambda: len(set(got)) == 100, 30)
                    # offsets were committed to the slave meanwhile
                    await wait_for(
                        lambda: (
                            sum(slave.ctx.offsets.query("FG", "Far", q) for q in range(4)) == 100
                        )
                    )
        assert set(got) == {f"m{i}".encode() for i in range(100)}


async def test_a_new_groups_retry_topic_is_there_on_the_slave_it_heartbeats(
    tmp_path: Path,
) -> None:
    """As RocketMQ's heartbeat: a slave creates the group's %RETRY% topic too, so a new
    group reading from it while the master is down pulls an empty queue instead of
    TOPIC_NOT_EXIST, again and again (the nameservers answer the retry topic's route
    before any broker has it)."""
    async with group(tmp_path) as (_, _master, slave), RemotingClient() as client:
        retry = pull_request("%RETRY%NewGroup", 0, group="NewGroup")
        before = await client.invoke(slave.address, retry, 5)
        assert before.code == ResponseCode.TOPIC_NOT_EXIST  # (no heartbeat yet)
        beat = HeartbeatData(
            "client-1",
            consumer_data_set=[
                ConsumerData("NewGroup", subscription_data_set=[SubscriptionData("T")])
            ],
        )
        request = RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(beat))
        assert (await client.invoke(slave.address, request, 5)).code == ResponseCode.SUCCESS
        after = await client.invoke(slave.address, retry, 5)
        assert after.code == ResponseCode.PULL_NOT_FOUND, (after.code, after.remark)
        assert slave.ctx.topics.get("%RETRY%NewGroup") is not None


async def test_a_metadata_round_under_way_is_not_reported_as_failed(tmp_path: Path) -> None:
    """``rounds`` counts finished rounds: a status read while the first round waits for
    the master shows no round yet (it showed 1 round, not ok, no error)."""
    held, release = trio.Event(), trio.Event()

    async def slow_refusal(request: RemotingCommand, conn: Connection) -> RemotingCommand:
        held.set()
        await release.wait()
        return request.response_to(ResponseCode.SYSTEM_ERROR, remark="not now")

    dispatcher = Dispatcher()
    dispatcher.register_async(RequestCode.GET_ALL_TOPIC_CONFIG, slow_refusal)
    master = RemotingServer(dispatcher)
    async with (
        running_broker(tmp_path) as node,
        RemotingClient() as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(master.run)
        sync = SlaveSync(node.ctx, client, lambda: master.address, lambda: None)
        nursery.start_soon(sync.sync_once)
        with trio.fail_after(10):
            await held.wait()
        during = sync.statistics()
        assert (during.rounds, during.last_error) == (0, None)
        release.set()
        await wait_for(lambda: sync.statistics().rounds > 0)
        after = sync.statistics()
        assert not after.last_round_ok and "not now" in (after.last_error or "")
        nursery.cancel_scope.cancel()
