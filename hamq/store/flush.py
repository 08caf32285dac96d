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

import logging
from collections.abc import Callable

import trio

from hamq.store.checkpoint import Checkpoint, save_checkpoint
from hamq.store.commitlog import CommitLog
from hamq.store.config import FlushDiskType, StoreConfig
from hamq.store.dispatcher import ConsumeQueueTable, ReputService
from hamq.store.index import IndexService
from hamq.store.segment import Segment

log = logging.getLogger(__name__)


def _sync_segments(segments: list[tuple[Segment, int]]) -> None:
    for segment, _target in segments:
        segment.sync_data()


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
        self._round_done = trio.Event()
        self._commitlog_lock = trio.Lock()
        self._checkpoint_lock = trio.Lock()
        self.rounds = 0

    # ------------------------------------------------------------------ CommitLog
    async def flush_commitlog(self) -> int:
        """fsync every segment with unflushed data; returns the new flushed offset."""
        async with self._commitlog_lock:
            target = self.commitlog.max_offset
            timestamp = self.reput.last_store_timestamp
            dirty = [(s, s.wrote) for s in self.commitlog.segments.segments if s.flushed < s.wrote]
            if dirty:
                await trio.to_thread.run_sync(_sync_segments, dirty)
                for segment, wrote in dirty:
                    segment.flushed = max(segment.flushed, wrote)
            if target > self.flushed_offset:
                self.flushed_offset = target
                self.flushed_timestamp = max(self.flushed_timestamp, timestamp)
            self.rounds += 1
            return self.flushed_offset

    async def wait_flushed(self, end_offset: int, timeout_s: float) -> bool:
        """Wait until the CommitLog is on disk up to ``end_offset`` (SYNC_FLUSH puts);
        False when ``timeout_s`` passes first. The data stays either way."""
        if self.flushed_offset >= end_offset:
            return True
        with trio.move_on_after(timeout_s):
            while self.flushed_offset < end_offset:
                done = self._round_done
                self._flush_requested.set()
                await done.wait()
            return True
        return False

    def reset(self, offset: int) -> None:
        """After a truncation: nothing past ``offset`` is flushed."""
        self.flushed_offset = min(self.flushed_offset, offset)

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
            finally:
                done, self._round_done = self._round_done, trio.Event()
                done.set()

    # ------------------------------------------------------------------ the rest
    async def flush_queues_and_checkpoint(self) -> Checkpoint:
        """Flush the CommitLog, consume queues and index, then save the checkpoint."""
        async with self._checkpoint_lock:
            return await self._flush_queues_and_checkpoint()

    async def _flush_queues_and_checkpoint(self) -> Checkpoint:
        dispatched = self.reput.offset
        logics_timestamp = self.reput.last_store_timestamp
        await self.flush_commitlog()
        dirty = [
            (segment, segment.wrote)
            for queue in self.queues.queues.values()
            for segment in queue.segments.segments
            if segment.flushed < segment.wrote
        ]
        index_files = self.index.dirty_files()
        for index_file in index_files:
            index_file.dirty = False

        def sync() -> None:
            _sync_segments(dirty)
            for index_file in index_files:
                index_file.sync_data()

        await trio.to_thread.run_sync(sync)
        for segment, wrote in dirty:
            segment.flushed = max(segment.flushed, wrote)
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
            nursery.start_soon(self._queue_loop)
            task_status.started()
