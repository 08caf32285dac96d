"""The reput task: follows the CommitLog and builds consume queues and the index.

It reads records from ``offset`` on — written here (master) or replicated (slave) —
and for each one adds a consume-queue entry and index keys, then tells the listeners
(long polling, the delay scheduler). Invariants:
- ``offset`` only moves forward, one whole record (or one blank segment tail) at a
  time, and never past the CommitLog's end; a record not yet complete (a slave's
  replicated bytes can stop mid-record) is waited for, not reported;
- prepared and rolled-back transaction messages get no consume-queue entry, rolled-back
  ones no index keys (RocketMQ's rules);
- for SCHEDULE_TOPIC_XXXX the tags code is the delivery time: store time + the delay
  of the message's level;
- dispatching a record twice is harmless (consume queues and index skip what they have).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    MessageFormatError,
    decode_properties,
    is_blank,
    read_record,
    tags_code,
)
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ConsumeQueue
from hamq.store.index import IndexService

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

_I32 = struct.Struct(">i")


@attrs.frozen(slots=True)
class DispatchRequest:
    topic: str
    queue_id: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sys_flag: int
    properties: dict[str, str]


class ConsumeQueueTable:
    """Every consume queue of the store, by (topic, queue id), created on first use."""

    def __init__(self, root: Path, entries_per_file: int) -> None:
        self.root = root
        self.entries_per_file = entries_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    queue = self.get_or_create(topic_dir.name, int(queue_dir.name))
                    queue.load()

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self.queues.get(key)
        if queue is None:
            queue = ConsumeQueue(self.root, topic, queue_id, self.entries_per_file)
            self.queues[key] = queue
        return queue

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()


class ReputService:
    def __init__(
        self,
        commitlog: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService,
        delay_levels_ms: tuple[int, ...],
        *,
        offset: int = 0,
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.offset = offset
        #: store time of the last record dispatched (for the checkpoint)
        self.last_store_timestamp = 0
        self.listeners: list[Callable[[DispatchRequest], None]] = []
        self.failure: str | None = None
        self._wakeup = trio.Event()
        self._progress = trio.Event()

    def wake(self) -> None:
        """New bytes are in the CommitLog."""
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            # a fresh event before each pass: appends after it wake the next pass,
            # appends before it are in the CommitLog this pass reads
            self._wakeup = trio.Event()
            if self.dispatch_available(limit=4096) == 4096:
                await trio.lowlevel.checkpoint()  # a backlog: let others run between batches
                continue
            await self._wakeup.wait()

    async def wait_dispatched(self, offset: int) -> None:
        """Wait until every record before CommitLog ``offset`` is dispatched."""
        while self.offset < offset:
            await self._progress.wait()

    def dispatch_available(self, limit: int | None = None) -> int:
        """Dispatch the records that are complete in the CommitLog; returns how many."""
        done = 0
        while (limit is None or done < limit) and self.failure is None:
            request = self._next()
            if request is None:
                break
            self._dispatch(request)
            done += 1
        if done:
            progress, self._progress = self._progress, trio.Event()
            progress.set()
        return done

    def _next(self) -> DispatchRequest | None:
        while True:
            segment = self.commitlog.segments.find(self.offset)
            if segment is None:
                return None
            pos = self.offset - segment.start
            if pos >= segment.wrote:
                return None
            buffer = segment.buffer
            if is_blank(buffer, pos):
                if segment.wrote < segment.size:
                    return None  # the rest of the blank tail has not arrived yet
                self.offset = segment.end
                continue
            if segment.wrote - pos < 4 or _I32.unpack_from(buffer, pos)[0] > segment.wrote - pos:
                return None  # the record is not complete yet
            try:
                info = read_record(segment.view(0, segment.wrote), pos, check_crc=False)
            except MessageFormatError as exc:
                self.failure = f"record at commitlog offset {self.offset} is damaged: {exc}"
                log.error("reput stopped: %s", self.failure)
                return None
            properties = decode_properties(info.properties)
            if info.topic == SCHEDULE_TOPIC:
                code = info.store_timestamp + self._delay_ms(properties)
            else:
                code = tags_code(properties.get(PROPERTY_TAGS))
            return DispatchRequest(
                topic=info.topic,
                queue_id=info.queue_id,
                physical_offset=self.offset,
                size=info.size,
                tags_code=code,
                store_timestamp=info.store_timestamp,
                queue_offset=info.queue_offset,
                sys_flag=info.sys_flag,
                properties=properties,
            )

    def _delay_ms(self, properties: dict[str, str]) -> int:
        try:
            level = int(properties.get(PROPERTY_DELAY, "1"))
        except ValueError:
            level = 1
        level = min(max(level, 1), len(self.delay_levels_ms))
        return self.delay_levels_ms[level - 1]

    def _dispatch(self, request: DispatchRequest) -> None:
        transaction = request.sys_flag & SYSFLAG_TRANSACTION_MASK
        if transaction not in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK):
            queue = self.queues.get_or_create(request.topic, request.queue_id)
            queue.put(
                request.queue_offset, request.physical_offset, request.size, request.tags_code
            )
        if transaction != SYSFLAG_TRANSACTION_ROLLBACK:
            keys = [k for k in request.properties.get(PROPERTY_KEYS, "").split(" ") if k]
            uniq_key = request.properties.get(PROPERTY_UNIQ_KEY)
            if uniq_key:
                keys.append(uniq_key)
            self.index.add(request.topic, keys, request.physical_offset, request.store_timestamp)
        self.offset = request.physical_offset + request.size
        self.last_store_timestamp = request.store_timestamp
        for listener in self.listeners:
            try:
                listener(request)
            except Exception:
                log.exception("dispatch listener failed for %s", request)
