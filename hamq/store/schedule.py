"""Delay levels: messages with a DELAY property wait in SCHEDULE_TOPIC_XXXX until due.

On put, a message with ``DELAY=n`` (n >= 1, capped at the last level) is stored in
SCHEDULE_TOPIC_XXXX queue n-1 with its real topic and queue in REAL_TOPIC / REAL_QID;
the dispatcher gives its consume-queue entry the delivery time (store time + the
level's delay) as tags code. This service — run on a master only — keeps, per level,
the offset of the next entry to deliver; when an entry is due it stores a copy of the
message under its real topic and queue (DELAY removed, everything else kept, the
UNIQ_KEY included) and moves the offset on.

Delay offsets are persisted every ``delay_offset_persist_interval_s`` and at stop as
``config/delayOffset.json`` in RocketMQ's shape (``{"offsetTable": {"1": 5, ...}}``), which
is also the body of GET_ALL_DELAY_OFFSET for slaves. Times come from the store's clock
(ms), so tests drive them with Trio's MockClock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    StoredMessage,
)
from hamq.store.dispatcher import SCHEDULE_TOPIC, ConsumeQueueTable, DispatchRequest
from hamq.store.files import write_atomically

log = logging.getLogger(__name__)

#: how long to wait before trying a failed delivery again
RETRY_DELIVERY_S = 1.0


def load_delay_offsets(path: Path) -> dict[int, int]:
    """Offsets by level from ``delayOffset.json``; ValueError names a malformed file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    table = data.get("offsetTable") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ValueError(f"{path} has no offsetTable object")
    offsets = {}
    for level, offset in table.items():
        if not str(level).isdigit() or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"{path}: bad entry {level!r}: {offset!r}")
        offsets[int(level)] = offset
    return offsets


def encode_delay_offsets(offsets: dict[int, int]) -> bytes:
    return json.dumps(
        {"offsetTable": {str(level): offset for level, offset in sorted(offsets.items())}},
        separators=(",", ":"),
    ).encode()


class ScheduleService:
    def __init__(
        self,
        *,
        queues: ConsumeQueueTable,
        delay_levels_ms: tuple[int, ...],
        offsets_path: Path,
        clock: Callable[[], int],
        read_message: Callable[[int, int], StoredMessage],
        deliver: Callable[[StoredMessage, str, int, dict[str, str]], Awaitable[bool]],
        persist_interval_s: float,
    ) -> None:
        self.queues = queues
        self.delay_levels_ms = delay_levels_ms
        self.offsets_path = offsets_path
        self._clock = clock
        self._read_message = read_message
        self._deliver = deliver
        self._persist_interval_s = persist_interval_s
        self.offsets: dict[int, int] = load_delay_offsets(offsets_path)
        self._arrived = {level: trio.Event() for level in self.levels}
        self._persisted: dict[int, int] = dict(self.offsets)
        self.delivered = 0

    @property
    def levels(self) -> range:
        return range(1, len(self.delay_levels_ms) + 1)

    def on_dispatch(self, request: DispatchRequest) -> None:
        """Dispatch listener: wake the level a new delayed message joined."""
        if request.topic == SCHEDULE_TOPIC:
            event = self._arrived.get(request.queue_id + 1)
            if event is not None:
                event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for level in self.levels:
                    nursery.start_soon(self._deliver_level, level)
                nursery.start_soon(self._persist_loop)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.persist()

    async def persist(self) -> None:
        if self.offsets != self._persisted:
            snapshot = dict(self.offsets)
            await trio.to_thread.run_sync(
                write_atomically, self.offsets_path, encode_delay_offsets(snapshot)
            )
            self._persisted = snapshot

    async def _persist_loop(self) -> None:
        while True:
            await trio.sleep(self._persist_interval_s)
            try:
                await self.persist()
            except OSError:
                log.exception("persisting delay offsets failed; retrying")

    async def _deliver_level(self, level: int) -> None:
        delay_ms = self.delay_levels_ms[level - 1]
        while True:
            self._arrived[level] = arrived = trio.Event()
            queue = self.queues.get(SCHEDULE_TOPIC, level - 1)
            offset = self.offsets.get(level, 0)
            if queue is None or offset >= queue.max_offset:
                await arrived.wait()
                continue
            if offset < queue.min_offset:
                log.warning(
                    "delay level %d: offset %d was deleted, continuing at %d",
                    level,
                    offset,
                    queue.min_offset,
                )
                offset = self.offsets[level] = queue.min_offset
                continue
            entry = queue.entry(offset)
            assert entry is not None
            physical_offset, size, deliver_at = entry
            now = self._clock()
            if deliver_at > now + delay_ms:  # a clock that jumped back: wait one delay
                deliver_at = now + delay_ms
            if deliver_at > now:
                await trio.sleep((deliver_at - now) / 1000)
                continue
            if await self._deliver_one(level, physical_offset, size):
                self.offsets[level] = offset + 1
                self.delivered += 1
            else:
                await trio.sleep(RETRY_DELIVERY_S)

    async def _deliver_one(self, level: int, physical_offset: int, size: int) -> bool:
        try:
            message = self._read_message(physical_offset, size)
        except Exception:
            log.exception("delay level %d: cannot read the message at %d", level, physical_offset)
            return False
        properties = dict(message.properties)
        topic = properties.get(PROPERTY_REAL_TOPIC)
        queue_text = properties.get(PROPERTY_REAL_QUEUE_ID, "")
        if not topic or not queue_text.isdigit():
            log.error(
                "delay level %d: message at %d has no real topic/queue; skipped",
                level,
                physical_offset,
            )
            return True
        properties.pop(PROPERTY_DELAY, None)
        return await self._deliver(message, topic, int(queue_text), properties)
