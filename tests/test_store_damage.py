"""Damaged files: flipped bytes in the CommitLog, zeroed or deleted
consume-queue files, invalid JSON metadata files. Real files in tmp_path, damaged the
way a disk or an operator would, then a real store or broker started on them."""

from __future__ import annotations

import itertools
import json
import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from hamq.broker.metrics import BrokerCollector
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.subscriptions import SubscriptionGroupManager
from hamq.broker.topics import TopicConfigManager
from hamq.client import AdminClient, Message, Producer, PullConsumer, PullStatus, SendStatus
from hamq.protocol.bodies import SubscriptionGroupConfig, TopicConfig
from hamq.protocol.record import decode_messages, read_record
from hamq.store import BrokerRole, GetMessageStatus, MessageStore, PutMessageStatus
from hamq.store.checkpoint import MetadataFileError, load_checkpoint, save_checkpoint
from hamq.store.consume_queue import ENTRY_SIZE
from hamq.store.segment import StoreError
from tests.support.brokers import namesrv, running_broker
from tests.support.store import SEGMENT, message, open_store, promote, put, put_many, small_config

# ---------------------------------------------------------------- helpers


def segment_of(store_dir: Path, offset: int, segment_bytes: int = SEGMENT) -> tuple[Path, int]:
    """The CommitLog file holding ``offset`` and the position of ``offset`` in it."""
    start = offset - offset % segment_bytes
    return store_dir / "commitlog" / f"{start:020d}", offset - start


def record_bytes(store_dir: Path, offset: int, segment_bytes: int = SEGMENT) -> bytes:
    path, pos = segment_of(store_dir, offset, segment_bytes)
    data = path.read_bytes()
    size = int.from_bytes(data[pos : pos + 4], "big")
    return data[pos : pos + size]


def where(store_dir: Path, offset: int, field: str, segment_bytes: int = SEGMENT) -> int:
    """The CommitLog offset of a byte inside a field of the record at ``offset``."""
    info = read_record(record_bytes(store_dir, offset, segment_bytes))
    body_at = 84 + 4
    return (
        offset
        + {
            "body": body_at + 1,
            "topic": body_at + len(info.body) + 1,
            "properties": info.size - 2,
        }[field]
    )


def set_byte(store_dir: Path, offset: int, value: int, segment_bytes: int = SEGMENT) -> None:
    path, pos = segment_of(store_dir, offset, segment_bytes)
    with path.open("r+b") as out:
        out.seek(pos)
        out.write(bytes([value]))


def flip(store_dir: Path, offset: int, field: str, segment_bytes: int = SEGMENT) -> None:
    """Damage the record at ``offset`` in ``field``: a body byte flipped (the CRC no
    longer matches), a topic or properties byte made invalid UTF-8."""
    at = where(store_dir, offset, field, segment_bytes)
    path, pos = segment_of(store_dir, at, segment_bytes)
    old = path.read_bytes()[pos]
    set_byte(store_dir, at, old ^ 0x40 if field == "body" else 0xFF, segment_bytes)


def bodies_of(records: bytes) -> list[str]:
    return [m.body.split(b".")[0].decode() for m in decode_messages(records)]


def read_all(store: MessageStore, queue_id: int = 0) -> tuple[list[str], int]:
    """Every message of queue ``queue_id`` pulled 7 at a time; (bodies, records skipped)."""
    found: list[str] = []
    results = []
    offset = 0
    high = store.max_offset_in_queue("T", queue_id)
    while offset < high:
        result = store.get_message("g", "T", queue_id, offset, 7)
        assert result.next_begin_offset > offset, result  # never stalls
        found += bodies_of(result.body)  # (checks every CRC, as hamq's consumer does)
        results.append(result)
        offset = result.next_begin_offset
    return found, sum(r.skipped for r in results)


def crash(store_dir: Path) -> None:
    """Make the next start recover as after a crash, scanning the whole log."""
    (store_dir / "abort").write_bytes(b"")
    (store_dir / "checkpoint").unlink()


# ---------------------------------------------------------------- 1. pulls pass over damage


async def test_a_pull_passes_over_a_damaged_record_counts_it_and_goes_on(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node:
        ns = namesrv(node)
        async with AdminClient(ns) as admin:
            await admin.create_topic("D", 1)
        async with Producer("PG", ns) as producer:
            for i in range(40):
                result = await producer.send(Message("D", f"m{i}.".encode() + b"x" * 300))
                assert result.status is SendStatus.SEND_OK
        victims = [node.store.get_message("g", "D", 0, i, 1).messages[0] for i in (17, 39)]
    segment_bytes = node.config.store.commitlog_segment_bytes
    # after a clean stop: only the log's last records are read again at start
    for victim in victims:
        flip(tmp_path, int.from_bytes(victim[28:36], "big"), "properties", segment_bytes)
    async with running_broker(tmp_path) as node:
        async with PullConsumer("G", namesrv(node)) as consumer:
            [queue] = await consumer.queues("D")
            past = await consumer.pull(queue, 17, max_nums=1)
            assert [m.body for m in past.messages] == [b"m18." + b"x" * 300]
            assert past.next_begin_offset == 19
            last = await consumer.pull(queue, 39, max_nums=1)  # nothing else to send
            assert last.status is PullStatus.NO_MATCHED_MSG  # retry at once, from 40
            assert last.next_begin_offset == 40
            found: list[str] = []
            offset = 0
            for _ in range(40):
                result = await consumer.pull(queue, offset, max_nums=16)
                if result.status is PullStatus.NO_NEW_MSG:
                    break
                found += [m.body.split(b".")[0].decode() for m in result.messages]
                offset = result.next_begin_offset
        assert found == [f"m{i}" for i in range(40) if i not in (17, 39)]
        # m17 was passed over by two pulls; m39, the log's last record, was cut at start
        # as a damaged tail (copied to torn/, its queue offset kept by a placeholder)
        assert node.store.recovery is not None
        assert node.store.recovery.lost_offsets == {"D/0": (39, 40)}
        assert node.ctx.stats.damaged_skipped["D"] == 2
        [family] = [
            f
            for f in BrokerCollector(node).collect()
            if f.name == "hamq_broker_damaged_records_skipped"
        ]
        assert [(s.labels, s.value) for s in family.samples] == [({"topic": "D"}, 2)]


async def test_check_crc_on_read_passes_over_a_flipped_body_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)  # (check_crc_on_read is on by default)
    async with open_store(config) as store:
        offsets = await put_many(store, 30, queues=1, padding=500)
    flip(tmp_path, offsets[12], "body")
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as store:
            found, skipped = read_all(store)
            again, _ = read_all(store)  # met again: counted again, not logged again
    assert found == again == [f"m{i}" for i in range(30) if i != 12]
    assert skipped == 1
    assert store.commitlog.damaged.count == 2
    [line] = [r.getMessage() for r in caplog.records if "a pull passed over" in r.getMessage()]
    assert f"commitlog offset {offsets[12]}" in line and "body CRC" in line
    # without the check the record is sent as it is (the consumer's own CRC check fails)
    async with open_store(small_config(tmp_path, check_crc_on_read=False)) as store:
        result = store.get_message("g", "T", 0, 12, 1)
        assert result.status is GetMessageStatus.FOUND and result.skipped == 0
        with pytest.raises(ValueError, match="body CRC"):
            decode_messages(result.body)


# ---------------------------------------------------------------- 2. consume queue files


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


DAMAGE: dict[str, Callable[[Path], None]] = {
    # consumequeue/T/0 holds entries 0-99, 100-199, 200-249 in three files
    "last file zeroed": lambda q: _zero(q / "0" / f"{200 * ENTRY_SIZE:020d}"),
    "last file deleted": lambda q: (q / "0" / f"{200 * ENTRY_SIZE:020d}").unlink(),
    "first file zeroed": lambda q: _zero(q / "0" / f"{0:020d}"),
    "middle file zeroed": lambda q: _zero(q / "0" / f"{100 * ENTRY_SIZE:020d}"),
    "middle file deleted": lambda q: (q / "0" / f"{100 * ENTRY_SIZE:020d}").unlink(),
    "every file zeroed": lambda q: [_zero(f) for f in (q / "0").iterdir()],
    "queue directory deleted": lambda q: shutil.rmtree(q / "0"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
async def test_a_damaged_consume_queue_is_rebuilt_at_start(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 500, queues=2, padding=500)  # 250 per queue, 100 entries per file
        await store.wait_dispatched()
        assert store.max_offset_in_queue("T", 0) == 250
    DAMAGE[damage](tmp_path / "consumequeue" / "T")
    with caplog.at_level(logging.WARNING):
        async with open_store(config) as store:
            assert store.max_offset_in_queue("T", 0) == 250
            assert store.max_offset_in_queue("T", 1) == 250
            for offset in (0, 99, 100, 150, 199, 200, 249):
                got = store.get_message("g", "T", 0, offset, 1)
                assert bodies_of(got.body) == [f"m{2 * offset}"], (offset, got)
            result = await put(store, message(queue_id=0, body=b"new"))
            assert result.append is not None and result.append.queue_offset == 250
            assert store.recovery is not None and store.recovery.rebuilt_queues == ("T/0",)
    assert "consume queue T/0" in caplog.text and "rebuilt" in caplog.text
    async with open_store(config) as store:  # and it stays so, nothing rebuilt again
        assert store.recovery is not None and store.recovery.rebuilt_queues == ()
        assert store.max_offset_in_queue("T", 0) == 251


# ---------------------------------------------------------------- 3. JSON metadata files

#: file name: (make its manager, change it (n), what it holds)
FILES: dict[str, tuple[Callable[[Path], Any], Callable[[Any, int], None], Callable[[Any], Any]]] = {
    "topics.json": (
        lambda path: TopicConfigManager(path, lambda: 0),
        lambda m, n: m.update(TopicConfig(f"topic{n}", 4, 4)),
        lambda m: sorted(t for t in m.table if t.startswith("topic")),
    ),
    "consumerOffset.json": (
        ConsumerOffsetManager,
        lambda m, n: m.commit("G", "T", 0, n),
        lambda m: m.query("G", "T", 0),
    ),
    "subscriptionGroup.json": (
        lambda path: SubscriptionGroupManager(path, auto_create=False),
        lambda m, n: m.update(SubscriptionGroupConfig(f"group{n}")),
        lambda m: sorted(m.table),
    ),
}


@pytest.mark.parametrize("name", list(FILES))
async def test_invalid_json_in_a_broker_file_uses_the_previous_copy(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, change, seen = FILES[name]
    path = tmp_path / "config" / name
    manager = make(path)
    change(manager, 1)
    assert await manager.persist()
    first = seen(manager)
    change(manager, 2)
    assert await manager.persist()  # the first content is now topics.json.bak, say
    path.write_text('{"half a file": ')
    with caplog.at_level(logging.WARNING):
        reloaded = make(path)
        await reloaded.load()
    assert seen(reloaded) == first
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0] and "\n" not in errors[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{name}.bak" in w for w in warnings)
    assert (tmp_path / "config" / f"{name}.damaged").read_text() == '{"half a file": '
    assert json.loads(path.read_text())  # the good copy is back under the file's name
    # no usable copy: the broker does not start, and the one-line error names the file
    path.write_text("not json")
    path.with_name(f"{name}.bak").write_text("")
    with pytest.raises(MetadataFileError) as refused:
        await make(path).load()
    assert isinstance(refused.value, StoreError)  # (the CLI prints these as one line)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


async def test_invalid_json_in_the_delay_offsets_uses_the_previous_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config" / "delayOffset.json"
    config = small_config(tmp_path, message_delay_level="1h 2h")
    async with open_store(config) as master:
        for level in (1, 2) * 10:  # none of them due during the test
            result = await put(master, message(body=b"later", DELAY=str(level)))
            assert result.status is PutMessageStatus.PUT_OK
    async with open_store(attrs.evolve(config, role=BrokerRole.SLAVE)) as slave:
        await slave.replace_delay_offsets({1: 5, 2: 7})  # copies of its master's
        await slave.replace_delay_offsets({1: 6, 2: 9})
    path.write_bytes(b"\x00" * 20)  # a block of zeros
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        async with open_store(config) as master:
            assert master.delay_offsets() == {1: 5, 2: 7}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0]
    assert any("delayOffset.json.bak" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- 4. crash recovery


@pytest.mark.parametrize("field", ["body", "properties", "topic"])
async def test_crash_recovery_passes_over_one_damaged_record_and_keeps_the_rest(
    tmp_path: Path, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 900, queues=3, padding=500)
        end = store.commitlog_max_offset
    victim = 400  # queue 1, offset 133; several segments before the end
    original = record_bytes(tmp_path, offsets[victim])
    flip(tmp_path, offsets[victim], field)
    crash(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue")  # queues rebuilt by dispatching every record
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as store:
            report = store.recovery
            assert report is not None and not report.clean
            assert report.commitlog_end == end and report.truncated is None
            assert report.damaged == (offsets[victim],)
            for queue_id in range(3):
                assert store.max_offset_in_queue("T", queue_id) == 300
            found, skipped = read_all(store, 1)
            assert found == [f"m{i}" for i in range(1, 900, 3) if i != victim]
            assert skipped == 1
            result = await put(store, message(queue_id=1, body=b"next"))
            assert result.append is not None
            assert (result.append.queue_offset, result.append.physical_offset) == (300, end)
    [copy] = (tmp_path / "torn").iterdir()
    assert copy.name == f"{offsets[victim]:020d}.damaged"
    assert copy.read_bytes() != original and len(copy.read_bytes()) == len(original)
    assert f"damaged record [{offsets[victim]}, " in caplog.text


async def test_two_damaged_records_in_a_row_are_a_torn_tail_and_cut(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 900, queues=3, padding=500)
        end = store.commitlog_max_offset
    flip(tmp_path, offsets[400], "body")
    flip(tmp_path, offsets[401], "body")
    crash(tmp_path)
    async with open_store(config) as store:
        report = store.recovery
        assert report is not None and report.damaged == ()
        assert report.commitlog_end == offsets[400]
        assert report.truncated is not None and report.truncated[0] == offsets[400]
        assert report.truncated[1] <= end
        # m1 ... m397 are left of queue 1; the offsets of m400 ... m898 (entries 133 to
        # 299) were handed out, and are kept by placeholders that pulls pass over
        assert report.lost_offsets == {f"T/{q}": (133 + (q == 0), 300) for q in range(3)}
        assert store.max_offset_in_queue("T", 1) == 300
        found, skipped = read_all(store, 1)
        assert found == [f"m{i}" for i in range(1, 400, 3)] and skipped == 0
        result = await put(store, message(queue_id=1, body=b"new"))
        assert result.append is not None and result.append.queue_offset == 300


async def test_put_status_is_unchanged_for_damage_elsewhere(tmp_path: Path) -> None:
    """A damaged record does not stop the store taking sends after it (a sanity check
    of the path every test above relies on)."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 10, queues=1, padding=500)
    flip(tmp_path, offsets[3], "topic")
    async with open_store(config) as store:
        result = await put(store, message(body=b"after"))
        assert result.status is PutMessageStatus.PUT_OK
        await store.wait_dispatched()
        found, skipped = read_all(store)
        assert found == [f"m{i}" for i in range(10) if i != 3] + ["after"]
        assert skipped == 1


async def test_consume_queue_holes_left_by_a_crash_are_rebuilt(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 300, queues=2, padding=1000)
    queue_file = tmp_path / "consumequeue" / "T" / "0" / f"{100 * ENTRY_SIZE:020d}"
    data = bytearray(queue_file.read_bytes())
    data[10 * ENTRY_SIZE : 20 * ENTRY_SIZE] = bytes(10 * ENTRY_SIZE)  # pages lost out of order
    queue_file.write_bytes(bytes(data))
    checkpoint = load_checkpoint(tmp_path / "checkpoint")
    assert checkpoint is not None
    save_checkpoint(tmp_path / "checkpoint", checkpoint.__class__(0, 0, 0, 0, 0))
    (tmp_path / "abort").write_bytes(b"")
    async with open_store(config) as store:
        assert store.max_offset_in_queue("T", 0) == 150
        for offset in (109, 110, 119, 149):
            assert store.get_message("g", "T", 0, offset, 1).status is GetMessageStatus.FOUND


async def test_torn_copies_from_two_crashes_are_both_kept(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 5, queues=2, padding=1000)
        end = store.commitlog_max_offset
    segment = tmp_path / "commitlog" / f"{0:020d}"
    for garbage in (b"first torn tail", b"second torn tail"):
        data = bytearray(segment.read_bytes())
        data[end : end + len(garbage)] = garbage
        segment.write_bytes(bytes(data))
        (tmp_path / "abort").write_bytes(b"")
        async with open_store(config) as store:
            assert store.commitlog_max_offset == end
    copies = sorted(p.read_bytes() for p in (tmp_path / "torn").iterdir())
    assert copies == [b"first torn tail", b"second torn tail"]


# ---------------------------------------------------------------- 5. damage met after start


def damage(store_dir: Path, offset: int, how: str) -> None:
    """Damage the record at ``offset`` so that it does not dispatch: ``properties`` or
    ``topic`` not UTF-8, or ``topic name`` valid UTF-8 that names no topic ("/")."""
    if how == "topic name":
        set_byte(store_dir, where(store_dir, offset, "topic"), ord("/"))
    else:
        flip(store_dir, offset, how)


async def master_log(store_dir: Path, count: int) -> tuple[list[int], bytes]:
    """A master's log of ``count`` messages over 3 queues: their offsets and its bytes."""
    async with open_store(small_config(store_dir)) as master:
        offsets = await put_many(master, count, queues=3, padding=500)
        end = master.commitlog_max_offset
    assert end < SEGMENT  # (one segment: replicated as it is)
    return offsets, (store_dir / "commitlog" / f"{0:020d}").read_bytes()[:end]


def replicate(slave: MessageStore, data: bytes, start: int, stop: int, chunk: int = 1000) -> None:
    """Append ``data[start:stop]`` to the slave's log as a master's transfers would,
    ``chunk`` bytes at a time (cut anywhere, mid-record too)."""
    for at in range(start, stop, chunk):
        slave.append_raw(at, data[at : min(stop, at + chunk)])


@pytest.mark.parametrize("how", ["properties", "topic", "topic name"])
async def test_a_slave_passes_over_a_damaged_record_it_receives_and_goes_on(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A slave receives a record its master holds damaged (flipped after a clean stop,
    so its master never read it again). The slave's dispatching waits while the record
    after it has not all come, then passes over it, logs and counts it, and goes on:
    every queue offset is its master's (the damaged record's too, whether its header
    still names its queue or the gap its queue shows is filled with it), pulls skip
    it, and promoted, the slave continues each queue after its master's last offset."""
    offsets, original = await master_log(tmp_path / "master", 30)
    victim = 16  # queue 1, offset 5
    damage(tmp_path / "master", offsets[victim], how)
    data = (tmp_path / "master" / "commitlog" / f"{0:020d}").read_bytes()[: len(original)]
    config = small_config(tmp_path / "slave", role=BrokerRole.SLAVE)
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as slave:
            with trio.fail_after(5):
                replicate(slave, data, 0, offsets[victim + 1])
                await slave.wait_dispatched(offsets[victim])
                assert slave.reput.failure is None  # (the record after it is still to come)
                assert slave.reput.offset == offsets[victim]
                replicate(slave, data, offsets[victim + 1], len(data))
                await slave.wait_dispatched()
            assert slave.reput.failure is None
            assert [slave.max_offset_in_queue("T", q) for q in range(3)] == [10, 10, 10]
            found, skipped = read_all(slave, 1)
            assert found == [f"m{i}" for i in range(1, 30, 3) if i != victim]
            assert skipped == 1
            assert slave.statistics().damaged_records_dispatched == 1
            await promote(slave)
            result = await put(slave, message(queue_id=1, body=b"next"))
            assert result.append is not None and result.append.queue_offset == 10
    assert f"damaged record at commitlog offset {offsets[victim]}" in caplog.text


async def test_dispatching_stops_at_damage_it_cannot_pass_over_until_the_log_is_cut_there(
    tmp_path: Path,
) -> None:
    """Two damaged records in a row cannot be told from garbage: the slave's dispatching
    stops there (and says so); once its log is cut there (as an HA slave truncates to
    where it agrees with its master) and the records come again whole, it goes on."""
    offsets, good = await master_log(tmp_path / "master", 30)
    for victim in (16, 17):
        damage(tmp_path / "master", offsets[victim], "properties")
    data = (tmp_path / "master" / "commitlog" / f"{0:020d}").read_bytes()[: len(good)]
    async with open_store(small_config(tmp_path / "slave", role=BrokerRole.SLAVE)) as slave:
        replicate(slave, data, 0, len(data))
        with trio.fail_after(5):
            await slave.wait_dispatched(offsets[16])
        failure = slave.reput.failure
        assert failure is not None and f"commitlog offset {offsets[16]}" in failure
        assert slave.statistics().dispatch_failure == failure
        await slave.truncate(offsets[16])
        assert slave.reput.failure is None
        replicate(slave, good, offsets[16], len(good))
        with trio.fail_after(5):
            await slave.wait_dispatched()
        assert [slave.max_offset_in_queue("T", q) for q in range(3)] == [10, 10, 10]
        assert read_all(slave, 1) == ([f"m{i}" for i in range(1, 30, 3)], 0)


async def test_a_record_replaced_after_a_cut_is_checked_again_before_it_is_sent(
    tmp_path: Path,
) -> None:
    """Pulls check a record whole once, then trust it (queue.checked). A truncation ends
    that trust for what it cut: when a slave's log is cut and other bytes come in its
    place — here a damaged record — a pull checks them again and passes over the
    damaged one instead of sending it."""
    offsets, good = await master_log(tmp_path / "master", 30)
    damage(tmp_path / "master", offsets[16], "properties")
    data = (tmp_path / "master" / "commitlog" / f"{0:020d}").read_bytes()[: len(good)]
    async with open_store(small_config(tmp_path / "slave", role=BrokerRole.SLAVE)) as slave:
        replicate(slave, good, 0, len(good))
        with trio.fail_after(5):
            await slave.wait_dispatched()
        assert read_all(slave, 1) == ([f"m{i}" for i in range(1, 30, 3)], 0)  # now trusted
        await slave.truncate(offsets[16])
        replicate(slave, data, offsets[16], len(data))
        with trio.fail_after(5):
            await slave.wait_dispatched()
        found, skipped = read_all(slave, 1)
        assert found == [f"m{i}" for i in range(1, 30, 3) if i != 16]
        assert skipped == 1


async def test_a_replicated_record_with_a_bad_body_crc_is_passed_over_by_pulls(
    tmp_path: Path,
) -> None:
    """A body byte flipped on the master's disk leaves a record that dispatches (its
    lengths are sound): the slave's pulls still check its CRC (check_crc_on_read) and
    pass over it, every time, while the records this process appended are sent as they
    are (their CRCs were computed here)."""
    offsets, good = await master_log(tmp_path / "master", 30)
    flip(tmp_path / "master", offsets[16], "body")
    data = (tmp_path / "master" / "commitlog" / f"{0:020d}").read_bytes()[: len(good)]
    async with open_store(small_config(tmp_path / "slave", role=BrokerRole.SLAVE)) as slave:
        replicate(slave, data, 0, len(data))
        with trio.fail_after(5):
            await slave.wait_dispatched()
        assert slave.statistics().damaged_records_dispatched == 0
        await promote(slave)
        assert (await put(slave, message(queue_id=1, body=b"m30."))).stored
        await slave.wait_dispatched()
        for _ in range(2):
            found, skipped = read_all(slave, 1)
            assert found == [f"m{i}" for i in range(1, 30, 3) if i != 16] + ["m30"]
            assert skipped == 1


async def test_dispatch_and_pulls_over_randomly_damaged_replicated_logs(tmp_path: Path) -> None:
    """A bounded random corpus (fixed seed): a master's log with 1-3 bytes changed
    anywhere (headers, lengths, bodies, topics) or in one record, received by a slave.
    Damage within one record's body or properties never stops dispatching. Dispatching never
    raises and never stops silently: it dispatches the whole log, or says why it
    stopped, or waits on what it cannot yet tell from a record still coming. Pulls never
    stall, never send a record hamq's consumer cannot decode (CRC included), one queue
    offset twice, or a body the master did not store."""
    rng = random.Random(14)
    offsets, data = await master_log(tmp_path / "master", 30)
    messages = decode_messages(data)
    assert len(messages) == len(offsets)
    bodies = {m.body for m in messages}
    # the bytes of each record but the last that dispatching need not trust: its body
    # (CRC'd) and its properties (passed over if they do not decode)
    passable, properties = [], []
    for at, end in itertools.pairwise(offsets):
        info = read_record(data, at)
        properties.append(range(end - len(info.properties.encode()), end))
        passable.append(set(range(at + 88, at + 88 + len(info.body))) | set(properties[-1]))
    for trial in range(300):
        damaged = bytearray(data)
        changed = set()
        # half the trials anywhere, half in one record's properties
        region = rng.choice(properties) if trial % 2 else range(len(damaged))
        for _ in range(rng.randint(1, 3)):
            where_ = rng.choice(region)
            changed.add(where_)
            damaged[where_] ^= 1 << rng.randrange(8)
        store = MessageStore(small_config(tmp_path / f"slave{trial}", role=BrokerRole.SLAVE))
        store.commitlog.load()
        store.queues.load()
        store.index.load()
        try:
            store.commitlog.append_raw(0, bytes(damaged))
            store.reput.dispatch_available()
            reput = store.reput
            at = reput.offset
            if any(changed <= region for region in passable):  # one record, passable
                assert (reput.failure, at) == (None, len(data)), trial
            if reput.failure is None and at < len(data):  # waiting: on what it cannot tell
                # from a record still to come, as a damaged last record or TOTALSIZE
                size = int.from_bytes(damaged[at : at + 4], "big", signed=True)
                assert damaged[at:] != data[at:], (trial, at)
                assert at == offsets[-1] or at + size > len(data), (trial, at)
            for (topic, queue_id), queue in store.queues.queues.items():
                sent = []
                offset = queue.min_offset
                while offset < queue.max_offset:
                    result = store.get_message("g", topic, queue_id, offset, 7)
                    assert result.next_begin_offset > offset
                    sent += decode_messages(result.body)  # (checks every CRC)
                    offset = result.next_begin_offset
                queue_offsets = [m.queue_offset for m in sent]
                assert len(set(queue_offsets)) == len(queue_offsets), (trial, topic, queue_id)
                assert all(m.topic == topic and m.queue_id == queue_id for m in sent)
                # fields outside the body have no CRC (as in RocketMQ): a changed
                # QUEUEID moves a record to another queue undetectably; its body is one
                # of the master's all the same
                assert all(m.body in bodies for m in sent), (trial, topic, queue_id)
        finally:
            store.commitlog.close()
            store.queues.close()
            store.index.close()
