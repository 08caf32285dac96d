"""The store's data promises as a person meets them: real ``hamq``
processes (broker, produce, consume, topic delete) on 127.0.0.1 with ports chosen at
run time, store files damaged between runs the way the hostile tester did it. Every
process is killed by PID at the end; every wait is bounded.
"""

from __future__ import annotations

import signal
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from anyio.abc import Process

from tests.support.brokers import SMALL_STORE
from tests.support.ha import broker_group
from tests.support.processes import hamq_as_run, hamq_server, ready_addresses, stop, write_toml
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow

ENTRY = struct.Struct(">qiq")


def broker_toml(directory: Path) -> Path:
    return write_toml(
        directory / "broker.toml",
        {"store": {"store_dir": str(directory / "store"), **SMALL_STORE}},
    )


@asynccontextmanager
async def broker(config: Path) -> AsyncIterator[tuple[Process, str]]:
    """A ``hamq broker`` process with its embedded nameserver: (process, nameserver)."""
    async with hamq_server("broker", "-c", str(config), "--port", "0", "--namesrv-port", "0") as (
        proc,
        line,
    ):
        yield proc, ready_addresses(line)[1]


async def hamq_ok(*args: str) -> str:
    done = await hamq_as_run(*args)
    assert done.returncode == 0, (args, done.stderr.decode())
    return done.stdout.decode()


async def consumed(namesrv: str, topic: str, group: str) -> list[str]:
    """The bodies ``hamq consume`` prints for ``group`` until 2 s pass with nothing."""
    out = await hamq_ok("consume", "-t", topic, "-g", group, "--idle-exit", "2", "-n", namesrv)
    return sorted(line.rsplit(" ", 1)[1] for line in out.splitlines())


async def consumed_by(namesrv: str, topic: str, *groups: str) -> dict[str, list[str]]:
    """``consumed`` for each of ``groups``, at the same time."""
    found: dict[str, list[str]] = {}

    async def one(group: str) -> None:
        found[group] = await consumed(namesrv, topic, group)

    async with trio.open_nursery() as nursery:
        for group in groups:
            nursery.start_soon(one, group)
    return found


def last_entries(store: Path, topic: str) -> dict[int, tuple[int, int]]:
    """Each queue's (entry count, commitlog offset of its last entry), from its files."""
    found = {}
    for queue_dir in (store / "consumequeue" / topic).iterdir():
        data = b"".join(f.read_bytes() for f in sorted(queue_dir.iterdir())).rstrip(b"\0")
        count = -(-len(data) // ENTRY.size)
        data = data.ljust(count * ENTRY.size, b"\0")  # (the last tags code may end in zeros)
        found[int(queue_dir.name)] = (count, ENTRY.unpack_from(data, (count - 1) * ENTRY.size)[0])
    return found


async def test_a_deleted_topic_does_not_come_back_with_its_messages(tmp_path: Path) -> None:
    """The tester's steps: produce 10, delete, produce 2; a fresh group consumes the 2,
    so does a group that had consumed the first 10, and a restart changes nothing."""
    config = broker_toml(tmp_path)
    async with broker(config) as (proc, ns):
        await hamq_ok("produce", "-t", "T", "-c", "10", "-n", ns, "old{i}")
        assert await consumed(ns, "T", "early") == sorted(f"old{i}" for i in range(10))
        await hamq_ok("topic", "delete", "T", "-n", ns)
        await hamq_ok("produce", "-t", "T", "-c", "2", "-n", ns, "new{i}")
        both = await consumed_by(ns, "T", "fresh", "early")
        assert both == {"fresh": ["new0", "new1"], "early": ["new0", "new1"]}
        status = await hamq_ok("topic", "status", "T", "-n", ns)
        assert "old" not in status
        assert await stop(proc) == 0
    async with broker(config) as (_, ns):
        assert await consumed(ns, "T", "later") == ["new0", "new1"]


async def test_a_slave_forgets_a_deleted_topic_too(tmp_path: Path) -> None:
    """On a master/slave group: after the deletion, with the master gone, consumers
    that read from the slave see only what was sent after it."""
    async with broker_group(tmp_path, "ASYNC_MASTER", {}) as (ns, (master, _), _slave):
        await hamq_ok("topic", "create", "T", "-n", ns)
        await hamq_ok("produce", "-t", "T", "-c", "10", "-n", ns, "old{i}")
        assert len(await consumed(ns, "T", "early")) == 10
        await hamq_ok("topic", "delete", "T", "-n", ns)
        await hamq_ok("topic", "create", "T", "-n", ns)
        await hamq_ok("produce", "-t", "T", "-c", "2", "-n", ns, "new{i}")

        async def slave_has_the_topic() -> bool:  # (its metadata sync brings the config)
            route = await hamq_as_run("topic", "route", "T", "-n", ns)
            return route.returncode == 0 and route.stdout.decode().count("broker-a") >= 1

        await wait_for(slave_has_the_topic, 30)
        await stop(master, signal.SIGKILL)
        await wait_for(lambda: consumed(ns, "T", "fresh-on-slave"), 30, what="reads from the slave")
        both = await consumed_by(ns, "T", "fresh2-on-slave", "early")
        assert both == {"fresh2-on-slave": ["new0", "new1"], "early": ["new0", "new1"]}


async def test_a_deleted_queue_file_is_rebuilt_and_every_message_delivered(
    tmp_path: Path,
) -> None:
    """The tester's steps: 400 messages (100 a queue), a clean stop, the file of the
    queue holding the newest message deleted, a start: all 400 are consumed."""
    config = broker_toml(tmp_path)
    async with broker(config) as (proc, ns):
        await hamq_ok("produce", "--topic", "R", "--count", "400", "-n", ns, "r{i}")
        assert await stop(proc) == 0
    queues = last_entries(tmp_path / "store", "R")
    assert sorted(count for count, _ in queues.values()) == [100] * 4
    newest = max(queues, key=lambda q: queues[q][1])
    (tmp_path / "store" / "consumequeue" / "R" / str(newest) / f"{0:020d}").unlink()
    async with broker(config) as (_, ns):
        assert await consumed(ns, "R", "g") == sorted(f"r{i}" for i in range(400))


async def test_offsets_consumed_before_a_crash_cut_their_records_are_not_reused(
    tmp_path: Path,
) -> None:
    """A group consumes everything, the broker is killed, its last records are
    destroyed (zeros): the log is cut there at the next start. New messages must reach
    the group: they may not take the queue offsets it already read past."""
    config = broker_toml(tmp_path)
    async with broker(config) as (proc, ns):
        await hamq_ok("produce", "-t", "C", "-c", "200", "-n", ns, "c{i}")
        assert len(await consumed(ns, "C", "reader")) == 200
        offsets = tmp_path / "store" / "config" / "consumerOffset.json"
        await wait_for(lambda: offsets.exists() and "C@reader" in offsets.read_text(), 30)
        await stop(proc, signal.SIGKILL)
    store = tmp_path / "store"
    queues = last_entries(store, "C")
    cut = min(offset for _, offset in queues.values())  # the last record of some queue
    segment = store / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    end = len(data.rstrip(b"\0"))
    data[cut:end] = bytes(end - cut)  # (four or more records)
    segment.write_bytes(bytes(data))
    async with broker(config) as (_, ns):
        await hamq_ok("produce", "-t", "C", "-c", "8", "-n", ns, "after{i}")
        assert await consumed(ns, "C", "reader") == sorted(f"after{i}" for i in range(8))


@pytest.mark.parametrize("damage", ["zeros", "random bytes"])
async def test_a_broker_whose_log_was_damaged_after_a_clean_stop_starts(
    tmp_path: Path, damage: str
) -> None:
    config = broker_toml(tmp_path)
    async with broker(config) as (proc, ns):
        await hamq_ok("produce", "-t", "D", "-c", "50", "-n", ns, "d{i}")
        assert await stop(proc) == 0
    segment = tmp_path / "store" / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    end = len(data.rstrip(b"\0"))
    start = end - 5 * (end // 50)  # about the last 5 records
    data[start:end] = (
        bytes(end - start)
        if damage == "zeros"
        else bytes(range(256)) * ((end - start) // 256) + bytes((end - start) % 256)
    )
    segment.write_bytes(bytes(data))
    async with broker(config) as (_, ns):
        got = await consumed(ns, "D", "g")
        assert 44 <= len(got) < 50
        await hamq_ok("produce", "-t", "D", "-c", "1", "-n", ns, "more")
        assert await consumed(ns, "D", "g") == ["more"]
    if damage == "random bytes":
        assert list((tmp_path / "store" / "torn").iterdir())
