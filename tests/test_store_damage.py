"""Damaged files (issue 14, item 5): flipped bytes in the CommitLog, zeroed or deleted
consume-queue files, invalid JSON metadata files. Real files in tmp_path, damaged the
way a disk or an operator would, then a real store or broker started on them."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from hamq.broker.metrics import BrokerCollector
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.subscriptions import SubscriptionGroupManager
from hamq.broker.topics import TopicConfigManager
from hamq.client import AdminClient, Message, Producer, PullConsumer, PullStatus, SendStatus
from hamq.protocol.bodies import SubscriptionGroupConfig, TopicConfig
from hamq.protocol.message import decode_messages, read_record
from hamq.store import BrokerRole, GetMessageStatus, MessageStore, PutMessageStatus
from hamq.store.checkpoint import MetadataFileError
from hamq.store.consume_queue import ENTRY_SIZE
from hamq.store.segment import StoreError
from tests.broker_support import namesrv, running_broker
from tests.store_support import SEGMENT, message, open_store, small_config

# ---------------------------------------------------------------- helpers


async def put_bodies(store: MessageStore, count: int, queues: int = 1) -> list[int]:
    """``count`` messages ``m<i>`` (queue i % queues); their CommitLog offsets."""
    offsets = []
    for i in range(count):
        result = await store.put_message(
            message(queue_id=i % queues, body=f"m{i}.".encode() + b"x" * 500, KEYS=f"k{i}")
        )
        assert result.append is not None, result
        offsets.append(result.append.physical_offset)
    return offsets


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
    # after a clean stop: nothing at start reads the records again
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
        assert node.ctx.stats.damaged_skipped["D"] == 4
        [family] = [
            f
            for f in BrokerCollector(node).collect()
            if f.name == "hamq_broker_damaged_records_skipped"
        ]
        assert [(s.labels, s.value) for s in family.samples] == [({"topic": "D"}, 4)]


async def test_check_crc_on_read_passes_over_a_flipped_body_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)  # (check_crc_on_read is on by default)
    async with open_store(config) as store:
        offsets = await put_bodies(store, 30)
    flip(tmp_path, offsets[12], "body")
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as store:
            found, skipped = read_all(store)
            again, _ = read_all(store)  # met again: counted again, not logged again
    assert found == again == [f"m{i}" for i in range(30) if i != 12]
    assert skipped == 1
    assert store.commitlog.damaged.count == 2
    [line] = [r.getMessage() for r in caplog.records if "damaged record" in r.getMessage()]
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
        await put_bodies(store, 500, queues=2)  # 250 per queue, 100 entries per file
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
            result = await store.put_message(message(queue_id=0, body=b"new"))
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
            result = await master.put_message(message(body=b"later", DELAY=str(level)))
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
        offsets = await put_bodies(store, 900, queues=3)
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
            result = await store.put_message(message(queue_id=1, body=b"next"))
            assert result.append is not None
            assert (result.append.queue_offset, result.append.physical_offset) == (300, end)
    [copy] = (tmp_path / "torn").iterdir()
    assert copy.name == f"{offsets[victim]:020d}.damaged"
    assert copy.read_bytes() != original and len(copy.read_bytes()) == len(original)
    assert f"damaged record [{offsets[victim]}, " in caplog.text


async def test_two_damaged_records_in_a_row_are_a_torn_tail_and_cut(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_bodies(store, 900, queues=3)
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
        assert store.max_offset_in_queue("T", 1) == 133  # m1 ... m397


async def test_put_status_is_unchanged_for_damage_elsewhere(tmp_path: Path) -> None:
    """A damaged record does not stop the store taking sends after it (a sanity check
    of the path every test above relies on)."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_bodies(store, 10)
    flip(tmp_path, offsets[3], "topic")
    async with open_store(config) as store:
        result = await store.put_message(message(body=b"after"))
        assert result.status is PutMessageStatus.PUT_OK
        await store.wait_dispatched()
        found, skipped = read_all(store)
        assert found == [f"m{i}" for i in range(10) if i != 3] + ["after"]
        assert skipped == 1
