"""Delay levels: messages with a DELAY property wait in SCHEDULE_TOPIC_XXXX until due.

On put, a message with ``DELAY=n`` (n >= 1, capped at the last level) is stored in
SCHEDULE_TOPIC_XXXX queue n-1 with its real topic and queue in REAL_TOPIC / REAL_QID;
the dispatcher gives its consume-queue entry the delivery time (store time + the
level's delay) as tags code. This service — run on a master only — keeps, per level,
the offset of the next entry to deliver; when an entry is due it stores a copy of the
message under its real topic and queue (DELAY removed, everything else kept, the
UNIQ_KEY included) and moves the offset on. A refusal that cannot pass (the message
is illegal) is logged and skipped; a passing one (the store is busy) is retried.

Delay offsets are persisted — only as far as the delivered copies are flushed — every
``delay_offset_persist_interval_s`` and at stop as
``config/delayOffset.json`` in RocketMQ's shape (``{"offsetTable": {"1": 5, ...}}``), which
is also the body of GET_ALL_DELAY_OFFSET for slaves. Times come from the store's clock
(ms), so tests drive them with Trio's MockClock. The file keeps its previous content
as ``delayOffset.json.bak``, used (with a warning) when the file is damaged
(hamq/store/checkpoint.py ``load_with_backup``). A delayed message whose record is
damaged (it does not decode) is logged and skipped, as a pull skips it.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    StoredMessage,
)
from hamq.store.checkpoint import load_with_backup, save_with_backup
from hamq.store.reput import ConsumeQueueTable, DispatchRequest
from hamq.store.segment import StoreError

log = logging.getLogger(__name__)

#: how long to wait before trying a failed delivery again
RETRY_DELIVERY_S = 1.0


def load_delay_offsets(path: Path) -> dict[int, int]:
    """Offsets by level from ``delayOffset.json`` (or its backup if it is damaged);
    MetadataFileError (a StoreError) names a file that is damaged without a backup."""
    return load_with_backup(path, decode_delay_offsets) or {}


def decode_delay_offsets(data: bytes) -> dict[int, int]:
    """Offsets by level from RocketMQ's ``{"offsetTable": {"1": 5, ...}}`` (the file, and
    GET_ALL_DELAY_OFFSET's body); ValueError names what is wrong."""
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    table = parsed.get("offsetTable") if isinstance(parsed, dict) else None
    if not isinstance(table, dict):
        raise ValueError("no offsetTable object")
    offsets = {}
    for level, offset in table.items():
        if not str(level).isdigit() or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"bad entry {level!r}: {offset!r}")
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
        deliver: Callable[[StoredMessage, str, int, dict[str, str]], Awaitable[int | None]],
        persist_interval_s: float,
        flushed_offset: Callable[[], int],
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
        self._flushed_offset = flushed_offset
        #: per level, (offset after a delivered entry, end of its copy) not yet flushed
        self._unflushed: dict[int, collections.deque[tuple[int, int]]] = {
            level: collections.deque() for level in self.levels
        }
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

    def correct_offsets(self) -> None:
        """Move offsets that are past their queue's end back to it (offsets copied from
        another broker, or a log cut after they were saved), as RocketMQ's
        ``correctDelayOffset`` does. Call it before new delayed messages arrive: at start
        and right after a truncation."""
        for level in self.levels:
            queue = self.queues.get(SCHEDULE_TOPIC, level - 1)
            end = queue.max_offset if queue is not None else 0
            offset = self.offsets.get(level, 0)
            if offset > end:
                log.warning(
                    "delay level %d: offset %d is past the queue's end %d; continuing there",
                    level,
                    offset,
                    end,
                )
                self.offsets[level] = end
                self._unflushed[level].clear()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.correct_offsets()
        try:
            async with trio.open_nursery() as nursery:
                for level in self.levels:
                    nursery.start_soon(self._deliver_level, level)
                nursery.start_soon(self._persist_loop)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.persist()

    def durable_offsets(self) -> dict[int, int]:
        """Offsets as far as the delivered copies are on disk: after a power loss the
        copies past ``flushed_offset`` may be gone, and must be delivered again."""
        flushed = self._flushed_offset()
        durable = dict(self.offsets)
        for level, pending in self._unflushed.items():
            while pending and pending[0][1] <= flushed:
                pending.popleft()
            if pending:
                durable[level] = pending[0][0] - 1
        return durable

    async def persist(self) -> None:
        snapshot = self.durable_offsets()
        if snapshot != self._persisted:
            await trio.to_thread.run_sync(
                save_with_backup, self.offsets_path, encode_delay_offsets(snapshot)
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
            outcome = await self._deliver_one(level, physical_offset, size)
            if outcome is None:
                await trio.sleep(RETRY_DELIVERY_S)  # a passing refusal: try again
                continue
            self.offsets[level] = offset + 1
            if outcome >= 0:
                self.delivered += 1
                self._unflushed[level].append((offset + 1, outcome))

    async def _deliver_one(self, level: int, physical_offset: int, size: int) -> int | None:
        """Store the message due at ``physical_offset`` under its real topic. Returns the
        end offset of the copy, -1 if it can never be delivered (skipped, logged), or
        None if it should be tried again."""
        try:
            message = self._read_message(physical_offset, size)
        except OSError:  # (a file that cannot be mapped now: tried again)
            log.exception("delay level %d: cannot read the message at %d", level, physical_offset)
            return None
        except StoreError as exc:  # a damaged record: it will not read better later
            log.error(
                "delay level %d: skipped the damaged message at %d: %s", level, physical_offset, exc
            )
            return -1
        except Exception:
            log.exception("delay level %d: cannot read the message at %d", level, physical_offset)
            return None
        properties = dict(message.properties)
        topic = properties.get(PROPERTY_REAL_TOPIC)
        queue_text = properties.get(PROPERTY_REAL_QUEUE_ID, "")
        if not topic or not queue_text.isdigit():
            log.error(
                "delay level %d: message at %d has no real topic/queue; skipped",
                level,
                physical_offset,
            )
            return -1
        properties.pop(PROPERTY_DELAY, None)
        return await self._deliver(message, topic, int(queue_text), properties)
