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

**Clocks.** The delivery time in a consume-queue entry is a wall-clock time, often
written by another clock (the old master's, before a failover) or before this clock
was set back. It is read once per entry, when the entry comes to the head of its level
queue, and turned into a due time on Trio's clock (monotonic): the time the entry says
is left, but never more than the level's delay from when this run first knew of the
entry (``SeenMarks``: when it was dispatched, or the schedule's start for entries
stored before). A delivery time in the future by an hour — a broker restarted with its
clock an hour behind, a new master whose clock is behind the old one's, a clock set
back while running — thus delays a message by at most its level's delay from when this
run saw it (plus SEEN_GRAIN_S), never until the clock catches up; the due time is not
read again from the wall clock while waiting for it. A level queue stays FIFO: an
entry waits for those before it, but they were seen no later than it was, so they are
due no later than the level's delay after it was seen, and so is it. A clock ahead of
the one that stamped an entry brings its delivery forward, by at most the skew
(RocketMQ's ``correctDeliverTimestamp`` delivers an entry due beyond now + its delay
at once: that would deliver a whole level at once after a clock was set back).
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
)
from hamq.protocol.record import StoredMessage
from hamq.store.checkpoint import load_with_backup, save_with_backup
from hamq.store.consume_queue import ConsumeQueueTable
from hamq.store.reput import DispatchRequest
from hamq.store.segment import StoreError

log = logging.getLogger(__name__)

#: how long to wait before trying a failed delivery again
RETRY_DELIVERY_S = 1.0
#: entries dispatched within this long of each other share a seen-time (the latest)
SEEN_GRAIN_S = 1.0


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


class SeenMarks:
    """When this run first knew of the entries of one level queue, as marks
    (end, first, last) in offset order: the entries below ``end`` and not below the mark
    before it were first known between Trio times ``first`` and ``last`` (s), and count
    as seen at ``last``. A mark takes in new entries while they come within SEEN_GRAIN_S
    of its ``first``, so an entry counts as seen at most SEEN_GRAIN_S late, never early,
    and there is one mark per SEEN_GRAIN_S of waiting entries at most."""

    def __init__(self) -> None:
        self._marks: collections.deque[tuple[int, float, float]] = collections.deque()

    def saw(self, end: int, at: float) -> None:
        """The entries below ``end`` are known at Trio time ``at`` (never earlier than
        the previous call's)."""
        marks = self._marks
        if marks and end <= marks[-1][0]:
            return  # (known before)
        if marks and at - marks[-1][1] < SEEN_GRAIN_S:
            marks[-1] = (end, marks[-1][1], at)
        else:
            marks.append((end, at, at))

    def seen(self, offset: int) -> float | None:
        """When entry ``offset`` counts as seen; None if no mark covers it. Forgets the
        marks of the entries before ``offset`` (call it with offsets that only grow)."""
        marks = self._marks
        while marks and marks[0][0] <= offset:
            marks.popleft()
        return marks[0][2] if marks else None

    def clear(self) -> None:
        self._marks.clear()


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
        #: per level, when this run first knew of each entry (see "Clocks")
        self._seen = {level: SeenMarks() for level in self.levels}
        #: per level, the entry at its head: (queue offset, due time on Trio's clock)
        self._heads: dict[int, tuple[int, float]] = {}

    @property
    def levels(self) -> range:
        return range(1, len(self.delay_levels_ms) + 1)

    def on_dispatch(self, request: DispatchRequest) -> None:
        """Dispatch listener: note when the entry was seen, wake the level it joined."""
        if request.topic == SCHEDULE_TOPIC:
            level = request.queue_id + 1
            event = self._arrived.get(level)
            if event is not None:
                self._seen[level].saw(request.queue_offset + 1, trio.current_time())
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
                self._seen[level].clear()  # (the entries there now are new ones)
                self._heads.pop(level, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.correct_offsets()
        now = trio.current_time()
        for level in self.levels:  # the entries stored before: seen now
            queue = self.queues.get(SCHEDULE_TOPIC, level - 1)
            if queue is not None:
                self._seen[level].saw(queue.max_offset, now)
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
            head = self._heads.get(level)
            if head is None or head[0] != offset:  # (the wall clock is read once per entry)
                head = self._heads[level] = (offset, self._due_time(level, offset, deliver_at))
            if head[1] > trio.current_time():
                await trio.sleep_until(head[1])
                continue
            outcome = await self._deliver_one(level, physical_offset, size)
            if outcome is None:
                await trio.sleep(RETRY_DELIVERY_S)  # a passing refusal: try again
                continue
            self.offsets[level] = offset + 1
            if outcome >= 0:
                self.delivered += 1
                self._unflushed[level].append((offset + 1, outcome))

    def _due_time(self, level: int, offset: int, deliver_at: int) -> float:
        """When entry ``offset`` of ``level``, whose delivery time is ``deliver_at`` (ms,
        wall clock), is due on Trio's clock: what is left until ``deliver_at`` by this
        broker's clock now, but no later than the level's delay after the entry was
        seen (module docstring, "Clocks")."""
        now = trio.current_time()
        by_stamp = now + max(0, deliver_at - self._clock()) / 1000
        seen = self._seen[level].seen(offset)
        return min(
            by_stamp, (now if seen is None else seen) + self.delay_levels_ms[level - 1] / 1000
        )

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
