"""The consume queues at start, against the CommitLog: judged, rebuilt when they do not
match, and the queue offsets they handed out kept.

A consume queue is derived data: each entry (CommitLog offset, size, tag code) stands
for one record of the log, its queue offset the entry's index. Recovery
(hamq/store/recovery.py) finds the log's end and dispatches what the queues lack; this
module then answers for the queues themselves:

- Which are wrong (``check_consume_queues``): a queue whose files do not load (those
  are removed first, ``remove_unloadable_queues``), whose files show empty entries at
  their ends or offsets going back, whose last entry does not point at the record it
  should, that ends before or starts after a record of it in the last TAIL_CHECK_BYTES
  of the log, that holds less than the last clean stop recorded of it
  (config/queueExtents.json, hamq/store/extents.py: zeroed or deleted files anywhere),
  or that still holds entries of its topic from before the topic's deletion
  (hamq/store/deletions.py). The check reads the queue files (two entries each), one
  record header per queue, and the log's tail in order: it stays cheap on a big store.
- Rebuilding them (``repair_queues``): each wrong queue is emptied and the whole log
  dispatched again (the other queues skip what they have), as deleting consumequeue/
  does, and logged: otherwise new sends would reuse its queue offsets.
- Queue offsets are never handed out twice. Entries whose records are no longer in the
  log (cut after a crash, or damaged after a clean stop: ``lost_entries``, a sane run
  of them only) gave out queue offsets a consumer may have read; each such offset is
  kept by a placeholder record appended to the log (PROPERTY_LOST, empty body, logged
  as an error: ``keep_lost_offsets``) before the store serves, and pulls pass over
  them. So is a rebuilt queue's offset up to what the last clean stop recorded of it.
  Not while dispatching is paused by a full disk: the queues' ends are not known then
  (logged).

``tail_start`` (where a record starts near the log's end, found through the queues) is
shared with recovery's check of a cleanly stopped log's tail. Everything here blocks:
recovery runs in a worker thread.
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
    encode_properties,
    topic_error,
)
from hamq.protocol.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2, RECORD_HEAD, make_record_template
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ENTRY_SIZE, ConsumeQueue, ConsumeQueueTable
from hamq.store.deletions import TopicDeletions
from hamq.store.extents import Extent, QueueExtents
from hamq.store.records import MIN_RECORD_BYTES, fields
from hamq.store.redispatch import Dispatcher
from hamq.store.segment import StoreCorruptionError, StoreError

log = logging.getLogger(__name__)

#: the start-up check compares every record in this much of the log's end with the
#: consume queues (a queue that lost entries further back is not noticed: delete
#: consumequeue/ to rebuild them all)
TAIL_CHECK_BYTES = 16 * 1024 * 1024
#: the most queue offsets recovery keeps for one queue's lost records (placeholders)
MAX_LOST_PER_QUEUE = 1_000_000
#: a queue file's name: its first byte's offset in the queue, 20 digits
_SEGMENT_NAME = re.compile(r"\d{20}")


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


def tail_start(commitlog: CommitLog, queues: ConsumeQueueTable, end: int, window: int) -> int:
    """Where a record starts at or just after ``end - window``: a segment's start or a
    queue entry's record (checked to say it is there). The tail check passes
    TAIL_CHECK_BYTES, read when it runs."""
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
    start = tail_start(commitlog, queues, end, TAIL_CHECK_BYTES)
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


def repair_queues(
    dispatcher: Dispatcher,
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


def _rebuild_queues(
    dispatcher: Dispatcher, problems: dict[tuple[str, int], str], store_dir: Path
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


def keep_lost_offsets(
    dispatcher: Dispatcher,
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
