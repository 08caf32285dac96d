"""Recovery at start: find where the CommitLog really ends and rebuild what depends on it.

Two paths, chosen by the abort marker (``<store>/abort``, created at start and removed
by a clean stop):

- clean stop: trust the checkpoint — the CommitLog ends at its flushed offset, which
  a clean stop made the end of the log — once the records of its last
  CLEAN_TAIL_SCAN_BYTES read whole (``_clean_tail``). Zeros or damage there mean the
  files changed after the stop (a disk, a person): they are dealt with as after a
  crash (below), logged as such, and the store starts. A last segment cut short is
  brought back to full size by ``CommitLog.load`` and scanned as after a crash.
- crash: scan from the start of the segment holding the checkpoint's flushed offset,
  record by record, checking magic, sizes and body CRC, and each record's own
  PHYSICALOFFSET. The log ends at the first record that fails (or at zeros). Whatever
  lies after — the torn tail of that segment and any later segments — is copied aside
  under ``<store>/torn/`` before the log is cut there, and every cut is logged with its
  range. Nothing is dropped silently.
  Except one damaged record with intact neighbours: when the record after it is whole
  (size, magic, CRC and PHYSICALOFFSET right, or a blank marker ending the segment
  exactly), the damage is that one record, not a torn tail. It is copied to
  ``<store>/torn/<offset>.damaged`` and passed over; its bytes stay in the log (the
  offsets after it, replicas and the index depend on them), and the log goes on.

Then the consume queues and the index are brought in line: entries that point past the
end are dropped, and the records from the checkpoint's dispatched offset (or from
wherever the consume queues really end, if their files were deleted) are dispatched
again. A damaged record met while dispatching is passed over the same way (by the
reput task, hamq/store/reput.py; here it is copied to torn/); its consume queue
entry (RocketMQ's queue offsets have no gaps) points at it, for pulls to skip. A disk
error while dispatching (a full disk) does not stop the start: the store runs with
dispatching paused there (``RecoveryReport.paused``), serves what is dispatched,
refuses sends, and its reput task finishes the rest once there is room.

Queue offsets are never handed out twice. Entries whose records are no longer in the
log (cut after a crash, or damaged after a clean stop: ``lost_entries``, a sane run of
them only) gave out queue offsets a consumer may have read; each such offset is kept
by a placeholder record appended to the log (PROPERTY_LOST, empty body, logged as an
error: ``_keep_lost_offsets``) before the store serves, and pulls pass over them. So
is a rebuilt queue's offset up to what the last clean stop recorded of it
(hamq/store/extents.py). Not while dispatching is paused by a full disk: the queues'
ends are not known then (logged).

Last, the consume queues are checked against the CommitLog (``check_consume_queues``):
a queue whose files do not load, whose files show empty entries at their ends or
offsets going back, whose last entry does not point at the record it should, that ends
before or starts after a record of it in the last TAIL_CHECK_BYTES of the log, that
holds less than the last clean stop recorded of it (zeroed or deleted files anywhere),
or that still holds entries of its topic from before the topic's deletion
(hamq/store/deletions.py) is rebuilt from the whole log, as deleting consumequeue/
does, and logged: otherwise new sends would reuse its queue offsets. The check reads
the queue files (two entries each), one record header per queue, and the log's tail in
order.

Everything here blocks: MessageStore runs it in a worker thread before serving.
"""

from __future__ import annotations

import bisect
import logging
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from hamq.protocol.message import (
    PROPERTY_LOST,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    TOPIC_DELETION_TOPIC,
    MessageFormatError,
    encode_properties,
    topic_error,
)
from hamq.protocol.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    RECORD_HEAD,
    is_blank,
    make_record_template,
    read_record,
)
from hamq.store.checkpoint import Checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ENTRY_SIZE, ConsumeQueue
from hamq.store.deletions import TopicDeletions
from hamq.store.extents import Extent, QueueExtents
from hamq.store.files import fsync_directory, write_atomically
from hamq.store.index import IndexService
from hamq.store.records import MIN_RECORD_BYTES, fields, isolated_damage, scan_problem
from hamq.store.reput import ConsumeQueueTable, ReputService
from hamq.store.segment import Segment, StoreCorruptionError, StoreError

log = logging.getLogger(__name__)

#: the start-up check compares every record in this much of the log's end with the
#: consume queues (a queue that lost entries further back is not noticed: delete
#: consumequeue/ to rebuild them all)
TAIL_CHECK_BYTES = 16 * 1024 * 1024
#: after a clean stop, the records in this much of the log's end are checked whole
#: (sizes, body CRC, their own offset) before the checkpoint's end is trusted
CLEAN_TAIL_SCAN_BYTES = 4 * 1024 * 1024
#: the most queue offsets recovery keeps for one queue's lost records (placeholders)
MAX_LOST_PER_QUEUE = 1_000_000
_SEGMENT_NAME = re.compile(r"\d{20}")


@attrs.frozen
class RecoveryReport:
    clean: bool
    commitlog_end: int
    dispatched_from: int
    records_dispatched: int
    #: the range cut off the log after a crash, if any, and where its bytes were put
    truncated: tuple[int, int] | None = None
    torn_copy: tuple[Path, ...] = ()
    bad_record: str | None = None
    #: damaged records passed over (their commitlog offsets): kept in the log, copied
    #: to torn/, and the records after them kept
    damaged: tuple[int, ...] = ()
    #: consume queues rebuilt because they did not match the log ("topic/queue id")
    rebuilt_queues: tuple[str, ...] = ()
    #: why dispatching is paused (a full disk) short of the log's end, if it is: the
    #: store runs, and its reput task retries
    paused: str | None = None
    #: topics whose deletion recovery applied (their records dispatched again: a slave
    #: or a master that stopped before they were): the broker forgets them too
    topics_deleted: tuple[str, ...] = ()
    #: queue offsets handed out for records no longer in the log, kept by placeholders
    #: ("topic/queue id" -> [first, stop)): pulls pass over them, new messages follow
    lost_offsets: dict[str, tuple[int, int]] = attrs.field(factory=dict)


def _last_nonzero(segment: Segment, start: int) -> int:
    """The position just past the last non-zero byte at or after ``start``."""
    chunk = 1 << 20
    end = segment.size
    while end > start:
        begin = max(start, end - chunk)
        data = bytes(segment.view(begin, end - begin)).rstrip(b"\0")
        if data:
            return begin + len(data)
        end = begin
    return start


@attrs.frozen
class Scan:
    """What a crash scan found: where the valid log ends (and why there, None for a
    clean end), and the damaged records it passed over: (offset, size, what is wrong)."""

    end: int
    reason: str | None = None
    damaged: tuple[tuple[int, int, str], ...] = ()


def scan_commitlog(commitlog: CommitLog, from_offset: int, *, at_record: bool = False) -> Scan:
    """Where the valid log ends, scanning from the start of the segment holding
    ``from_offset`` (``at_record``: from ``from_offset`` itself, where a record starts);
    damaged records with intact neighbours are passed over (``isolated_damage``)."""
    segments = commitlog.segments.segments
    if not segments:
        return Scan(0)
    first = commitlog.segments.find(from_offset)
    if first is None:
        # the checkpoint sits at the end of a full last segment: nothing after it to scan
        first = segments[-1] if from_offset >= segments[-1].end else segments[0]
        if from_offset >= first.end:
            return Scan(from_offset)
    offset = first.start
    damaged: list[tuple[int, int, str]] = []

    def ended(at: int, reason: str | None) -> Scan:
        return Scan(at, reason, tuple(damaged))

    for segment in segments[segments.index(first) :]:
        if segment.start != offset:
            break  # the previous segment ended early: this one is after the end
        view = segment.view(0, segment.size)
        pos = from_offset - segment.start if at_record and segment is first else 0
        while True:
            if segment.size - pos < 8:
                return ended(segment.start + pos, "a segment ends without a blank marker")
            total = int.from_bytes(view[pos : pos + 4], "big", signed=True)
            if total == 0 and not any(view[pos : pos + 8]):
                return ended(segment.start + pos, None)  # zeros: the end of what was written
            if is_blank(view, pos):
                if total != segment.size - pos:
                    left = segment.size - pos
                    return ended(
                        segment.start + pos,
                        f"blank marker says {total} bytes remain, the segment has {left}",
                    )
                offset = segment.end
                break
            problem = scan_problem(view, pos, segment.start + pos)
            if problem is not None:
                size = isolated_damage(segment, pos)
                if size is None:
                    return ended(segment.start + pos, problem)
                damaged.append((segment.start + pos, size, problem))
                pos += size
                continue
            pos += total
    return ended(offset, None)


def _after_end(commitlog: CommitLog, end: int) -> tuple[Segment | None, list[Segment]]:
    """The segment holding ``end`` (None when ``end`` closes a full last segment) and the
    segments wholly after it."""
    holder = commitlog.segments.find(end)
    later = [s for s in commitlog.segments.segments if s.start > end]
    return holder, later


def written_past(commitlog: CommitLog, end: int) -> bool:
    """True if any byte after ``end`` is not zero, or a segment lies wholly after it."""
    holder, later = _after_end(commitlog, end)
    if later:
        return True
    return holder is not None and _last_nonzero(holder, end - holder.start) > end - holder.start


def _unused(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``... whichever does not exist: copies of torn
    data from different crashes never overwrite each other."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def cut_commitlog(commitlog: CommitLog, end: int, torn_dir: Path) -> tuple[Path, ...]:
    """Copy whatever lies after ``end`` to ``torn_dir``, then end the log there.

    The segment holding ``end`` keeps its place (zeroed after ``end``); segments wholly
    after it are moved into ``torn_dir`` (or deleted when they hold only zeros).
    Returns the copies made.
    """
    copies: list[Path] = []
    torn_dir.mkdir(parents=True, exist_ok=True)
    holder, later = _after_end(commitlog, end)
    if holder is not None:
        pos = end - holder.start
        stop = _last_nonzero(holder, pos)
        if stop > pos:
            target = _unused(torn_dir / f"{end:020d}.tail")
            write_atomically(target, bytes(holder.view(pos, stop - pos)))
            copies.append(target)
            holder.zero(pos, stop)
            holder.sync_data()  # the cut is on disk before anything relies on it
    for segment in reversed(later):  # newest first: a crash part way leaves no gap
        if _last_nonzero(segment, 0) > 0:
            segment.close()
            target = _unused(torn_dir / f"{segment.path.name}.segment")
            shutil.move(segment.path, target)
            copies.append(target)
        else:
            segment.destroy()
    commitlog.segments.segments = [s for s in commitlog.segments.segments if s not in later]
    fsync_directory(commitlog.segments.directory)
    if copies:
        fsync_directory(torn_dir)
    commitlog.segments.set_end(end)
    return tuple(copies)


def _copy_damaged(torn_dir: Path, offset: int, data: bytes) -> Path:
    """``torn/<offset>.damaged`` holding ``data`` (written unless an identical copy is
    there: a record met again at the next start is not copied twice)."""
    target = torn_dir / f"{offset:020d}.damaged"
    if target.exists() and target.read_bytes() == data:
        return target
    target = _unused(target)
    write_atomically(target, data)
    return target


@attrs.define
class _Dispatcher:
    """Recovery's dispatch passes: every record of the log into the consume queues and
    the index. Damaged records are passed over by the reput task itself (hamq/store/
    reput.py, with the log's end known); here each is copied to torn/ and logged.
    A queue whose entry conflicts with the log is emptied and rebuilt (``_reset_queue``).
    A disk error (a full disk) ends the pass: the store starts with dispatching paused
    there, and the reput task's retries finish it (``paused``)."""

    commitlog: CommitLog
    queues: ConsumeQueueTable
    reput: ReputService
    torn_dir: Path
    #: offsets of damaged records already reported (the crash scan reports its own)
    reported: set[int] = attrs.field(factory=set)
    #: queues emptied to be rebuilt because an entry conflicted with the log
    reset: dict[tuple[str, int], str] = attrs.field(factory=dict)
    records: int = 0
    #: topics whose deletion a pass applied (their records dispatched again)
    deleted: list[str] = attrs.field(factory=list)

    @property
    def paused(self) -> bool:
        """Dispatching stopped at a disk error, to be retried once the store runs."""
        return self.reput.failure is not None and self.reput.failure_is_transient

    def run(self) -> None:
        """Dispatch until the end of the log (or a disk error: ``paused``);
        StoreCorruptionError if a record that fails cannot be passed over."""
        self.reput.on_damaged = self._report
        self.reput.deletion_listeners.append(self.deleted.append)
        try:
            while True:
                self.records += self.reput.dispatch_available(final=True)
                failure = self.reput.failure
                if failure is None or self.paused:
                    return
                if not self._reset_queue(self.reput.offset):
                    raise StoreCorruptionError(f"rebuilding the consume queues failed: {failure}")
                self.reput.failure = None
        finally:
            self.reput.on_damaged = None
            self.reput.deletion_listeners.remove(self.deleted.append)

    def _report(self, offset: int, size: int, problem: str) -> None:
        """Copy a damaged record the reput task passed over to torn/ and log it (once)."""
        if offset in self.reported:
            return
        copy = _copy_damaged(self.torn_dir, offset, bytes(self.commitlog.read(offset, size)))
        log.error(
            "passed over the damaged record [%d, %d) (%s); copied to %s, the records "
            "after it are kept",
            offset,
            offset + size,
            problem,
            copy,
        )
        self.reported.add(offset)

    def _whole_record(self, at: int) -> tuple[ConsumeQueue, int, int] | None:
        """(its queue, its queue offset, its size) for the record at ``at`` if it reads
        and its queue exists."""
        segment = self.commitlog.segments.find(at)
        if segment is None:
            return None
        try:
            info = read_record(segment.view(0, segment.wrote), at - segment.start, check_crc=False)
        except MessageFormatError:
            return None
        queue = self.queues.get(info.topic, info.queue_id)
        return None if queue is None else (queue, info.queue_offset, info.size)

    def _reset_queue(self, at: int) -> bool:
        """The whole record at ``at`` failed because its queue's entry for it points
        elsewhere: empty that queue and dispatch the log again from its start (once per
        queue)."""
        found = self._whole_record(at)
        if found is None:
            return False
        queue, queue_offset, size = found
        entry = queue.entry(queue_offset)
        key = (queue.topic, queue.queue_id)
        if entry is None or entry[:2] == (at, size) or key in self.reset:
            return False
        problem = f"entry {queue_offset} points at {entry[0]}, the record is at {at}"
        log.error(
            "consume queue %s/%d does not match the commitlog (%s): rebuilding it",
            *key,
            problem,
        )
        self.reset[key] = problem
        queue.clear()
        self.reput.offset = self.commitlog.min_offset
        return True


# ---------------------------------------------------------------- consume queue check


def _bad_queue_files(directory: Path, file_bytes: int) -> str | None:
    """Why the files of a consume queue directory cannot load (what SegmentQueue.load
    would refuse: a gap, a wrong size, a misaligned name), None if they can."""
    names = sorted(p.name for p in directory.iterdir() if _SEGMENT_NAME.fullmatch(p.name))
    expected: int | None = None
    for name in names:
        start = int(name)
        if start % file_bytes:
            return f"file {name} does not start at a multiple of {file_bytes}"
        if expected is not None and start != expected:
            return f"file {expected:020d} is missing"
        size = (directory / name).stat().st_size
        if size != file_bytes:
            return f"file {name} has {size} bytes, not {file_bytes}"
        expected = start + file_bytes
    return None


def remove_unloadable_queues(root: Path, entries_per_file: int) -> list[str]:
    """Delete the consume queue directories whose files cannot load (a deleted middle
    file, a truncated one): they are rebuilt from the log. Returns "topic/queue id"s."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            if not (queue_dir.is_dir() and queue_dir.name.isdigit()):
                continue
            problem = _bad_queue_files(queue_dir, entries_per_file * ENTRY_SIZE)
            if problem is not None:
                name = f"{topic_dir.name}/{queue_dir.name}"
                log.error("consume queue %s: %s; rebuilding it from the commitlog", name, problem)
                shutil.rmtree(queue_dir)
                removed.append(name)
    return removed


def _entry_problem(commitlog: CommitLog, queue: ConsumeQueue, index: int, end: int) -> str | None:
    """What is wrong with entry ``index`` of ``queue``, judged by the record it points
    at; None if it matches or cannot be judged (the record is gone, or damaged)."""
    entry = queue.entry(index)
    if entry is None:
        return None
    physical_offset, size, _tags = entry
    if size <= 0:
        return f"entry {index} is empty"
    if physical_offset < commitlog.min_offset:
        return None  # the record was deleted with its segment
    if physical_offset + size > end:
        return f"entry {index} points past the end of the commitlog ({physical_offset}+{size})"
    try:
        head = commitlog.read(physical_offset, RECORD_HEAD.size)
    except StoreError:
        return f"entry {index} points at {physical_offset}, which the commitlog does not have"
    total, magic, _crc, queue_id, _flag, queue_offset, physical, _sys = RECORD_HEAD.unpack_from(
        head
    )
    if total != size:
        return f"entry {index} says {size} bytes, the record at {physical_offset} has {total}"
    if magic not in (MAGIC_V1, MAGIC_V2):
        return None  # a damaged record (pulls skip it): nothing to judge the entry by
    if (physical, queue_id, queue_offset) != (physical_offset, queue.queue_id, index):
        return (
            f"entry {index} points at {physical_offset}, which holds queue {queue_id} "
            f"offset {queue_offset}"
        )
    return None


def _queue_files_problem(queue: ConsumeQueue) -> str | None:
    """What a queue's own files show to be wrong, read from them alone (no CommitLog
    read: this runs for every file of every queue at each start): its first file holds
    none of its entries (it was zeroed), an entry at either end of a file's share is
    empty, or CommitLog offsets go back from one of those entries to the next."""
    low, high = queue.min_offset, queue.max_offset
    first = queue.segments.first
    if low >= high or first is None:
        return None
    if low * ENTRY_SIZE >= first.end:
        return f"its first file {first.path.name} holds no entry"
    per_file = queue.entries_per_file
    previous = -1
    for start in range(low - low % per_file, high, per_file):
        for index in (max(start, low), min(start + per_file, high) - 1):
            entry = queue.entry(index)
            if entry is None or entry[1] <= 0:
                return f"entry {index} is empty"
            if entry[0] < previous:
                return f"entry {index} points at {entry[0]}, before the entry ahead of it"
            previous = entry[0]
    return None


def _first_at_or_after(queue: ConsumeQueue, physical_offset: int) -> int | None:
    """The commitlog offset of the queue's first entry at or after ``physical_offset``.
    The search reads the last entry, then the first of each file back from the last
    until one starts before ``physical_offset``, then bisects there: near the log's
    end, a file or two of each queue, whatever the queue's length."""
    low, high = queue.min_offset, queue.max_offset
    last = queue.entry(high - 1)
    if last is None or last[0] < physical_offset:
        return None
    per_file = queue.entries_per_file
    begin = max(low, (high - 1) - (high - 1) % per_file)
    while begin > low:
        first = queue.entry(begin)
        if first is None or first[0] < physical_offset:
            break
        begin = max(low, begin - per_file)
    offsets = range(begin, high)
    found = bisect.bisect_left(
        offsets, physical_offset, key=lambda i: (queue.entry(i) or (0, 0, 0))[0]
    )
    if found == len(offsets):
        return None
    entry = queue.entry(offsets[found])
    return entry[0] if entry is not None and entry[1] > 0 else None


def _tail_start(
    commitlog: CommitLog, queues: ConsumeQueueTable, end: int, window: int = TAIL_CHECK_BYTES
) -> int:
    """Where a record starts at or just after ``end - window``: a segment's start or a
    queue entry's record (checked to say it is there)."""
    target = end - window
    if target <= commitlog.min_offset:
        return commitlog.min_offset
    holder = commitlog.segments.find(target)
    best = end if holder is None else min(end, holder.end)
    for queue in queues.queues.values():
        at = _first_at_or_after(queue, target)
        if at is None or not target <= at < best:
            continue
        try:
            head = commitlog.read(at, RECORD_HEAD.size)
        except StoreError:
            continue
        if RECORD_HEAD.unpack_from(head)[6] == at:
            best = at
    return best


#: a record the tail check read: (its offset, its size, its queue offset)
_Seen = tuple[int, int, int]


def _tail_records(
    commitlog: CommitLog, start: int, end: int, deletions: TopicDeletions
) -> Iterator[tuple[tuple[str, int], _Seen]]:
    """((topic, queue id), the record) for each record in [start, end) that has a
    consume queue entry (header and topic read, nothing more: this runs for every
    record of the window at each start): not a deletion record, nor one of a topic
    deleted after it. Damaged ones are passed over by their size, the walk stops where
    nothing can be read."""
    offset = start
    topics: dict[bytes, str | None] = {}
    no_entry = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
    head, head_size = RECORD_HEAD.unpack_from, RECORD_HEAD.size  # (bound once: per record)
    while offset < end:
        segment = commitlog.segments.find(offset)
        if segment is None:
            return
        view = segment.view(0, segment.wrote)
        stop = min(segment.wrote, end - segment.start)
        pos = offset - segment.start
        while pos + head_size <= stop:
            size, magic, _crc, queue_id, _flag, queue_offset, _phy, sys_flag = head(view, pos)
            if magic == BLANK_MAGIC:
                break
            if size < MIN_RECORD_BYTES or pos + size > stop:
                return
            place = fields(view, pos) if magic in (MAGIC_V1, MAGIC_V2) else None
            if (
                place is not None
                and place[2] + place[3] < pos + size
                and sys_flag & SYSFLAG_TRANSACTION_MASK not in no_entry
            ):
                raw = bytes(view[place[2] : place[2] + place[3]])
                topic = topics.get(raw, "")
                if topic == "":
                    topic = topics[raw] = _topic_name(raw)
                at = segment.start + pos
                if (
                    topic is not None
                    and topic != TOPIC_DELETION_TOPIC
                    and not deletions.dead(topic, at)
                ):
                    yield (topic, queue_id), (at, size, queue_offset)
            pos += size
        if pos + 8 > stop:
            return
        offset = segment.end  # a blank marker: the segment's records end here


def _topic_name(raw: bytes) -> str | None:
    """``raw`` as a topic name, None if it is not one (not UTF-8, or not valid)."""
    try:
        topic = raw.decode()
    except UnicodeDecodeError:
        return None
    return topic if topic_error(topic) is None else None


def _tail_problems(
    commitlog: CommitLog, queues: ConsumeQueueTable, end: int, deletions: TopicDeletions
) -> dict[tuple[str, int], str]:
    """Queues that the records in the log's last TAIL_CHECK_BYTES show to be wrong: one
    ends before a record of it or starts after one, or its entries for them point
    elsewhere."""
    seen: dict[tuple[str, int], list[_Seen]] = {}
    start = _tail_start(commitlog, queues, end)
    for key, record in _tail_records(commitlog, start, end, deletions):
        records = seen.get(key)
        if records is None:
            seen[key] = [record]
        else:
            records.append(record)
    problems: dict[tuple[str, int], str] = {}
    for key, records in seen.items():
        last_offset, _size, last = records[-1]
        queue = queues.get(*key)
        if queue is None or queue.max_offset <= last:
            have = "there is no such queue" if queue is None else f"it ends at {queue.max_offset}"
            problems[key] = f"the commitlog has its entry {last} at {last_offset}, {have}"
            continue
        first_offset, _size, first = records[0]
        if first < queue.min_offset:  # (every record of the window is in the log)
            problems[key] = (
                f"it starts at entry {queue.min_offset}, the commitlog has its entry {first} "
                f"at {first_offset}"
            )
            continue
        entries = queue.entries(first, last + 1 - first)
        for offset, size, queue_offset in records:
            index = queue_offset - first
            entry = entries[index] if index < len(entries) else None
            if entry is None or entry[0] != offset or entry[1] != size:
                problems[key] = f"entry {queue_offset} is {entry}, the record is at {offset}+{size}"
                break
    return problems


def check_consume_queues(
    commitlog: CommitLog,
    queues: ConsumeQueueTable,
    end: int,
    deletions: TopicDeletions,
    extents: QueueExtents | None = None,
) -> dict[tuple[str, int], str]:
    """Consume queues that do not match the CommitLog (dispatched up to ``end``), with
    what is wrong: what the last clean stop's ``extents`` say they held, their files
    read alone (``_queue_files_problem``), their last entry against the record it
    points at, the log's last TAIL_CHECK_BYTES against them, and (a topic deleted) an
    entry left from before the deletion. The CommitLog reads are one record header per
    queue plus the tail window, read in order: the check stays cheap on a big store."""
    problems = _tail_problems(commitlog, queues, end, deletions)
    if extents is not None:
        found = extents.problems(queues.queues, deletions, commitlog.min_offset)
        problems = found | problems
    for key, queue in queues.queues.items():
        if key in problems:
            continue
        first = queue.entry(queue.min_offset)
        if first is not None and deletions.dead(queue.topic, first[0]):
            problems[key] = (
                f"its topic was deleted at commitlog offset {deletions.offsets[queue.topic]}, "
                f"its entry {queue.min_offset} is of a record before that"
            )
            continue
        problem = _queue_files_problem(queue)
        if problem is None and queue.max_offset > queue.min_offset:
            problem = _entry_problem(commitlog, queue, queue.max_offset - 1, end)
        if problem is not None:
            problems[key] = problem
    return problems


def _rebuild_queues(
    dispatcher: _Dispatcher, problems: dict[tuple[str, int], str], store_dir: Path
) -> None:
    """Empty the queues named in ``problems`` and dispatch the whole log again (the
    other queues skip what they have), as deleting consumequeue/ does."""
    commitlog, queues = dispatcher.commitlog, dispatcher.queues
    for (topic, queue_id), problem in sorted(problems.items()):
        queue = queues.get(topic, queue_id)
        before = (queue.min_offset, queue.max_offset) if queue is not None else None
        if queue is not None:
            queue.clear()
        log.error(
            "consume queue %s/%d does not match the commitlog (%s): rebuilding it "
            "(it had entries %s)",
            topic,
            queue_id,
            problem,
            "none" if before is None else f"[{before[0]}, {before[1]})",
        )
    dispatcher.reput.offset = commitlog.min_offset
    dispatcher.reput.failure = None  # (paused: tried again from the start, up to there)
    dispatcher.run()
    for topic, queue_id in sorted(problems):
        queue = queues.get(topic, queue_id)
        log.warning(
            "consume queue %s/%d rebuilt in %s: entries [%d, %d)",
            topic,
            queue_id,
            store_dir,
            queue.min_offset if queue else 0,
            queue.max_offset if queue else 0,
        )


def recover(
    *,
    store_dir: Path,
    commitlog: CommitLog,
    queues: ConsumeQueueTable,
    index: IndexService,
    reput: ReputService,
    checkpoint: Checkpoint | None,
    clean: bool,
    extents: QueueExtents | None = None,
) -> RecoveryReport:
    """Load and recover everything; on return the store can serve, and ``reput`` has
    dispatched every record of the log. StoreCorruptionError if it cannot: the store
    must not start (what was cut or moved aside so far stays so, and is logged).

    The steps: load the files (the topic deletions too: ``reput.deletions``); find where
    the log ends (``_clean_end``, its tail checked by ``_clean_tail``, or after a crash
    ``_crash_end``: cut there); note the queue entries whose records are gone
    (``lost_entries``); dispatch again from where the consume queues and the index are
    known complete (``_dispatch_start``); check and rebuild the queues that do not match
    the log or the last clean stop's ``extents`` (``_repair_queues``); and keep the queue
    offsets handed out for records that are gone (``_keep_lost_offsets``)."""
    commitlog.load()
    reput.deletions.load()
    unloadable = remove_unloadable_queues(queues.root, queues.entries_per_file)
    queues.load()
    index.load()
    segments = commitlog.segments
    space_end = segments.last.end if segments.last is not None else 0
    dispatcher = _Dispatcher(commitlog, queues, reput, store_dir / "torn")
    if clean and checkpoint is None and not segments.empty:
        log.warning("no checkpoint in %s: scanning the commitlog as after a crash", store_dir)
        clean = False
    if clean and segments.extended:
        log.error("a commitlog segment was cut short: scanning it as after a crash")
        clean = False
    if segments.empty:
        found = _LogEnd(0)
    elif clean:
        assert checkpoint is not None
        found = _clean_tail(
            commitlog, queues, _clean_end(commitlog, checkpoint, store_dir), dispatcher
        )
    else:
        found = _crash_end(commitlog, checkpoint, dispatcher)
    end = found.end
    lost = lost_entries(queues, end, space_end)
    start = _dispatch_start(commitlog, queues, index, checkpoint, end)
    reput.offset = start
    dispatcher.run()
    if dispatcher.paused:  # (what the queues hold is not all they will hold: no judging)
        extents = None
    kept = _keep_lost_offsets(dispatcher, lost)
    # (the placeholders kept are the log's end now)
    problems = _repair_queues(dispatcher, unloadable, segments.max_offset, store_dir, extents)
    if extents is not None and problems and not dispatcher.paused:
        # (rebuilt queues keep the offsets they had handed out)
        kept |= _keep_lost_offsets(dispatcher, {}, extents.standing(reput.deletions))
    for queue in queues.queues.values():
        queue.delete_expired(segments.min_offset)  # minimums follow the log's start
    commitlog.queue_offsets = {key: q.max_offset for key, q in queues.queues.items()}
    _log_recovered(dispatcher, clean=clean, start=start, end=found.end)
    return RecoveryReport(
        clean=clean,
        commitlog_end=found.end,
        dispatched_from=start,
        records_dispatched=dispatcher.records,
        truncated=found.truncated,
        torn_copy=found.copies,
        bad_record=found.reason,
        damaged=tuple(sorted(dispatcher.reported)),
        rebuilt_queues=tuple(f"{t}/{q}" for t, q in sorted(problems)),
        paused=reput.failure if dispatcher.paused else None,
        topics_deleted=tuple(dispatcher.deleted),
        lost_offsets=kept,
    )


@attrs.frozen
class _LogEnd:
    """Where recovery found the log to end, and (after a crash) why there and what was
    cut after it (``RecoveryReport``'s fields of the same meaning)."""

    end: int
    reason: str | None = None
    truncated: tuple[int, int] | None = None
    copies: tuple[Path, ...] = ()


def _clean_end(commitlog: CommitLog, checkpoint: Checkpoint, store_dir: Path) -> int:
    """Where a cleanly stopped log ends, its flushed offset by the checkpoint, made its
    end; StoreCorruptionError if its segments do not end there."""
    segments = commitlog.segments
    end = checkpoint.commitlog_flushed_offset
    last = segments.last
    assert last is not None
    if not segments.min_offset <= end <= last.end or any(s.start > end for s in segments.segments):
        raise StoreCorruptionError(
            f"the checkpoint says the commitlog ends at {end}, but its segments cover "
            f"[{segments.min_offset}, {last.end}); remove {store_dir / 'checkpoint'} "
            f"to recover by scanning"
        )
    segments.set_end(end)
    return end


def _crash_end(
    commitlog: CommitLog, checkpoint: Checkpoint | None, dispatcher: _Dispatcher
) -> _LogEnd:
    """Where the log ends after a crash: scanned from the checkpoint's flushed offset
    (``scan_commitlog``; the damaged records passed over are copied to torn/), what lies
    after cut (copied to torn/ first, ``cut_commitlog``), and what survived made durable.
    A failure part way leaves what was cut so far cut (and copied)."""
    segments = commitlog.segments
    scan_from = checkpoint.commitlog_flushed_offset if checkpoint else segments.min_offset
    scan = scan_commitlog(commitlog, scan_from)
    _report_damaged(commitlog, scan, dispatcher)
    found = _end_log(commitlog, _LogEnd(scan.end, scan.reason), dispatcher, "crash recovery")
    # what survived a killed process may still be only in the page cache: make it
    # durable before the flush service counts it as flushed
    for segment in segments.segments:
        if segment.end > scan_from:
            segment.sync_data()
    return found


def _end_log(commitlog: CommitLog, found: _LogEnd, dispatcher: _Dispatcher, what: str) -> _LogEnd:
    """End the log at ``found.end``: whatever lies after it is copied to torn/ and cut
    (``cut_commitlog``, logged as an error starting with ``what``); ``found`` with the
    range cut and the copies made."""
    segments = commitlog.segments
    if not written_past(commitlog, found.end):
        segments.set_end(found.end)
        return found
    data_end = max(s.start + _last_nonzero(s, 0) for s in segments.segments)
    copies = cut_commitlog(commitlog, found.end, dispatcher.torn_dir)
    log.error(
        "%s: commitlog cut at %d (%s); bytes [%d, %d) copied to %s",
        what,
        found.end,
        found.reason or "data after the end",
        found.end,
        data_end,
        ", ".join(str(c) for c in copies),
    )
    return attrs.evolve(found, truncated=(found.end, data_end), copies=copies)


def _clean_tail(
    commitlog: CommitLog, queues: ConsumeQueueTable, end: int, dispatcher: _Dispatcher
) -> _LogEnd:
    """After a clean stop, the log's last CLEAN_TAIL_SCAN_BYTES before the checkpoint's
    ``end`` checked whole, as a crash scan checks records: a damaged record between whole
    ones is passed over (copied to torn/), a damaged tail is cut there (copied to torn/
    first), and either is logged as an error. The log's end, cut or not.

    A clean stop wrote everything up to ``end``: zeros or damage before it mean the
    files were damaged since (by a disk, or by hand), not a crash; the store deals with
    them as crash recovery would rather than refuse to start."""
    start = _tail_start(commitlog, queues, end, CLEAN_TAIL_SCAN_BYTES)
    scan = scan_commitlog(commitlog, start, at_record=True)
    stop = min(scan.end, end)  # (what lies past the clean end is not the log's)
    damaged = tuple(d for d in scan.damaged if d[0] < stop)
    _report_damaged(commitlog, Scan(stop, scan.reason, damaged), dispatcher)
    if stop == end:
        return _LogEnd(end)
    reason = scan.reason or "zeros"
    log.error(
        "the commitlog was stopped cleanly at %d but its records end at %d (%s): the "
        "bytes from there on were damaged after the stop; dealt with as after a crash",
        end,
        stop,
        reason,
    )
    found = _end_log(commitlog, _LogEnd(stop, reason), dispatcher, "recovery of a damaged log")
    holder = commitlog.segments.find(stop)
    if holder is not None:
        holder.sync_data()
    return found


@attrs.frozen
class LostEntries:
    """A queue's entries [first, first + count) whose records are not in the log any
    more (cut after a crash, or damaged after a clean stop); the first pointed at
    CommitLog offset ``at``."""

    first: int
    count: int
    at: int


def lost_entries(
    queues: ConsumeQueueTable, end: int, space_end: int
) -> dict[tuple[str, int], LostEntries]:
    """The entries of each queue that point at or past the log's ``end`` (and below
    ``space_end``, where its segments ended before any cut): their queue offsets were
    handed out, and a consumer may have read them. Only a run of sane entries counts —
    sizes of a record, CommitLog offsets going forward without overlapping, empty
    entries (holes an unflushed page left) only before a sane one — so that garbage in a
    queue file never passes for lost records."""
    lost = {}
    for key, queue in queues.queues.items():
        first = queue.first_dirty(end)
        count, previous_end, at = 0, end, -1
        offset = first
        while offset < queue.max_offset:
            batch = queue.entries(offset, 4096)
            if not batch:
                break
            for physical_offset, size, _tags in batch:
                offset += 1
                if size == 0:
                    continue  # (counted once a sane entry follows it)
                sane = (
                    size >= MIN_RECORD_BYTES
                    and physical_offset >= previous_end
                    and physical_offset + size <= space_end
                )
                if not sane:
                    offset = queue.max_offset  # (the rest is not trusted)
                    break
                previous_end = physical_offset + size
                count = offset - first
                if at < 0:
                    at = physical_offset
        if count:
            lost[key] = LostEntries(first, count, at)
    return lost


def _keep_lost_offsets(
    dispatcher: _Dispatcher,
    lost: dict[tuple[str, int], LostEntries],
    floors: Mapping[tuple[str, int], Extent] | None = None,
) -> dict[str, tuple[int, int]]:
    """Queue offsets are never handed out twice: where a queue ends before the entries
    it had for records that are gone (``lost``), or before the max offset the last
    clean stop recorded (``floors``; for a queue the log still has records of), a
    placeholder record per missing offset is appended to the log (PROPERTY_LOST, empty
    body: pulls pass over it) and dispatched, so new messages follow them. Each queue
    kept so is logged as an error. Returns "topic/queue id" -> the offsets kept
    [first, stop).

    StoreCorruptionError if a placeholder cannot be written (a full disk, with no room
    left in the last segment): the store must not start and hand the offsets out."""
    queues, commitlog = dispatcher.queues, dispatcher.commitlog
    floors = floors or {}
    kept: dict[str, tuple[int, int]] = {}
    if dispatcher.paused:  # (a full disk: the queues' ends are not known yet)
        for key, entries in lost.items():
            log.error(
                "consume queue %s/%d: entries [%d, %d) were handed out for records the "
                "commitlog no longer has; dispatching is paused, so they are not kept and "
                "may be handed out again",
                *key,
                entries.first,
                entries.first + entries.count,
            )
        return kept
    for key in sorted(set(lost) | set(floors)):
        queue = queues.get(*key)
        have = queue.max_offset if queue is not None else 0
        floor = floors.get(key)
        target = floor.max_offset if floor is not None and have else 0
        missing = lost.get(key)
        if missing is not None:
            target = max(target, missing.first + missing.count)
        if target <= have:
            continue
        if target - have > MAX_LOST_PER_QUEUE:
            log.error(
                "consume queue %s/%d: %d queue offsets from %d have no record any more; only "
                "the last %d are kept",
                *key,
                target - have,
                have,
                MAX_LOST_PER_QUEUE,
            )
            have = target - MAX_LOST_PER_QUEUE
        where = f"at commitlog offset {missing.at}" if missing is not None else "before a crash"
        _append_placeholders(commitlog, key, have, target, where)
        kept[f"{key[0]}/{key[1]}"] = (have, target)
        log.error(
            "consume queue %s/%d: entries [%d, %d) were handed out for records the commitlog "
            "no longer has (the first was %s); they are kept by placeholders that pulls pass "
            "over, and new messages continue at %d",
            *key,
            have,
            target,
            where,
            target,
        )
    if kept:
        dispatcher.run()
        last = commitlog.segments.last
        if last is not None:
            last.sync_data()
    return kept


def _append_placeholders(
    commitlog: CommitLog, key: tuple[str, int], first: int, stop: int, where: str
) -> None:
    """Append placeholders for queue offsets [first, stop) of ``key``'s queue."""
    topic, queue_id = key
    template = make_record_template(
        topic=topic,
        queue_id=queue_id,
        body=b"",
        properties=encode_properties({PROPERTY_LOST: where}),
    )
    commitlog.queue_offsets[key] = first
    try:
        for _ in range(first, stop):
            commitlog.append(topic, template)
    except (StoreError, OSError) as exc:
        raise StoreCorruptionError(
            f"consume queue {topic}/{queue_id}: the placeholders that keep queue offsets "
            f"[{first}, {stop}) from being handed out again cannot be written: {exc}"
        ) from exc


def _dispatch_start(
    commitlog: CommitLog,
    queues: ConsumeQueueTable,
    index: IndexService,
    checkpoint: Checkpoint | None,
    end: int,
) -> int:
    """Where dispatching starts again: where the consume queues and the index are known
    to be complete (the checkpoint's dispatched offset, or the queues' real end if their
    files were removed), never past the log's ``end``. What they hold from there on (and
    the index past ``end``) is dropped, to be dispatched again."""
    segments = commitlog.segments
    dispatched = checkpoint.dispatched_offset if checkpoint else segments.min_offset
    ends = [e for q in queues.queues.values() if (e := q.last_entry_end()) is not None]
    queues_end = max(ends) if ends else segments.min_offset
    start = max(segments.min_offset, min(dispatched, end, queues_end))
    for queue in queues.queues.values():
        dropped = queue.truncate_dirty(start)
        if dropped:
            log.info(
                "consume queue %s/%d: %d entries rebuilt from commitlog offset %d",
                queue.topic,
                queue.queue_id,
                dropped,
                start,
            )
    index.truncate(end)
    return start


def _repair_queues(
    dispatcher: _Dispatcher,
    unloadable: list[str],
    end: int,
    store_dir: Path,
    extents: QueueExtents | None,
) -> dict[tuple[str, int], str]:
    """Check the consume queues against the log dispatched up to ``end`` (and the
    ``extents`` of the last clean stop) and rebuild those that do not match it, or whose
    files could not be loaded (``unloadable``, "topic/queue id"s): each with what was
    wrong, the ones dispatching rebuilt too."""
    reput = dispatcher.reput
    # (paused by a full disk: what is dispatched so far is checked, the rest waits)
    checked_to = reput.offset if dispatcher.paused else end
    problems = check_consume_queues(
        dispatcher.commitlog, dispatcher.queues, checked_to, reput.deletions, extents
    )
    for name in unloadable:  # (records anywhere in the log: the tail check may miss them)
        topic, _, queue_id = name.rpartition("/")
        problems.setdefault((topic, int(queue_id)), "its files could not be loaded")
    if problems:
        _rebuild_queues(dispatcher, problems, store_dir)
    problems.update(dispatcher.reset)
    return problems


def _log_recovered(dispatcher: _Dispatcher, *, clean: bool, start: int, end: int) -> None:
    """One line for every start; an error too if dispatching is paused short of ``end``."""
    segments, reput = dispatcher.commitlog.segments, dispatcher.reput
    log.info(
        "store recovered after a %s stop: commitlog [%d, %d), %d records dispatched from %d",
        "clean" if clean else "unclean",
        segments.min_offset,
        end,
        dispatcher.records,
        start,
    )
    if dispatcher.paused:
        log.error(
            "the store starts with dispatching paused at commitlog offset %d of %d (%s): "
            "what is dispatched is served, sends are refused until the rest is",
            reput.offset,
            end,
            reput.failure,
        )


def _report_damaged(commitlog: CommitLog, scan: Scan, dispatcher: _Dispatcher) -> None:
    """Copy the damaged records a crash scan passed over to torn/ and log each."""
    for offset, size, problem in scan.damaged:
        copy = _copy_damaged(dispatcher.torn_dir, offset, bytes(commitlog.read(offset, size)))
        log.error(
            "recovery: the damaged record [%d, %d) (%s) is passed over, not cut; "
            "copied to %s, the records after it are kept",
            offset,
            offset + size,
            problem,
            copy,
        )
        dispatcher.reported.add(offset)
