"""MessageStore: puts and gets, restart and recovery, flush, delay levels, retention;
truncation (racing a slow fsync, its zeroed tail put on disk), a slave whose log starts
mid-way, and topic names and configurations refused before anything reaches disk."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import random
import shutil
import threading
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from hamq.protocol.message import tags_code
from hamq.protocol.record import StoredMessage, decode_messages
from hamq.store import (
    SCHEDULE_TOPIC,
    BrokerRole,
    FlushDiskType,
    GetMessageStatus,
    MessageStore,
    MessageToStore,
    PutMessageStatus,
    StoreConfig,
)
from hamq.store import segment as segment_module
from hamq.store.checkpoint import load_checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.message_store import StoreLockedError
from hamq.store.segment import Segment, StoreError
from tests.support.store import SEGMENT, message, open_store, put, put_many, small_config
from tests.support.timing import virtual_clock, wait_for


async def settle(store: MessageStore) -> None:
    """Let the dispatch task catch up with the CommitLog."""
    with trio.fail_after(10):
        await store.wait_dispatched()


def bodies(store: MessageStore, queue_id: int, offset: int = 0, count: int = 32) -> list[bytes]:
    result = store.get_message("g", "T", queue_id, offset, count)
    return [m.body.split(b".")[0] for m in decode_messages(result.body)]


async def test_put_and_get_with_every_status(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path)) as store:
        await put_many(store, 40)
        await settle(store)
        found = store.get_message("g", "T", 1, 0, 3)
        assert found.status is GetMessageStatus.FOUND
        assert (found.next_begin_offset, found.min_offset, found.max_offset) == (3, 0, 10)
        records = decode_messages(found.body)
        assert [m.queue_offset for m in records] == [0, 1, 2]
        assert [m.body.split(b".")[0] for m in records] == [
            b"m1",
            b"m5",
            b"m9",
        ]
        assert store.get_message("g", "T", 1, 10, 3).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        badly = store.get_message("g", "T", 1, 99, 3)
        # RocketMQ: a queue that still starts at 0 sends the consumer back to 0
        assert (badly.status, badly.next_begin_offset) == (
            GetMessageStatus.OFFSET_OVERFLOW_BADLY,
            0,
        )
        none = store.get_message("g", "T", 9, 0, 3)
        assert none.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        # tag filter by hash: queue 0 holds only "even" messages
        odd = store.get_message("g", "T", 0, 0, 32, tag_codes={tags_code("odd")})
        assert (odd.status, odd.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 10)
        even = store.get_message("g", "T", 0, 0, 32, tag_codes={tags_code("even")})
        assert even.message_count == 10
        # byte budget: at least one message, then whole messages only
        small = store.get_message("g", "T", 0, 0, 32, max_bytes=5000)
        assert small.message_count == 2
        assert small.next_begin_offset == 2


async def test_messages_and_offsets_survive_a_restart(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 200)
        end = store.commitlog_max_offset
    assert not (tmp_path / "abort").exists()  # a clean stop removes the marker
    async with open_store(config) as store:
        assert store.recovery is not None and store.recovery.clean
        assert store.commitlog_max_offset == end
        assert bodies(store, 2, 45, 2) == [b"m182", b"m186"]
        result = await put(store, message(queue_id=2, body=b"after-restart"))
        assert result.append is not None and result.append.queue_offset == 50
        [by_key] = store.query_message("T", "k123", 5)
        assert by_key.body.startswith(b"m123.")
        [by_id] = store.query_message("T", "UNIQ000077", 5)
        assert by_id.queue_offset == 19


async def test_a_pull_reads_records_back_to_back_as_one_view_and_checks_the_rest(
    tmp_path: Path,
) -> None:
    """Trusted records that follow one another in the log come as one view (never
    across a segment); records a restarted store has not checked yet are checked one by
    one. Either way the answer is every record, whole, in queue order, as read alone."""
    config = small_config(tmp_path, max_transfer_count=1000, max_transfer_bytes=4 * SEGMENT)
    async with open_store(config) as store:
        for i in range(300):  # queue 0: runs of 5 in a row; queue 1: one record at a time
            await put(store, message(queue_id=0 if i % 6 else 1, body=b"%d." % i * 700))
        await settle(store)
        assert store.commitlog_max_offset > 2 * SEGMENT  # the queues span segments

        def alone(queue_id: int) -> list[bytes]:
            queue = store.queues.get("T", queue_id)
            assert queue is not None
            entries = queue.entries(0, queue.max_offset)
            return [bytes(store.commitlog.read(offset, size)) for offset, size, _ in entries]

        first = store.get_message("g", "T", 0, 0, 1000)
        assert first.message_count == 250 and 50 <= len(first.runs) <= 53
        assert [bytes(m) for m in first.messages] == alone(0)
        assert first.body == b"".join(alone(0))
        one_by_one = store.get_message("g", "T", 1, 0, 1000)
        assert [bytes(m) for m in one_by_one.messages] == alone(1)
    async with open_store(config) as store:  # nothing checked yet in this process
        checked = store.get_message("g", "T", 0, 0, 1000)
        assert len(checked.runs) == checked.message_count == 250
        again = store.get_message("g", "T", 0, 0, 1000)
        assert 50 <= len(again.runs) <= 53
        assert checked.body == again.body == first.body


async def test_pulls_of_checked_and_unchecked_records_take_what_the_budgets_allow(
    tmp_path: Path,
) -> None:
    """Random pulls (offset, count, byte budget) over a queue whose records a restarted
    store has checked only in places: each answer is the records from the offset, whole
    and in order, as many as the count and the budget allow (the first whatever its
    size), whether they were checked before (read as runs) or are checked now."""
    rng = random.Random(18)
    config = small_config(tmp_path, max_transfer_count=500, max_transfer_bytes=SEGMENT)
    async with open_store(config) as store:
        for i in range(400):
            body = b"%d." % i + b"x" * rng.choice([10, 300, 3000])
            await put(store, message(queue_id=i % 3 and 1, body=body))
        await settle(store)
    async with open_store(config) as store:  # nothing checked yet
        queue = store.queues.get("T", 1)
        assert queue is not None
        entries = queue.entries(0, queue.max_offset)
        records = [bytes(store.commitlog.read(offset, size)) for offset, size, _ in entries]
        store.get_message("g", "T", 1, 40, 30)  # checked: 40..69, then more as pulls go
        for _ in range(300):
            offset = rng.randrange(len(records))
            count, budget = rng.randint(1, 120), rng.choice([1, 2000, 9000, 60000])
            result = store.get_message("g", "T", 1, offset, count, max_bytes=budget)
            expected: list[bytes] = []
            for record in records[offset : offset + count]:
                if expected and sum(map(len, expected)) + len(record) > budget:
                    break
                expected.append(record)
            assert [bytes(m) for m in result.messages] == expected, (offset, count, budget)
            assert result.next_begin_offset == offset + len(expected)


async def test_consume_queues_are_rebuilt_after_their_files_are_deleted(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 300)
    shutil.rmtree(tmp_path / "consumequeue")
    async with open_store(config) as store:
        assert store.recovery is not None
        assert store.recovery.records_dispatched == 300
        assert store.max_offset_in_queue("T", 3) == 75
        assert bodies(store, 3, 70, 2) == [b"m283", b"m287"]


async def test_two_corrupted_records_in_the_last_segment_are_found_by_crc_and_cut_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 300)
    last_segment = max((tmp_path / "commitlog").iterdir())
    start = int(last_segment.name)
    in_last = [o for o in offsets if o >= start]
    victim = in_last[len(in_last) // 2]  # a record in the middle of the last segment
    victim_index = offsets.index(victim)
    data = bytearray(last_segment.read_bytes())
    data[victim - start + 100] ^= 0x40  # a byte of its body
    # and of the next record's: one damaged record alone is passed over, not cut
    # (tests/test_store_damage.py); two in a row are a torn tail
    following = in_last[len(in_last) // 2 + 1]
    data[following - start + 100] ^= 0x40
    last_segment.write_bytes(bytes(data))
    (tmp_path / "abort").write_bytes(b"")  # as after a crash
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as store:
            report = store.recovery
            assert report is not None and not report.clean
            assert report.commitlog_end == victim
            assert report.bad_record is not None and "body CRC" in report.bad_record
            assert report.truncated is not None and report.truncated[0] == victim
            # every record before the bad one is still there, none after it; the queue
            # offsets that were handed out for those are kept by placeholders (after the
            # cut), which pulls pass over
            queue = victim_index % 4
            kept = victim_index // 4
            assert report.lost_offsets[f"T/{queue}"] == (kept, 75)
            assert store.max_offset_in_queue("T", queue) == 75
            assert store.commitlog_max_offset > victim
            assert bodies(store, queue, kept - 1, 5) == [f"m{victim_index - 4}".encode()]
    assert f"commitlog cut at {victim}" in caplog.text
    [copy] = report.torn_copy
    assert copy.parent == tmp_path / "torn"
    assert copy.read_bytes()[:4] == data[victim - start : victim - start + 4]  # the bad record


async def test_a_torn_tail_is_copied_aside_and_cut(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 10)
        end = store.commitlog_max_offset
    segment = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    torn = bytes(range(1, 60))  # half a record: a size and then garbage
    data[end : end + len(torn)] = torn
    segment.write_bytes(bytes(data))
    (tmp_path / "abort").write_bytes(b"")
    async with open_store(config) as store:
        assert store.commitlog_max_offset == end
        assert store.recovery is not None and store.recovery.truncated == (end, end + len(torn))
        assert sum(store.max_offset_in_queue("T", q) for q in range(4)) == 10
        result = await put(store, message(body=b"next"))
        assert result.append is not None and result.append.physical_offset == end
    assert (tmp_path / "torn" / f"{end:020d}.tail").read_bytes() == torn


async def test_sync_flush_group_commit(tmp_path: Path) -> None:
    config = small_config(tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with open_store(config) as store:
        assert store.flush is not None
        results = []

        async def put_one(i: int) -> None:
            results.append(await put(store, message(queue_id=i % 4, body=b"x" * 100)))

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(put_one, i)
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert store.flush.flushed_offset >= max(r.append.end_offset for r in results if r.append)
        assert store.flush.rounds < 64  # puts shared their fsyncs


async def test_a_slow_fsync_gives_flush_disk_timeout_and_keeps_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # real time: the fsync really hangs in its worker thread until released
    config = small_config(
        tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_s=0.2
    )
    release = threading.Event()
    original = Segment.sync_data

    def stuck_sync(self: Segment) -> None:
        release.wait(30)
        original(self)

    async with open_store(config) as store:
        monkeypatch.setattr(Segment, "sync_data", stuck_sync)
        start = trio.current_time()
        try:
            with trio.fail_after(10):
                result = await put(store, message(body=b"slow disk"))
            assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert trio.current_time() - start >= 0.2
            assert result.append is not None  # stored nonetheless
            await settle(store)
            assert bodies(store, 0) == [b"slow disk"]
        finally:
            release.set()


async def test_a_delayed_message_is_delivered_after_its_level(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = small_config(tmp_path, message_delay_level="1s 5s 10s")
    async with open_store(config, clock=virtual_clock()) as store:
        sent = await put(
            store, message(queue_id=2, body=b"later", DELAY="3", UNIQ_KEY="ID-1", TAGS="t")
        )
        assert sent.append is not None
        start = trio.current_time()
        await settle(store)
        assert store.max_offset_in_queue(SCHEDULE_TOPIC, 2) == 1  # waiting in level 3
        await trio.sleep(9.9)
        assert store.max_offset_in_queue("T", 2) == 0  # not yet
        await trio.sleep(0.3)
        assert store.max_offset_in_queue("T", 2) == 1
        [delivered] = decode_messages(store.get_message("g", "T", 2, 0, 1).body)
        assert delivered.body == b"later"
        assert delivered.msg_id == "ID-1"  # the same id the producer saw
        assert "DELAY" not in delivered.properties
        assert delivered.properties["REAL_TOPIC"] == "T"
        assert delivered.store_timestamp - sent.append.store_timestamp == pytest.approx(
            10_000, abs=200
        )
        assert trio.current_time() - start < 10.3
        assert store.delay_offsets() == {3: 1}
        # a level past the last one is capped at the last
        await put(store, message(queue_id=0, body=b"capped", DELAY="99"))
        await settle(store)
        assert store.max_offset_in_queue(SCHEDULE_TOPIC, 2) == 2
    offsets = (tmp_path / "config" / "delayOffset.json").read_text()
    assert '"3":1' in offsets


async def test_retention_deletes_old_segments_once_nobody_needs_them(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    needed = [0]
    config = small_config(tmp_path, file_reserved_time_h=1, clean_interval_s=10)
    clock = virtual_clock(base_ms=int(__import__("time").time() * 1000))
    async with open_store(config, clock=clock, retention_floor=lambda: needed[0]) as store:
        await put_many(store, 400)  # several segments
        segments = len(store.commitlog.segments.segments)
        assert segments >= 4
        assert store.flush is not None
        await store.flush.flush_queues_and_checkpoint()
        await trio.sleep(2 * 3600)  # old enough now, but a consumer still needs everything
        assert store.commitlog_min_offset == 0
        needed[0] = 2 * SEGMENT  # consumers are past the first two segments
        await wait_for(lambda: store.commitlog_min_offset == 2 * SEGMENT, 600, every_s=1)
        await trio.sleep(60)
        assert store.commitlog_min_offset == 2 * SEGMENT  # and no further
        low = store.min_offset_in_queue("T", 1)
        assert low > 0
        too_small = store.get_message("g", "T", 1, 0, 5)
        assert too_small.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert too_small.next_begin_offset == low
        assert store.get_message("g", "T", 1, low, 1).status is GetMessageStatus.FOUND
        high = store.max_offset_in_queue("T", 1)
        badly = store.get_message("g", "T", 1, high + 5, 1)  # past the end of a trimmed queue
        assert (badly.status, badly.next_begin_offset) == (
            GetMessageStatus.OFFSET_OVERFLOW_BADLY,
            high,
        )
        needed[0] = 10**12
        await wait_for(lambda: len(store.commitlog.segments.segments) == 1, 600, every_s=1)
        await trio.sleep(60)
        assert len(store.commitlog.segments.segments) == 1  # never the one being written


async def test_bad_puts_are_refused_with_a_named_status(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path)) as store:
        too_big = await put(store, message(body=b"x" * (64 * 1024 + 1)))
        assert too_big.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "over max_message_bytes 65536" in too_big.remark
        huge_properties = await put(store, message(big="p" * 40_000))
        assert huge_properties.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        # the status follows the error's type, not its text: this one names the key
        illegal_key = await put(store, message(**{"properties of\x01": "v"}))
        assert illegal_key.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "may not contain" in illegal_key.remark
        bad_delay = await put(store, message(DELAY="soon"))
        assert bad_delay.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert not (too_big.stored or huge_properties.stored or bad_delay.stored)
        assert not illegal_key.stored
        assert store.commitlog_max_offset == 0
    async with open_store(small_config(tmp_path, role=BrokerRole.SLAVE)) as slave:
        refused = await put(slave, message())
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE


async def test_one_store_directory_one_process(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path)):
        with pytest.raises(ExceptionGroup) as refused:
            async with open_store(small_config(tmp_path)):
                pass
        assert refused.group_contains(StoreLockedError, match=f"is in use by process {os.getpid()}")


async def test_a_slave_rebuilds_queues_from_replicated_bytes(tmp_path: Path) -> None:
    async with (
        open_store(small_config(tmp_path / "master")) as master,
        open_store(small_config(tmp_path / "slave", role=BrokerRole.SLAVE)) as slave,
    ):
        await put_many(master, 120)
        offset = 0
        while offset < master.commitlog_max_offset:
            chunk = bytes(master.get_data(offset, 7000))
            slave.append_raw(offset, chunk)
            offset += len(chunk)
        await settle(slave)
        assert [slave.max_offset_in_queue("T", q) for q in range(4)] == [30] * 4
        assert bodies(slave, 1, 29, 1) == [b"m117"]
        assert [m.queue_offset for m in slave.query_message("T", "k5", 3)] == [1]


async def test_a_batch_past_a_segment_end_keeps_each_queue_in_order(tmp_path: Path) -> None:
    """A batch to two queues, longer than what is left of the CommitLog's segment (its
    records are written a segment's worth at a time): the segment ends with its blank
    marker, the rest go on in the next ones, each queue's offsets run on without a gap,
    and every record reads back (its CRC checked after a restart)."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 3, queues=1)  # (the batch starts mid-segment)
        batch = [message("B", i % 2, b"%d." % i + b"." * 5000) for i in range(120)]
        results = store.put_batch_nowait(batch)
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        places = [r.append for r in results if r.append is not None]
        assert [a.queue_offset for a in places] == [i // 2 for i in range(120)]
        assert len({a.physical_offset // SEGMENT for a in places}) == 3
        assert all(a.end_offset <= b.physical_offset for a, b in itertools.pairwise(places))
        await settle(store)

    def read_back(store: MessageStore, queue_id: int) -> list[bytes]:
        found = []
        while (result := store.get_message("g", "B", queue_id, len(found), 32)).message_count:
            found += [m.body.split(b".")[0] for m in decode_messages(result.body)]
        return found

    expected = [[b"%d" % i for i in range(q, 120, 2)] for q in (0, 1)]
    async with open_store(config) as store:
        await settle(store)
        assert [read_back(store, q) for q in (0, 1)] == expected


async def test_a_batch_is_stored_as_its_messages_would_be_one_by_one(tmp_path: Path) -> None:
    """A batch as a send makes it (one queue, the same hosts and times) is checked and
    encoded as one: its records are those of the same messages put one by one, but for
    their places; an entry the store refuses is named and nothing is stored."""
    host, store_host = ("10.1.2.3", 4567), ("127.0.0.1", 10911)

    def batch(topic: str) -> list[MessageToStore]:
        return [
            MessageToStore(
                topic,
                1,
                b"%d" % i * 300,
                i,
                {"UNIQ_KEY": f"U{i}", "TAGS": "t"},
                0,
                99,
                host,
                store_host,
                3,
            )
            for i in range(12)
        ]

    async with open_store(small_config(tmp_path)) as store:
        results = store.put_batch_nowait(batch("A"))
        assert [r.append.queue_offset for r in results if r.append] == list(range(12))
        for message in batch("B"):
            assert store.put_message_nowait(message).stored
        too_big = batch("A")
        too_big[5].body = b"x" * (store.config.max_message_bytes + 1)
        (refused,) = store.put_batch_nowait(too_big)
        assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert refused.remark.startswith("batch entry 5: body of ")
        await settle(store)

        def records(topic: str) -> list[StoredMessage]:
            return decode_messages(store.get_message("g", topic, 1, 0, 32).body)

        def same(record: StoredMessage) -> tuple[object, ...]:
            place = ("topic", "physical_offset", "store_timestamp", "offset_msg_id")
            return tuple(v for k, v in attrs.asdict(record).items() if k not in place)

        assert len(records("A")) == 12
        assert [same(r) for r in records("A")] == [same(r) for r in records("B")]


async def test_batches_to_one_queue_are_dispatched_past_its_file_ends(tmp_path: Path) -> None:
    """Batches to one queue are dispatched a run of records at a time: its entries are
    written together where they fit in the queue's file, one by one where they reach
    its end (100 entries a file here); every entry is in place, each message can be
    found by its key, and the queue reads back whole after a restart."""
    config = small_config(tmp_path, index_max_entries=1000)

    def batch(first: int) -> list[MessageToStore]:
        return [
            MessageToStore("R", 0, b"%d." % i, properties={"KEYS": f"k{i}"})
            for i in range(first, first + 70)
        ]

    async with open_store(config) as store:
        for first in (0, 70, 140):
            results = store.put_batch_nowait(batch(first))
            assert [r.append.queue_offset for r in results if r.append] == list(
                range(first, first + 70)
            )
        await settle(store)
        assert len(store.queues.get("R", 0).segments.segments) == 3
        for i in (0, 99, 100, 139, 209):
            assert len(store.query_message("R", f"k{i}", 10)) == 1, i

    def read_back(store: MessageStore) -> list[bytes]:
        found: list[bytes] = []
        while (result := store.get_message("g", "R", 0, len(found), 32)).message_count:
            found += [m.body.split(b".")[0] for m in decode_messages(result.body)]
        return found

    async with open_store(config) as store:
        await settle(store)
        assert read_back(store) == [b"%d" % i for i in range(210)]


async def test_a_batch_is_stored_when_no_descriptor_is_left_for_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process is out of file descriptors (EMFILE) when a batch is written: it goes
    through the map instead, and reads back."""

    def no_descriptor(*args: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    async with open_store(small_config(tmp_path)) as store:
        await put_many(store, 1, queues=1)  # (the segment is there: no file to make)
        monkeypatch.setattr(segment_module.os, "open", no_descriptor)
        results = store.put_batch_nowait(
            [message("B", 0, b"%d." % i + b"." * 5000) for i in range(8)]
        )
        monkeypatch.undo()
        assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 8
        await settle(store)
        found = decode_messages(store.get_message("g", "B", 0, 0, 32).body)
        assert [m.body.split(b".")[0] for m in found] == [b"%d" % i for i in range(8)]


async def test_truncate_drops_records_everywhere_and_appends_continue(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path)) as store:
        offsets = await put_many(store, 100)
        await settle(store)
        await store.truncate(offsets[60])
        assert store.commitlog_max_offset == offsets[60]
        other = await put(store, message(topic="Other", queue_id=0))
        assert other.append is not None
        await store.wait_dispatched()
        with pytest.raises(StoreError, match="no record starts there"):
            await store.truncate(other.append.physical_offset + 1)
        await store.truncate(other.append.physical_offset)  # "Other" loses its only message
        empty = store.get_message("g", "Other", 0, 0, 1)
        assert (empty.status, empty.next_begin_offset) == (GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0)
        await store.truncate(offsets[60])
        assert [store.max_offset_in_queue("T", q) for q in range(4)] == [15, 15, 15, 15]
        assert store.query_message("T", "k70", 3) == []
        result = await put(store, message(queue_id=0, body=b"new", KEYS="k70"))
        assert result.append is not None
        assert (result.append.physical_offset, result.append.queue_offset) == (offsets[60], 15)
        await settle(store)
        [found] = store.query_message("T", "k70", 3)
        assert found.body == b"new"


async def test_offset_by_time_and_store_times(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    clock = virtual_clock()
    async with open_store(small_config(tmp_path), clock=clock) as store:
        stamps = []
        for _ in range(10):
            result = await put(store, message(queue_id=0))
            assert result.append is not None
            stamps.append(result.append.store_timestamp)
            await trio.sleep(1)
        await settle(store)
        assert store.offset_by_time("T", 0, stamps[4]) == 4
        assert store.offset_by_time("T", 0, stamps[4] + 500) == 5
        assert store.offset_by_time("T", 0, stamps[4] + 500, upper=True) == 4
        assert store.earliest_message_time("T", 0) == stamps[0]
        assert store.message_store_time("T", 0, 7) == stamps[7]
        assert store.message_store_time("T", 0, 70) == -1


async def test_a_truncation_during_a_slow_fsync_does_not_overstate_what_is_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(tmp_path)
    release = threading.Event()
    syncing = trio.Event()
    original = Segment.sync_data
    token = trio.lowlevel.current_trio_token()

    def slow(self: Segment) -> None:
        token.run_sync_soon(syncing.set)
        release.wait(10)
        original(self)

    async with open_store(config) as store:
        assert store.flush is not None
        await put_many(store, 20, queues=2, padding=1000)
        half = store.commitlog_max_offset
        await put_many(store, 20, queues=2, padding=1000)
        monkeypatch.setattr(Segment, "sync_data", slow)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.flush.flush_commitlog)
            await syncing.wait()
            nursery.start_soon(store.truncate, half)  # waits for the flush to finish
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        monkeypatch.setattr(Segment, "sync_data", original)
        assert store.commitlog_max_offset == half
        assert store.flush.flushed_offset <= half
        for segment in store.commitlog.segments.segments:
            assert segment.flushed <= segment.wrote
    checkpoint = load_checkpoint(tmp_path / "checkpoint")
    assert checkpoint is not None and checkpoint.commitlog_flushed_offset == half
    async with open_store(config) as store:  # restarts cleanly at the cut
        assert store.commitlog_max_offset == half


async def test_truncation_puts_the_zeroed_tail_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    original = Segment.sync_data

    def counting(self: Segment) -> None:
        synced.append(f"{self.path.parent.name}/{self.path.name}")
        original(self)

    async with open_store(small_config(tmp_path)) as store:
        await put_many(store, 30, queues=2, padding=1000)
        assert store.flush is not None
        await store.flush.flush_queues_and_checkpoint()
        cut = store.get_message("g", "T", 0, 5, 1).messages[0]
        offset = int.from_bytes(cut[28:36], "big")  # PHYSICALOFFSET of entry 5
        monkeypatch.setattr(Segment, "sync_data", counting)
        await store.truncate(offset)
    assert f"commitlog/{0:020d}" in synced  # the segment holding the cut
    assert f"0/{0:020d}" in synced  # and the consume queue it cut


async def test_a_slave_whose_log_starts_mid_way_builds_its_queues(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "master")) as master:
        await put_many(master, 700, queues=2, padding=1000)
        last = master.commitlog.segments.last
        assert last is not None and last.start > 0
        async with open_store(small_config(tmp_path / "slave", role=BrokerRole.SLAVE)) as slave:
            offset = last.start  # a master starts a new slave at its last segment
            while offset < master.commitlog_max_offset:
                chunk = bytes(master.get_data(offset, 32 * 1024))
                slave.append_raw(offset, chunk)
                offset += len(chunk)
            with trio.fail_after(10):
                await slave.wait_dispatched()
            high = master.max_offset_in_queue("T", 1)
            assert slave.max_offset_in_queue("T", 1) == high
            found = slave.get_message("g", "T", 1, high - 1, 1)
            assert found.status is GetMessageStatus.FOUND


async def test_delay_offsets_past_their_queue_move_back_to_its_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = small_config(tmp_path, message_delay_level="1s")
    (tmp_path / "config").mkdir(parents=True)
    (tmp_path / "config" / "delayOffset.json").write_text(json.dumps({"offsetTable": {"1": 9}}))
    async with open_store(config, clock=virtual_clock()) as store:
        await put(store, message(queue_id=0, body=b"late", DELAY="1"))
        await trio.sleep(5)
        assert store.max_offset_in_queue(SCHEDULE_TOPIC, 0) == 1
        assert store.max_offset_in_queue("T", 0) == 1  # delivered after all
        assert store.delay_offsets() == {1: 1}


async def test_bad_topic_names_are_refused_before_they_reach_disk(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "store")) as store:
        for topic in ("", "bad\x00topic", "../../escaped", "a/b", "t" * 128, "spaces here"):
            result = await put(store, message(topic=topic))
            assert result.status is PutMessageStatus.MESSAGE_ILLEGAL, topic
        ok = await put(store, message(topic="%RETRY%group|x-y_z"))
        assert ok.status is PutMessageStatus.PUT_OK
        assert store.running
    assert sorted(os.listdir(tmp_path)) == ["store"]  # nothing written outside the store


def test_an_invalid_config_is_refused_by_field() -> None:
    with pytest.raises(ValueError, match="delay level 'soon'"):
        StoreConfig(store_dir="x", message_delay_level="1s soon")
    with pytest.raises(ValueError, match="cannot hold a message"):
        StoreConfig(store_dir="x", commitlog_segment_bytes=SEGMENT, max_message_bytes=SEGMENT)
    with pytest.raises(StoreError):
        CommitLog(Path(os.devnull), 64 * 1024, lambda: 0).append_raw(10, b"x")
