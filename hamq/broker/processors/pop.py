"""Pop consumption over remoting (RocketMQ 5): POP_MESSAGE, ACK_MESSAGE,
BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION, POLLING_INFO
(docs/PROTOCOL.md#pop; the state they keep: hamq/broker/pop.py).

- **POP_MESSAGE**: up to ``maxMsgNums`` (1-32) messages of the topic's queue, or of every
  queue (``queueId`` -1, from a random one on), and of the group's pop retry topic (first
  one time in five, else when the topic leaves room), from the group's pop offset (a new
  group: the queue's first message, ``initMode`` 1 its end), filtered by tags. Each queue's
  messages get a checkpoint record, stored (flushed and replicated as a SEND_OK) before
  the answer, which then names where they came from (``startOffsetInfo``,
  ``msgOffsetInfo``). Nothing found: held up to ``pollTime`` (at most
  ``long_polling_max_s``) for a message to arrive, then POLLING_TIMEOUT; too many held:
  POLLING_FULL. Refused: a slave (the role's refusal), ``maxMsgNums`` out of range,
  invisible time not in (0, ``timer_max_delay_s``], a topic or group that does not
  exist or may not be read, a filter that does not parse. FIFO (``order``): one queue's
  messages, the queue locked to the group until they are acked or their time is up
  (then the same ones again); the same ``attemptId`` gets the same batch while locked.
- **ACK_MESSAGE** / **BATCH_ACK_MESSAGE**: the message popped with that receipt handle is
  done with: an ack record, stored before the answer. Refused (nothing changed): a
  handle that does not read or names another queue or group (INVALID_PARAMETER), one no
  pop in flight gave (acked already, never popped, or its time ran out: the message was
  delivered again), NO_MESSAGE.
- **CHANGE_MESSAGE_INVISIBLETIME**: the message comes back ``invisibleTime`` ms from now
  instead: one record, the new checkpoint with the old one's ack. The answer's pop time
  and invisible time, with the message's offset as checkpoint offset, make its new
  receipt handle. (FIFO: a record of the message's new time; the batch's pop time stays.)
- **NOTIFICATION**: whether the group has a message to pop there, waiting up to
  ``pollTime`` for one; **POLLING_INFO**: how many pops wait there.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from typing import Literal

import trio

from hamq.broker.context import BrokerContext
from hamq.broker.pop import (
    ACK_QUEUE,
    DUE_QUEUE,
    ORDER_QUEUE,
    Checkpoint,
    OrderBatch,
    PopService,
    ack_value,
    ck_key,
    marks,
)
from hamq.broker.processors.pull import consuming_group, tag_filter
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import PERM_READ
from hamq.protocol.headers import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    NotificationRequestHeader,
    NotificationResponseHeader,
    PollingInfoRequestHeader,
    PollingInfoResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from hamq.protocol.message import (
    PROPERTY_MARKS,
    PROPERTY_POP_ACK,
    PROPERTY_POP_CK,
    PROPERTY_POP_ORDER,
    PROPERTY_POP_ORDER_VISIBLE,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_WAIT,
    TagExpressionError,
    dlq_topic,
    is_retry_topic,
)
from hamq.protocol.pop import (
    MAX_POP_MESSAGES,
    ORDER_REVIVE_QUEUE,
    REVIVE_QUEUE,
    ReceiptHandle,
    ReceiptHandleError,
    msg_offset_info,
    pop_retry_topic,
    real_topic,
    start_offset_info,
    topic_kind,
)
from hamq.remoting import Connection, Dispatcher, Responder
from hamq.store import MessageToStore, PutMessageStatus, Ticket

#: a pop's queue offset field in a record (QUEUEOFFSET, after TOTALSIZE, MAGIC, BODYCRC,
#: QUEUEID and FLAG)
_QUEUE_OFFSET_AT = 20
#: one pop in five reads the retry topic first (RocketMQ's odds)
RETRY_FIRST_ONE_IN = 5


def _record_queue_offset(record: memoryview) -> int:
    return int.from_bytes(record[_QUEUE_OFFSET_AT : _QUEUE_OFFSET_AT + 8], "big")


class PopProcessor:
    def __init__(self, ctx: BrokerContext, pops: Callable[[], PopService]) -> None:
        self.ctx = ctx
        self._pops = pops

    def install(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(RequestCode.POP_MESSAGE, self.pop)
        dispatcher.register(RequestCode.ACK_MESSAGE, self.ack)
        dispatcher.register(RequestCode.BATCH_ACK_MESSAGE, self.batch_ack)
        dispatcher.register(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, self.change_invisible_time)
        dispatcher.register(RequestCode.NOTIFICATION, self.notification)
        dispatcher.register(RequestCode.POLLING_INFO, self.polling_info)

    # ------------------------------------------------------------------ pop
    def pop(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        return self._pop(request, conn, hold=True)

    def answer_held(self, responder: Responder) -> None:
        """A held pop, run again (no more waiting) and answered: POLLING_TIMEOUT if
        still nothing."""
        request = responder.request
        try:
            if request.code == RequestCode.NOTIFICATION:
                response = self._notify(request, responder.connection, hold=False)
            else:
                response = self._pop(request, responder.connection, hold=False, responder=responder)
        except RequestError as exc:
            response = request.response_to(exc.code, str(exc))
        if response is not None:
            responder.send(response)

    def _pop(
        self,
        request: RemotingCommand,
        conn: Connection,
        *,
        hold: bool,
        responder: Responder | None = None,
    ) -> RemotingCommand | None:
        """The answer, or None when it comes later (held, or waiting for the
        checkpoints' durability: through ``responder`` if given, a held pop's)."""
        header = request.header(PopMessageRequestHeader)
        self._refuse_unless_master()
        self._check_pop(header)
        codes = self._filter(header)
        topic = self._readable(header.topic)
        group = header.consumer_group
        retry = pop_retry_topic(group, header.topic)
        if header.queue_id >= 0:
            if not 0 <= header.queue_id < topic:
                raise RequestError(
                    ResponseCode.INVALID_PARAMETER,
                    f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                    f"readQueueNums:[{topic}]",
                )
            normal = [(header.topic, header.queue_id)]
        else:
            start = random.randrange(topic)
            normal = [(header.topic, (start + i) % topic) for i in range(topic)]
        if header.order:
            answer = self._pop_fifo(request, conn, header, normal, codes, responder)
            if answer is not False:
                return answer
            return self._nothing(request, conn, header, hold, retry, ORDER_REVIVE_QUEUE, 0)
        retry_queues = self.ctx.topics.get(retry)
        retries = [(retry, q) for q in range(retry_queues.read_queue_nums)] if retry_queues else []
        order = retries + normal if random.randrange(RETRY_FIRST_ONE_IN) == 0 else normal + retries
        pop_time = self.ctx.clock()
        taken: list[tuple[str, int, int, list[int], int, list[memoryview]]] = []
        room = header.max_msg_nums
        rest = 0
        for topic_name, queue_id in order:
            found = self._take(header, topic_name, queue_id, room, codes) if room else None
            if found is None:
                continue
            start, offsets, end, records, left = found
            rest += left
            if offsets:
                taken.append((topic_name, queue_id, start, offsets, end, records))
                room -= len(offsets)
            elif end > start:  # (only filtered-out messages: the pop offset moves past them)
                self._advance(group, topic_name, queue_id, end)
        if not taken:
            return self._nothing(request, conn, header, hold, retry, REVIVE_QUEUE, rest)
        return self._store_checkpoints(request, conn, header, pop_time, taken, rest, responder)

    def _nothing(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: PopMessageRequestHeader,
        hold: bool,
        retry: str,
        revive_queue: int,
        rest: int,
    ) -> RemotingCommand | None:
        """A pop that found nothing: held for ``pollTime`` (None), or POLLING_TIMEOUT
        (a FIFO pop: every queue may be locked to the group's messages in flight)."""
        if hold and header.poll_time > 0 and self._hold(request, conn, header, retry):
            return None
        return request.response_to(
            ResponseCode.POLLING_TIMEOUT,
            "no new message",
            header=PopMessageResponseHeader(
                self.ctx.clock(), header.invisible_time, revive_queue, rest
            ),
        )

    def _take(
        self,
        header: PopMessageRequestHeader,
        topic: str,
        queue_id: int,
        most: int,
        codes: frozenset[int] | None,
    ) -> tuple[int, list[int], int, list[memoryview], int] | None:
        """(where it read from, the offsets taken, where it stopped, their records, how
        many are left) of one queue; None if the queue has nothing from the offset."""
        store = self.ctx.store
        queue = store.consume_queue(topic, queue_id)
        if queue is None:
            return None
        offset = self._pop_offset(header, topic, queue_id, queue.min_offset, queue.max_offset)
        if offset >= queue.max_offset:
            return None
        result = store.get_message(
            header.consumer_group, topic, queue_id, offset, most, tag_codes=codes
        )
        records = list(result.messages)
        offsets = [_record_queue_offset(r) for r in records]
        end = max(result.next_begin_offset, offset)
        return offset, offsets, end, records, max(0, queue.max_offset - end)

    def _pop_offset(
        self, header: PopMessageRequestHeader, topic: str, queue_id: int, low: int, high: int
    ) -> int:
        """Where the group pops this queue from: past everything it popped, never below
        the queue's first message; a group new to it starts at its first message, or with
        ``initMode`` 1 at its end."""
        group = header.consumer_group
        popped = self._pops().state.pop_offset(group, topic, queue_id)
        committed = self.ctx.offsets.query(group, topic, queue_id)
        offset = max(popped if popped is not None else -1, committed)
        if offset < 0:
            offset = high if header.init_mode == 1 else low
        return max(offset, low)

    def _advance(self, group: str, topic: str, queue_id: int, end: int) -> None:
        self._pops().state.popped[(group, topic, queue_id)] = end
        self.ctx.offsets.commit(group, topic, queue_id, end)

    def _store_checkpoints(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: PopMessageRequestHeader,
        pop_time: int,
        taken: list[tuple[str, int, int, list[int], int, list[memoryview]]],
        rest: int,
        responder: Responder | None,
    ) -> RemotingCommand | None:
        """One checkpoint record per queue; the answer once they are as safe as a send."""
        group = header.consumer_group
        due = str(pop_time + header.invisible_time)
        store = self.ctx.store
        ticket = store.durability.ticket(True)
        end_offset = 0
        for topic, queue_id, start, offsets, end, _records in taken:
            ck = Checkpoint(
                group, topic, queue_id, start, pop_time, header.invisible_time, end, offsets
            )
            result = store.put_message_nowait(self._ck_message(ck, due), announce=False)
            if result.append is None:
                store.announce_appends()
                raise RequestError(
                    ResponseCode.SYSTEM_ERROR
                    if result.status is not PutMessageStatus.SERVICE_NOT_AVAILABLE
                    else ResponseCode.SERVICE_NOT_AVAILABLE,
                    f"the pop's checkpoint was not stored: {result.remark}",
                )
            self._advance(group, topic, queue_id, end)
            self._pops().state.stored(ck)
            end_offset = result.append.end_offset
        store.announce_appends()
        response_header = PopMessageResponseHeader(
            pop_time,
            header.invisible_time,
            REVIVE_QUEUE,
            rest,
            start_offset_info([(t, q, s) for t, q, s, _o, _e, _r in taken]),
            msg_offset_info([(t, q, o) for t, q, _s, o, _e, _r in taken]),
        )
        body = b"".join(r for *_head, records in taken for r in records)
        self.ctx.stats.delivered(header.topic, sum(len(t[3]) for t in taken), len(body))
        answer = request.response_to(header=response_header, body=body)
        return self._answer_when_safe(request, conn, answer, ticket, end_offset, responder)

    # ------------------------------------------------------------------ notification
    def notification(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        return self._notify(request, conn, hold=True)

    def _notify(
        self, request: RemotingCommand, conn: Connection, *, hold: bool
    ) -> RemotingCommand | None:
        """NOTIFICATION: ``hasMsg`` when the group has a message to pop there (the topic's
        queue, or any, or its pop retry topic); else held up to ``pollTime`` for one
        (``pollingFull`` when too many wait)."""
        header = request.header(NotificationRequestHeader)
        self._refuse_unless_master()
        self._group(header.consumer_group)
        queues = self._readable(header.topic)
        if header.queue_id >= queues:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                f"readQueueNums:[{queues}]",
            )
        group = header.consumer_group
        retry = pop_retry_topic(group, header.topic)
        where = [(header.topic, q) for q in range(queues) if header.queue_id in (-1, q)]
        retries = self.ctx.topics.get(retry)
        where += [(retry, q) for q in range(retries.read_queue_nums)] if retries else []
        has = any(self._has_message(group, topic, queue_id) for topic, queue_id in where)
        if has or not hold or header.poll_time <= 0:
            return request.response_to(header=NotificationResponseHeader(has_msg=has))
        holds = self._pops().holds
        if holds.held >= holds.most:
            return request.response_to(header=NotificationResponseHeader(polling_full=True))
        wait_s = min(header.poll_time / 1000, self.ctx.config.long_polling_max_s)
        responder = conn.defer(request)
        holds.hold(responder, header.topic, header.queue_id, 0, wait_s)
        holds.hold(responder, retry, -1, 0, wait_s)
        return None

    def _has_message(self, group: str, topic: str, queue_id: int) -> bool:
        queue = self.ctx.store.consume_queue(topic, queue_id)
        if queue is None or queue.max_offset <= queue.min_offset:
            return False
        popped = self._pops().state.pop_offset(group, topic, queue_id)
        committed = self.ctx.offsets.query(group, topic, queue_id)
        return max(popped if popped is not None else -1, committed) < queue.max_offset

    def polling_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """POLLING_INFO: how many pops wait at the topic's queue (-1: of any)."""
        header = request.header(PollingInfoRequestHeader)
        self._group(header.consumer_group)
        self._readable(header.topic)
        waiting = self._pops().holds.waiting(header.topic, header.queue_id)
        return request.response_to(header=PollingInfoResponseHeader(waiting))

    # ------------------------------------------------------------------ FIFO
    def _pop_fifo(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: PopMessageRequestHeader,
        queues: list[tuple[str, int]],
        codes: frozenset[int] | None,
        responder: Responder | None,
    ) -> RemotingCommand | Literal[False] | None:
        """A FIFO pop: the messages of the first queue not locked to the group (its
        last batch all acked, or its time up: then the same messages again); the same
        batch again for the same ``attemptId`` while it is locked. False: nothing."""
        group, now = header.consumer_group, self.ctx.clock()
        state = self._pops().state
        for topic, queue_id in queues:
            batch = state.orders.get((group, topic, queue_id))
            if batch is not None and batch.open_offsets:
                if batch.locked(now):
                    if header.attempt_id and header.attempt_id == batch.attempt_id:
                        return self._order_answer(request, header, batch, cached=True)
                    continue
                again = self._again(header, batch, now)
                if again is None:
                    continue
                return self._store_order(request, conn, header, again, responder)
            start = batch.end if batch is not None else None
            found = self._take_fifo(header, topic, queue_id, start, codes)
            if found is None:
                continue
            offsets, end = found
            new = OrderBatch(
                group,
                topic,
                queue_id,
                offsets[0],
                now,
                header.invisible_time,
                end,
                header.attempt_id or "",
                offsets,
                [1] * len(offsets),
            )
            return self._store_order(request, conn, header, new, responder)
        return False

    def _take_fifo(
        self,
        header: PopMessageRequestHeader,
        topic: str,
        queue_id: int,
        start: int | None,
        codes: frozenset[int] | None,
    ) -> tuple[list[int], int] | None:
        """(offsets taken, where reading stopped) of a queue's next messages; None if
        none (a filtered-out stretch moves the queue's offset past it)."""
        queue = self.ctx.store.consume_queue(topic, queue_id)
        if queue is None:
            return None
        if start is None:
            start = self._pop_offset(header, topic, queue_id, queue.min_offset, queue.max_offset)
        start = max(start, queue.min_offset)
        if start >= queue.max_offset:
            return None
        result = self.ctx.store.get_message(
            header.consumer_group, topic, queue_id, start, header.max_msg_nums, tag_codes=codes
        )
        offsets = [_record_queue_offset(r) for r in result.messages]
        end = max(result.next_begin_offset, start)
        if not offsets:
            if end > start:
                self.ctx.offsets.commit(header.consumer_group, topic, queue_id, end)
            return None
        return offsets, end

    def _again(
        self, header: PopMessageRequestHeader, batch: OrderBatch, now: int
    ) -> OrderBatch | None:
        """The batch's messages not acked, once more (their counts + 1), in order;
        those past the group's retries go to its DLQ instead (each copy acks its
        message in the same record). None if none is left."""
        counts = dict(zip(batch.offsets, batch.counts, strict=True))
        most = self._pops().max_retries(batch.group) + 1
        offsets, again = [], []
        for offset in batch.open_offsets:
            if counts[offset] >= most:
                if not self._dead_letter(batch, offset):
                    break  # (the store refused it for now: the order waits)
                continue
            offsets.append(offset)
            again.append(counts[offset] + 1)
        if not offsets:
            return None
        return OrderBatch(
            batch.group,
            batch.topic,
            batch.queue_id,
            offsets[0],
            max(now, batch.pop_time + 1),
            header.invisible_time,
            batch.end,
            header.attempt_id or "",
            offsets,
            again,
        )

    def _dead_letter(self, batch: OrderBatch, offset: int) -> bool:
        """Store a FIFO message past its retries in the DLQ, acking it in the same record."""
        store = self.ctx.store
        queue = store.consume_queue(batch.topic, batch.queue_id)
        entry = queue.entry(offset) if queue is not None else None
        if entry is None:
            return True
        message = store.look_message_by_offset(entry[0], entry[1])
        topic = dlq_topic(batch.group)
        self.ctx.topics.ensure(topic)
        properties = dict(message.properties)
        properties.setdefault(PROPERTY_RETRY_TOPIC, batch.topic)
        properties[PROPERTY_POP_ACK] = ack_value(batch.key, [offset])
        properties[PROPERTY_MARKS] = marks("a", batch.key, [offset])
        result = store.put_message_nowait(
            MessageToStore(
                topic,
                0,
                message.body,
                message.flag,
                properties,
                born_timestamp=message.born_timestamp,
                store_host=self.ctx.store_host,
                reconsume_times=message.reconsume_times + 1,
            )
        )
        if result.stored:
            batch.acked.add(offset)
        return result.stored

    def _store_order(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: PopMessageRequestHeader,
        batch: OrderBatch,
        responder: Responder | None,
    ) -> RemotingCommand | None:
        """Store a FIFO batch's record (revive topic queue 2); answer once it is safe."""
        store = self.ctx.store
        ticket = store.durability.ticket(True)
        result = store.put_message_nowait(
            self._record(ORDER_QUEUE, {PROPERTY_POP_ORDER: batch.encode()})
        )
        if result.append is None:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"the FIFO pop was not stored: {result.remark}"
            )
        self._pops().state.order_stored(batch)
        self.ctx.offsets.commit(batch.group, batch.topic, batch.queue_id, batch.offsets[0])
        answer = self._order_answer(request, header, batch, cached=False)
        return self._answer_when_safe(
            request, conn, answer, ticket, result.append.end_offset, responder
        )

    def _order_answer(
        self,
        request: RemotingCommand,
        header: PopMessageRequestHeader,
        batch: OrderBatch,
        *,
        cached: bool,
    ) -> RemotingCommand:
        """The batch's messages (those not acked, when ``cached``: the same receive
        asked again), with their delivery counts (orderCountInfo)."""
        store = self.ctx.store
        offsets = batch.open_offsets if cached else batch.offsets
        records = []
        for offset in offsets:
            found = store.get_message(batch.group, batch.topic, batch.queue_id, offset, 1)
            records += [r for r in found.messages if _record_queue_offset(r) == offset]
        counts = dict(zip(batch.offsets, batch.counts, strict=True))
        kind = topic_kind(batch.topic)
        count_info = ";".join(
            [f"{kind} qo{batch.queue_id}%{o} {counts[o] - 1}" for o in offsets]
            + [f"{kind} {batch.queue_id} {min(counts[o] for o in offsets) - 1}"]
        )
        body = b"".join(records)
        self.ctx.stats.delivered(batch.topic, len(records), len(body))
        return request.response_to(
            header=PopMessageResponseHeader(
                batch.pop_time,
                batch.invisible_ms,
                ORDER_REVIVE_QUEUE,
                0,
                start_offset_info([(batch.topic, batch.queue_id, batch.ck_offset)]),
                msg_offset_info([(batch.topic, batch.queue_id, offsets)]),
                count_info,
            ),
            body=body,
        )

    def _ck_message(self, ck: Checkpoint, due: str, *, acks: str | None = None) -> MessageToStore:
        """A checkpoint's record: a timer message due when the messages come back,
        delivered then to the revive topic (with the ack of an old handle: ``acks``)."""
        properties = {PROPERTY_POP_CK: ck.encode(), PROPERTY_TIMER_DELIVER_MS: due}
        if acks is not None:
            properties[PROPERTY_POP_ACK] = acks
            properties[PROPERTY_MARKS] = marks(
                "a", acks.split(" ")[0], [int(o) for o in acks.split(" ")[1].split(",")]
            )
        return self._record(DUE_QUEUE, properties)

    def _record(self, queue_id: int, properties: dict[str, str]) -> MessageToStore:
        """One of pop's records, in the revive topic's ``queue_id`` (hamq/broker/pop.py);
        its durability is the request's to wait for (WAIT=false: not the store's)."""
        return MessageToStore(
            self._pops().state.revive_topic,
            queue_id,
            b"",
            properties={**properties, PROPERTY_WAIT: "false"},
            store_host=self.ctx.store_host,
        )

    def _answer_when_safe(
        self,
        request: RemotingCommand,
        conn: Connection,
        answer: RemotingCommand,
        ticket: Ticket | None,
        end_offset: int,
        responder: Responder | None = None,
    ) -> RemotingCommand | None:
        """``answer`` once the records up to ``end_offset`` are as durable as a SEND_OK
        (flushed with SYNC_FLUSH, on the replicas a send waits for); if they are not in
        time, a SYSTEM_ERROR saying so (the records stand: a pop's messages come back
        when their time runs out, an ack is taken)."""
        if ticket is None:
            return answer
        if responder is None:
            responder = conn.defer(request)
        deferred = responder

        def done(status: PutMessageStatus, remark: str) -> None:
            if status is PutMessageStatus.PUT_OK:
                deferred.send(answer)
            else:
                deferred.send(
                    request.response_to(ResponseCode.SYSTEM_ERROR, f"{status.value}: {remark}")
                )

        ticket.wait(end_offset, done)
        return None

    def _hold(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: PopMessageRequestHeader,
        retry: str,
    ) -> bool:
        holds = self._pops().holds
        if holds.held >= holds.most:
            raise RequestError(
                ResponseCode.POLLING_FULL,
                f"{holds.held} pops wait already (the most a broker holds); try again later",
            )
        wait_s = min(header.poll_time / 1000, self.ctx.config.long_polling_max_s)
        responder = conn.defer(request)
        holds.hold(responder, header.topic, header.queue_id, 0, wait_s)
        holds.hold(responder, retry, -1, 0, wait_s)
        return True

    # ------------------------------------------------------------------ checks
    def _refuse_unless_master(self) -> None:
        refusal = self.ctx.roles.refusal(trio.current_time())
        if refusal is not None:
            raise RequestError(refusal.code, f"pop: {refusal.why}")

    def _check_pop(self, header: PopMessageRequestHeader) -> None:
        if not 1 <= header.max_msg_nums <= MAX_POP_MESSAGES:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"maxMsgNums {header.max_msg_nums} is not in 1..{MAX_POP_MESSAGES}",
            )
        self._check_invisible(header.invisible_time)
        self._group(header.consumer_group)

    def _check_invisible(self, invisible_ms: int) -> None:
        most = int(self.ctx.store.config.timer_max_delay_s * 1000)
        if not 0 < invisible_ms <= most:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"invisibleTime {invisible_ms} ms is not in 1..{most} (timer_max_delay_s)",
            )

    def _group(self, group: str) -> None:
        consuming_group(self.ctx, group)

    def _readable(self, topic: str) -> int:
        """The topic's read queue count; it must exist and be readable."""
        config = self.ctx.topics.get(topic)
        if config is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not config.perm & PERM_READ:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden"
            )
        return config.read_queue_nums

    @staticmethod
    def _filter(header: PopMessageRequestHeader) -> frozenset[int] | None:
        if (header.exp_type or "TAG").upper() != "TAG":
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"{header.exp_type} filters are not supported; subscribe by tags",
            )
        try:
            return tag_filter(header.exp)
        except TagExpressionError as exc:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription failed: {exc}",
            ) from None

    # ------------------------------------------------------------------ ack
    def _in_flight(
        self, group: str, topic: str, queue_id: int, extra_info: str, offset: int
    ) -> tuple[Checkpoint | OrderBatch, ReceiptHandle]:
        """The checkpoint a receipt handle names, with the message at ``offset`` in flight
        in it; RequestError (nothing changed) otherwise."""
        try:
            handle = ReceiptHandle.parse(extra_info)
        except ReceiptHandleError as exc:
            raise RequestError(ResponseCode.INVALID_PARAMETER, str(exc)) from None
        popped_from = topic if is_retry_topic(topic) else real_topic(handle.kind, topic, group)
        if handle.queue_id != queue_id or handle.offset != offset:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"the receipt handle is for queue {handle.queue_id} offset {handle.offset}, "
                f"not queue {queue_id} offset {offset}",
            )
        if handle.revive_queue == ORDER_REVIVE_QUEUE:
            batch = self._pops().state.orders.get((group, popped_from, queue_id))
            if batch is None or batch.pop_time != handle.pop_time or offset not in batch.offsets:
                raise RequestError(
                    ResponseCode.NO_MESSAGE,
                    f"no FIFO message in flight has this receipt handle (group {group}, "
                    f"topic {popped_from}: its time ran out and it was delivered again, or "
                    "it was never popped)",
                )
            if offset in batch.acked:
                raise RequestError(ResponseCode.NO_MESSAGE, "the message was acked already")
            return batch, handle
        key = ck_key(group, popped_from, queue_id, handle.ck_offset, handle.pop_time)
        ck, why = self._pops().state.known(key, offset)
        if ck is None:
            raise RequestError(
                ResponseCode.NO_MESSAGE, f"{why} (group {group}, topic {popped_from})"
            )
        return ck, handle

    def ack(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        header = request.header(AckMessageRequestHeader)
        self._refuse_unless_master()
        ck, _handle = self._in_flight(
            header.consumer_group, header.topic, header.queue_id, header.extra_info, header.offset
        )
        return self._store_acks(request, conn, [(ck, [header.offset])])

    def batch_ack(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """BATCH_ACK_MESSAGE: body ``{"acks": [{"c": group, "t": topic, "r": kind, "q":
        queue, "so": ck offset, "pt": pop time, "it": invisible time, "rq": revive queue,
        "b": base64 of a Java BitSet (bit i: offset so + i)}], "brokerName": ...}``
        (RocketMQ's BatchAckMessageRequestBody; long key names read too). As RocketMQ's,
        entries that name no message in flight are passed over; NO_MESSAGE if none did."""
        self._refuse_unless_master()
        try:
            body = json.loads(request.body or b"{}")
            entries = [_batch_entry(a) for a in body.get("acks") or ()]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER, f"batch ack body does not read: {exc}"
            ) from None
        state = self._pops().state
        found: list[tuple[Checkpoint | OrderBatch, list[int]]] = []
        refused: list[str] = []
        for group, topic, queue_id, (ck_offset, pop_time), offsets in entries:
            key = ck_key(group, topic, queue_id, ck_offset, pop_time)
            taken = []
            for offset in offsets:
                ck, why = state.known(key, offset)
                if ck is None:
                    refused.append(f"{topic}/{queue_id}/{offset}: {why}")
                    continue
                taken.append(offset)
            if taken and ck is not None:
                found.append((state.checkpoints[key], taken))
        if not found:
            raise RequestError(
                ResponseCode.NO_MESSAGE,
                "no ack of the batch names a message in flight"
                + (f": {'; '.join(refused[:5])}" if refused else ""),
            )
        return self._store_acks(request, conn, found)

    def _store_acks(
        self,
        request: RemotingCommand,
        conn: Connection,
        acks: list[tuple[Checkpoint | OrderBatch, list[int]]],
    ) -> RemotingCommand | None:
        store = self.ctx.store
        ticket = store.durability.ticket(True)
        end_offset = 0
        for ck, offsets in acks:
            result = store.put_message_nowait(
                self._record(
                    ACK_QUEUE,
                    {
                        PROPERTY_POP_ACK: ack_value(ck.key, offsets),
                        PROPERTY_MARKS: marks("a", ck.key, offsets),
                    },
                ),
                announce=False,
            )
            if result.append is None:
                store.announce_appends()
                raise RequestError(
                    ResponseCode.SYSTEM_ERROR, f"the ack was not stored: {result.remark}"
                )
            ck.acked.update(offsets)  # (at once: a second ack of it is refused)
            if isinstance(ck, OrderBatch):  # (the group's offset: its first message open)
                left = ck.open_offsets
                self.ctx.offsets.commit(
                    ck.group, ck.topic, ck.queue_id, left[0] if left else ck.end
                )
            end_offset = result.append.end_offset
        store.announce_appends()
        return self._answer_when_safe(request, conn, request.response_to(), ticket, end_offset)

    # ------------------------------------------------------------------ change
    def _change_order(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: ChangeInvisibleTimeRequestHeader,
        batch: OrderBatch,
    ) -> RemotingCommand | None:
        """A FIFO message's new time: when it (and so its queue) comes back; its
        receipt handle keeps its batch's pop time."""
        at = self.ctx.clock() + header.invisible_time
        store = self.ctx.store
        ticket = store.durability.ticket(True)
        result = store.put_message_nowait(
            self._record(
                ORDER_QUEUE, {PROPERTY_POP_ORDER_VISIBLE: f"{batch.key} {header.offset} {at}"}
            )
        )
        if result.append is None:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"the change was not stored: {result.remark}"
            )
        batch.visible_at[header.offset] = at
        answer = request.response_to(
            header=ChangeInvisibleTimeResponseHeader(
                batch.pop_time, at - batch.pop_time, ORDER_REVIVE_QUEUE
            )
        )
        return self._answer_when_safe(request, conn, answer, ticket, result.append.end_offset)

    def change_invisible_time(
        self, request: RemotingCommand, conn: Connection
    ) -> RemotingCommand | None:
        header = request.header(ChangeInvisibleTimeRequestHeader)
        self._refuse_unless_master()
        self._check_invisible(header.invisible_time)
        ck, _handle = self._in_flight(
            header.consumer_group, header.topic, header.queue_id, header.extra_info, header.offset
        )
        if isinstance(ck, OrderBatch):
            return self._change_order(request, conn, header, ck)
        # (after the old pop time: a change within the pop's millisecond would otherwise
        # name the old checkpoint again when its offset was the pop's first)
        pop_time = max(self.ctx.clock(), ck.pop_time + 1)
        new = Checkpoint(
            ck.group,
            ck.topic,
            ck.queue_id,
            header.offset,
            pop_time,
            header.invisible_time,
            ck.end,
            [header.offset],
        )
        store = self.ctx.store
        ticket = store.durability.ticket(True)
        message = self._ck_message(
            new, str(pop_time + header.invisible_time), acks=ack_value(ck.key, [header.offset])
        )
        result = store.put_message_nowait(message)
        if result.append is None:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"the change was not stored: {result.remark}"
            )
        ck.acked.add(header.offset)
        self._pops().state.stored(new)
        answer = request.response_to(
            header=ChangeInvisibleTimeResponseHeader(pop_time, header.invisible_time, REVIVE_QUEUE)
        )
        return self._answer_when_safe(request, conn, answer, ticket, result.append.end_offset)


def _batch_entry(ack: dict[str, object]) -> tuple[str, str, int, tuple[int, int], list[int]]:
    """(group, topic popped from, queue, (ck offset, pop time), offsets) of a BatchAck."""

    def field(short: str, long: str) -> object:
        return ack[short] if short in ack else ack[long]

    group, topic = str(field("c", "consumerGroup")), str(field("t", "topic"))
    kind = str(ack.get("r", ack.get("retry", "0")))
    start = int(field("so", "startOffset"))  # type: ignore[call-overload]
    bits = field("b", "bitSet")
    offsets = [start + i for i in _bit_indexes(bits)]
    return (
        group,
        real_topic(kind, topic, group),
        int(field("q", "queueId")),  # type: ignore[call-overload]
        (start, int(field("pt", "popTime"))),  # type: ignore[call-overload]
        offsets,
    )


def _bit_indexes(bits: object) -> list[int]:
    """The set bits of a Java BitSet as fastjson writes its ``toByteArray()``: base64,
    little-endian (bit i is bit i % 8 of byte i // 8)."""
    if not isinstance(bits, str):
        raise ValueError(f"bitSet {bits!r} is not base64 text")
    data = base64.b64decode(bits, validate=True)
    return [8 * i + bit for i, byte in enumerate(data) for bit in range(8) if byte >> bit & 1]
