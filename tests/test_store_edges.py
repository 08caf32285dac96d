"""Store edge cases: races with fsync, crashes at awkward moments, hostile input."""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from hamq.store import (
    SCHEDULE_TOPIC,
    BrokerRole,
    GetMessageStatus,
    PutMessageStatus,
    StoreConfig,
)
from hamq.store.checkpoint import load_checkpoint, save_checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ENTRY_SIZE, MAX_CHECKED_RANGES, CheckedRanges
from hamq.store.index import IndexService
from hamq.store.segment import Segment, StoreError, fsync_directory
from tests.support.store import SEGMENT, message, open_store, put, put_many, small_config
from tests.support.timing import virtual_clock


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


def test_a_failed_roll_over_can_be_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commitlog = CommitLog(tmp_path, 64 * 1024, lambda: 0)
    commitlog.load()
    commitlog.segments.create(0)
    calls = []

    def failing_fsync(directory: Path) -> None:
        calls.append(directory)
        if len(calls) == 1:
            raise OSError(5, "EIO (simulated)")
        fsync_directory(directory)

    monkeypatch.setattr("hamq.store.segment.fsync_directory", failing_fsync)
    with pytest.raises(OSError, match="EIO"):
        commitlog.segments.create(64 * 1024)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{0:020d}"]  # nothing left behind
    commitlog.segments.create(64 * 1024)  # the retry works
    assert len(commitlog.segments.segments) == 2


def test_dropping_segments_newest_first_never_leaves_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commitlog = CommitLog(tmp_path, 64 * 1024, lambda: 0)
    commitlog.load()
    for start in range(0, 5 * 64 * 1024, 64 * 1024):
        commitlog.segments.create(start)
    destroyed = []
    original = Segment.destroy

    def crash_on_second(self: Segment) -> None:
        if destroyed:
            raise KeyboardInterrupt("the process dies here")
        destroyed.append(self.start)
        original(self)

    monkeypatch.setattr(Segment, "destroy", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        commitlog.segments.remove_after(64 * 1024)
    monkeypatch.setattr(Segment, "destroy", original)
    commitlog.close()
    again = CommitLog(tmp_path, 64 * 1024, lambda: 0)
    again.load()  # no gap: loads
    assert [s.start for s in again.segments.segments] == [i * 64 * 1024 for i in range(4)]


async def test_bad_topic_names_are_refused_before_they_reach_disk(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "store")) as store:
        for topic in ("", "bad\x00topic", "../../escaped", "a/b", "t" * 128, "spaces here"):
            result = await put(store, message(topic=topic))
            assert result.status is PutMessageStatus.MESSAGE_ILLEGAL, topic
        ok = await put(store, message(topic="%RETRY%group|x-y_z"))
        assert ok.status is PutMessageStatus.PUT_OK
        assert store.running
    assert sorted(os.listdir(tmp_path)) == ["store"]  # nothing written outside the store


def test_index_names_keep_growing_when_the_clock_goes_back(tmp_path: Path) -> None:
    index = IndexService(tmp_path, hash_slots=7, max_entries=3)
    index.load()
    now = 1_700_000_000_000
    for i in range(6):  # two entries per file: several files
        index.add("T", [f"k{i}"], physical_offset=i, store_timestamp=now - i * 600_000)
    names = [f.path.name for f in index.files]
    assert names == sorted(names) and len(set(names)) == len(names)


def test_an_invalid_config_is_refused_by_field() -> None:
    with pytest.raises(ValueError, match="delay level 'soon'"):
        StoreConfig(store_dir="x", message_delay_level="1s soon")
    with pytest.raises(ValueError, match="cannot hold a message"):
        StoreConfig(store_dir="x", commitlog_segment_bytes=SEGMENT, max_message_bytes=SEGMENT)
    with pytest.raises(StoreError):
        CommitLog(Path(os.devnull), 64 * 1024, lambda: 0).append_raw(10, b"x")


def test_checked_ranges_never_vouch_for_an_offset_not_added_or_clipped_since() -> None:
    """A queue's ``checked`` lets pulls skip checking records: it may forget offsets
    (at most MAX_CHECKED_RANGES ranges are kept), but every offset it vouches for was
    added and not clipped since. Random adds and clips (fixed seed) against a set."""
    rng = random.Random(14)
    for _ in range(200):
        ranges, added = CheckedRanges(), set()
        for _ in range(30):
            if rng.random() < 0.15:
                stop = rng.randrange(0, 120)
                ranges.clip(stop)
                added = {o for o in added if o < stop}
            else:
                start = rng.randrange(0, 100)
                stop = start + rng.choice([1, 1, 2, 5, 20])
                ranges.add(start, stop)
                added.update(range(start, stop))
            vouched = {o for o in range(130) if ranges.end_of(o) > o}
            assert vouched <= added, (ranges, sorted(added))
            assert all(ranges.end_of(o) == o or o in added for o in range(130))
            spans = ranges.spans()
            assert len(spans) <= MAX_CHECKED_RANGES and spans == sorted(spans)
            assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(spans))
        ranges.add(0, 10)
        ranges.add(10, 11)  # (the dispatcher's case: one more at the end)
        assert ranges.end_of(3) >= 11
