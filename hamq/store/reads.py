"""Reading the store: consume queues to messages, lookups by offset, key and time.

``StoreReader`` is the read half of ``MessageStore`` (message_store.py, which is one):
every read is synchronous and returns zero-copy views of the CommitLog, meant to be used
(joined into a response) before the next await — a segment may be deleted after it. A
record is checked (decoded, with ``check_crc_on_read`` its body CRC) once per run of
the process; a damaged one is passed over and counted, never served. Messages of a
deleted topic (deletions.py) stored before its deletion are never found.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Collection

from hamq.protocol.message import (
    PROPERTY_KEYS,
    PROPERTY_MARKS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_BORNHOST_V6,
    TOPIC_DELETION_TOPIC,
    MessageFormatError,
)
from hamq.protocol.record import (
    StoredMessage,
    decode_message,
    read_record,
)
from hamq.store.commitlog import CommitLog
from hamq.store.config import StoreConfig
from hamq.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from hamq.store.deletions import TopicDeletions
from hamq.store.index import IndexService
from hamq.store.records import is_lost_record
from hamq.store.segment import StoreError
from hamq.store.values import GetMessageResult, GetMessageStatus

#: entries a get_message scans at most while a tag filter skips them (RocketMQ: 16000)
MAX_FILTERED_SCAN = 16_000


class _Scan:
    """What one read of a consume queue found (``get_message``)."""

    __slots__ = (
        "count", "filtered", "last_physical", "next_offset", "removed", "runs", "skipped",
    )  # fmt: skip

    def __init__(self, offset: int) -> None:
        self.next_offset = offset
        #: the records found: views of one or more records back to back (``count`` in all)
        self.runs: list[memoryview] = []
        self.count = 0
        self.last_physical = 0
        self.removed = self.filtered = self.skipped = 0


class StoreReader:
    """The reads of a store's CommitLog, consume queues and index."""

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService,
        deletions: TopicDeletions,
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.deletions = deletions
        self._gets = 0

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        tag_codes: Collection[int] | None = None,
        max_bytes: int | None = None,
    ) -> GetMessageResult:
        """Up to ``max_count`` messages of a queue from ``offset``; ``tag_codes`` keeps
        only messages whose tags hash is in it (None: all).

        A record a consumer could not decode (or, with ``check_crc_on_read``, whose body
        CRC fails) is passed over and counted in ``skipped``. Each record is checked
        once per run of the process: entries in the queue's ``checked`` (dispatched by
        this process, or checked by an earlier pull) are read as they are."""
        self._gets += 1
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        low, high = queue.min_offset, queue.max_offset

        def result(status: GetMessageStatus, next_offset: int) -> GetMessageResult:
            return GetMessageResult(status, next_offset, low, high)

        if high == 0:
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0)
        if offset < low:
            return result(GetMessageStatus.OFFSET_TOO_SMALL, low)
        if offset == high:
            return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset)
        if offset > high:  # RocketMQ: back to the start when the queue starts at 0
            return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, low if low == 0 else high)
        scan = _Scan(offset)
        self._read_queue(
            scan,
            queue,
            (topic, queue_id),
            high,
            max(1, min(max_count, self.config.max_transfer_count)),
            self.config.max_transfer_bytes if max_bytes is None else max_bytes,
            tag_codes,
        )
        if scan.count:
            lag = self.commitlog.max_offset - scan.last_physical
            return GetMessageResult(
                GetMessageStatus.FOUND,
                scan.next_offset,
                low,
                high,
                tuple(scan.runs),
                scan.count,
                lag,
                scan.skipped,
            )
        if scan.filtered:
            status = GetMessageStatus.NO_MATCHED_MESSAGE
        elif scan.removed or scan.skipped:  # (RocketMQ's status for a message it could not read)
            status = GetMessageStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetMessageStatus.OFFSET_FOUND_NULL
        return GetMessageResult(status, scan.next_offset, low, high, skipped=scan.skipped)

    def _read_queue(
        self,
        scan: _Scan,
        queue: ConsumeQueue,
        queue_key: tuple[str, int],
        high: int,
        max_count: int,
        byte_budget: int,
        tag_codes: Collection[int] | None,
    ) -> None:
        """Read a queue's records into ``scan`` from its ``next_offset``: at most
        ``max_count`` and (but for the first) ``byte_budget`` bytes, scanning at most
        MAX_FILTERED_SCAN entries. Entries before ``trusted`` were checked in this
        process (queue.checked): read as they are (with no filter, ``_read_trusted``:
        records that follow one another in the log as one view); the others are checked
        whole (``record_problem``), and the runs that pass are added to ``checked``."""
        commitlog = self.commitlog
        read = commitlog.reader()
        commitlog_min = commitlog.min_offset
        check_crc = self.config.check_crc_on_read
        checked = queue.checked
        offset = next_offset = scan.next_offset
        trusted = checked.end_of(offset)
        run_start = run_end = offset
        runs = scan.runs
        count = total = 0
        full = False
        while next_offset < high and count < max_count and not full:
            if next_offset - offset >= MAX_FILTERED_SCAN:
                break
            if tag_codes is None and next_offset < trusted:
                limit = min(trusted, high, next_offset + max_count - count) - next_offset
                took, total, full = self._read_trusted(
                    scan, queue, read, next_offset, limit, total, byte_budget, first=not count
                )
                if took:
                    next_offset += took
                    count += took
                    continue
            batch = queue.entries(next_offset, max(max_count - count, 32))
            if not batch:
                break
            for physical_offset, size, tags in batch:
                if physical_offset < commitlog_min:
                    scan.removed += 1
                elif tag_codes is not None and tags not in tag_codes:
                    scan.filtered += 1
                else:
                    if count and total + size > byte_budget:
                        full = True
                        break
                    record: memoryview | None
                    if next_offset < trusted:
                        record = read(physical_offset, size)
                    else:
                        entry = (*queue_key, next_offset)
                        record = commitlog.read_checked(
                            physical_offset, size, entry, check_crc=check_crc
                        )
                        if record is not None and is_lost_record(record):
                            # a placeholder for a record a crash cut (queue_check.py):
                            # passed over, as a message removed, never marked checked
                            scan.removed += 1
                            next_offset += 1
                            continue
                        if record is not None:
                            if next_offset != run_end:
                                checked.add(run_start, run_end)
                                run_start = next_offset
                            run_end = next_offset + 1
                    if record is None:  # damaged: passed over (counted, logged), never sent
                        scan.skipped += 1
                    else:
                        runs.append(record)
                        count += 1
                        scan.last_physical = physical_offset
                        total += size
                next_offset += 1
                if count >= max_count:
                    break
        checked.add(run_start, run_end)
        scan.next_offset = next_offset
        scan.count = count

    def _read_trusted(
        self,
        scan: _Scan,
        queue: ConsumeQueue,
        read: Callable[[int, int], memoryview],
        next_offset: int,
        limit: int,
        total: int,
        byte_budget: int,
        *,
        first: bool,
    ) -> tuple[int, int, bool]:
        """``_read_queue``'s loop for up to ``limit`` entries checked before, with no
        filter, without a step per entry: a file's entries unpacked at once, how many
        fit the byte budget found by bisection (``total`` bytes taken so far; the
        ``first`` record of a pull is taken whatever its size), and the records that
        follow one another in the log appended as one view. How many entries it took
        (0: none, the caller steps through them), the new total, and whether the byte
        budget stopped it."""
        physical, sizes, _tags = queue.entry_columns(next_offset, limit)
        if not physical or min(physical) < self.commitlog.min_offset:
            return 0, total, False
        totals = list(itertools.accumulate(sizes, initial=total))[1:]
        count = bisect.bisect_right(totals, byte_budget)
        full = count < len(physical)
        if first and not count:
            count = 1
        if not count:
            return 0, total, full
        ends = list(map(operator.add, physical[:count], sizes[:count]))
        breaks = itertools.compress(range(1, count), map(operator.ne, ends, physical[1:count]))
        segment_size = self.commitlog.segment_size
        runs = scan.runs
        begin = 0
        for stop in itertools.chain(breaks, (count,)):
            start, end = physical[begin], ends[stop - 1]
            if start // segment_size == (end - 1) // segment_size:
                runs.append(read(start, end - start))
            else:  # records back to back across a segment's end (never in a sound log)
                runs.extend(read(physical[i], sizes[i]) for i in range(begin, stop))
            begin = stop
        scan.last_physical = physical[count - 1]
        return count, totals[count - 1], full

    def max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.max_offset if queue else 0

    def min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.min_offset if queue else 0

    def store_time_at(self, physical_offset: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``physical_offset``."""
        record = self.commitlog.read(physical_offset, size)
        sys_flag = int.from_bytes(record[36:40], "big")
        at = 48 + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
        return int.from_bytes(record[at : at + 8], "big", signed=True)

    def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, *, upper: bool = False
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``
        (``upper``: the last stored at or before it)."""
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return 0
        return queue.offset_by_time(timestamp_ms, self.store_time_at, upper=upper)

    def message_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """Store time of the message at ``offset`` of a queue, -1 if there is none."""
        queue = self.queues.get(topic, queue_id)
        entry = queue.entry(offset) if queue else None
        if entry is None or entry[0] < self.commitlog.min_offset:
            return -1
        return self.store_time_at(entry[0], entry[1])

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        return self.message_store_time(topic, queue_id, self.min_offset_in_queue(topic, queue_id))

    def look_message_by_offset(
        self, physical_offset: int, size: int | None = None
    ) -> StoredMessage:
        """The message at a CommitLog offset; StoreError if none starts there (or what
        starts there is no message: ``record_at``)."""
        if size is None:
            return decode_message(self.record_at(physical_offset), check_crc=False)
        try:
            record = self.commitlog.read(physical_offset, size)
            message = decode_message(record, check_crc=False)
        except MessageFormatError as exc:
            raise StoreError(f"no message at commitlog offset {physical_offset}: {exc}") from None
        self._check_readable(physical_offset, record, message.topic)
        return message

    def record_at(self, physical_offset: int) -> memoryview:
        """The whole record that starts at ``physical_offset``, checked (magic, sizes,
        CRC); StoreError if no record starts there, or if it is no message for anyone to
        read: a lost record's placeholder (VIEW_MESSAGE_BY_ID)."""
        try:
            size = int.from_bytes(self.commitlog.read(physical_offset, 4), "big", signed=True)
            record = self.commitlog.read(physical_offset, size)
            topic = read_record(record).topic
        except (MessageFormatError, ValueError) as exc:
            raise StoreError(f"no message at commitlog offset {physical_offset}: {exc}") from None
        self._check_readable(physical_offset, record, topic)
        return record

    def _check_readable(self, physical_offset: int, record: memoryview, topic: str) -> None:
        """StoreError if the sound record of ``topic`` at ``physical_offset`` is not a
        message to hand out: the placeholder of a record lost in a crash, a topic's
        deletion record, or a message of a topic deleted after it."""
        problem = None
        if is_lost_record(record):
            problem = "it holds the queue offset of a message lost in a crash"
        elif topic == TOPIC_DELETION_TOPIC:
            problem = "it records a topic's deletion"
        elif self.deletions.dead(topic, physical_offset):
            problem = f"its topic {topic} was deleted after it"
        if problem is not None:
            raise StoreError(f"no message at commitlog offset {physical_offset}: {problem}")

    def query_records(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[memoryview]:
        """Records of ``topic`` whose KEYS hold ``key`` or whose UNIQ_KEY is ``key``,
        stored in [begin_ms, end_ms], newest first (zero-copy views; QUERY_MESSAGE)."""
        found: list[memoryview] = []
        for physical_offset in self.index.query(topic, key, max_num * 4, begin_ms, end_ms):
            if physical_offset < self.commitlog.min_offset or len(found) >= max_num:
                continue
            if self.deletions.dead(topic, physical_offset):
                continue  # (indexed before its topic was deleted)
            try:
                record = self.record_at(physical_offset)
            except StoreError:
                continue  # an entry left by a truncation
            message = decode_message(record, check_crc=False)
            keys = message.properties.get(PROPERTY_KEYS, "").split(" ")
            if (
                message.topic == topic
                and (key in keys or message.properties.get(PROPERTY_UNIQ_KEY) == key)
                and begin_ms <= message.store_timestamp <= end_ms
            ):
                found.append(record)
        return found

    def query_marks(self, mark: str, max_num: int = 8) -> list[StoredMessage]:
        """Records whose HAMQ_MARKS hold ``mark``, newest first (decoded; candidates the
        index gives whose record cannot be read are left out: the caller checks the
        properties that matter)."""
        found: list[StoredMessage] = []
        for physical_offset in self.index.query(PROPERTY_MARKS, mark, max_num, 0, 2**62):
            if not self.commitlog.min_offset <= physical_offset < self.commitlog.max_offset:
                continue
            try:
                found.append(decode_message(self.record_at(physical_offset), check_crc=False))
            except (StoreError, MessageFormatError):
                continue
        return found

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[StoredMessage]:
        """Like ``query_records``, decoded."""
        return [
            decode_message(record, check_crc=False)
            for record in self.query_records(topic, key, max_num, begin_ms, end_ms)
        ]

    def index_last_update(self) -> tuple[int, int]:
        """(store time, CommitLog offset) of the newest index entry: (0, 0) with none
        (a QUERY_MESSAGE answer's indexLastUpdateTimestamp and ...Phyoffset)."""
        files = self.index.files
        return (files[-1].end_timestamp, files[-1].end_offset) if files else (0, 0)
