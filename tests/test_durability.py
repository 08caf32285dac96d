"""A send's durability wait on the broker's real path (hamq/store/durability.py with
hamq/ha/group_transfer.py): a broker in this process on loopback, raw SEND_MESSAGE_V2
requests, a disk whose fsync a test holds (Segment.sync_data waits on an event, in the
flush's worker thread) and a slave that is a ``FakeSlave`` — it proves the group's
[ha] secret, then acks only what and when the test says.

Real time throughout (worker threads and sockets): the waits are short (0.4 s) and
every wait of the test itself is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from hamq.broker import BrokerNode
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.message import BatchEntry, encode_batch
from hamq.remoting import RemotingClient
from hamq.store.segment import Segment
from tests.support.brokers import running_broker, send_request
from tests.support.ha import FakeSlave, in_sync_fake_slave
from tests.support.timing import wait_for

SECRET = "a-long-random-secret-of-group-a"
GROUP = "broker-a"
WAIT_S = 0.4


@asynccontextmanager
async def broker(
    tmp_path: Path, *, role: str = "ASYNC_MASTER", flush: str = "ASYNC_FLUSH"
) -> AsyncIterator[BrokerNode]:
    store = {"role": role, "flush_disk_type": flush, "sync_flush_timeout_s": WAIT_S}
    ha = {"secret": SECRET, "sync_timeout_s": WAIT_S}
    async with running_broker(tmp_path / "broker", broker_name=GROUP, store=store, ha=ha) as node:
        yield node


@contextmanager
def held_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The disk's fsyncs hang until the event is set (set at the end in any case)."""
    release = threading.Event()
    original = Segment.sync_data

    def held(self: Segment) -> None:
        release.wait(30)
        original(self)

    monkeypatch.setattr(Segment, "sync_data", held)
    try:
        yield release
    finally:
        release.set()


def fake_slave(node: BrokerNode) -> AbstractAsyncContextManager[FakeSlave]:
    """A slave of ``node``'s group, in sync (it reported offset 0) and silent after."""
    return in_sync_fake_slave(node, SECRET, GROUP)


async def ack_everything(node: BrokerNode, fake: FakeSlave) -> None:
    """The fake acks the log's end once the master has sent it that far."""
    service = node.ha_service
    assert service is not None
    end = node.store.commitlog_max_offset
    await wait_for(lambda: any(c.session.sent_end >= end for c in service.connections))
    await fake.report_classic(end)


async def send(
    node: BrokerNode, request: RemotingCommand | None = None
) -> tuple[RemotingCommand, float]:
    """(the answer, seconds it took)."""
    async with RemotingClient() as client:
        started = trio.current_time()
        response = await client.invoke(node.address, request or send_request("Durable"), 10)
        return response, trio.current_time() - started


def stored(node: BrokerNode, count: int) -> bool:
    return node.store.max_offset_in_queue("Durable", 0) == count


async def first_send(node: BrokerNode) -> None:
    """The topic exists: one send that waits for nothing (WAIT=false)."""
    response, _ = await send(node, send_request("Durable", b"first", WAIT="false"))
    assert response.code == ResponseCode.SUCCESS, response.remark


# ---------------------------------------------------------------- the disk


async def test_sync_flush_answers_once_the_fsync_is_done(tmp_path: Path) -> None:
    async with broker(tmp_path, flush="SYNC_FLUSH") as node:
        response, _ = await send(node)
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert node.store.flush is not None
        assert node.store.flush.flushed_offset >= node.store.commitlog_max_offset


async def test_a_held_fsync_answers_flush_disk_timeout_and_keeps_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker(tmp_path, flush="SYNC_FLUSH") as node:
        await first_send(node)
        with held_fsync(monkeypatch):
            response, took = await send(node)
        assert response.code == ResponseCode.FLUSH_DISK_TIMEOUT, response.remark
        assert response.remark == f"not on disk within {WAIT_S:g}s; stored"
        assert took >= WAIT_S
        assert stored(node, 2)


# ---------------------------------------------------------------- the slave


async def test_sync_master_without_a_slave_answers_slave_not_available_at_once(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path, role="SYNC_MASTER") as node:
        response, took = await send(node)
        assert response.code == ResponseCode.SLAVE_NOT_AVAILABLE, response.remark
        assert response.remark == (
            "no slave in sync (none connected, or too far behind): stored on this master "
            "only (dropped if a broker without it becomes master first)"
        )
        assert took < WAIT_S  # it did not wait for an ack that cannot come
        assert stored(node, 1)


async def test_sync_master_answers_send_ok_once_the_slave_acks(tmp_path: Path) -> None:
    async with broker(tmp_path, role="SYNC_MASTER") as node, fake_slave(node) as fake:
        await first_send(node)
        async with trio.open_nursery() as nursery:
            answers: list[RemotingCommand] = []

            async def sending() -> None:
                answers.append((await send(node))[0])

            nursery.start_soon(sending)
            await wait_for(lambda: stored(node, 2))
            assert not answers  # stored, not answered: no ack yet
            await ack_everything(node, fake)
        assert answers[0].code == ResponseCode.SUCCESS, answers[0].remark


async def test_a_silent_slave_answers_flush_slave_timeout_and_keeps_the_message(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path, role="SYNC_MASTER") as node, fake_slave(node):
        response, took = await send(node)
        assert response.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, response.remark
        assert response.remark == (
            f"no slave had it within {WAIT_S:g}s: stored on this master only (dropped if "
            "a broker without it becomes master first)"
        )
        assert took >= WAIT_S
        assert stored(node, 1)


# ---------------------------------------------------------------- both at once


async def test_disk_and_slave_both_late_the_slaves_status_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker(tmp_path, role="SYNC_MASTER", flush="SYNC_FLUSH") as node:
        await first_send(node)
        async with fake_slave(node):
            with held_fsync(monkeypatch):
                response, took = await send(node)
        assert response.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, response.remark
        assert WAIT_S <= took < 2 * WAIT_S + 1  # both waits ran at once
        assert stored(node, 2)


async def test_an_acked_message_on_a_held_disk_answers_flush_disk_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker(tmp_path, role="SYNC_MASTER", flush="SYNC_FLUSH") as node:
        await first_send(node)
        async with fake_slave(node) as fake, trio.open_nursery() as nursery:
            answers: list[RemotingCommand] = []

            async def sending() -> None:
                answers.append((await send(node))[0])

            with held_fsync(monkeypatch):
                nursery.start_soon(sending)
                await wait_for(lambda: stored(node, 2))
                await ack_everything(node, fake)
                await wait_for(lambda: bool(answers), timeout_s=5)
        assert answers[0].code == ResponseCode.FLUSH_DISK_TIMEOUT, answers[0].remark


async def test_no_slave_and_a_held_disk_answer_slave_not_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker(tmp_path, role="SYNC_MASTER", flush="SYNC_FLUSH") as node:
        await first_send(node)
        with held_fsync(monkeypatch):
            response, took = await send(node)
        assert response.code == ResponseCode.SLAVE_NOT_AVAILABLE, response.remark
        assert took >= WAIT_S  # the disk was still waited for
        assert stored(node, 2)


# ---------------------------------------------------------------- what does not wait


async def test_wait_false_is_answered_at_once_whatever_the_disk_and_slaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker(tmp_path, role="SYNC_MASTER", flush="SYNC_FLUSH") as node:
        await first_send(node)
        with held_fsync(monkeypatch):
            response, took = await send(node, send_request("Durable", WAIT="false"))
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert took < WAIT_S


async def test_a_batch_waits_once_for_its_last_message(tmp_path: Path) -> None:
    async with broker(tmp_path, role="SYNC_MASTER") as node, fake_slave(node):
        await first_send(node)
        body = encode_batch([BatchEntry(body=f"m{i}".encode()) for i in range(5)])
        request = send_request("Durable", body, code=RequestCode.SEND_BATCH_MESSAGE)
        response, _ = await send(node, request)
        assert response.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, response.remark
        assert stored(node, 6)
        assert len(response.ext_fields["msgId"].split(",")) == 5


def _tasks(task: trio.lowlevel.Task) -> int:
    return 1 + sum(_tasks(child) for n in task.child_nurseries for child in n.child_tasks)


async def test_waiting_sends_take_no_task_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 sends waiting for a held disk and a silent slave: the broker runs as many
    tasks as with none waiting (callbacks answer them, not a task per send)."""
    async with broker(tmp_path, role="SYNC_MASTER", flush="SYNC_FLUSH") as node:
        await first_send(node)
        async with fake_slave(node), RemotingClient() as client:
            warm_up = send_request("Durable", WAIT="false")  # (the connection's own tasks)
            await client.invoke(node.address, warm_up, 10)
            root = trio.lowlevel.current_root_task()
            idle = _tasks(root)
            with held_fsync(monkeypatch):
                async with trio.open_nursery() as nursery:
                    for _ in range(50):
                        nursery.start_soon(client.invoke, node.address, send_request("Durable"), 10)
                    await wait_for(lambda: stored(node, 52))
                    # +50: the client's invoke tasks (one each); a task per send would
                    # make it +100
                    assert _tasks(root) <= idle + 50 + 2
        assert node.store.durability.flush is not None


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER"])
async def test_the_replica_policy_follows_the_configured_role(tmp_path: Path, role: str) -> None:
    async with broker(tmp_path, role=role) as node:
        assert node.ha_service is not None
        waits: Any = node.ha_service.transfer.waits()
        assert waits is (role == "SYNC_MASTER")
        ticket = node.store.durability.ticket(wait_store_ok=True)
        assert (ticket is not None) is (role == "SYNC_MASTER")
        assert node.store.durability.ticket(wait_store_ok=False) is None
