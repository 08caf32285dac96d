"""Replication with real processes on loopback: kill -9 a master, stop a slave.

A nameserver, a master and a slave run as ``hamq`` processes (free ports, stores under
tmp_path, small store files); the producers and the checks run here, in the test's
loop, on Trio and on asyncio: the support modules start and kill the
processes with AnyIO's API. Every wait is bounded; every process is killed by PID at
the end.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from hamq.client import Message, Producer, PullConsumer, SendError, SendResult, SendStatus
from hamq.remoting import RemotingError
from tests.support.backends import trio_and_asyncio
from tests.support.ha import broker_group, ha_status, log_prefix
from tests.support.processes import hamq_command

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def produce_until_killed(
    ns: str, master: Process, total: int, kill_after: int
) -> tuple[dict[bytes, SendResult], int]:
    """8 producers send ``total`` messages; the master is killed (-9) once
    ``kill_after`` are acknowledged. Returns (acknowledged by body, sends cut short)."""
    acked: dict[bytes, SendResult] = {}
    failed = 0
    numbers = iter(range(total))
    killed = anyio.Event()

    async with Producer("PG", ns, send_timeout_s=3, retry_times_when_send_failed=0) as producer:

        async def sender() -> None:
            nonlocal failed
            for i in numbers:
                body = f"message {i} ".encode() + bytes([i % 251]) * (i % 700)
                try:
                    result = await producer.send(Message("Durable", body))
                except SendError:
                    failed += 1
                    if killed.is_set():
                        return
                    continue
                if result.status is SendStatus.SEND_OK:
                    acked[body] = result
                if len(acked) >= kill_after and not killed.is_set():
                    killed.set()

        async def killer() -> None:
            await killed.wait()
            os.kill(master.pid, signal.SIGKILL)

        async with anyio.create_task_group() as group:
            group.start_soon(killer)
            for _ in range(8):
                group.start_soon(sender)
    return acked, failed


async def read_back(ns: str, topic: str) -> dict[bytes, tuple[int, int, str]]:
    """Every message of ``topic`` as the slave serves it: body -> (queue, offset, id)."""
    found = {}
    async with PullConsumer("reader", ns) as puller:
        with anyio.fail_after(60):
            queues = await puller.queues(topic)
            for queue in queues:
                offset = 0
                while True:
                    try:
                        result = await puller.pull(queue, offset, max_nums=256)
                    except RemotingError:  # the route still named the killed master
                        await anyio.sleep(0.2)  # (a failed pull looks the route up again)
                        continue
                    for m in result.messages:
                        found[m.body] = (m.queue_id, m.queue_offset, m.msg_id)
                    if result.next_begin_offset == offset:
                        break
                    offset = result.next_begin_offset
    return found


@trio_and_asyncio  # (20 000 sends through a cluster: not on uvloop as well)
async def test_a_sync_master_killed_mid_run_loses_no_acknowledged_message(
    tmp_path: Path, report: Any
) -> None:
    async with broker_group(tmp_path, "SYNC_MASTER") as (ns, (master, _), (_, slave_addr)):
        acked, cut_short = await produce_until_killed(ns, master, total=20_000, kill_after=8_000)
        on_slave = await read_back(ns, "Durable")
        missing = [body for body in acked if body not in on_slave]
        assert not missing, f"{len(missing)} acknowledged messages are not on the slave"
        for body, result in acked.items():
            queue_id, queue_offset, msg_id = on_slave[body]
            assert (queue_id, queue_offset, msg_id) == (
                result.queue.queue_id,
                result.queue_offset,
                result.msg_id,
            )
        slave_end = (await ha_status(slave_addr))["slave"]["max_offset"]
        # byte for byte what the master wrote (its files outlive the kill)
        assert log_prefix(tmp_path / "slave", slave_end) == log_prefix(
            tmp_path / "master", slave_end
        )
        report(
            f"SYNC_MASTER killed after {len(acked)} acknowledged sends: 0 lost; "
            f"{cut_short} send(s) in flight at the kill got an error; "
            f"{len(on_slave) - len(acked)} unacknowledged message(s) reached the slave anyway"
        )


@trio_and_asyncio  # (20 000 sends through a cluster: not on uvloop as well)
async def test_an_async_master_killed_mid_run_loses_at_most_its_replication_lag(
    tmp_path: Path, report: Any
) -> None:
    async with broker_group(tmp_path, "ASYNC_MASTER") as (ns, (master, _), (_, slave_addr)):
        acked, cut_short = await produce_until_killed(ns, master, total=20_000, kill_after=8_000)
        on_slave = await read_back(ns, "Durable")
        lost = [body for body in acked if body not in on_slave]
        slave_end = (await ha_status(slave_addr))["slave"]["max_offset"]
        master_log = log_prefix(tmp_path / "master", 1 << 40)
        master_end = len(master_log.rstrip(b"\0"))  # (a record never ends in a zero byte here)
        assert log_prefix(tmp_path / "slave", slave_end) == master_log[:slave_end]
        for body in set(acked) - set(lost):
            assert on_slave[body][2] == acked[body].msg_id
        report(
            f"ASYNC_MASTER killed after {len(acked)} acknowledged sends: {len(lost)} lost "
            f"(the slave was {max(0, master_end - slave_end)} bytes behind the master's log); "
            f"{cut_short} send(s) in flight got an error"
        )


async def test_a_stopped_slave_means_flush_slave_timeout_until_it_resumes(tmp_path: Path) -> None:
    async with (
        broker_group(tmp_path, "SYNC_MASTER", ha={"sync_timeout_s": 1.0}) as (
            ns,
            (_, master_addr),
            (slave, _),
        ),
        Producer("PG", ns) as producer,
    ):
        first = await producer.send(Message("Stop", b"before"))
        assert first.status is SendStatus.SEND_OK
        os.kill(slave.pid, signal.SIGSTOP)
        try:
            stalled = [await producer.send(Message("Stop", f"stalled {i}")) for i in range(3)]
            assert {r.status for r in stalled} == {SendStatus.FLUSH_SLAVE_TIMEOUT}
        finally:
            os.kill(slave.pid, signal.SIGCONT)
        with anyio.fail_after(20):
            while True:
                again = await producer.send(Message("Stop", b"after"))
                if again.status is SendStatus.SEND_OK:
                    break
        status = (await ha_status(master_addr))["master"]
        assert status["slaves"][0]["ack_offset"] == status["max_offset"]  # it caught up
        shown = await hamq_command("admin", "ha-status", "-n", ns)
        assert shown.returncode == 0, shown.stderr
        assert b"in sync" in shown.stdout and b"TRANSFER from" in shown.stdout
