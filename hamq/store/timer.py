"""Timer messages: any delivery time (RocketMQ 5), delivered once, by whichever broker
is master when it comes.

**On put** (encoding.py ``timer_transform``) a message whose TIMER_DELIVER_MS,
TIMER_DELAY_MS or TIMER_DELAY_SEC names a time in the future is stored in
rmq_sys_wheel_timer queue 0, its real topic and queue in REAL_TOPIC / REAL_QID and the
time it is due in TIMER_OUT_MS, which the dispatcher makes its consume-queue entry's
tags code. It is stored, flushed and replicated as any message before SEND_OK.

**Delivered** means: the log holds a record carrying ``HAMQ_TIMER_SOURCE=<q>``, q the
timer record's queue offset — the copy stored under the real topic and queue (REAL_*
removed, TIMER_ENQUEUE_MS and TIMER_DEQUEUE_MS added, as RocketMQ's timer does), or,
for a message that can never be delivered (its record damaged, its topic deleted since,
no real topic), a record in rmq_sys_wheel_timer queue 1 saying why. One record says it:
a replica has the delivery whole or not at all, a crash keeps it or cuts it, and a
broker that has it counts the message delivered; one that lacks it (a new master whose
log ends before it) delivers it. So each timer message reaches its topic once in the log
that survives a failover. The dispatcher indexes that mark (``rmq_sys_wheel_timer#<q>``)
so that a broker starting up can tell.

**What waits** (``TimerWaits``, on every broker, master or slave alike): the timer
records dispatched and not delivered, by queue offset, with their due times. It follows
dispatching (``on_dispatch``): a timer record joins, a delivery mark removes its source.
At start, and after the log was cut (a replica that diverged), it is built from the log:
the timer queue's entries from a *floor* on, less those the index shows delivered. A
floor is a queue offset below which every timer message was delivered, as of some
commit-log offset (``config/timerFloor.json``, a few of them, each saved once the log is
on disk up to that offset); one is used only while the log still reaches that offset,
and those past a cut are forgotten at the cut. Without one the build starts at the
queue's first entry: slower, never wrong. While messages wait, retention keeps the log
from the oldest of them on (``oldest_offset``).

A real topic may have a *handler* that delivers its messages instead of a copy (pop's
checkpoints, hamq/broker/pop.py: their messages revived); it stores the record that
carries the mark itself, last.

**Delivery** (``TimerService``, while the store is a master's): the waiting messages in
a heap by due time; the task sleeps until the first is due by this broker's clock (woken
early only by a message due sooner), then stores the copies of all that are due, in due
order, and says once that the log grew. A copy the store refuses for now (a full disk)
is tried again after RETRY_DELIVERY_S; one it can never take gets the queue-1 record. A
message is never delivered before its time by this broker's clock; a new master whose
clock is behind the old one's delivers later by that much.

``timer_max_pending`` bounds what waits (each costs about 100 bytes of memory): a send
past it is refused for now (WHEEL_TIMER_FLOW_CONTROL); ``timer_max_delay_s`` bounds how
far away a delivery time may be (WHEEL_TIMER_MSG_ILLEGAL).
"""

from __future__ import annotations

import collections
import heapq
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import trio

from hamq.protocol.message import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_ENQUEUE_MS,
    PROPERTY_TIMER_SOURCE,
    TIMER_TOPIC,
    topic_error,
)
from hamq.protocol.record import StoredMessage
from hamq.store.checkpoint import load_with_backup, save_with_backup
from hamq.store.consume_queue import ConsumeQueueTable
from hamq.store.deletions import TopicDeletions
from hamq.store.durability import PutMessageStatus
from hamq.store.index import IndexService
from hamq.store.reput import DispatchRequest
from hamq.store.segment import StoreError
from hamq.store.values import MessageToStore, PutMessageResult, copy_to_store

log = logging.getLogger(__name__)

#: the timer records' queue, and the queue of records saying one can never be delivered
TIMER_QUEUE_ID = 0
UNDELIVERABLE_QUEUE_ID = 1
#: how long to wait before trying a delivery the store refused for now again
RETRY_DELIVERY_S = 1.0
#: most copies stored in one round (then the task yields)
ROUND_MOST = 256
#: delivers a timer message of one real topic instead of a copy: (the message, its
#: queue offset in the timer topic) -> True once the record that says it is delivered
#: (HAMQ_TIMER_SOURCE=<that offset>) is stored, False if the store refused for now
TimerHandler = Callable[[StoredMessage, int], bool]
#: floors kept in timerFloor.json
FLOORS_KEPT = 3
#: entries read from the timer queue at a time while building
READ_CHUNK = 1024


@attrs.frozen
class Floor:
    """Every timer message below queue offset ``floor`` was delivered by the records
    before commit-log offset ``as_of``."""

    floor: int
    as_of: int


def decode_floors(data: bytes) -> list[Floor]:
    """timerFloor.json: ``{"floors": [{"floor": q, "asOf": offset}, ...]}``, newest first;
    ValueError names what is wrong."""
    try:
        parsed = json.loads(data)
        floors = [Floor(int(f["floor"]), int(f["asOf"])) for f in parsed["floors"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a timer floor file: {exc}") from None
    if any(f.floor < 0 or f.as_of < 0 for f in floors):
        raise ValueError("a timer floor is negative")
    return floors


def encode_floors(floors: list[Floor]) -> bytes:
    return json.dumps({"floors": [{"floor": f.floor, "asOf": f.as_of} for f in floors]}).encode()


class TimerWaits:
    """The timer messages dispatched and not delivered (module docstring, "What
    waits"), on every broker; the heap of them by due time while one is delivering."""

    def __init__(
        self,
        *,
        queues: ConsumeQueueTable,
        index: IndexService,
        read_message: Callable[[int, int | None], StoredMessage],
        log_end: Callable[[], int],
        floors_path: Path,
        max_pending: int,
    ) -> None:
        self.queues = queues
        self.index = index
        self._read_message = read_message
        self._log_end = log_end
        self.floors_path = floors_path
        self.max_pending = max_pending
        #: queue offset -> due time (ms) of every timer message waiting
        self.pending: dict[int, int] = {}
        #: the timer queue's next offset this knows of (its records after are to come)
        self.next_offset = 0
        #: (due ms, queue offset) of what waits, while a deliverer runs (else None);
        #: delivered ones leave it when they come to its head
        self.heap: list[tuple[int, int]] | None = None
        #: copies stored and not dispatched yet (delivered, not yet known so)
        self.delivering: set[int] = set()
        #: set when a message joins that is due before the heap's head
        self.arrived = trio.Event()
        self.floors: list[Floor] = []
        #: (floor, as of) samples not saved yet, oldest first
        self._samples: collections.deque[Floor] = collections.deque(maxlen=64)

    # ------------------------------------------------------------------ building
    def load_floors(self, log_end: int) -> None:
        """The saved floors that still hold: those of offsets the log reaches."""
        try:
            floors = load_with_backup(self.floors_path, decode_floors) or []
        except (StoreError, OSError) as exc:
            log.warning("timer floors unreadable (%s): every timer entry is checked", exc)
            floors = []
        self.floors = [f for f in floors if f.as_of <= log_end]

    def build(self) -> None:
        """What waits, from the log: the timer queue from the newest floor that holds
        on, less what the index shows delivered."""
        self.pending.clear()
        self.delivering.clear()
        self._samples.clear()
        queue = self.queues.get(TIMER_TOPIC, TIMER_QUEUE_ID)
        if queue is None:
            self.next_offset = 0
            self._restart_heap()
            return
        start = max(self.floors[0].floor if self.floors else 0, queue.min_offset)
        checked = 0
        offset = start
        while offset < queue.max_offset:
            entries = queue.entries(offset, READ_CHUNK)
            if not entries:
                break
            for physical_offset, _size, due in entries:
                checked += 1
                if not self.delivered(offset, physical_offset):
                    self.pending[offset] = due
                offset += 1
        self.next_offset = max(offset, queue.max_offset)
        self._restart_heap()
        if checked:
            log.info(
                "timer messages: %d waiting (%d checked from queue offset %d)",
                len(self.pending),
                checked,
                start,
            )

    def delivered(self, offset: int, physical_offset: int) -> bool:
        """Whether the log holds the delivery of timer entry ``offset`` (its record at
        ``physical_offset``): a record after it with its mark, found by the index and
        read to be sure (the index gives hash matches, and may point at records a cut
        removed)."""
        mark = str(offset)
        end = self._log_end()
        for candidate in self.index.query(TIMER_TOPIC, mark, 16, 0, 2**62):
            if not physical_offset < candidate < end:
                continue
            try:
                message = self._read_message(candidate, None)
            except (StoreError, OSError):
                continue
            if message.properties.get(PROPERTY_TIMER_SOURCE) == mark:
                return True
        return False

    def truncated(self, cut: int) -> None:
        """The log was cut at ``cut``: floors past it are forgotten, and what waits is
        built again (from queues and index, cut too)."""
        self.floors = [f for f in self.floors if f.as_of <= cut]
        self.build()

    # ------------------------------------------------------------------ following
    def on_dispatch(self, request: DispatchRequest) -> None:
        """Dispatch listener: a timer record joins; a delivery's mark removes its source."""
        if request.topic == TIMER_TOPIC and request.queue_id == TIMER_QUEUE_ID:
            offset = request.queue_offset
            if offset >= self.next_offset:
                self.next_offset = offset + 1
                self.pending[offset] = due = request.tags_code
                heap = self.heap
                if heap is not None:
                    if not heap or due < heap[0][0]:
                        self.arrived.set()
                    heapq.heappush(heap, (due, offset))
        source = request.properties.get(PROPERTY_TIMER_SOURCE)
        if source is not None:
            offset = int(source)
            self.pending.pop(offset, None)
            self.delivering.discard(offset)

    def room(self) -> bool:
        """Whether one more timer message may wait (``timer_max_pending``)."""
        return len(self.pending) + len(self.delivering) < self.max_pending

    def oldest_offset(self) -> int | None:
        """The commit-log offset of the oldest timer record waiting (retention keeps
        the log from there), None if none waits."""
        if not self.pending:
            return None
        queue = self.queues.get(TIMER_TOPIC, TIMER_QUEUE_ID)
        entry = queue.entry(min(self.pending)) if queue is not None else None
        return entry[0] if entry is not None else None

    # ------------------------------------------------------------------ floors
    def sample(self, dispatched: int) -> None:
        """Note the floor as of the dispatched offset ``dispatched`` (every timer
        message below it was delivered by then): saved once that is on disk."""
        floor = min(self.pending) if self.pending else self.next_offset
        if not self._samples or self._samples[-1].floor != floor:
            self._samples.append(Floor(floor, dispatched))

    def durable_floors(self, flushed: int) -> list[Floor] | None:
        """The floors to save, newest first, now that the log is on disk up to
        ``flushed``; None if they did not change."""
        newest = None
        while self._samples and self._samples[0].as_of <= flushed:
            newest = self._samples.popleft()
        if newest is None or (self.floors and self.floors[0].floor == newest.floor):
            return None
        self.floors = [newest, *self.floors][:FLOORS_KEPT]
        return list(self.floors)

    def save_floors(self, floors: list[Floor]) -> None:
        """Blocking (fsyncs): run it in a worker thread."""
        save_with_backup(self.floors_path, encode_floors(floors))

    # ------------------------------------------------------------------ the heap
    def _restart_heap(self) -> None:
        if self.heap is not None:
            self.start_delivering()

    def start_delivering(self) -> None:
        self.heap = [(due, offset) for offset, due in self.pending.items()]
        heapq.heapify(self.heap)
        self.arrived.set()

    def stop_delivering(self) -> None:
        self.heap = None
        self.delivering.clear()

    def head(self) -> tuple[int, int] | None:
        """The first message due that waits and is not being delivered."""
        heap = self.heap
        assert heap is not None
        pending, delivering = self.pending, self.delivering
        while heap:
            due, offset = heap[0]
            if pending.get(offset) == due and offset not in delivering:
                return due, offset
            heapq.heappop(heap)
        return None

    def take_due(self, now_ms: int) -> list[int]:
        """Up to ROUND_MOST queue offsets due by ``now_ms``, first due first; each is
        marked as being delivered (``delivering``) until its copy is dispatched or
        ``give_back`` returns it."""
        taken: list[int] = []
        heap = self.heap
        assert heap is not None
        while len(taken) < ROUND_MOST:
            head = self.head()
            if head is None or head[0] > now_ms:
                break
            heapq.heappop(heap)
            self.delivering.add(head[1])
            taken.append(head[1])
        return taken

    def give_back(self, offset: int) -> None:
        """A delivery the store refused for now: it waits again (in the heap)."""
        self.delivering.discard(offset)
        due = self.pending.get(offset)
        if due is not None and self.heap is not None:
            heapq.heappush(self.heap, (due, offset))


class TimerService:
    """Delivers the timer messages that come due, while the store is a master's."""

    def __init__(
        self,
        waits: TimerWaits,
        *,
        clock: Callable[[], int],
        read_message: Callable[[int, int | None], StoredMessage],
        put: Callable[[MessageToStore], PutMessageResult],
        announce: Callable[[], None],
        deletions: TopicDeletions,
        handlers: Mapping[str, TimerHandler] | None = None,
    ) -> None:
        self.waits = waits
        #: real topic -> what delivers its timer messages instead of a copy (pop's
        #: checkpoints: hamq/broker/pop.py)
        self._handlers = handlers if handlers is not None else {}
        self._clock = clock
        self._read_message = read_message
        self._put = put
        self._announce = announce
        self._deletions = deletions
        self.delivered = 0
        self.undeliverable = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        waits = self.waits
        waits.start_delivering()
        task_status.started()
        try:
            while True:
                waits.arrived = arrived = trio.Event()
                head = waits.head()
                if head is None:
                    await arrived.wait()
                    continue
                left_ms = head[0] - self._clock()
                if left_ms > 0:
                    with trio.move_on_after(left_ms / 1000):
                        await arrived.wait()
                    continue
                if not self._deliver_round():
                    await trio.sleep(RETRY_DELIVERY_S)  # (the store refused for now)
                await trio.lowlevel.checkpoint()
        finally:
            waits.stop_delivering()

    def _deliver_round(self) -> bool:
        """Store the copies of the messages due now; False if the store refused one for
        now (it and those after it wait again)."""
        waits = self.waits
        queue = waits.queues.get(TIMER_TOPIC, TIMER_QUEUE_ID)
        taken = waits.take_due(self._clock())
        refused_at = None
        for i, offset in enumerate(taken):
            entry = queue.entry(offset) if queue is not None else None
            if entry is None:
                done = self._undeliverable(offset, "its timer queue entry is gone")
            else:
                done = self._deliver(offset, entry[0], entry[1])
            if not done:
                refused_at = i
                break
        if refused_at is not None:
            for offset in taken[refused_at:]:
                waits.give_back(offset)
        if taken:
            self._announce()
        return refused_at is None

    def _deliver(self, offset: int, physical_offset: int, size: int) -> bool:
        """Store timer entry ``offset``'s copy (or, if it can never be delivered, the
        record saying so); False if the store refused it for now."""
        try:
            message = self._read_message(physical_offset, size)
        except StoreError as exc:  # (a damaged record: it will not read better later)
            return self._undeliverable(offset, f"its record at {physical_offset}: {exc}")
        except OSError as exc:
            log.warning("timer message at %d: cannot read it now: %s", physical_offset, exc)
            return False
        properties = dict(message.properties)
        topic = properties.pop(PROPERTY_REAL_TOPIC, "")
        queue_text = properties.pop(PROPERTY_REAL_QUEUE_ID, "")
        if topic_error(topic) is not None or not queue_text.isdigit() or len(queue_text) > 9:
            return self._undeliverable(offset, f"no real topic and queue at {physical_offset}")
        if self._deletions.dead(topic, physical_offset):
            return self._undeliverable(offset, f"topic {topic} was deleted after it was sent")
        handler = self._handlers.get(topic)
        if handler is not None:
            done = handler(message, offset)
            if done:
                self.delivered += 1
            return done
        properties[PROPERTY_TIMER_ENQUEUE_MS] = str(message.store_timestamp)
        properties[PROPERTY_TIMER_DEQUEUE_MS] = str(self._clock())
        properties[PROPERTY_TIMER_SOURCE] = str(offset)
        result = self._put(copy_to_store(message, topic, int(queue_text), properties))
        if result.stored:
            self.delivered += 1
            return True
        if result.status in (
            PutMessageStatus.MESSAGE_ILLEGAL,
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
        ):
            return self._undeliverable(offset, f"the store refuses it: {result.remark}")
        log.warning(
            "timer message for %s/%s not delivered yet: %s", topic, queue_text, result.remark
        )
        return False

    def _undeliverable(self, offset: int, why: str) -> bool:
        """Record that timer entry ``offset`` can never be delivered (queue 1 of the
        timer topic, the reason as body); False if the store refused that for now."""
        result = self._put(
            MessageToStore(
                TIMER_TOPIC,
                UNDELIVERABLE_QUEUE_ID,
                why.encode(),
                properties={PROPERTY_TIMER_SOURCE: str(offset)},
            )
        )
        if not result.stored:
            log.warning(
                "timer entry %d: cannot record it undeliverable yet: %s", offset, result.remark
            )
            return False
        self.undeliverable += 1
        log.error("timer message %d dropped, it can never be delivered: %s", offset, why)
        return True
