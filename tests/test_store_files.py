"""CommitLog, consume queue and index files, used directly (no Trio)."""

from __future__ import annotations

import itertools
import logging
import mmap
import random
import struct
from pathlib import Path

import pytest

from hamq.protocol.record import BLANK_MAGIC, is_blank, make_record_template, read_record
from hamq.store.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import MAX_CHECKED_RANGES, CheckedRanges, ConsumeQueue
from hamq.store.index import IndexService
from hamq.store.segment import (
    ADVICE_CHUNK,
    Segment,
    StoreCorruptionError,
    StoreError,
    fsync_directory,
)

SEGMENT = 64 * 1024


def clock() -> int:
    return 1_700_000_000_000


def template(body_size: int = 1000, queue_id: int = 0, topic: str = "T"):  # type: ignore[no-untyped-def]
    return make_record_template(topic=topic, queue_id=queue_id, body=b"x" * body_size)


def new_commitlog(path: Path) -> CommitLog:
    commitlog = CommitLog(path / "commitlog", SEGMENT, clock)
    commitlog.load()
    return commitlog


def test_records_never_span_segments_and_a_full_segment_ends_blank(tmp_path: Path) -> None:
    commitlog = new_commitlog(tmp_path)
    results = [commitlog.append("T", template(5000)) for _ in range(40)]
    assert len(commitlog.segments.segments) >= 3
    for result in results:
        start = result.physical_offset - result.physical_offset % SEGMENT
        assert result.physical_offset + result.size <= start + SEGMENT  # within one segment
        assert read_record(commitlog.read(result.physical_offset, result.size)).physical_offset == (
            result.physical_offset
        )
    first = commitlog.segments.segments[0]
    last_in_first = [r for r in results if r.physical_offset < SEGMENT][-1]
    blank_at = last_in_first.end_offset
    assert is_blank(first.buffer, blank_at)
    remaining, magic = struct.unpack_from(">ii", first.buffer, blank_at)
    assert (remaining, magic) == (SEGMENT - blank_at, BLANK_MAGIC)
    # queue offsets count up per queue; the next record starts the next segment
    assert [r.queue_offset for r in results] == list(range(40))
    assert results[results.index(last_in_first) + 1].physical_offset == SEGMENT


def test_segment_files_are_named_by_offset_and_reload(tmp_path: Path) -> None:
    commitlog = new_commitlog(tmp_path)
    for _ in range(30):
        commitlog.append("T", template(5000))
    names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
    assert names == [f"{i * SEGMENT:020d}" for i in range(len(names))]
    commitlog.close()
    again = new_commitlog(tmp_path)
    assert len(again.segments.segments) == len(names)


def test_a_wrong_sized_segment_is_refused_by_name(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / f"{0:020d}").write_bytes(b"\0" * 100)
    message = "has 100 bytes, not the 65536 that commitlog_segment_bytes says: either"
    with pytest.raises(StoreCorruptionError, match=message):
        new_commitlog(tmp_path)


def test_append_raw_replicates_byte_for_byte_and_refuses_gaps_and_overlaps(tmp_path: Path) -> None:
    master = new_commitlog(tmp_path / "master")
    for i in range(30):
        master.append("T", template(3000, queue_id=i % 3))
    slave = new_commitlog(tmp_path / "slave")
    offset = 0
    while offset < master.max_offset:
        chunk = master.get_data(offset, 10_000)  # HA batches may end mid-record
        slave.append_raw(offset, chunk)
        offset += len(chunk)
    assert slave.max_offset == master.max_offset
    for m, s in zip(master.segments.segments, slave.segments.segments, strict=True):
        assert bytes(m.view(0, m.wrote)) == bytes(s.view(0, s.wrote))
    with pytest.raises(StoreError, match="gap of 10 bytes"):
        slave.append_raw(offset + 10, b"x")
    with pytest.raises(StoreError, match="overlap of 5 bytes"):
        slave.append_raw(offset - 5, b"x")
    last = slave.segments.last
    assert last is not None
    with pytest.raises(StoreError, match="would cross the end of segment"):
        slave.append_raw(offset, b"\0" * (last.remaining + 1))


def test_truncate_drops_and_zeroes_the_tail_and_logs_the_range(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    commitlog = new_commitlog(tmp_path)
    results = [commitlog.append("T", template(5000)) for _ in range(30)]
    cut = results[20].physical_offset
    end = commitlog.max_offset
    with caplog.at_level(logging.WARNING):
        assert commitlog.truncate(cut) == (cut, end)
    assert f"dropped [{cut}, {end})" in caplog.text
    assert commitlog.max_offset == cut
    segment = commitlog.segments.find(cut)
    assert segment is not None
    assert not any(segment.view(cut - segment.start, segment.size - (cut - segment.start)))
    assert commitlog.segments.last is segment
    commitlog.queue_offsets[("T", 0)] = 20
    again = commitlog.append("T", template(5000))
    assert (again.physical_offset, again.queue_offset) == (cut, 20)
    with pytest.raises(StoreError, match="the log ends at"):
        commitlog.truncate(commitlog.max_offset + 1)


def test_consume_queue_entries_files_and_reload(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 3, entries_per_file=16)
    for i in range(50):
        assert queue.put(i, i * 100, 100, i % 7)
    assert (queue.min_offset, queue.max_offset) == (0, 50)
    names = sorted(p.name for p in (tmp_path / "T" / "3").iterdir())
    assert names == [f"{i * 16 * 20:020d}" for i in range(4)]  # named by byte offset
    assert queue.entry(17) == (1700, 100, 3)
    assert queue.entries(14, 5) == [(i * 100, 100, i % 7) for i in range(14, 19)]
    assert not queue.put(10, 1000, 100, 3)  # already there: skipped
    with pytest.raises(StoreCorruptionError, match="entry 10 points at 1000"):
        queue.put(10, 999, 100, 0)
    with pytest.raises(StoreCorruptionError, match="would leave a gap"):
        queue.put(52, 5200, 100, 0)
    queue.close()
    again = ConsumeQueue(tmp_path, "T", 3, entries_per_file=16)
    again.load()
    assert (again.min_offset, again.max_offset) == (0, 50)
    assert again.last_entry_end() == 49 * 100 + 100


def test_consume_queue_truncate_and_start_anywhere(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, entries_per_file=16)
    for i in range(40):
        queue.put(i, i * 100, 100, 0)
    assert queue.truncate_dirty(2500) == 15
    assert queue.max_offset == 25
    assert queue.put(25, 9000, 100, 0)  # continues where it was cut
    assert queue.truncate_dirty(0) == 26  # everything
    assert (queue.min_offset, queue.max_offset) == (0, 0)
    fresh = ConsumeQueue(tmp_path, "U", 0, entries_per_file=16)
    assert fresh.put(1000, 5, 10, 0)  # a rebuild after old segments were deleted
    assert (fresh.min_offset, fresh.max_offset) == (1000, 1001)


def test_consume_queue_min_offset_follows_deleted_commitlog(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, entries_per_file=16)
    for i in range(40):
        queue.put(i, i * 100, 100, 0)
    assert queue.delete_expired(commitlog_min_offset=2050) == 1  # file [0, 16) is all below
    assert queue.min_offset == 21  # entry 20 at 2000 is gone too, 21 at 2100 is the first left
    assert queue.entry(20) is None


def test_consume_queue_offset_by_time(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, entries_per_file=16)
    times = [1000, 1000, 2000, 3000, 3000, 3000, 5000]
    for i in range(len(times)):
        queue.put(i, i, 1, 0)

    def store_time(physical_offset: int, size: int) -> int:
        return times[physical_offset]

    assert queue.offset_by_time(500, store_time) == 0
    assert queue.offset_by_time(1000, store_time) == 0
    assert queue.offset_by_time(2500, store_time) == 3
    assert queue.offset_by_time(3000, store_time) == 3
    assert queue.offset_by_time(9000, store_time) == 7  # all earlier: the end
    assert queue.offset_by_time(3000, store_time, upper=True) == 5
    assert queue.offset_by_time(4000, store_time, upper=True) == 5


def test_index_finds_keys_across_files_newest_first(tmp_path: Path) -> None:
    index = IndexService(tmp_path / "index", hash_slots=7, max_entries=10)
    index.load()
    for i in range(30):
        index.add(
            "T", [f"k{i % 5}", f"uniq{i}"], physical_offset=1000 + i, store_timestamp=i * 1000
        )
    assert len(index.files) >= 6  # 9 entries per file (entry 0 is never used)
    assert index.query("T", "k3", 10, 0, 10**9) == [1028, 1023, 1018, 1013, 1008, 1003]
    assert index.query("T", "uniq7", 10, 0, 10**9) == [1007]
    assert index.query("U", "k3", 10, 0, 10**9) == []  # another topic
    assert index.query("T", "k3", 2, 0, 10**9) == [1028, 1023]
    assert index.query("T", "k3", 10, 10_000, 20_000) == [1018, 1013]  # by store time
    index.add("T", ["k3"], physical_offset=1010, store_timestamp=0)  # already indexed: skipped
    assert index.query("T", "k3", 10, 0, 10**9).count(1010) == 0
    index.add("T", ["again"], physical_offset=1029, store_timestamp=0)  # the last one indexed
    assert index.query("T", "again", 10, 0, 10**9) == []
    index.truncate(1020)
    assert index.indexed_offset == 1019
    index.close()
    again = IndexService(tmp_path / "index", hash_slots=7, max_entries=10)
    again.load()
    assert again.query("T", "k3", 10, 0, 10**9)[:2] == [1028, 1023]


def test_checkpoint_round_trips_and_refuses_damage(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    assert load_checkpoint(path) is None
    checkpoint = Checkpoint(12345, 12000, 17, 16, 0)
    save_checkpoint(path, checkpoint)
    assert load_checkpoint(path) == checkpoint
    data = bytearray(path.read_bytes())
    data[14] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptionError, match="CRC mismatch"):
        load_checkpoint(path)


def map_advice(path: Path) -> list[tuple[int, int, bool]]:
    """(file offset, length, advised MADV_RANDOM) of each area this process maps of
    ``path``, in file order (from /proc/self/smaps: ``rr`` among an area's VmFlags)."""
    areas, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            mapped = len(fields) >= 6 and fields[-1] == str(path)
            current = [int(fields[2], 16), end - start, False] if mapped else None
            if current is not None:
                areas.append(current)
        elif fields[0] == "VmFlags:" and current is not None:
            current[2] = "rr" in fields[1:]
    return sorted((offset, length, random) for offset, length, random in areas)


def test_a_mapping_reads_ahead_only_where_it_was_written(tmp_path: Path) -> None:
    """A write's fault on a fresh page brings in that page alone (MADV_RANDOM past the
    data), and the data written keeps its readahead: the advice follows the writes a
    chunk at a time, and is set again where a reloaded log ends."""
    size = 16 << 20
    commitlog = CommitLog(tmp_path / "commitlog", size, clock)
    commitlog.load()
    commitlog.append("T", template(1000))
    path = commitlog.segments.segments[0].path
    assert map_advice(path) == [(0, size, True)]  # all of a new file is unwritten
    while commitlog.max_offset < ADVICE_CHUNK + 200_000:
        commitlog.append("T", template(100_000))
    [(_, normal, written_random), (normal_to, rest, unwritten_random)] = map_advice(path)
    assert (written_random, unwritten_random) == (False, True)
    assert normal_to == normal and normal + rest == size
    assert ADVICE_CHUNK <= normal <= commitlog.max_offset < normal + ADVICE_CHUNK
    end = commitlog.max_offset
    commitlog.close()
    reloaded = CommitLog(tmp_path / "commitlog", size, clock)
    reloaded.load()
    reloaded.segments.set_end(end)  # (what recovery does)
    page = end - end % mmap.PAGESIZE
    assert map_advice(path) == [(0, page, False), (page, size - page, True)]
    reloaded.close()


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


def test_index_names_keep_growing_when_the_clock_goes_back(tmp_path: Path) -> None:
    index = IndexService(tmp_path, hash_slots=7, max_entries=3)
    index.load()
    now = 1_700_000_000_000
    for i in range(6):  # two entries per file: several files
        index.add("T", [f"k{i}"], physical_offset=i, store_timestamp=now - i * 600_000)
    names = [f.path.name for f in index.files]
    assert names == sorted(names) and len(set(names)) == len(names)


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
