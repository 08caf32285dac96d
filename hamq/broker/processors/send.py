"""Sending: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320), and
CONSUMER_SEND_MSG_BACK (36). Shapes and codes: docs/PROTOCOL.md#sending,
docs/PROTOCOL.md#batch-body.

Appends run inline, in the order requests arrive on a connection (ordered messages
stay ordered). The sends of one group of requests (the complete frames of one read:
``Connection.at_group_end``) are finished together: their puts are announced to the
store once (a master's slaves get the group's bytes in one write and ack it once), and
those that wait share one durability ticket and one wait, for the group's end, and are
answered together, in one write — each with its own answer, in the order the requests
came (an answer decided after the group's first waiting send waits behind it).

Before it puts, a send asks the store for its durability ticket
(hamq/store/durability.py decides, in ``Durability.ticket``: its fsync with SYNC_FLUSH,
its replicas on a SYNC_MASTER, unless the message's WAIT is "false"); with one, the send
takes its place in flight before it is stored and is answered when the ticket calls
back with the status (SEND_OK, FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
SLAVE_NOT_AVAILABLE; the message is stored in every case). What the statuses promise:
SEND_OK, that it is as durable as configured (with a SyncStateSet: on every member);
FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE, only that it is on this master — kept if
this broker stays master until its replicas have it, but cut from its log if another
broker is elected first without it (this broker truncates to the new master's log when
it follows it), so a producer that needs it must send it again (a duplicate if it
survives).

Whether a send is taken at all is hamq/broker/roles.py's ``refusal``: a broker that is
not master refuses sends with SERVICE_NOT_AVAILABLE, as RocketMQ's store does, and so
does a controller-mode master that has lost its controller lease (fenced); NO_PERMISSION
is left to refusals no failover will lift (the ACL, a topic or broker without write
permission). Both codes make producers retry — SERVICE_NOT_AVAILABLE is in RocketMQ's
retry codes, and hamq's producer looks the route up again — and both are said before
anything is stored. A controller-mode master that stops being master, or loses its
lease, while sends wait for their replicas answers them SERVICE_NOT_AVAILABLE (stored
here, not known to be on the replicas: send again) instead of their status; so is an
answer the lease no longer covers (``Roles.answer_refusal``).

What is checked, each refusal with RocketMQ's code and a remark that names it: the
topic's name, sending to system topics, the topic's existence (auto-created from
TBW102 when allowed), its write permission, the queue id, the body's size; a
transactional (half) message in a batch or with a delay level (MESSAGE_ILLEGAL). A half
message (``TRAN_MSG=true``) is stored under RMQ_SYS_TRANS_HALF_TOPIC with its real topic
and queue in its properties (hamq/broker/transactions.py); it waits for its fsync and
replicas like any other send. The broker adds CLUSTER and, when the
producer sent none, a UNIQ_KEY. A batch (code 320, or code 10 with ``batch`` "1" or
"true" as the C++ client sends it) is split and each entry stored as its own message.
A send to a retry topic takes its reconsume times from the header, else from the
RECONSUME_TIME property (a consumer's fallback retry); past the group's maximum it
goes to the DLQ.
"""

from __future__ import annotations

import logging
import random

import trio

from hamq.broker.context import BrokerContext
from hamq.broker.stats import code_name
from hamq.broker.transactions import half_message, is_transactional
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import PERM_WRITE
from hamq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
)
from hamq.protocol.message import (
    DEFAULT_TOPIC,
    INTERNAL_PREFIX,
    INTERNAL_PROPERTIES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_KEY,
    RETRY_GROUP_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    MessageFormatError,
    decode_batch,
    decode_properties,
    dlq_topic,
    is_retry_topic,
    retry_topic,
    topic_error,
)
from hamq.protocol.send_fields import decode_send_header, send_answer_fields
from hamq.remoting import Connection, Dispatcher, Responder, parse_address
from hamq.store import (
    MessageToStore,
    PutMessageResult,
    PutMessageStatus,
    StoreError,
    Ticket,
    is_timer_message,
)

log = logging.getLogger(__name__)

_STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.WHEEL_TIMER_FLOW_CONTROL: ResponseCode.SYSTEM_ERROR,
}
#: the statuses a send's replicas decide (a controller-mode master may have to take them
#: back: Roles.answer_refusal)
_REPLICA_STATUSES = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)
#: a stored send's answer by the SendStatus a client reads from it (for the broker's stats)
_SEND_STATUSES: dict[int, str] = {
    ResponseCode.SUCCESS: "SEND_OK",
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}


#: delay level a sent-back message gets when the consumer asks for none: 3 + reconsume times
BASE_RETRY_DELAY_LEVEL = 3


def _pair(key: str, value: str) -> str:
    """One property as encode_properties writes it."""
    return f"{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"


def peer_host(conn: Connection) -> tuple[str, int]:
    """The BORNHOST of a request: its connection's remote address (parsed once)."""
    host = conn.attributes.get("born_host")
    if host is None:
        try:
            host = parse_address(conn.peer)
        except ValueError:
            host = ("127.0.0.1", 0)
        conn.attributes["born_host"] = host
    return host


def _reconsume_times(
    topic: str, header: SendMessageRequestHeader, properties: dict[str, str]
) -> int:
    """How often a message was consumed before: the header's ``reconsumeTimes``; for a
    retry topic, when the header has none, the RECONSUME_TIME property (taken out of the
    properties), which a consumer's fallback retry carries (Java's producer moves it
    into the header; others may not)."""
    if header.reconsume_times or not is_retry_topic(topic):
        return header.reconsume_times or 0
    text = properties.pop(PROPERTY_RECONSUME_TIME, None)
    if text is None:
        return 0
    try:
        times = int(text)
    except ValueError:
        times = -1
    if times < 0:
        raise RequestError(
            ResponseCode.MESSAGE_ILLEGAL,
            f"property {PROPERTY_RECONSUME_TIME} {text!r} is not a count",
        )
    return times


def _batch_entry_properties(topic: str, shared: dict[str, str], text: str) -> dict[str, str]:
    """A batch entry's properties: the request's, then its own. RequestError if they ask
    for a delivery time (a batch goes to one queue at once); hamq's timer mark is
    dropped (only the broker's deliveries carry it), as are hamq's other own properties."""
    properties = {**shared, **decode_properties(text)} if shared else decode_properties(text)
    if is_timer_message(topic, properties):
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot hold timer messages")
    _drop_internal(properties)
    return properties


def _drop_internal(properties: dict[str, str]) -> bool:
    """Drop what only the broker may write (INTERNAL_PROPERTIES); whether there was any."""
    found = False
    for key in INTERNAL_PROPERTIES:
        found = properties.pop(key, None) is not None or found
    return found


class _Group:
    """The sends of one group of requests (``Connection.at_group_end``: the complete
    frames of one read): their puts are announced to the store once, and those that
    wait for their durability share one ticket and one wait, for the group's end. Its
    requests came in one read: ``started`` is when, for each of them."""

    __slots__ = ("end_offset", "started", "ticket", "waiting")

    def __init__(self, started: float) -> None:
        self.started = started
        self.ticket: Ticket | None = None
        self.end_offset = -1
        #: the answers given once the group's wait is over, in the order the requests
        #: came: (answer, its responder, when its request came, decided already) — the
        #: sends that wait, and every answer decided after the first of them (a refusal,
        #: a send that waits for nothing), so that a connection's answers keep its order
        self.waiting: list[tuple[RemotingCommand, Responder, float, bool]] = []


class SendProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        #: the sends of the group being dispatched (None between groups)
        self._group: _Group | None = None

    def install(self, dispatcher: Dispatcher) -> None:
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
        ):
            dispatcher.register(code, self.send)
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.send_back)

    # ------------------------------------------------------------------ send
    def _refuse_unless_taken(self, now: float) -> None:
        """RequestError unless this broker takes sends now (hamq/broker/roles.py says)."""
        refusal = self.ctx.roles.refusal(now)
        if refusal is not None:
            raise RequestError(refusal.code, refusal.why)

    def send(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        group = self._group
        fresh = group is None
        if group is None:
            group = self._group = _Group(trio.current_time())
        started = group.started
        try:
            response = self._send(request, conn, started)
        except RequestError as exc:
            self.ctx.stats.refused(code_name(exc.code))
            if not group.waiting:
                raise
            response = request.response_to(exc.code, str(exc))
        finally:
            if fresh:  # (at once when no group is being dispatched)
                conn.at_group_end(self._end_group)
        if response is not None and group.waiting:  # (behind the answers it follows)
            try:
                responder = conn.defer(request)
            except RequestError:
                return response  # (no place in flight to wait in: answered now)
            group.waiting.append((response, responder, started, True))
            return None
        return response

    def _end_group(self) -> None:
        """The group's sends are all stored: wait once for the durability of those that
        wait (to the group's end), then say once that the log grew (a master's slaves
        get the group's bytes in one write; the acks wake the wait)."""
        group, self._group = self._group, None
        if group is None:
            return
        if group.waiting:
            assert group.ticket is not None
            waiting = group.waiting
            group.ticket.wait(
                group.end_offset, lambda status, remark: self._answer(waiting, status, remark)
            )
        self.ctx.store.announce_appends()

    def _answer(
        self,
        waiting: list[tuple[RemotingCommand, Responder, float, bool]],
        status: PutMessageStatus,
        remark: str,
    ) -> None:
        """Answer a group's waiting sends with their ticket's status, and the answers
        decided already that followed them, in order."""
        code = _STATUS_CODES[status]
        roles = self.ctx.roles
        if roles.controlled and status in _REPLICA_STATUSES:
            why = roles.answer_refusal(
                replicated=status is PutMessageStatus.PUT_OK, now=trio.current_time()
            )
            if why is not None:
                code, remark = ResponseCode.SERVICE_NOT_AVAILABLE, why
        connections = set()
        for response, responder, started, decided in waiting:
            if not decided and code != ResponseCode.SUCCESS:
                response.code = code
                response.remark = remark
            responder.send(response, flush=False)
            connections.add(responder.connection)
            if not decided:
                self._answered(response, started)
        for conn in connections:  # (one write of a connection's answers)
            conn.flush()

    def _send(
        self, request: RemotingCommand, conn: Connection, started: float
    ) -> RemotingCommand | None:
        self._refuse_unless_taken(started)
        header = decode_send_header(request.ext_fields, v2=request.code != RequestCode.SEND_MESSAGE)
        batch = request.code == RequestCode.SEND_BATCH_MESSAGE or bool(header.batch)
        topic, queue_id = self._check(header)
        properties = decode_properties(header.properties or "")
        forged = INTERNAL_PREFIX in (header.properties or "") and _drop_internal(properties)
        transactional = is_transactional(properties, header.sys_flag)
        if transactional:
            self._check_half(properties, batch)
        reconsume_times = _reconsume_times(topic, header, properties)
        topic, queue_id = self._retry_or_dead_letter(
            topic, queue_id, header, properties, reconsume_times
        )
        born_host, store_host = peer_host(conn), self.ctx.store_host  # (one each per batch)
        if batch:
            try:
                entries = decode_batch(request.body)
            except MessageFormatError as exc:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
            if not entries:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
            messages = [
                self._message(
                    header,
                    topic,
                    queue_id,
                    entry.body,
                    _batch_entry_properties(topic, properties, entry.properties),
                    born_host,
                    store_host,
                    reconsume_times,
                    flag=entry.flag,
                    text=None
                    if properties or INTERNAL_PREFIX in entry.properties
                    else entry.properties,
                )
                for entry in entries
            ]
        else:
            messages = [
                self._message(
                    header,
                    topic,
                    queue_id,
                    request.body,
                    properties,
                    born_host,
                    store_host,
                    reconsume_times,
                    # (the text the properties came from, unless they were changed since)
                    text=None
                    if transactional or forged or is_retry_topic(header.topic)
                    else header.properties,
                )
            ]
        if transactional:
            half_message(messages[0], header.producer_group)
        return self._store(request, conn, messages, started, queue_id)

    @staticmethod
    def _check_half(properties: dict[str, str], batch: bool) -> None:
        """What a half message may not be (hamq/broker/transactions.py)."""
        if batch:
            raise RequestError(
                ResponseCode.MESSAGE_ILLEGAL, "a batch cannot hold transactional messages"
            )
        if properties.get(PROPERTY_DELAY, "0").strip() not in ("", "0"):
            raise RequestError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"a transactional message cannot have a delay level "
                f"({PROPERTY_DELAY}={properties[PROPERTY_DELAY]})",
            )

    def _check(self, header: SendMessageRequestHeader) -> tuple[str, int]:
        topic = header.topic
        problem = topic_error(topic)
        if problem is not None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, problem)
        if topic in SYSTEM_TOPICS:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"Sending message to topic[{topic}] is forbidden."
            )
        config = self.ctx.topics.get(topic)
        if config is None:
            if is_retry_topic(topic):
                config = self.ctx.topics.ensure(topic)
            elif self.ctx.config.auto_create_topic_enable:
                config = self.ctx.topics.create_from_default(
                    topic,
                    header.default_topic or DEFAULT_TOPIC,
                    header.default_topic_queue_nums,
                )
            if config is None:
                raise RequestError(
                    ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                )
        if not config.perm & PERM_WRITE:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
            )
        queue_id = header.queue_id
        if queue_id < 0:
            queue_id = random.randrange(config.write_queue_nums)
        elif queue_id >= config.write_queue_nums:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.writeQueueNums:[{config.write_queue_nums}]",
            )
        return topic, queue_id

    def _retry_or_dead_letter(
        self,
        topic: str,
        queue_id: int,
        header: SendMessageRequestHeader,
        properties: dict[str, str],
        reconsume_times: int,
    ) -> tuple[str, int]:
        """A consumer re-sending to its retry topic past its retries goes to its DLQ."""
        if not is_retry_topic(topic):
            return topic, queue_id
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        config = self.ctx.subscriptions.find(group)
        most = header.max_reconsume_times
        if most is None:
            text = properties.get(PROPERTY_MAX_RECONSUME_TIMES) or "-1"
            try:
                most = int(text)
            except ValueError:
                raise RequestError(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"property {PROPERTY_MAX_RECONSUME_TIMES} {text!r} is not a number",
                ) from None
        if most < 0:
            most = config.retry_max_times if config else 16
        if reconsume_times > most:
            dead = dlq_topic(group)
            self.ctx.topics.ensure(dead)
            return dead, 0
        return topic, queue_id

    def _message(
        self,
        header: SendMessageRequestHeader,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: dict[str, str],
        born_host: tuple[str, int],
        store_host: tuple[str, int],
        reconsume_times: int,
        *,
        flag: int | None = None,
        text: str | None = None,
    ) -> MessageToStore:
        """The message to store; ``text``: what ``properties`` was decoded from, if the
        caller has it (a batch entry's): the pairs added here are appended to it, so the
        store need not encode them all again (only when they are new keys and the text
        ends with a separator: the text then decodes to ``properties``)."""
        cluster = self.ctx.config.cluster_name
        if text and (
            text[-1] != PROPERTY_SEPARATOR
            or PROPERTY_CLUSTER in properties
            or (PROPERTY_UNIQ_KEY in properties and not properties[PROPERTY_UNIQ_KEY])
        ):
            text = None
        properties[PROPERTY_CLUSTER] = cluster
        if text is not None:
            text += _pair(PROPERTY_CLUSTER, cluster)
        if not properties.get(PROPERTY_UNIQ_KEY):
            uniq_key = properties[PROPERTY_UNIQ_KEY] = self.ctx.ids.next_id(self.ctx.clock())
            if text is not None:
                text += _pair(PROPERTY_UNIQ_KEY, uniq_key)
        return MessageToStore(  # (by position: one per message, half the cost by keyword)
            topic,
            queue_id,
            body,
            header.flag if flag is None else flag,
            properties,
            header.sys_flag,
            header.born_timestamp,
            born_host,
            store_host,
            reconsume_times,
            properties_text=text,
        )

    def _answered(self, response: RemotingCommand, started: float) -> None:
        """Count an answer to a send that stored its message(s), by its SendStatus."""
        status = _SEND_STATUSES.get(response.code) or code_name(response.code)
        self.ctx.stats.answered(status, trio.current_time() - started)

    def _store(
        self,
        request: RemotingCommand,
        conn: Connection,
        messages: list[MessageToStore],
        started: float,
        queue_id: int,
    ) -> RemotingCommand | None:
        # A send that waits (for its fsync, for a slave's ack) takes its place in flight
        # first: refused for being one too many (SYSTEM_BUSY), it must not be stored. The
        # sends of a group that wait share a ticket: what it waits for cannot change
        # within a group (no other task runs in between).
        store = self.ctx.store
        group = self._group
        assert group is not None
        ticket = None
        if messages[-1].wait_store_ok:
            ticket = group.ticket
            if ticket is None:
                ticket = store.durability.ticket(True)
        responder = conn.defer(request) if ticket is not None else None
        if len(messages) == 1:
            results = [store.put_message_nowait(messages[0], announce=False)]
        else:
            results = store.put_batch_nowait(messages, announce=False)
        last = results[-1]
        stats = self.ctx.stats
        sizes = [r.append.size for r in results if r.append is not None]
        if sizes:
            stats.stored(messages[0].topic, len(sizes), sum(sizes))
        if last.append is None:
            if len(results) > 1:
                log.error(
                    "batch to %s stopped after %d of %d messages: %s",
                    messages[0].topic,
                    len(results) - 1,
                    len(messages),
                    last.remark,
                )
            refusal = RequestError(
                _STATUS_CODES.get(last.status, ResponseCode.SYSTEM_ERROR),
                f"{last.status.value}: {last.remark}",
            )
            if responder is None:
                raise refusal
            stats.refused(code_name(refusal.code))
            answer = request.response_to(refusal.code, str(refusal))
            if group.waiting:  # (behind the answers it follows)
                group.waiting.append((answer, responder, started, True))
            else:
                responder.send(answer)
            return None
        response = self._response(request, messages, results, queue_id)
        if responder is None or ticket is None:
            self._answered(response, started)
            return response
        group.ticket = ticket
        group.end_offset = max(group.end_offset, last.append.end_offset)
        group.waiting.append((response, responder, started, False))
        return None

    def _response(
        self,
        request: RemotingCommand,
        messages: list[MessageToStore],
        results: list[PutMessageResult],
        queue_id: int,
    ) -> RemotingCommand:
        """SUCCESS with the offset message id(s) (comma-joined for a batch), the queue it
        was sent to (a half message's real one) and the first queue offset (a half
        message's in the half queue: END_TRANSACTION names it), and the UNIQ_KEY as
        transaction id, as Java answers."""
        first = results[0].append
        assert first is not None
        if len(results) == 1:
            msg_id = first.offset_msg_id
        else:
            msg_id = ",".join(r.append.offset_msg_id for r in results if r.append is not None)
        fields = send_answer_fields(
            msg_id,
            queue_id,
            first.queue_offset,
            messages[0].properties.get(PROPERTY_UNIQ_KEY),  # transaction_id
            None,  # batch_uniq_id
            "DefaultRegion",  # msg_region
            "true",  # trace_on
        )
        return request.response_to(ResponseCode.SUCCESS, ext_fields=fields)

    # ------------------------------------------------------------------ send back
    def send_back(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """A push consumer could not consume a message: store a copy in its group's retry
        topic, delayed by level, or in its dead-letter topic past its retries."""
        self._refuse_unless_taken(trio.current_time())
        header = request.header(ConsumerSendMsgBackRequestHeader)
        group = self.ctx.subscriptions.find(header.group)
        if group is None:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {header.group}",
            )
        try:
            original = self.ctx.store.look_message_by_offset(header.offset)
        except StoreError:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {header.offset}"
            ) from None
        claimed = header.origin_msg_id
        if claimed and claimed not in (original.msg_id, original.offset_msg_id):
            # after a failover this log may hold another message at that offset (the old
            # master's tail was never replicated): retrying it would retry the wrong one
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"the message at offset {header.offset} is {original.msg_id}, not {claimed}: "
                "send the message itself to the retry topic",
            )
        properties = dict(original.properties)
        properties.setdefault(PROPERTY_RETRY_TOPIC, original.topic)
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, header.origin_msg_id or original.msg_id)
        properties.pop(PROPERTY_DELAY, None)
        most = (
            header.max_reconsume_times
            if header.max_reconsume_times is not None
            else group.retry_max_times
        )
        reconsume = original.reconsume_times
        if reconsume >= most or header.delay_level < 0:
            topic, queue_id = dlq_topic(header.group), 0
            self.ctx.topics.ensure(topic)
        else:
            topic = retry_topic(header.group)
            config = self.ctx.topics.ensure(topic, max(1, group.retry_queue_nums))
            queue_id = random.randrange(config.write_queue_nums)
            level = header.delay_level or BASE_RETRY_DELAY_LEVEL + reconsume
            properties[PROPERTY_DELAY] = str(level)
        result = self.ctx.store.put_message_nowait(
            MessageToStore(
                topic=topic,
                queue_id=queue_id,
                body=original.body,
                flag=original.flag,
                properties=properties,
                sys_flag=original.sys_flag,
                born_timestamp=original.born_timestamp,
                born_host=peer_host(conn),
                store_host=self.ctx.store_host,
                reconsume_times=reconsume + 1,
            )
        )
        if result.append is None:
            raise RequestError(
                _STATUS_CODES.get(result.status, ResponseCode.SYSTEM_ERROR), result.remark
            )
        return request.response_to()
