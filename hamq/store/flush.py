"""Flushing: CommitLog to disk (async or group commit), queues and index, checkpoint.

- ASYNC_FLUSH: the CommitLog is fsynced every ``flush_interval_commitlog_s`` (500 ms).
- SYNC_FLUSH: group commit. A put that must be on disk asks for a flush and waits;
  one fsync covers everything appended before it started, so concurrent puts share it.
  Puts that do not wait are covered by the same rounds or by the periodic flush.
- every ``flush_interval_consume_queue_s`` (1 s): the CommitLog, then consume queues
  and index files are fsynced, then the checkpoint is written. The checkpoint's
  dispatched offset is read before the queues are flushed, so it never claims more
  than is on disk.

Every fsync runs in a worker thread; ``flushed_offset`` only grows (except through
``reset`` after a truncation).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import trio

from hamq.store.checkpoint import Checkpoint, save_checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.config import FlushDiskType, StoreConfig
from hamq.store.consume_queue import ConsumeQueueTable
from hamq.store.index import IndexFile, IndexService
from hamq.store.offset_waiters import OffsetWaiters
from hamq.store.reput import ReputService
from hamq.store.segment import Segment

log = logging.getLogger(__name__)


def _dirty(segments: list[Segment]) -> list[tuple[Segment, int]]:
    """(segment, bytes written) of each segment with changes not yet on disk; the
    ``needs_sync`` flag is taken here, so changes made during the sync set it again."""
    dirty = []
    for segment in segments:
        if segment.dirty:
            dirty.append((segment, segment.wrote))
            segment.needs_sync = False
    return dirty


async def _sync(segments: list[tuple[Segment, int]], index_files: Sequence[IndexFile] = ()) -> None:
    """fsync the segments (and index files) in a worker thread, then record that what
    they held when taken is on disk — never more than they hold now, should a
    truncation have cut one meanwhile. A failed sync marks them for the next round.
    Nothing to sync: no thread is started."""
    if not segments and not index_files:
        return

    def sync() -> None:
        for segment, _wrote in segments:
            segment.sync_data()
        for index_file in index_files:
            index_file.sync_data()

    try:
        await trio.to_thread.run_sync(sync)
    except BaseException:
        for segment, _wrote in segments:
            segment.needs_sync = True
        raise
    for segment, wrote in segments:
        segment.flushed = min(max(segment.flushed, wrote), segment.wrote)


class FlushService:
    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService,
        reput: ReputService,
        *,
        checkpoint: Checkpoint,
        confirm_offset: Callable[[], int] = lambda: 0,
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.reput = reput
        self.checkpoint = checkpoint
        self._confirm_offset = confirm_offset
        self.flushed_offset = commitlog.max_offset
        self.flushed_timestamp = checkpoint.physic_msg_timestamp
        self._flush_requested = trio.Event()
        #: SYNC_FLUSH puts waiting for their fsync (durability.py)
        self._waiters = OffsetWaiters()
        self._waiters.reached(self.flushed_offset)
        self._truncations = 0
        self._commitlog_lock = trio.Lock()
        self._checkpoint_lock = trio.Lock()
        self.rounds = 0

    # ------------------------------------------------------------------ CommitLog
    async def flush_commitlog(self) -> int:
        """fsync every segment with unflushed data; returns the new flushed offset."""
        async with self._commitlog_lock:
            target = self.commitlog.max_offset
            timestamp = self.reput.last_store_timestamp
            truncations = self._truncations
            dirty = _dirty(self.commitlog.segments.segments)
            if dirty:
                await _sync(dirty)
            # a truncation during the sync moved the end back: this round proves nothing
            if target > self.flushed_offset and truncations == self._truncations:
                self.flushed_offset = target
                self.flushed_timestamp = max(self.flushed_timestamp, timestamp)
            self.rounds += 1
            return self.flushed_offset

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """No flush runs while the block does (for cutting or deleting files)."""
        async with self._checkpoint_lock, self._commitlog_lock:
            yield

    def notify_flushed(
        self, end_offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> None:
        """``callback(True)`` once the CommitLog is on disk up to ``end_offset`` (at once
        if it is), ``callback(False)`` when ``timeout_s`` passes first (SYNC_FLUSH puts:
        durability.py). The data stays either way."""
        if self.flushed_offset >= end_offset:
            callback(True)
            return
        self._waiters.notify(end_offset, callback, timeout_s)
        self._flush_requested.set()

    def _release_flushed(self) -> None:
        """Answer every waiter the flushed offset now covers; flush again for the rest."""
        self._waiters.reached(self.flushed_offset)
        if self._waiters.pending:
            self._flush_requested.set()

    def reset(self, offset: int) -> None:
        """After a truncation: nothing past ``offset`` is flushed."""
        self._truncations += 1
        self.flushed_offset = min(self.flushed_offset, offset)
        self._waiters.reset(self.flushed_offset)

    async def _commitlog_loop(self) -> None:
        sync = self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        interval = self.config.flush_interval_commitlog_s
        while True:
            if sync:
                with trio.move_on_after(interval):
                    await self._flush_requested.wait()
                self._flush_requested = trio.Event()
            else:
                await trio.sleep(interval)
            try:
                await self.flush_commitlog()
            except OSError:
                log.exception("commitlog flush failed; retrying")
            self._release_flushed()

    # ------------------------------------------------------------------ the rest
    async def flush_queues_and_checkpoint(self) -> Checkpoint:
        """Flush the CommitLog, consume queues and index, then save the checkpoint."""
        async with self._checkpoint_lock:
            return await self._flush_queues_and_checkpoint()

    async def _flush_queues_and_checkpoint(self) -> Checkpoint:
        dispatched = self.reput.offset
        logics_timestamp = self.reput.last_store_timestamp
        await self.flush_commitlog()
        dirty = _dirty(
            [
                segment
                for queue in self.queues.queues.values()
                for segment in queue.segments.segments
            ]
        )
        index_files = self.index.dirty_files()
        for index_file in index_files:
            index_file.dirty = False

        try:
            await _sync(dirty, index_files)
        except BaseException:
            for index_file in index_files:
                index_file.dirty = True  # not synced: the next round tries again
            raise
        checkpoint = Checkpoint(
            commitlog_flushed_offset=self.flushed_offset,
            dispatched_offset=min(dispatched, self.flushed_offset),
            physic_msg_timestamp=self.flushed_timestamp,
            logics_msg_timestamp=logics_timestamp,
            confirm_offset=self._confirm_offset(),
        )
        if checkpoint != self.checkpoint:
            await trio.to_thread.run_sync(
                save_checkpoint, self.config.store_dir / "checkpoint", checkpoint
            )
            self.checkpoint = checkpoint
        return checkpoint

    async def _queue_loop(self) -> None:
        while True:
            await trio.sleep(self.config.flush_interval_consume_queue_s)
            try:
                await self.flush_queues_and_checkpoint()
            except OSError:
                log.exception("consume queue flush or checkpoint failed; retrying")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._commitlog_loop)
            await nursery.start(self._waiters.run)
            nursery.start_soon(self._queue_loop)
            task_status.started()
