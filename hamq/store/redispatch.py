"""Recovery's dispatch passes: the records of the CommitLog into the consume queues and
the index, from an offset to the log's end, at start before the store serves.

``Dispatcher.run`` drives the reput task (hamq/store/reput.py) to the log's end. The
reput task passes over a damaged record itself (the log's end is known); here each one
is copied to ``<store>/torn/<offset>.damaged`` (``copy_damaged``: once, however often
it is met) and logged. A queue whose entry conflicts with the log is emptied and
dispatched again from the log's start, once per queue (``reset`` says which, and why).
A disk error (a full disk) ends the pass without failing: the store starts with
dispatching paused there (``paused``), and the reput task's retries finish it. Any other
failure that cannot be passed over is a StoreCorruptionError: the store must not start.

Copies under torn/ never overwrite each other (``unused_path``). Everything here
blocks: recovery runs in a worker thread.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs

from hamq.protocol.message import MessageFormatError
from hamq.protocol.record import read_record
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from hamq.store.files import write_atomically
from hamq.store.reput import ReputService
from hamq.store.segment import StoreCorruptionError

log = logging.getLogger(__name__)


def unused_path(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``... whichever does not exist: copies of torn
    data from different crashes never overwrite each other."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def copy_damaged(torn_dir: Path, offset: int, data: bytes) -> Path:
    """``torn/<offset>.damaged`` holding ``data`` (written unless an identical copy is
    there: a record met again at the next start is not copied twice)."""
    target = torn_dir / f"{offset:020d}.damaged"
    if target.exists() and target.read_bytes() == data:
        return target
    target = unused_path(target)
    write_atomically(target, data)
    return target


@attrs.define
class Dispatcher:
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
        copy = copy_damaged(self.torn_dir, offset, bytes(self.commitlog.read(offset, size)))
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
