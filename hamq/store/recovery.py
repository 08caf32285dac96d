"""Recovery at start: find where the CommitLog really ends and rebuild what depends on it.

Two paths, chosen by the abort marker (``<store>/abort``, created at start and removed
by a clean stop):

- clean stop: trust the checkpoint. The CommitLog ends at its flushed offset, which
  a clean stop made the end of the log.
- crash: scan from the start of the segment holding the checkpoint's flushed offset,
  record by record, checking magic, sizes and body CRC, and each record's own
  PHYSICALOFFSET. The log ends at the first record that fails (or at zeros). Whatever
  lies after — the torn tail of that segment and any later segments — is copied aside
  under ``<store>/torn/`` before the log is cut there, and every cut is logged with its
  range. Nothing is dropped silently.

Then the consume queues and the index are brought in line: entries that point past the
end are dropped, and the records from the checkpoint's dispatched offset (or from
wherever the consume queues really end, if their files were deleted) are dispatched
again. Everything here blocks: MessageStore runs it in a worker thread before serving.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import attrs

from hamq.protocol.message import MessageFormatError, is_blank, read_record
from hamq.store.checkpoint import Checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.dispatcher import ConsumeQueueTable, ReputService
from hamq.store.files import fsync_directory, write_atomically
from hamq.store.index import IndexService
from hamq.store.segment import Segment, StoreCorruptionError

log = logging.getLogger(__name__)


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


def scan_commitlog(commitlog: CommitLog, from_offset: int) -> tuple[int, str | None]:
    """(end of the valid log, why the scan stopped there or None for a clean end)."""
    segments = commitlog.segments.segments
    if not segments:
        return 0, None
    first = commitlog.segments.find(from_offset)
    if first is None:
        # the checkpoint sits at the end of a full last segment: nothing after it to scan
        first = segments[-1] if from_offset >= segments[-1].end else segments[0]
        if from_offset >= first.end:
            return from_offset, None
    offset = first.start
    for segment in segments[segments.index(first) :]:
        if segment.start != offset:
            break  # the previous segment ended early: this one is after the end
        view = segment.view(0, segment.size)
        pos = 0
        while True:
            if segment.size - pos < 8:
                return segment.start + pos, "a segment ends without a blank marker"
            total = int.from_bytes(view[pos : pos + 4], "big", signed=True)
            if total == 0 and not any(view[pos : pos + 8]):
                return segment.start + pos, None  # zeros: the end of what was written
            if is_blank(view, pos):
                if total != segment.size - pos:
                    left = segment.size - pos
                    return segment.start + pos, (
                        f"blank marker says {total} bytes remain, the segment has {left}"
                    )
                offset = segment.end
                break
            try:
                info = read_record(view, pos, check_crc=True)
            except MessageFormatError as exc:
                return segment.start + pos, str(exc)
            if info.physical_offset != segment.start + pos:
                return segment.start + pos, (
                    f"record says it is at {info.physical_offset}, it is at {segment.start + pos}"
                )
            pos += info.size
    return offset, None


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


def recover(
    *,
    store_dir: Path,
    commitlog: CommitLog,
    queues: ConsumeQueueTable,
    index: IndexService,
    reput: ReputService,
    checkpoint: Checkpoint | None,
    clean: bool,
) -> RecoveryReport:
    """Load and recover everything; on return the store can serve, and ``reput`` has
    dispatched every record of the log."""
    commitlog.load()
    queues.load()
    index.load()
    segments = commitlog.segments
    reason: str | None = None
    truncated: tuple[int, int] | None = None
    copies: tuple[Path, ...] = ()
    if clean and checkpoint is None and not segments.empty:
        log.warning("no checkpoint in %s: scanning the commitlog as after a crash", store_dir)
        clean = False
    if segments.empty:
        end = 0
    elif clean:
        assert checkpoint is not None
        end = checkpoint.commitlog_flushed_offset
        last = segments.last
        assert last is not None
        if not segments.min_offset <= end <= last.end or any(
            s.start > end for s in segments.segments
        ):
            raise StoreCorruptionError(
                f"the checkpoint says the commitlog ends at {end}, but its segments cover "
                f"[{segments.min_offset}, {last.end}); remove {store_dir / 'checkpoint'} "
                f"to recover by scanning"
            )
        segments.set_end(end)
    else:
        scan_from = checkpoint.commitlog_flushed_offset if checkpoint else segments.min_offset
        end, reason = scan_commitlog(commitlog, scan_from)
        if written_past(commitlog, end):
            data_end = max(s.start + _last_nonzero(s, 0) for s in segments.segments)
            copies = cut_commitlog(commitlog, end, store_dir / "torn")
            truncated = (end, data_end)
            log.error(
                "crash recovery: commitlog cut at %d (%s); bytes [%d, %d) copied to %s",
                end,
                reason or "data after the end",
                end,
                data_end,
                ", ".join(str(c) for c in copies),
            )
        else:
            segments.set_end(end)
        # what survived a killed process may still be only in the page cache: make it
        # durable before the flush service counts it as flushed
        for segment in segments.segments:
            if segment.end > scan_from:
                segment.sync_data()
    # consume queues and index: drop what points past the end, dispatch from where they
    # are known to be complete (the checkpoint, or their real end if files were removed)
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
    reput.offset = start
    records = reput.dispatch_available()
    if reput.failure is not None:
        raise StoreCorruptionError(f"rebuilding the consume queues failed: {reput.failure}")
    for queue in queues.queues.values():
        queue.delete_expired(segments.min_offset)  # minimums follow the log's start
    commitlog.queue_offsets = {key: q.max_offset for key, q in queues.queues.items()}
    log.info(
        "store recovered after a %s stop: commitlog [%d, %d), %d records dispatched from %d",
        "clean" if clean else "unclean",
        segments.min_offset,
        end,
        records,
        start,
    )
    return RecoveryReport(
        clean=clean,
        commitlog_end=end,
        dispatched_from=start,
        records_dispatched=records,
        truncated=truncated,
        torn_copy=copies,
        bad_record=reason,
    )
