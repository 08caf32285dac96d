"""Pop consumption's state: what each group has popped, acked and had revived, kept as
records in the CommitLog (so every replica has it) and followed from dispatch on every
broker; the revive of what was not acked in time is the master's timer service's.

**Records** (all stored as puts, flushed and replicated like a send before the request
that made them is answered):

- a **checkpoint** (CK), one per queue a pop took messages from: a timer message
  (hamq/store/timer.py) due when the messages' invisible time runs out, property
  ``HAMQ_POP_CK`` = ``<group> <topic> <queue> <ck offset> <pop time> <invisible ms>
  <end> <offset>,<offset>...`` (the queue offsets handed out; ``end``: where the pop
  stopped reading), body empty, its real topic the revive topic
  ``rmq_sys_REVIVE_LOG_<cluster>``;
- an **ack**: a record in the revive topic's queue 1, ``HAMQ_POP_ACK`` = ``<ck key>
  <offset>,<offset>...``;
- a **changed invisible time**: a new CK for the one message, due then, that carries
  the ack of its old handle in the same record (``HAMQ_POP_ACK``): one record, so the
  message is never both or neither;
- a **revived copy**: the message stored again in the group's pop retry topic
  (``%RETRY%<group>_<topic>``, reconsume times + 1; past the group's retries its DLQ,
  ``%DLQ%<group>``), ``HAMQ_POP_REVIVED`` = ``<ck key> <offset>``; the last one of a CK
  also carries the CK's timer mark (``HAMQ_TIMER_SOURCE``), or, for a CK all acked, a
  record in the revive topic's queue 0 does.

A CK's key is ``<group>@<topic>@<queue>@<ck offset>@<pop time>``, what a receipt handle
names (hamq/protocol/pop.py). Acks and revived copies are also indexed
(``HAMQ_MARKS``: ``a@<key>@<offset>``, ``r@<key>@<offset>``), so a broker that did not
follow a CK from its start (it restarted since) can tell what was acked or revived.

**Following** (``PopState.on_dispatch``, on every broker): a CK joins ``checkpoints``
and moves the group's pop offset of its queue to its ``end``; an ack or a revived copy
marks its offsets; a CK all of whose messages are acked or revived is dropped. At start,
and after a cut of the log, the CKs still waiting in the timer are read back (their acks
and revives from the index, when first needed).

**Revive** (``ReviveService.revive``): the master's timer service hands each CK to it
when its time is up instead of storing a copy. It stores a revived copy of each message
neither acked nor revived, the last marked as the CK's delivery; the timer entry counts
as delivered only then. A master that dies half-way leaves the entry waiting: the next
master's timer hands it over again, and the copies stored already are known by their
marks. So each message not acked in time comes back exactly once in the log that
survives, and never one whose ack was answered. An ack after the time is up is refused
(the message comes back).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable

import attrs
import trio

from hamq.broker.long_polling import HeldPull, PullHoldService
from hamq.broker.topics import TopicConfigManager
from hamq.protocol import RemotingCommand
from hamq.protocol.message import (
    INTERNAL_PROPERTIES,
    PROPERTY_MARKS,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_ACK,
    PROPERTY_POP_CK,
    PROPERTY_POP_ORDER,
    PROPERTY_POP_ORDER_VISIBLE,
    PROPERTY_POP_REVIVED,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_SOURCE,
    PROPERTY_WAIT,
    SYSFLAG_TRANSACTION_MASK,
    TIMER_TOPIC,
    dlq_topic,
    is_retry_topic,
)
from hamq.protocol.pop import pop_retry_topic
from hamq.protocol.record import StoredMessage
from hamq.remoting import Connection, Responder
from hamq.store import DispatchRequest, MessageStore, MessageToStore, StoreError

log = logging.getLogger(__name__)

#: the revive topic's queues: CKs come due in 0, acks are kept in 1, FIFO batches in 2
DUE_QUEUE, ACK_QUEUE, ORDER_QUEUE = 0, 1, 2


def revive_topic(cluster: str) -> str:
    """RocketMQ's revive topic name (characters a topic may not hold replaced by _)."""
    return "rmq_sys_REVIVE_LOG_" + re.sub(r"[^%|a-zA-Z0-9_-]", "_", cluster)[:100]


def ck_key(group: str, topic: str, queue_id: int, ck_offset: int, pop_time: int) -> str:
    return f"{group}@{topic}@{queue_id}@{ck_offset}@{pop_time}"


@attrs.define
class Checkpoint:
    """One pop's messages of one queue."""

    group: str
    topic: str
    queue_id: int
    ck_offset: int
    pop_time: int
    invisible_ms: int
    end: int
    offsets: list[int]
    acked: set[int] = attrs.field(factory=set)
    revived: set[int] = attrs.field(factory=set)
    #: the timer delivered it to the revive topic: its time is up
    due: bool = False
    #: followed from its start (else acks and revives are looked up in the index)
    whole: bool = True
    #: offsets whose revived copy this broker stored and has not dispatched yet
    reviving: set[int] = attrs.field(factory=set)

    @property
    def key(self) -> str:
        return ck_key(self.group, self.topic, self.queue_id, self.ck_offset, self.pop_time)

    @property
    def visible_at(self) -> int:
        return self.pop_time + self.invisible_ms

    @property
    def open_offsets(self) -> list[int]:
        """Those neither acked nor revived."""
        return [o for o in self.offsets if o not in self.acked and o not in self.revived]

    def encode(self) -> str:
        return (
            f"{self.group} {self.topic} {self.queue_id} {self.ck_offset} {self.pop_time} "
            f"{self.invisible_ms} {self.end} {','.join(map(str, self.offsets))}"
        )

    @classmethod
    def decode(cls, text: str) -> Checkpoint:
        """ValueError if ``text`` is not one."""
        group, topic, queue, ck, pop_time, invisible, end, offsets = text.split(" ")
        return cls(
            group,
            topic,
            int(queue),
            int(ck),
            int(pop_time),
            int(invisible),
            int(end),
            [int(o) for o in offsets.split(",")],
        )


def _key_of(text: str) -> str:
    """The key of a HAMQ_POP_CK text ("" if it does not read)."""
    parts = text.split(" ", 5)
    return "@".join(parts[:5]) if len(parts) == 6 else ""


def ack_value(key: str, offsets: list[int]) -> str:
    return f"{key} {','.join(map(str, offsets))}"


def marks(kind: str, key: str, offsets: list[int]) -> str:
    """The index marks of acks (``a``) or revives (``r``) of ``offsets`` of CK ``key``."""
    return " ".join(f"{kind}@{key}@{o}" for o in offsets)


@attrs.define
class OrderBatch:
    """A FIFO pop's messages of one queue: the queue stays locked to the group until
    each is acked or its invisible time runs out (then the same ones come again, in
    order, ``counts`` + 1)."""

    group: str
    topic: str
    queue_id: int
    ck_offset: int
    pop_time: int
    invisible_ms: int
    end: int
    attempt_id: str
    offsets: list[int]
    #: how many times each was delivered (1: the first time)
    counts: list[int]
    acked: set[int] = attrs.field(factory=set)
    #: a changed invisible time: when that message comes back (ms)
    visible_at: dict[int, int] = attrs.field(factory=dict)

    @property
    def key(self) -> str:
        return ck_key(self.group, self.topic, self.queue_id, self.ck_offset, self.pop_time)

    @property
    def open_offsets(self) -> list[int]:
        return [o for o in self.offsets if o not in self.acked]

    def locked(self, now_ms: int) -> bool:
        """Whether the queue is still locked: a message not acked whose time is not up."""
        default = self.pop_time + self.invisible_ms
        return any(self.visible_at.get(o, default) > now_ms for o in self.open_offsets)

    def encode(self) -> str:
        return (
            f"{self.group} {self.topic} {self.queue_id} {self.ck_offset} {self.pop_time} "
            f"{self.invisible_ms} {self.end} {self.attempt_id or '-'} "
            f"{','.join(map(str, self.offsets))} {','.join(map(str, self.counts))}"
        )

    @classmethod
    def decode(cls, text: str) -> OrderBatch:
        """ValueError if ``text`` is not one."""
        group, topic, queue, ck, pop_time, invisible, end, attempt, offsets, counts = text.split(
            " "
        )
        batch = cls(
            group,
            topic,
            int(queue),
            int(ck),
            int(pop_time),
            int(invisible),
            int(end),
            "" if attempt == "-" else attempt,
            [int(o) for o in offsets.split(",")],
            [int(c) for c in counts.split(",")],
        )
        if len(batch.offsets) != len(batch.counts):
            raise ValueError("offsets and counts differ in number")
        return batch


class PopState:
    """Every broker's view of the pops in flight (module docstring, "Following")."""

    def __init__(self, store: MessageStore, cluster: str) -> None:
        self.store = store
        self.revive_topic = revive_topic(cluster)
        self.checkpoints: dict[str, Checkpoint] = {}
        #: keys of CKs followed whole and all acked before their time, until the record
        #: retiring them is dispatched: when one falls due it needs no look-up in the index
        self.finished: set[str] = set()
        #: (group, topic, queue) -> the next offset to pop, as far as CKs say
        self.popped: dict[tuple[str, str, int], int] = {}
        #: (group, topic, queue) -> its last FIFO batch (hamq's FIFO pop)
        self.orders: dict[tuple[str, str, int], OrderBatch] = {}

    # ------------------------------------------------------------------ building
    def reset(self) -> None:
        """Forget everything followed (the log was cut: records this state followed may
        be gone); ``waiting_checkpoints`` and ``join_waiting`` build it again."""
        self.checkpoints.clear()
        self.finished.clear()
        self.popped.clear()
        self.orders.clear()

    def waiting_checkpoints(self, timer_offsets: list[int]) -> list[str]:
        """The CKs among the timer messages at ``timer_offsets`` (those waiting when a
        broker starts). Blocking: run it in a worker thread; ``join_waiting`` them."""
        queue = self.store.consume_queue(TIMER_TOPIC, 0)
        found = []
        for offset in timer_offsets if queue is not None else ():
            entry = queue.entry(offset) if queue is not None else None
            if entry is None:
                continue
            try:
                message = self.store.look_message_by_offset(entry[0], entry[1])
            except StoreError:
                continue
            text = message.properties.get(PROPERTY_POP_CK)
            if text is not None:
                found.append(text)
        return found

    def join_waiting(self, texts: list[str]) -> None:
        """Follow the CKs ``waiting_checkpoints`` found (their acks and revives looked up
        in the index when asked)."""
        for text in texts:
            self._join(text, whole=False)

    # ------------------------------------------------------------------ following
    def on_dispatch(self, request: DispatchRequest) -> None:
        topic = request.topic
        if topic[0] != "%" and topic != TIMER_TOPIC and topic != self.revive_topic:
            return  # (a pop's records are in these, its revived copies in %RETRY%/%DLQ%)
        properties = request.properties
        if PROPERTY_POP_CK in properties:
            text = properties[PROPERTY_POP_CK]
            if request.topic == TIMER_TOPIC:
                self._join(text, whole=True)
            elif request.topic == self.revive_topic:  # (a CK all done with when revived)
                key = _key_of(text)
                self.finished.discard(key)
                ck = self.checkpoints.get(key)
                if ck is not None:
                    self.done_with(ck)
        acked = properties.get(PROPERTY_POP_ACK)
        if acked is not None:
            key, offsets = acked.split(" ")
            self._mark(key, [int(o) for o in offsets.split(",")], revived=False)
        revived = properties.get(PROPERTY_POP_REVIVED)
        if revived is not None:
            key, offset = revived.split(" ")
            self._mark(key, [int(offset)], revived=True)
        order = properties.get(PROPERTY_POP_ORDER)
        if order is not None:
            self.order_stored(OrderBatch.decode(order))
        visible = properties.get(PROPERTY_POP_ORDER_VISIBLE)
        if visible is not None:
            key, offset, at = visible.split(" ")
            batch = self.order_batch(key)
            if batch is not None:
                batch.visible_at[int(offset)] = int(at)

    def order_stored(self, batch: OrderBatch) -> None:
        """A FIFO batch stored (here, or as dispatched): the queue's current one."""
        where = (batch.group, batch.topic, batch.queue_id)
        known = self.orders.get(where)
        if known is None or (known.pop_time, known.ck_offset) < (batch.pop_time, batch.ck_offset):
            self.orders[where] = batch  # (the same one again, dispatched: kept as it is)

    def order_batch(self, key: str) -> OrderBatch | None:
        group, topic, queue, _ck, _pop_time = key.split("@")
        batch = self.orders.get((group, topic, int(queue)))
        return batch if batch is not None and batch.key == key else None

    def stored(self, ck: Checkpoint) -> None:
        """A CK this master just stored: followed at once (its acks may come before
        it is dispatched)."""
        self._join(ck.encode(), whole=True)

    def _join(self, text: str, *, whole: bool) -> Checkpoint | None:
        try:
            ck = Checkpoint.decode(text)
        except ValueError:
            log.error("a pop checkpoint does not read: %r", text[:200])
            return None
        ck.whole = whole
        known = self.checkpoints.setdefault(ck.key, ck)
        where = (ck.group, ck.topic, ck.queue_id)
        if ck.end > self.popped.get(where, -1):
            self.popped[where] = ck.end
        return known

    def checkpoint(self, text: str) -> Checkpoint | None:
        """The followed CK a record's HAMQ_POP_CK names (followed from now on, its acks
        and revives looked up, if this state did not follow it); None if it does not read."""
        key = _key_of(text)
        known = self.checkpoints.get(key)
        if known is not None:
            return known
        if key in self.finished:  # (all done while followed: nothing to look up)
            try:
                ck = Checkpoint.decode(text)
            except ValueError:
                return None
            ck.acked.update(ck.offsets)
            return ck
        return self._join(text, whole=False)

    def done_with(self, ck: Checkpoint) -> None:
        self.checkpoints.pop(ck.key, None)

    def _mark(self, key: str, offsets: list[int], *, revived: bool) -> None:
        ck = self.checkpoints.get(key)
        if ck is None:
            batch = self.order_batch(key) if not revived else None
            if batch is not None:
                batch.acked.update(offsets)
            return
        (ck.revived if revived else ck.acked).update(offsets)
        if not ck.open_offsets:
            self.done_with(ck)
            if ck.whole and not ck.revived:  # (all acked: it falls due still, to be retired)
                self.finished.add(key)

    # ------------------------------------------------------------------ asking
    def known(self, key: str, offset: int) -> tuple[Checkpoint | None, str | None]:
        """The CK of an ack or a change of ``offset`` under ``key``, or why it cannot be:
        no such pop (a handle this broker never gave, or one whose pop is all done), the
        message acked already, or come back already (its time ran out)."""
        ck = self.checkpoints.get(key)
        if ck is None or offset not in ck.offsets:
            return None, "no message in flight has this receipt handle (acked, or never popped)"
        if not ck.whole:
            self._look_up(ck)
        if offset in ck.acked:
            return None, "the message was acked already"
        if offset in ck.revived or ck.due:
            return None, "the message's invisible time ran out: it is delivered again"
        return ck, None

    def _look_up(self, ck: Checkpoint) -> None:
        """A CK not followed from its start: its acks and revives from the index."""
        for offset in ck.offsets:
            if self._indexed(f"a@{ck.key}@{offset}", PROPERTY_POP_ACK, ck.key):
                ck.acked.add(offset)
            elif self._indexed(f"r@{ck.key}@{offset}", PROPERTY_POP_REVIVED, ck.key):
                ck.revived.add(offset)
        ck.whole = True

    def _indexed(self, mark: str, prop: str, key: str) -> bool:
        for found in self.store.query_marks(mark):
            if found.properties.get(prop, "").startswith(key + " "):
                return True
        return False

    def in_flight(self, group: str, topic: str, queue_id: int) -> int:
        """Messages ``group`` popped from the queue and has not acked, not come back."""
        return sum(
            len(ck.open_offsets) - len(ck.reviving)
            for ck in self.checkpoints.values()
            if ck.group == group and ck.topic == topic and ck.queue_id == queue_id and not ck.due
        )

    def pop_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.popped.get((group, topic, queue_id))


@attrs.define
class ReviveService:
    """Revives a CK when its time is up: the timer service's handler of the revive topic
    (hamq/store/timer.py), so it runs on the master, and the CK's timer entry counts as
    delivered once its last record is stored (module docstring, "Revive")."""

    state: PopState
    store: MessageStore
    topics: TopicConfigManager
    max_retries: Callable[[str], int]
    store_host: Callable[[], tuple[str, int]]
    revived: int = 0

    def revive(self, message: StoredMessage, source: int) -> bool:
        """Revive the CK timer message ``message`` (timer queue offset ``source``): a
        copy of each of its messages neither acked nor revived, the last record marked
        HAMQ_TIMER_SOURCE; a CK all done with gets a record of its own saying so. False
        if the store refused a record for now (the timer asks again: what was stored
        counts, by its marks)."""
        text = message.properties.get(PROPERTY_POP_CK, "")
        ck = self.state.checkpoint(text)
        mark = {PROPERTY_TIMER_SOURCE: str(source)}
        if ck is None:  # (a CK that does not read: done with, logged)
            return self._stored(self._record(DUE_QUEUE, {PROPERTY_POP_CK: text[:200], **mark}))
        ck.due = True  # (acks are refused from here on: the message comes back)
        if not ck.whole:
            self.state._look_up(ck)
        todo = [o for o in ck.open_offsets if o not in ck.reviving]
        try:
            if not todo:
                done = self._record(DUE_QUEUE, {PROPERTY_POP_CK: ck.encode(), **mark})
                return self._stored(done)
            for i, offset in enumerate(todo):
                last = i == len(todo) - 1
                if not self._revive(ck, offset, mark if last else {}):
                    return False
            return True
        finally:
            self.store.announce_appends()

    def _record(self, queue_id: int, properties: dict[str, str]) -> MessageToStore:
        return MessageToStore(
            self.state.revive_topic,
            queue_id,
            b"",
            properties={**properties, PROPERTY_WAIT: "false"},
            store_host=self.store_host(),
        )

    def _stored(self, message: MessageToStore) -> bool:
        result = self.store.put_message_nowait(message, announce=False)
        if not result.stored:
            log.warning("pop revive waits: %s", result.remark)
        return result.stored

    def _revive(self, ck: Checkpoint, offset: int, extra: dict[str, str]) -> bool:
        """Store the copy of ``ck``'s message at ``offset`` in the retry topic (the DLQ
        past the group's retries; a record saying it is gone if it cannot be read)."""
        queue = self.store.consume_queue(ck.topic, ck.queue_id)
        entry = queue.entry(offset) if queue is not None else None
        message: StoredMessage | None = None
        if entry is not None:
            try:
                message = self.store.look_message_by_offset(entry[0], entry[1])
            except StoreError as exc:
                log.error(
                    "pop revive: message %s/%d/%d unreadable: %s",
                    ck.topic,
                    ck.queue_id,
                    offset,
                    exc,
                )
        marked = {
            PROPERTY_POP_REVIVED: f"{ck.key} {offset}",
            PROPERTY_MARKS: marks("r", ck.key, [offset]),
            **extra,
        }
        if message is None:
            stored = self._stored(self._record(ACK_QUEUE, marked))
        else:
            stored = self._stored(self._copy(ck, message, marked))
        if stored:
            self.revived += 1
            ck.reviving.add(offset)
        return stored

    def _copy(
        self, ck: Checkpoint, message: StoredMessage, marked: dict[str, str]
    ) -> MessageToStore:
        normal = ck.topic
        if is_retry_topic(ck.topic):
            normal = message.properties.get(PROPERTY_RETRY_TOPIC) or ck.topic
        reconsume = message.reconsume_times + 1
        if reconsume > self.max_retries(ck.group):
            topic, queue_id = dlq_topic(ck.group), 0
            self.topics.ensure(topic)
        else:
            topic = ck.topic if is_retry_topic(ck.topic) else pop_retry_topic(ck.group, ck.topic)
            config = self.topics.ensure(topic)
            queue_id = random.randrange(config.write_queue_nums)
        properties = {k: v for k, v in message.properties.items() if k not in INTERNAL_PROPERTIES}
        properties.pop(PROPERTY_TIMER_DELIVER_MS, None)
        properties[PROPERTY_WAIT] = "false"
        properties.setdefault(PROPERTY_RETRY_TOPIC, normal)
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
        properties.update(marked)
        return MessageToStore(
            topic=topic,
            queue_id=queue_id,
            body=message.body,
            flag=message.flag,
            properties=properties,
            sys_flag=message.sys_flag & ~SYSFLAG_TRANSACTION_MASK,
            born_timestamp=message.born_timestamp,
            store_host=self.store_host(),
            reconsume_times=reconsume,
        )


def _never(request: RemotingCommand, conn: Connection) -> RemotingCommand:
    raise AssertionError("held pops are answered by PopHoldService._answer")


class PopHoldService(PullHoldService):
    """Pops that found nothing, held until a message reaches one of their topic's queues
    (a pop of every queue is held under queue -1) or their poll time runs out; then
    ``answer`` runs the pop again and answers its responder (maybe later: a pop that
    finds messages answers once its checkpoints are safe)."""

    def __init__(self, answer: Callable[[Responder], None], most: int) -> None:
        super().__init__(_never)
        self._answer_held = answer
        self.most = most

    def _answer(self, pull: HeldPull) -> None:
        if not pull.gone:
            self._answer_held(pull.responder)

    def waiting(self, topic: str, queue_id: int) -> int:
        """Held pops (and notifications) of ``topic``'s queue, or of any of it (-1)."""
        return sum(
            1
            for (held_topic, held_queue), pulls in self._held.items()
            if held_topic == topic and queue_id in (-1, held_queue)
            for pull in pulls
            if not pull.gone
        )

    def on_dispatch(self, request: DispatchRequest) -> None:
        if not self._held:  # (most records, under load: nobody waits)
            return
        for key in ((request.topic, request.queue_id), (request.topic, -1)):
            if key in self._held:
                arrived = (request.queue_offset, request.tags_code)
                self._arrived.setdefault(key, []).append(arrived)
                self._wakeup.set()


class PopService:
    """Pop's state, its holds and its revive (while master), for the broker node."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicConfigManager,
        *,
        cluster: str,
        max_retries: Callable[[str], int],
        store_host: Callable[[], tuple[str, int]],
        answer_held: Callable[[Responder], None],
        max_held: int,
    ) -> None:
        self.state = PopState(store, cluster)
        self.holds = PopHoldService(answer_held, max_held)
        self._revive = ReviveService(self.state, store, topics, max_retries, store_host)
        # (the master's timer service revives each CK when its time is up)
        store.timer_handlers[self.state.revive_topic] = self._revive.revive

    @property
    def revived(self) -> int:
        return self._revive.revived

    def max_retries(self, group: str) -> int:
        return self._revive.max_retries(group)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the pops from the store's dispatch (after reading back those waiting)
        and hold pops that wait."""
        state = self.state
        state.reset()
        state.store.on_dispatch(state.on_dispatch)
        state.store.on_dispatch(self.holds.on_dispatch)
        state.store.on_truncated(self._truncated)
        waiting = sorted(state.store.timers.pending)
        state.join_waiting(await trio.to_thread.run_sync(state.waiting_checkpoints, waiting))
        await self.holds.run(task_status=task_status)

    def _truncated(self) -> None:
        """The log was cut (a replica that diverged): what is followed is built again."""
        state = self.state
        state.reset()
        state.join_waiting(state.waiting_checkpoints(sorted(state.store.timers.pending)))
