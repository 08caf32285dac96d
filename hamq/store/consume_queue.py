"""ConsumeQueue: per (topic, queue id), where each of its messages sits in the CommitLog.

Entry k (logical offset k) is 20 bytes at byte k*20 of the queue (docs/PROTOCOL.md#consume-queue):
commit-log offset int64, record size int32, tags code int64 (for
SCHEDULE_TOPIC_XXXX: the delivery time in ms). Files hold ``entries_per_file`` entries
and are named by the 20-digit byte offset of their first entry, under
``consumequeue/<topic>/<queue id>/``. Invariants:
- entries [min_offset, max_offset) are valid; files are zero-filled and an entry of
  size 0 is empty;
- ``put`` is idempotent for an entry that is there already (recovery may dispatch a
  record twice) and refuses a gap, except that an empty queue may start anywhere (a
  rebuild after the oldest CommitLog files were deleted);
- the dispatch (reput) task is the only writer; readers get copies of entries;
- a queue's files are mapped only while used (the table's ``MappedFiles`` bounds how
  many are at once): thousands of queues cost a bounded number of maps and fds;
- ``checked`` holds the entries whose records this process read whole and found sound
  (the dispatcher reads every record it dispatches; a pull checks the others once):
  pulls need not decode those again, only check CRCs if configured. A record's bytes
  do not change while the process runs except through a truncation, which clips
  ``checked`` with the entries.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from hamq.protocol.message import topic_error
from hamq.store.files import open_files_limit
from hamq.store.segment import MappedFiles, SegmentQueue, StoreCorruptionError

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20


@functools.lru_cache(maxsize=64)  # (runs of at most reput.MAX_RUN)
def _run_struct(count: int) -> struct.Struct:
    """``count`` entries one after another: one pack_into (``put_run``)."""
    return struct.Struct(">" + "qiq" * count)


Entry = tuple[int, int, int]  # commit-log offset, size, tags code


@functools.lru_cache(maxsize=64)
def _entries_struct(count: int) -> struct.Struct:
    """``count`` entries back to back, as one struct (unpacked with one call)."""
    return struct.Struct(">" + "qiq" * count)


#: most separate ranges a queue's ``checked`` keeps (consumers read forward, so a few
#: cover a queue: the tail the dispatcher extends, and one per backlog being read)
MAX_CHECKED_RANGES = 4


class CheckedRanges:
    """Queue offsets as at most MAX_CHECKED_RANGES sorted, disjoint half-open ranges
    (``[start, stop)`` lists); past that many, the shortest is forgotten."""

    __slots__ = ("_ranges",)

    def __init__(self) -> None:
        self._ranges: list[list[int]] = []

    def __repr__(self) -> str:
        return f"<CheckedRanges {self.spans()}>"

    def spans(self) -> list[tuple[int, int]]:
        """The ranges, as (start, stop) pairs in order."""
        return [(start, stop) for start, stop in self._ranges]

    def end_of(self, offset: int) -> int:
        """The end of the range holding ``offset``; ``offset`` itself if none does."""
        for start, stop in self._ranges:
            if start <= offset < stop:
                return stop
        return offset

    def add(self, start: int, stop: int) -> None:
        """Add [start, stop), merging it with the ranges it overlaps or touches."""
        if start >= stop:
            return
        ranges = self._ranges
        if ranges and ranges[-1][1] == start:  # (the dispatcher's case: one more at the end)
            ranges[-1][1] = stop
            return
        for i, current in enumerate(ranges):
            if current[1] == start:  # (the common case: one more at a range's end)
                current[1] = stop
                self._merge_from(i)
                return
            if stop < current[0]:
                ranges.insert(i, [start, stop])
                break
            if start <= current[1]:
                current[0] = min(current[0], start)
                current[1] = max(current[1], stop)
                self._merge_from(i)
                return
        else:
            ranges.append([start, stop])
        if len(ranges) > MAX_CHECKED_RANGES:
            ranges.remove(min(ranges, key=lambda r: r[1] - r[0]))

    def _merge_from(self, i: int) -> None:
        ranges = self._ranges
        current = ranges[i]
        while i + 1 < len(ranges) and ranges[i + 1][0] <= current[1]:
            current[1] = max(current[1], ranges.pop(i + 1)[1])

    def clip(self, stop: int) -> None:
        """Forget every offset at or past ``stop``."""
        self._ranges = [[a, min(b, stop)] for a, b in self._ranges if a < stop]


class ConsumeQueue:
    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        entries_per_file: int,
        files: MappedFiles | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = root / topic / str(queue_id)
        self.entries_per_file = entries_per_file
        self.segments = SegmentQueue(
            self.directory,
            entries_per_file * ENTRY_SIZE,
            files,
            size_setting="consume_queue_entries_per_file x 20 bytes",
        )
        self.min_offset = 0
        self.max_offset = 0
        #: entries whose records are known to decode (read whole in this process)
        self.checked = CheckedRanges()

    def __repr__(self) -> str:
        return f"<ConsumeQueue {self.topic}/{self.queue_id} [{self.min_offset}, {self.max_offset})>"

    # ------------------------------------------------------------------ load
    def load(self) -> None:
        """Open the files and find the entries they hold (the last non-empty one ends it)."""
        self.segments.load()
        first, last = self.segments.first, self.segments.last
        if first is None or last is None:
            return
        data = bytes(last.view(0, last.size)).rstrip(b"\0")
        used = -(-len(data) // ENTRY_SIZE) * ENTRY_SIZE  # round up to whole entries
        self.segments.set_end(last.start + used)
        self.max_offset = (last.start + used) // ENTRY_SIZE
        self.min_offset = first.start // ENTRY_SIZE
        while self.min_offset < self.max_offset and self._raw(self.min_offset)[1] == 0:
            self.min_offset += 1
        if self.min_offset == self.max_offset:  # nothing valid: start afresh
            self.segments.remove_after(0)
            self.min_offset = self.max_offset = 0

    def close(self) -> None:
        self.segments.close()

    # ------------------------------------------------------------------ writing
    def put(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> bool:
        """Add entry ``queue_offset``; False if that very entry was there already."""
        if queue_offset < self.max_offset:
            if queue_offset < self.min_offset:
                return False
            existing = self._raw(queue_offset)
            if existing[:2] == (physical_offset, size):
                return False
            if existing[1] == 0:  # a hole left by a crash: fill it
                position = queue_offset * ENTRY_SIZE
                segment = self.segments.find(position)
                assert segment is not None
                ENTRY.pack_into(
                    segment.buffer, position - segment.start, physical_offset, size, tags_code
                )
                segment.needs_sync = True
                return True
            raise StoreCorruptionError(
                f"consume queue {self.topic}/{self.queue_id} entry {queue_offset} points at "
                f"{existing[0]} (+{existing[1]}), but the commitlog has it at "
                f"{physical_offset} (+{size})"
            )
        if queue_offset > self.max_offset and not self.segments.empty:
            raise StoreCorruptionError(
                f"consume queue {self.topic}/{self.queue_id} ends at entry {self.max_offset}; "
                f"entry {queue_offset} would leave a gap"
            )
        position = queue_offset * ENTRY_SIZE
        segment = self.segments.last
        if segment is None:
            segment = self.segments.create(position - position % self.segments.segment_size)
            self.min_offset = queue_offset
        elif position >= segment.end:
            segment = self.segments.create(segment.end)
        ENTRY.pack_into(segment.buffer, position - segment.start, physical_offset, size, tags_code)
        segment.wrote = position - segment.start + ENTRY_SIZE
        if segment.wrote >= segment.advice_due:
            segment.advise_written()
        self.max_offset = queue_offset + 1
        return True

    def put_run(self, queue_offset: int, entries: list[Entry]) -> None:
        """``put`` each of ``entries`` ((physical offset, size, tags code) each) at
        ``queue_offset`` and the offsets after it: with one write when they go at the
        queue's end, within its last file."""
        position = queue_offset * ENTRY_SIZE
        end = position + len(entries) * ENTRY_SIZE
        segment = self.segments.last
        if queue_offset != self.max_offset or segment is None or end > segment.end:
            for i, (physical_offset, size, tags_code) in enumerate(entries):
                self.put(queue_offset + i, physical_offset, size, tags_code)
            return
        _run_struct(len(entries)).pack_into(
            segment.buffer, position - segment.start, *itertools.chain.from_iterable(entries)
        )
        segment.wrote = end - segment.start
        if segment.wrote >= segment.advice_due:
            segment.advise_written()
        self.max_offset = queue_offset + len(entries)

    def first_dirty(self, physical_offset: int) -> int:
        """The first entry that points at or past ``physical_offset``, or is empty (a
        hole a crash left among unflushed entries); ``max_offset`` if none is.

        Commit-log offsets grow along a queue and before the first dirty entry
        everything was flushed, so the predicate is false, then true: a binary search."""
        offsets = range(self.min_offset, self.max_offset)

        def dirty(offset: int) -> bool:
            entry_offset, size, _tags = self._raw(offset)
            return size == 0 or entry_offset >= physical_offset

        return offsets.start + bisect.bisect_left(offsets, True, key=dirty)

    def truncate_dirty(self, physical_offset: int) -> int:
        """Drop the entries from ``first_dirty(physical_offset)`` on; returns how many."""
        keep = self.first_dirty(physical_offset)
        dropped = self.max_offset - keep
        if not dropped:
            return 0
        self.checked.clip(keep)
        if keep == self.min_offset:
            self.segments.remove_after(0)
            self.min_offset = self.max_offset = keep
            return dropped
        position = keep * ENTRY_SIZE
        self.segments.remove_after(position)
        segment = self.segments.last
        assert segment is not None  # it holds entry keep - 1
        segment.cut(position - segment.start)
        self.max_offset = keep
        return dropped

    def clear(self) -> None:
        """Remove every entry and file: the queue is as new (to be rebuilt from the
        CommitLog, from whatever queue offset its first record has)."""
        self.segments.remove_after(0)
        self.min_offset = self.max_offset = 0
        self.checked = CheckedRanges()

    def destroy(self) -> None:
        """Remove every file and the queue's directory: its topic was deleted. The
        object must not be used again."""
        self.clear()
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete files whose every entry points below the CommitLog's start, then move
        ``min_offset`` past such entries; returns the number of files deleted."""
        deleted = 0
        while len(self.segments.segments) > 1:
            first = self.segments.segments[0]
            last_entry = self._raw((first.end - ENTRY_SIZE) // ENTRY_SIZE)
            if last_entry[0] + last_entry[1] > commitlog_min_offset:
                break
            self.segments.remove_first()
            deleted += 1
        self.min_offset = max(self.min_offset, self.segments.min_offset // ENTRY_SIZE)
        while self.min_offset < self.max_offset:
            physical_offset, _size, _tags = self._raw(self.min_offset)
            if physical_offset >= commitlog_min_offset:
                break
            self.min_offset += 1
        return deleted

    # ------------------------------------------------------------------ reading
    def _raw(self, offset: int) -> Entry:
        position = offset * ENTRY_SIZE
        segment = self.segments.find(position)
        if segment is None:
            return (0, 0, 0)
        entry: Entry = ENTRY.unpack_from(segment.buffer, position - segment.start)
        return entry

    def entry(self, offset: int) -> Entry | None:
        """Entry ``offset`` if it is in [min_offset, max_offset)."""
        if not self.min_offset <= offset < self.max_offset:
            return None
        return self._raw(offset)

    def entries(self, offset: int, max_count: int) -> list[Entry]:
        """Up to ``max_count`` entries from ``offset`` (clamped to the valid range)."""
        offset = max(offset, self.min_offset)
        stop = min(self.max_offset, offset + max_count)
        found: list[Entry] = []
        while offset < stop:
            position = offset * ENTRY_SIZE
            segment = self.segments.find(position)
            if segment is None:
                break
            in_file = min(stop - offset, (segment.end - position) // ENTRY_SIZE)
            start = position - segment.start
            found.extend(ENTRY.iter_unpack(segment.view(start, in_file * ENTRY_SIZE)))
            offset += in_file
        return found

    def entry_columns(self, offset: int, max_count: int) -> tuple[tuple[int, ...], ...]:
        """Entries ``offset`` .. of one file, up to ``max_count`` of them and within
        [min_offset, max_offset), as columns: (commit-log offsets, sizes, tags codes);
        empty when ``offset`` is outside that range. (Unpacked by one call, not an
        entry at a time: a pull's fast path.)"""
        stop = min(self.max_offset, offset + max_count)
        if not self.min_offset <= offset < stop:
            return (), (), ()
        position = offset * ENTRY_SIZE
        segment = self.segments.find(position)
        if segment is None:
            return (), (), ()
        count = min(stop - offset, (segment.end - position) // ENTRY_SIZE)
        flat = _entries_struct(count).unpack_from(segment.buffer, position - segment.start)
        return flat[0::3], flat[1::3], flat[2::3]

    def last_entry_end(self) -> int | None:
        """The commit-log offset just past the last entry's record, None when empty."""
        if self.max_offset == self.min_offset:
            return None
        physical_offset, size, _tags = self._raw(self.max_offset - 1)
        return physical_offset + size

    def offset_by_time(
        self, timestamp_ms: int, store_time_of: Callable[[int, int], int], *, upper: bool = False
    ) -> int:
        """Binary search by store time. LOWER (default): the first entry stored at or after
        ``timestamp_ms`` (``max_offset`` if all are earlier). UPPER: the last entry stored
        at or before it (``min_offset`` if none is)."""
        offsets = range(self.min_offset, self.max_offset)
        if not offsets:
            return self.min_offset

        def store_time(offset: int) -> int:
            physical_offset, size, _tags = self._raw(offset)
            return store_time_of(physical_offset, size)

        if upper:
            found = bisect.bisect_right(offsets, timestamp_ms, key=store_time) - 1
            return offsets[max(found, 0)]
        found = bisect.bisect_left(offsets, timestamp_ms, key=store_time)
        return offsets[found] if found < len(offsets) else self.max_offset


#: most consume-queue files mapped at a time, whatever the open-files limit (every map
#: is a kernel map area: vm.max_map_count is 65530 by default)
MAX_MAPPED_QUEUE_FILES = 8192


def mapped_queue_files_limit() -> int:
    """How many consume-queue files may be mapped at once: a quarter of the open-files
    limit (each map holds a descriptor before CPython 3.13; the rest is for
    connections, CommitLog and index files), at least 16, at most MAX_MAPPED_QUEUE_FILES."""
    return max(16, min(MAX_MAPPED_QUEUE_FILES, open_files_limit() // 4))


class ConsumeQueueTable:
    """Every consume queue of the store, by (topic, queue id), created on first use.

    Their files share one MappedFiles: at most ``files.limit`` are mapped at a time.
    The limit is ``max_mapped_files`` if given, else it follows the open-files limit in
    force when the store loads (``mapped_queue_files_limit``)."""

    def __init__(
        self, root: Path, entries_per_file: int, *, max_mapped_files: int | None = None
    ) -> None:
        self.root = root
        self.entries_per_file = entries_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.max_mapped_files = max_mapped_files
        self.files = MappedFiles(max_mapped_files or mapped_queue_files_limit())

    def load(self) -> None:
        self.files.limit = self.max_mapped_files or mapped_queue_files_limit()
        self.files.shrink()
        self.root.mkdir(parents=True, exist_ok=True)
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    queue = self.get_or_create(topic_dir.name, int(queue_dir.name))
                    queue.load()

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self.queues.get(key)
        if queue is None:
            problem = topic_error(topic)
            if problem is not None or queue_id < 0:
                raise StoreCorruptionError(
                    f"no consume queue for {topic!r}/{queue_id}: {problem or 'negative queue id'}"
                )
            queue = ConsumeQueue(self.root, topic, queue_id, self.entries_per_file, self.files)
            self.queues[key] = queue
        return queue

    def remove_topic_directory(self, topic: str) -> None:
        """Remove ``consumequeue/<topic>`` and what is left in it (the queues' own
        directories): the topic was deleted, and its queues destroyed."""
        shutil.rmtree(self.root / topic, ignore_errors=True)

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
