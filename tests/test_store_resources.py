"""Resources the store and the broker must not run out of: file descriptors (many
topics and queues under a low open-files limit, in a real child process), the topic
cap, and a full disk while a consume-queue file is created (through the store's
``reserve_blocks`` seam), from which dispatching must recover by itself."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from anyio.abc import Process

from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import DeleteTopicRequestHeader, PullMessageResponseHeader
from hamq.protocol.record import decode_messages
from hamq.remoting import RemotingClient
from hamq.store import GetMessageStatus, MessageStore, MessageToStore, PutMessageStatus
from hamq.store import segment as segment_module
from tests.support.brokers import (
    SMALL_STORE,
    create_topic_request,
    pull_request,
    running_broker,
    send_request,
)
from tests.support.processes import (
    ROOT,
    free_ports,
    kill_and_reap,
    open_child,
    read_ready_line,
    stop,
    write_toml,
)
from tests.support.store import message, open_store, put, small_config
from tests.support.timing import wait_for

TIMEOUT_S = 10.0


def descriptors_under(pid: int | str, directory: Path) -> list[str]:
    """The files under ``directory`` that process ``pid`` holds open (/proc/<pid>/fd)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


def log_tail(path: Path) -> str:
    return path.read_text()[-3000:]


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def read_queue(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    """Every body queue ``topic``/``queue_id`` holds, in order."""
    bodies: list[bytes] = []
    offset = 0
    while True:
        result = store.get_message("G", topic, queue_id, offset, 32)
        if result.status is not GetMessageStatus.FOUND:
            return bodies
        bodies += [m.body for m in decode_messages(result.body)]
        offset = result.next_begin_offset


# ---------------------------------------------------------------- file descriptors
QUEUES = 40
MAPPED = 8
#: a flush syncs one file at a time through a descriptor of its own, for the call
SYNCING = 1


async def test_idle_consume_queue_files_are_unmapped_and_hold_no_descriptor(
    tmp_path: Path,
) -> None:
    """40 queues written round-robin with room for 8 maps: at most 8 consume-queue files
    are mapped (and held open: CPython 3.11's mmap keeps one descriptor) at any time,
    every message is read back, and again after a restart."""
    config = small_config(tmp_path)
    queue_dir = config.consume_queue_dir
    sent: dict[str, list[bytes]] = {f"T{i}": [] for i in range(QUEUES)}

    def started_store() -> MessageStore:
        store = MessageStore(config)
        store.queues.max_mapped_files = MAPPED
        return store

    store = started_store()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for round_ in range(3):
            for topic, bodies in sent.items():
                body = f"{topic}-{round_}".encode()
                result = await put(store, message(topic, body=body))
                assert result.status is PutMessageStatus.PUT_OK, result
                bodies.append(body)
            await store.wait_dispatched()
            assert len(descriptors_under(os.getpid(), queue_dir)) <= MAPPED + SYNCING
            assert len(store.queues.files) <= MAPPED
        for topic, bodies in sent.items():
            assert await read_queue(store, topic) == bodies
        assert store.queues.files.remaps > 0  # unmapped ones were mapped again to be read
        assert len(descriptors_under(os.getpid(), queue_dir)) <= MAPPED + SYNCING
        nursery.cancel_scope.cancel()
    assert descriptors_under(os.getpid(), queue_dir) == []  # all closed at the stop

    store = started_store()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        assert len(descriptors_under(os.getpid(), queue_dir)) <= MAPPED + SYNCING
        for topic, bodies in sent.items():
            assert await read_queue(store, topic) == bodies
        result = await put(store, message("T0", body=b"after the restart"))
        assert result.status is PutMessageStatus.PUT_OK and result.append is not None
        assert result.append.queue_offset == 3
        nursery.cancel_scope.cancel()


FD_LIMIT = 256
#: above what the limit allows at one descriptor per queue file, let alone at two
TOPICS = 300

#: sets the open-files limit, then becomes ``hamq broker <argv>``
LIMITED = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
os.execv(sys.executable, [sys.executable, "-m", "cli.main", "--log-level", "info", *sys.argv[1:]])
"""


@asynccontextmanager
async def limited_broker(
    config: Path, log_path: Path, soft: int, hard: int
) -> AsyncIterator[tuple[Process, str]]:
    """``hamq broker -c config`` under an open-files limit of (soft, hard); yields the
    process and its address once it is ready. Killed by PID at the end."""
    limited = [sys.executable, "-c", LIMITED.format(soft=soft, hard=hard)]
    with log_path.open("ab") as log_file:
        proc = await open_child([*limited, "broker", "-c", str(config)], stderr=log_file, cwd=ROOT)
    try:
        try:
            line = await read_ready_line(proc, "the broker", timeout_s=60)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}:\n{log_tail(log_path)}") from None
        match = re.search(r" at (\S+), ", line)
        assert match, line
        yield proc, match.group(1)
    finally:
        await kill_and_reap(proc)


async def send_to_every_topic(address: str, round_: int) -> None:
    async with RemotingClient() as client:
        for i in range(TOPICS):
            request = send_request(f"T{i}", f"T{i}-{round_}".encode(), queue_id=0)
            response = await client.invoke(address, request, TIMEOUT_S)
            assert response.code == ResponseCode.SUCCESS, (i, response.remark)


async def pull_every_topic(address: str, rounds: int) -> None:
    """Each topic's queue 0 holds its messages of every round, in order."""
    async with RemotingClient() as client:
        for i in range(TOPICS):
            response = await client.invoke(address, pull_request(f"T{i}", 0, 0), TIMEOUT_S)
            assert response.code == ResponseCode.SUCCESS, (i, response.remark)
            assert response.header(PullMessageResponseHeader).next_begin_offset == rounds
            bodies = [m.body for m in decode_messages(response.body)]
            assert bodies == [f"T{i}-{r}".encode() for r in range(rounds)]


@pytest.mark.slow
async def test_a_broker_under_a_low_fd_limit_serves_hundreds_of_queues_across_a_restart(
    tmp_path: Path,
) -> None:
    """A ``hamq broker`` started with 128 open files (hard limit 256) raises its limit to
    256, takes a message for each of 300 auto-created topics (600 descriptors before
    the fix), stops, starts again, accepts connections, serves every message and takes
    more; it never holds more than a quarter of its limit in consume-queue files."""
    ports = free_ports(2)
    store_dir = tmp_path / "store"
    config = write_toml(
        tmp_path / "broker.toml",
        {
            "listen_port": ports[0],
            "embedded_namesrv_port": ports[1],
            "store": {"store_dir": str(store_dir), **SMALL_STORE},
        },
    )
    log_path = tmp_path / "broker.log"
    queue_dir = store_dir / "consumequeue"

    def check_descriptors(pid: int) -> None:
        limits = Path(f"/proc/{pid}/limits").read_text()
        assert re.search(rf"Max open files\s+{FD_LIMIT}\s+{FD_LIMIT}\s", limits), limits
        assert open_descriptors(pid) < FD_LIMIT
        assert len(descriptors_under(pid, queue_dir)) <= FD_LIMIT // 4 + SYNCING

    async with limited_broker(config, log_path, FD_LIMIT // 2, FD_LIMIT) as (proc, address):
        await send_to_every_topic(address, 0)
        await pull_every_topic(address, 1)
        check_descriptors(proc.pid)
        assert await stop(proc) == 0
    assert len(list(queue_dir.iterdir())) == TOPICS
    async with limited_broker(config, log_path, FD_LIMIT // 2, FD_LIMIT) as (proc, address):
        check_descriptors(proc.pid)
        await pull_every_topic(address, 1)
        await send_to_every_topic(address, 1)
        await pull_every_topic(address, 2)
        check_descriptors(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # and after a crash too
        await proc.wait()
    async with limited_broker(config, log_path, FD_LIMIT // 2, FD_LIMIT) as (proc, address):
        await pull_every_topic(address, 2)
        check_descriptors(proc.pid)
    assert "open files limit raised from 128 to 256" in log_path.read_text()


async def test_topics_beyond_max_topics_are_refused_with_the_limit_named(
    tmp_path: Path,
) -> None:
    """max_topics 3: three topics are auto-created (the system topics do not count); a
    fourth is refused, by a send and by UPDATE_AND_CREATE_TOPIC alike, with a remark
    naming the limit; existing topics can still be changed and sent to."""
    async with running_broker(tmp_path, max_topics=3) as node, RemotingClient() as client:
        address = node.address
        for i in range(3):
            response = await client.invoke(address, send_request(f"T{i}"), TIMEOUT_S)
            assert response.code == ResponseCode.SUCCESS, response.remark
        refused = await client.invoke(address, send_request("T3"), TIMEOUT_S)
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert "topic[T3] cannot be created" in (refused.remark or "")
        assert "3 topics, its max_topics" in (refused.remark or "")
        created = await client.invoke(address, create_topic_request("X"), TIMEOUT_S)
        assert created.code == ResponseCode.SYSTEM_ERROR
        assert "topic[X] cannot be created" in (created.remark or "")
        assert "max_topics" in (created.remark or "")
        changed = await client.invoke(address, create_topic_request("T0", queues=2), TIMEOUT_S)
        assert changed.code == ResponseCode.SUCCESS, changed.remark
        again = await client.invoke(address, send_request("T1", b"more"), TIMEOUT_S)
        assert again.code == ResponseCode.SUCCESS, again.remark
        assert "T3" not in node.ctx.topics.table and "X" not in node.ctx.topics.table
        deleted = RemotingCommand.request(
            RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader(topic="T2")
        )
        assert (await client.invoke(address, deleted, TIMEOUT_S)).code == ResponseCode.SUCCESS
        after = await client.invoke(address, send_request("T3"), TIMEOUT_S)
        assert after.code == ResponseCode.SUCCESS, after.remark  # room again


# ---------------------------------------------------------------- a full disk
class FullDisk:
    """Plays a disk with no room for new files through the store's seam: while ``full``,
    reserving blocks for a new file whose path holds ``where`` fails with ENOSPC as
    posix_fallocate does."""

    def __init__(self, where: str = "") -> None:
        self.full = False
        self.where = where
        self.refused: list[Path] = []

    def __call__(self, fd: int, size: int, path: Path) -> None:
        if self.full and self.where in str(path):
            self.refused.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, 0, size)


async def test_a_full_disk_pauses_dispatching_refuses_sends_and_both_resume_by_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while a new topic's consume-queue file is created: the send that
    brought it was acknowledged (it is in the CommitLog), later sends are refused with a
    remark saying the disk is full, dispatching retries; once there is room again it all
    resumes without a restart, and every acknowledged message is consumable, in order,
    then and after a restart."""
    disk = FullDisk()
    monkeypatch.setattr(segment_module, "reserve_blocks", disk)
    config = small_config(tmp_path)
    acknowledged: dict[str, list[bytes]] = {"A": [], "B": []}

    async def put_acked(topic: str, body: bytes) -> PutMessageStatus:
        result = await put(store, message(topic, body=body))
        if result.stored:
            acknowledged[topic].append(body)
        return result.status

    async with open_store(config) as store:
        assert await put_acked("A", b"a0") is PutMessageStatus.PUT_OK
        await store.wait_dispatched()
        disk.full = True
        assert await put_acked("B", b"b0") is PutMessageStatus.PUT_OK  # the CommitLog had room
        await wait_for(lambda: store.reput.failure is not None)
        assert any("consumequeue" in str(p) for p in disk.refused)
        refused = await put(store, message("A", body=b"refused"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert refused.remark.startswith("disk full: "), refused.remark
        assert "consumequeue/B/0" in refused.remark and "retrying" in refused.remark
        await wait_for(lambda: store.reput.retries >= 3)  # it keeps trying
        assert store.reput.failure is not None
        disk.full = False  # space was freed
        await wait_for(lambda: store.reput.failure is None)
        for i in range(1, 4):
            assert await put_acked("A", b"a%d" % i) is PutMessageStatus.PUT_OK
            assert await put_acked("B", b"b%d" % i) is PutMessageStatus.PUT_OK
        await store.wait_dispatched()
        for topic, bodies in acknowledged.items():
            assert await read_queue(store, topic) == bodies
    assert acknowledged == {"A": [b"a0", b"a1", b"a2", b"a3"], "B": [b"b0", b"b1", b"b2", b"b3"]}
    async with open_store(config) as store:
        for topic, bodies in acknowledged.items():
            assert await read_queue(store, topic) == bodies


async def test_a_full_disk_at_an_index_file_loses_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills just as a new index file is needed, between two keys of one
    message: once there is room, the message is indexed under both keys."""
    disk = FullDisk()
    monkeypatch.setattr(segment_module, "reserve_blocks", disk)
    config = small_config(tmp_path, index_max_entries=4)  # 3 usable entries a file
    async with open_store(config) as store:
        assert (await put(store, message(KEYS="k0 k00"))).stored
        await store.wait_dispatched()
        disk.full = True
        assert (await put(store, message(KEYS="k1 k2"))).stored  # 2 keys, 1 entry left
        await wait_for(lambda: store.reput.failure is not None)
        assert any("index" in str(p) for p in disk.refused)
        disk.full = False
        await wait_for(lambda: store.reput.failure is None)
        await store.wait_dispatched()
        for key in ("k0", "k00", "k1", "k2"):
            assert len(store.query_message("T", key, 10)) == 1, key


async def test_a_batch_stopped_by_a_full_disk_at_a_segment_end_keeps_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch reaches the end of a CommitLog segment when the disk has no room for the
    next one: the records before that end are stored (PUT_OK), the batch's last result is
    CREATE_MAPPED_FILE_FAILED; once there is room the queue offsets go on from the last
    stored record, and every stored record reads back, after a restart too."""
    disk = FullDisk("commitlog")
    monkeypatch.setattr(segment_module, "reserve_blocks", disk)
    config = small_config(tmp_path)  # segments of 256 KiB: 13 of these records

    def batch(numbers: range) -> list[MessageToStore]:
        return [message("A", body=b"%d." % i + b"." * 20_000) for i in numbers]

    async with open_store(config) as store:
        first = store.put_batch_nowait(batch(range(8)))
        assert [r.status for r in first] == [PutMessageStatus.PUT_OK] * 8
        disk.full = True
        second = store.put_batch_nowait(batch(range(8, 16)))
        assert any("commitlog" in str(p) for p in disk.refused)
        *stored, refused = second
        assert refused.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED, refused
        assert len(stored) == 5 and all(r.status is PutMessageStatus.PUT_OK for r in stored)
        disk.full = False
        third = store.put_batch_nowait(batch(range(16, 20)))
        written = first + stored + third
        assert [r.append.queue_offset for r in written if r.append] == list(range(17))
        expected = [b"%d." % i + b"." * 20_000 for i in [*range(13), *range(16, 20)]]
        await store.wait_dispatched()
        assert await read_queue(store, "A") == expected
    async with open_store(config) as store:
        assert await read_queue(store, "A") == expected


async def put_all(store: MessageStore, messages: list[tuple[str, str]]) -> None:
    for topic, body in messages:
        result = await put(store, message(topic, body=body.encode()))
        assert result.status is PutMessageStatus.PUT_OK, result


def bodies(*names: str) -> list[bytes]:
    return [name.encode() for name in names]


async def test_a_store_started_on_a_full_disk_serves_what_it_dispatched_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk is full when the store starts and must rebuild its consume queues
    (consumequeue/ was deleted): the file for B's queue cannot be made. The store
    starts anyway, serves what it dispatched before B's first message, refuses sends
    with the disk-full remark, stops cleanly, and once there is room dispatches the rest
    by itself; sends then continue every queue after its last message, no queue offset
    twice."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_all(store, [("A", f"a{i}") for i in range(5)])
        await put_all(store, [("B", f"b{i}") for i in range(3)] + [("A", "a5"), ("A", "a6")])
    shutil.rmtree(config.consume_queue_dir)
    disk = FullDisk(where="consumequeue/B")
    disk.full = True
    monkeypatch.setattr(segment_module, "reserve_blocks", disk)
    async with open_store(config) as store:
        assert store.recovery is not None and store.recovery.paused is not None
        assert store.recovery.paused.startswith("disk full: ")
        assert await read_queue(store, "A") == bodies("a0", "a1", "a2", "a3", "a4")
        assert await read_queue(store, "B") == []
        refused = await put(store, message("A", body=b"refused"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert refused.remark.startswith("disk full: "), refused.remark
        assert "consumequeue/B/0" in refused.remark
    async with open_store(config) as store:  # stopped while paused: a clean stop all the same
        assert store.recovery is not None and store.recovery.clean
        assert store.recovery.paused is not None
        assert await read_queue(store, "A") == bodies("a0", "a1", "a2", "a3", "a4")
        await wait_for(lambda: store.reput.retries >= 2)  # it keeps trying
        disk.full = False
        await wait_for(lambda: store.reput.failure is None)
        await store.wait_dispatched()
        assert await read_queue(store, "A") == bodies(*(f"a{i}" for i in range(7)))
        assert await read_queue(store, "B") == bodies("b0", "b1", "b2")
        for topic, body, queue_offset in (("A", b"a7", 7), ("B", b"b3", 3)):
            result = await put(store, message(topic, body=body))
            assert result.append is not None, result
            assert result.append.queue_offset == queue_offset
    async with open_store(config) as store:
        assert await read_queue(store, "A") == bodies(*(f"a{i}" for i in range(8)))
        assert await read_queue(store, "B") == bodies("b0", "b1", "b2", "b3")


async def test_a_broker_started_on_a_full_disk_serves_pulls_and_takes_sends_once_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same over the wire: a broker whose store starts with dispatching paused by a
    full disk starts, answers pulls of what is dispatched, refuses sends with a remark
    saying the disk is full, and takes them again by itself once there is room."""
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        for topic in ("A", "A", "B", "A"):
            response = await client.invoke(node.address, send_request(topic), TIMEOUT_S)
            assert response.code == ResponseCode.SUCCESS, response.remark
    shutil.rmtree(tmp_path / "consumequeue")
    disk = FullDisk(where="consumequeue/B")
    disk.full = True
    monkeypatch.setattr(segment_module, "reserve_blocks", disk)
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        pulled = await client.invoke(node.address, pull_request("A"), TIMEOUT_S)
        assert pulled.code == ResponseCode.SUCCESS, pulled.remark
        assert len(decode_messages(pulled.body)) == 2
        refused = await client.invoke(node.address, send_request("A"), TIMEOUT_S)
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "disk full" in (refused.remark or ""), refused.remark
        disk.full = False
        await wait_for(lambda: node.store.reput.failure is None)
        await node.store.wait_dispatched()
        taken = await client.invoke(node.address, send_request("A"), TIMEOUT_S)
        assert taken.code == ResponseCode.SUCCESS, taken.remark
        pulled = await client.invoke(node.address, pull_request("A"), TIMEOUT_S)
        assert len(decode_messages(pulled.body)) == 4
