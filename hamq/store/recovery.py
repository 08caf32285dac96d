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
again (hamq/store/redispatch.py). A damaged record met while dispatching is passed over
the same way (by the reput task, hamq/store/reput.py; copied to torn/); its consume
queue entry (RocketMQ's queue offsets have no gaps) points at it, for pulls to skip. A
disk error while dispatching (a full disk) does not stop the start: the store runs with
dispatching paused there (``RecoveryReport.paused``), serves what is dispatched,
refuses sends, and its reput task finishes the rest once there is room.

Last, the consume queues themselves (hamq/store/queue_check.py): those that do not match
the log or the last clean stop are rebuilt, and the queue offsets handed out for records
no longer in the log are kept by placeholder records, so that none is handed out twice.
``recover`` runs the steps in that order and says what it did in a ``RecoveryReport``.

Everything here blocks: MessageStore runs it in a worker thread before serving.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import attrs

from hamq.protocol.record import is_blank
from hamq.store.checkpoint import Checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ConsumeQueueTable
from hamq.store.extents import QueueExtents
from hamq.store.files import fsync_directory, write_atomically
from hamq.store.index import IndexService
from hamq.store.queue_check import (
    keep_lost_offsets,
    lost_entries,
    remove_unloadable_queues,
    repair_queues,
    tail_start,
)
from hamq.store.records import isolated_damage, scan_problem
from hamq.store.redispatch import Dispatcher, copy_damaged, unused_path
from hamq.store.reput import ReputService
from hamq.store.segment import Segment, StoreCorruptionError

log = logging.getLogger(__name__)

#: after a clean stop, the records in this much of the log's end are checked whole
#: (sizes, body CRC, their own offset) before the checkpoint's end is trusted
CLEAN_TAIL_SCAN_BYTES = 4 * 1024 * 1024


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
            target = unused_path(torn_dir / f"{end:020d}.tail")
            write_atomically(target, bytes(holder.view(pos, stop - pos)))
            copies.append(target)
            holder.zero(pos, stop)
            holder.sync_data()  # the cut is on disk before anything relies on it
    for segment in reversed(later):  # newest first: a crash part way leaves no gap
        if _last_nonzero(segment, 0) > 0:
            segment.close()
            target = unused_path(torn_dir / f"{segment.path.name}.segment")
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
    the log or the last clean stop's ``extents`` (``repair_queues``); and keep the queue
    offsets handed out for records that are gone (``keep_lost_offsets``)."""
    commitlog.load()
    reput.deletions.load()
    unloadable = remove_unloadable_queues(queues.root, queues.entries_per_file)
    queues.load()
    index.load()
    segments = commitlog.segments
    space_end = segments.last.end if segments.last is not None else 0
    dispatcher = Dispatcher(commitlog, queues, reput, store_dir / "torn")
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
    kept = keep_lost_offsets(dispatcher, lost)
    # (the placeholders kept are the log's end now)
    problems = repair_queues(dispatcher, unloadable, segments.max_offset, store_dir, extents)
    if extents is not None and problems and not dispatcher.paused:
        # (rebuilt queues keep the offsets they had handed out)
        kept |= keep_lost_offsets(dispatcher, {}, extents.standing(reput.deletions))
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
    commitlog: CommitLog, checkpoint: Checkpoint | None, dispatcher: Dispatcher
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


def _end_log(commitlog: CommitLog, found: _LogEnd, dispatcher: Dispatcher, what: str) -> _LogEnd:
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
    commitlog: CommitLog, queues: ConsumeQueueTable, end: int, dispatcher: Dispatcher
) -> _LogEnd:
    """After a clean stop, the log's last CLEAN_TAIL_SCAN_BYTES before the checkpoint's
    ``end`` checked whole, as a crash scan checks records: a damaged record between whole
    ones is passed over (copied to torn/), a damaged tail is cut there (copied to torn/
    first), and either is logged as an error. The log's end, cut or not.

    A clean stop wrote everything up to ``end``: zeros or damage before it mean the
    files were damaged since (by a disk, or by hand), not a crash; the store deals with
    them as crash recovery would rather than refuse to start."""
    start = tail_start(commitlog, queues, end, CLEAN_TAIL_SCAN_BYTES)
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


def _log_recovered(dispatcher: Dispatcher, *, clean: bool, start: int, end: int) -> None:
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


def _report_damaged(commitlog: CommitLog, scan: Scan, dispatcher: Dispatcher) -> None:
    """Copy the damaged records a crash scan passed over to torn/ and log each."""
    for offset, size, problem in scan.damaged:
        copy = copy_damaged(dispatcher.torn_dir, offset, bytes(commitlog.read(offset, size)))
        log.error(
            "recovery: the damaged record [%d, %d) (%s) is passed over, not cut; "
            "copied to %s, the records after it are kept",
            offset,
            offset + size,
            problem,
            copy,
        )
        dispatcher.reported.add(offset)
