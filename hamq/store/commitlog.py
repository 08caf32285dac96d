"""CommitLog: every message of every topic, in arrival order, in RocketMQ's record format.

Offsets here are byte offsets in the log ("physical offsets"). Invariants:
- one writer: ``append``, ``append_many``, ``append_raw`` and ``truncate`` never
  await, so Trio runs them one at a time and no lock is needed;
- a record never spans two segments: when a record plus the 8-byte blank marker does
  not fit, the segment's tail gets ``int32 remaining, int32 BLANK_MAGIC`` and the record
  starts the next segment (docs/PROTOCOL.md#commitlog-record);
- queue offsets are assigned here, one per stored message of a (topic, queue id) —
  not for prepared or rolled-back transaction messages, as in RocketMQ — from
  ``queue_offsets``, which recovery rebuilds from the consume queues;
- everything after ``max_offset`` is zeros, so a scan after a crash stops there;
- reads for consumers (``read_checked``) never hand out a record that would not decode:
  a damaged one (flipped bytes on disk) is skipped, counted in ``damaged`` and logged
  at most once per DAMAGE_LOG_INTERVAL_S (hamq/store/records.py); the bytes stay where
  they are (offsets after them, replicas and the index depend on them).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from hamq.protocol.message import (
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    offset_msg_id,
)
from hamq.protocol.record import (
    BLANK_MAGIC,
    END_FILE_MIN_BLANK_LENGTH,
    MAGIC_V1,
    MAGIC_V2,
    SIZE_MAGIC,
    RecordTemplate,
)
from hamq.store.records import DamageLog, record_problem
from hamq.store.segment import Segment, SegmentQueue, StoreError

log = logging.getLogger(__name__)

#: replicated chunks at least this big are written with pwrite, not through the map
BULK_BYTES = 16 * 1024
#: records put together at least this big are written with pwrite (``append_many``)
BULK_BYTES_PUT = 4096


@attrs.define(slots=True)
class AppendResult:
    """Where a record went (not frozen: one per message on the hot path; not changed)."""

    physical_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    store_host: bytes

    @property
    def end_offset(self) -> int:
        """The log offset just past this record: what a flush or a replica must reach."""
        return self.physical_offset + self.size

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)


class CommitLog:
    def __init__(self, directory: Path, segment_size: int, clock: Callable[[], int]) -> None:
        self.segments = SegmentQueue(
            directory, segment_size, size_setting="commitlog_segment_bytes"
        )
        self.segment_size = segment_size
        self._clock = clock
        #: next queue offset of each (topic, queue id)
        self.queue_offsets: dict[tuple[str, int], int] = {}
        #: damaged records reads skipped (``read_checked``)
        self.damaged = DamageLog("a pull")
        #: every record from here to the end was appended by this process (``append``:
        #: its CRC computed here from the body given); None after replicated bytes
        self.local_from: int | None = None

    def load(self) -> None:
        """Open the segments; a last one cut short is brought back to full size and
        listed in ``segments.extended`` (recovery then scans it as after a crash)."""
        self.segments.load(extend_short_last=True)

    def close(self) -> None:
        self.segments.close()

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    @property
    def max_offset(self) -> int:
        return self.segments.max_offset

    # ------------------------------------------------------------------ writing
    def append(self, topic: str, template: RecordTemplate) -> AppendResult:
        """Store one record; its queue offset, physical offset and store time are set here."""
        size = template.size
        if size + END_FILE_MIN_BLANK_LENGTH > self.segment_size:
            raise StoreError(
                f"a record of {size} bytes cannot fit a {self.segment_size}-byte segment"
            )
        segment = self._segment_with_room(size)
        pos = segment.wrote
        physical_offset = segment.start + pos
        key = (topic, template.queue_id)
        transaction = template.sys_flag & SYSFLAG_TRANSACTION_MASK
        counted = transaction not in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
        queue_offset = self.queue_offsets.get(key, 0) if counted else 0
        store_timestamp = self._clock()
        template.pack_into(
            segment.buffer,
            pos,
            queue_offset=queue_offset,
            physical_offset=physical_offset,
            store_timestamp=store_timestamp,
        )
        segment.wrote = pos + size
        if segment.wrote >= segment.advice_due:
            segment.advise_written()
        if self.local_from is None:
            self.local_from = physical_offset
        if counted:
            self.queue_offsets[key] = queue_offset + 1
        return AppendResult(
            physical_offset, size, queue_offset, store_timestamp, template.store_host
        )

    def append_many(
        self, records: Sequence[tuple[str, RecordTemplate]], done: list[AppendResult]
    ) -> None:
        """Store records one after another, as ``append`` would each (the topic each goes
        to, its record), adding where each went to ``done`` once it is written. The
        records that fall in one segment are packed together and written with one
        ``pwrite`` when they fill a page or more: a copy into the map faults on each
        fresh page, which the kernel zero-fills first (1.25 against 0.55 us a 1 KiB
        record here). They share one store time, as a RocketMQ batch's records do.
        StoreError or OSError: the records before the failing write are stored (in
        ``done``), none after."""
        i, count = 0, len(records)
        while i < count:
            first = records[i][1].size
            if first + END_FILE_MIN_BLANK_LENGTH > self.segment_size:
                raise StoreError(
                    f"a record of {first} bytes cannot fit a {self.segment_size}-byte segment"
                )
            segment = self._segment_with_room(first)
            room = segment.remaining - END_FILE_MIN_BLANK_LENGTH
            end, total = i, 0
            while end < count and total + records[end][1].size <= room:
                total += records[end][1].size
                end += 1
            if total < BULK_BYTES_PUT:
                for topic, template in records[i:end]:
                    done.append(self.append(topic, template))
            else:
                self._write_group(segment, records[i:end], total, done)
            i = end

    def _write_group(
        self,
        segment: Segment,
        records: Sequence[tuple[str, RecordTemplate]],
        total: int,
        done: list[AppendResult],
    ) -> None:
        """Pack ``records`` (``total`` bytes, room for them in ``segment``) and write
        them with one pwrite; their queue offsets are taken once they are written."""
        data = bytearray(total)
        start = segment.start + segment.wrote
        store_timestamp = self._clock()
        queue_offsets = self.queue_offsets
        taken: dict[tuple[str, int], int] = {}
        results = []
        at = 0
        for topic, template in records:
            transaction = template.sys_flag & SYSFLAG_TRANSACTION_MASK
            if transaction in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK):
                queue_offset = 0
            else:
                key = (topic, template.queue_id)
                queue_offset = taken[key] if key in taken else queue_offsets.get(key, 0)
                taken[key] = queue_offset + 1
            template.pack_into(
                data,
                at,
                queue_offset=queue_offset,
                physical_offset=start + at,
                store_timestamp=store_timestamp,
            )
            results.append(
                AppendResult(
                    start + at, template.size, queue_offset, store_timestamp, template.store_host
                )
            )
            at += template.size
        try:
            segment.write_bulk((data,))
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            segment.write(data)  # (no descriptor to spare for the pwrite: through the map)
        queue_offsets.update(taken)
        if self.local_from is None:
            self.local_from = start
        done.extend(results)

    def _segment_with_room(self, size: int) -> Segment:
        segment = self.segments.last
        if segment is None:
            return self.segments.create(0)
        if segment.remaining >= size + END_FILE_MIN_BLANK_LENGTH:
            return segment
        if segment.remaining >= END_FILE_MIN_BLANK_LENGTH:
            SIZE_MAGIC.pack_into(segment.buffer, segment.wrote, segment.remaining, BLANK_MAGIC)
        segment.wrote = segment.size
        segment.advise_written()
        return self.segments.create(segment.end)

    def append_raw(self, offset: int, data: bytes | memoryview) -> None:
        """Append bytes replicated from a master at ``offset`` (a slave's write path).

        ``offset`` must be exactly the end of this log; a gap or an overlap is refused,
        and so is data that would cross a segment boundary (a master sends within one
        segment, blank marker included).
        """
        self.append_raw_many(offset, [data])

    def append_raw_many(self, offset: int, chunks: Sequence[bytes | memoryview]) -> None:
        """Append consecutive replicated chunks from ``offset`` on: those that fall in
        one segment go to disk in one gathered write. Each chunk stays within a segment,
        as ``append_raw`` requires."""
        self.local_from = None
        i = 0
        while i < len(chunks):
            segment = self._segment_for_raw(offset)
            group: list[bytes | memoryview] = []
            size = 0
            while i < len(chunks) and size + len(chunks[i]) <= segment.remaining:
                group.append(chunks[i])
                size += len(chunks[i])
                i += 1
            if not group:
                raise StoreError(
                    f"{len(chunks[i])} replicated bytes at {offset} would cross the end of "
                    f"segment {segment.path.name} ({segment.remaining} bytes left)"
                )
            if size >= BULK_BYTES:
                segment.write_bulk(group)
            else:
                for chunk in group:
                    segment.write(chunk)
            offset += size

    def _segment_for_raw(self, offset: int) -> Segment:
        """The segment replicated bytes at ``offset`` go into (created when the log is
        empty or its last segment is full); StoreError for a gap or an overlap."""
        segment = self.segments.last
        if segment is None:
            if offset % self.segment_size:
                raise StoreError(
                    f"an empty log can only start at a segment boundary, not at {offset}"
                )
            return self.segments.create(offset)
        if offset != self.max_offset:
            kind = "gap" if offset > self.max_offset else "overlap"
            raise StoreError(
                f"replicated data at {offset} does not continue the log at {self.max_offset} "
                f"({kind} of {abs(offset - self.max_offset)} bytes)"
            )
        if segment.remaining == 0:
            return self.segments.create(segment.end)
        return segment

    def truncate(self, offset: int, *, partial_tail: bool = False) -> tuple[int, int] | None:
        """Drop everything at and after ``offset``; returns the dropped range, logged.

        ``offset`` must be where a record (or a blank marker) starts; ``partial_tail``
        says the caller knows it is where the log's last, incomplete record starts
        (a replica's log can end anywhere)."""
        end = self.max_offset
        if offset >= end:
            if offset > end:
                raise StoreError(f"cannot truncate to {offset}: the log ends at {end}")
            return None
        if offset < self.min_offset:
            raise StoreError(f"cannot truncate to {offset}: the log starts at {self.min_offset}")
        holder = self.segments.find(offset)
        if holder is not None and offset > holder.start and not partial_tail:
            magic = SIZE_MAGIC.unpack_from(holder.buffer, offset - holder.start)[1]
            if magic not in (MAGIC_V1, MAGIC_V2, BLANK_MAGIC):
                raise StoreError(f"cannot truncate to {offset}: no record starts there")
        if self.local_from is not None and offset < self.local_from:
            self.local_from = None
        self.segments.remove_after(offset + 1)  # keeps the segment holding offset
        segment = self.segments.find(offset)
        if segment is not None:
            segment.cut(offset - segment.start)
        log.warning(
            "commitlog truncated to %d: dropped [%d, %d), %d bytes",
            offset,
            offset,
            end,
            end - offset,
        )
        return offset, end

    def is_boundary(self, offset: int) -> bool:
        """True if ``offset`` is where a record or a blank marker starts, or the log's
        start or end: where a replica's log may end when it agrees with this one."""
        if offset in (self.min_offset, self.max_offset):
            return True
        segment = self.segments.find(offset)
        if segment is None or offset - segment.start + 8 > segment.wrote:
            return False
        if offset == segment.start:
            return True
        magic = SIZE_MAGIC.unpack_from(segment.buffer, offset - segment.start)[1]
        return magic in (MAGIC_V1, MAGIC_V2, BLANK_MAGIC)

    def appended_here(self, offset: int) -> bool:
        """Whether the record at ``offset`` was appended by this process (``append``),
        with a body CRC computed here: its bytes are as written, CRC and all."""
        return self.local_from is not None and offset >= self.local_from

    # ------------------------------------------------------------------ reading
    def read(self, offset: int, size: int) -> memoryview:
        """The ``size`` bytes at ``offset`` (one record), zero-copy."""
        segment = self.segments.find(offset)
        if segment is None or size < 0 or offset - segment.start + size > segment.wrote:
            raise StoreError(f"no {size}-byte record at commitlog offset {offset}")
        return segment.view(offset - segment.start, size)

    def reader(self) -> Callable[[int, int], memoryview]:
        """``read`` for many records one after another (a pull): the segment of the last
        record read is tried first. For use within one synchronous call: the views it
        keeps are of segments that stay mapped until the next await."""
        cached_start = cached_end = 0
        cached: memoryview | None = None

        def read(offset: int, size: int) -> memoryview:
            nonlocal cached_start, cached_end, cached
            if cached is not None and cached_start <= offset and offset + size <= cached_end:
                at = offset - cached_start
                if size >= 0:
                    return cached[at : at + size]
            record = self.read(offset, size)  # (raises StoreError for no such record)
            segment = self.segments.find(offset)
            assert segment is not None
            cached_start, cached_end = segment.start, segment.start + segment.wrote
            cached = segment.view(0, segment.wrote)
            return record

        return read

    def read_checked(
        self, offset: int, size: int, entry: tuple[str, int, int] | None = None, *, check_crc: bool
    ) -> memoryview | None:
        """The record at ``offset`` if a consumer can decode it (``record_problem``: for
        the consume-queue ``entry`` (topic, queue id, queue offset) if given; the body
        CRC with ``check_crc``), else None: the record is damaged (or the entry pointing
        here is), and it is counted and logged (rate-limited) in ``damaged``. Never raises."""
        try:
            record = self.read(offset, size)
        except StoreError as exc:
            self.damaged.note(offset, str(exc))
            return None
        problem = record_problem(record, offset, entry, check_crc=check_crc)
        if problem is not None:
            self.damaged.note(offset, problem)
            return None
        return record

    def get_data(self, offset: int, max_bytes: int) -> memoryview:
        """Up to ``max_bytes`` from ``offset`` within one segment (for HA transfers);
        empty at the end of the log."""
        segment = self.segments.find(offset)
        if segment is None:
            if offset == self.max_offset:
                return memoryview(b"")
            raise StoreError(
                f"commitlog offset {offset} is outside [{self.min_offset}, {self.max_offset}]"
            )
        pos = offset - segment.start
        return segment.view(pos, max(0, min(max_bytes, segment.wrote - pos)))
