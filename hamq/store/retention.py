"""Retention: delete the oldest CommitLog segments once nobody needs them.

Every ``clean_interval_s`` the oldest segment is deleted when all of these hold, and
then the next one is considered (deletion is always oldest first):
- it is not the last segment (the one being written);
- it was last written more than ``file_reserved_time_h`` ago (72 h by default);
- it is on disk and dispatched (flushed and built into consume queues);
- ``floor()`` — the lowest CommitLog offset the broker still needs (its replicas'
  acknowledged offsets) — is at or past its end. Consumers do not hold segments back,
  as in RocketMQ: a group that lags past the oldest segment moves on to the oldest
  message kept (its pulls are answered with the new minimum).

Then consume-queue files and index files that only point below the CommitLog's new
start are deleted too, and every queue's ``min_offset`` moves past entries whose
records are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import trio

from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ConsumeQueueTable
from hamq.store.index import IndexService
from hamq.store.reput import ReputService

log = logging.getLogger(__name__)


class RetentionService:
    def __init__(
        self,
        *,
        commitlog: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService,
        reput: ReputService,
        clock: Callable[[], int],
        floor: Callable[[], int],
        reserved_ms: int,
        interval_s: float,
        exclusive: Callable[[], AbstractAsyncContextManager[None]],
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.reput = reput
        self._clock = clock
        self._floor = floor
        self.reserved_ms = reserved_ms
        self.interval_s = interval_s
        self._exclusive = exclusive
        self.segments_deleted = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.delete_expired()
            except OSError:
                log.exception("retention pass failed; retrying")

    async def delete_expired(self) -> int:
        """One retention pass; returns how many CommitLog segments it deleted.

        Runs with flushing held off, so no file is closed while a worker thread syncs it.
        """
        async with self._exclusive():
            return self._delete_expired()

    def _delete_expired(self) -> int:
        segments = self.commitlog.segments
        now = self._clock()
        floor = self._floor()
        deleted = 0
        while len(segments.segments) > 1:
            oldest = segments.segments[0]
            age_ms = now - oldest.mtime() * 1000
            if age_ms <= self.reserved_ms:
                break
            if oldest.dirty or self.reput.offset < oldest.end:
                break
            if floor < oldest.end:
                log.info(
                    "segment %s is past its retention time but still needed up to offset %d",
                    oldest.path.name,
                    floor,
                )
                break
            segments.remove_first()
            deleted += 1
            log.info(
                "deleted commitlog segment %s (%.1f h old); commitlog now starts at %d",
                oldest.path.name,
                age_ms / 3_600_000,
                segments.min_offset,
            )
        if deleted:
            self.segments_deleted += deleted
            minimum = self.commitlog.min_offset
            for queue in self.queues.queues.values():
                queue.delete_expired(minimum)
            self.index.delete_expired(minimum)
        return deleted
