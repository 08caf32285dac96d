"""Transactional messages: RocketMQ 4.x's two-phase send, kept in the CommitLog.

1. **Prepare.** A send whose message has ``TRAN_MSG=true`` (or the PREPARED sysflag) is
   a half message: stored under RMQ_SYS_TRANS_HALF_TOPIC queue 0, its real topic and
   queue in REAL_TOPIC / REAL_QID, its producer group in PGROUP (``half_message``).
   Consumers never see it: no consumer queue of the real topic holds it.
2. **End.** END_TRANSACTION (37, oneway from the producer) names the half message by its
   CommitLog offset and half-queue offset; it counts only if the message there is a half
   message of the group the request names, with that transaction id. COMMIT stores a
   copy under the real topic and queue (sysflag COMMIT, REAL_TOPIC / REAL_QID / TRAN_MSG
   taken out, ``preparedTransactionOffset`` the half message's offset) and then an op
   record; ROLLBACK only the op record; UNKNOW nothing. An op record is a message of
   RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, tag ``d``, whose body is the half queue offset
   it settles (a comma-separated list is read too: RocketMQ 5 writes several in one).
3. **Check-back** (master only, every ``transaction_check_interval_s``): from the
   progress offsets (consumer group CID_RMQ_SYS_TRANS on the half and op queues, in
   consumerOffset.json, so slaves copy them every metadata sync), the op records name
   the half messages that are settled; each other half message open at least
   ``transaction_timeout_s`` (CHECK_IMMUNITY_TIME_IN_SECONDS on its first check, when
   the producer set it; how that is timed: "Clocks" below) is put back at the half
   queue's end with TRANSACTION_CHECK_TIMES one higher, an op record settles the
   original, and a producer of its group still connected is asked
   (CHECK_TRANSACTION_STATE, 39, oneway; the body is the message with its real topic
   and queue). The answer is an END_TRANSACTION for the copy. A half message checked
   ``transaction_check_max`` times goes to TRANS_CHECK_MAX_TIME_TOPIC instead (and an
   op record settles it): no producer could say what became of it, and an operator can
   read it there. A check finding no producer connected counts as a check, as in
   RocketMQ: a group gone for good ends in that topic.

Exactly once, where RocketMQ is at least once. One transaction (its UNIQ_KEY) may have
several half messages: the original and the copies checks put back. Whichever is
committed first is the one copy stored under the real topic; a commit of another one
finds the transaction settled — in ``settled`` (this master's decisions) or, for a
decision taken before this broker became master (a restart, a failover), in the index,
where the committed copy is under its real topic and UNIQ_KEY — and only writes its op
record. A half message whose transaction is settled is passed over by the check. The
first decision wins: a rollback after a commit (or the reverse) is logged and ignored.
The progress offsets only move past half messages that are settled, put back or
discarded, and past op records of half messages behind the half offset, so a restart
or a new master — from offsets up to one metadata sync old — looks at some half
messages again and asks about none that are settled.

A pass looks at the CHECK_BATCH half messages past the progress offset and does not
stop at one that is not due: those after it are checked when they are due (an op
record then settles each, as any check does), and the progress offset stays at the
first one not done. Half messages more than CHECK_BATCH past one not due wait for it.

**Clocks.** How long a half message has been open is counted on this master's
monotonic clock (Trio's), from when a check pass of this master term first read it,
back-dated by as much as its store timestamp lies in the past of this broker's wall
clock (``OpenSince``). A store timestamp ahead of the wall clock — written by a clock
that was ahead (an old master's), or before this clock was set back — counts as "read
now": the message is asked about ``transaction_timeout_s`` after this master first
read it, as a new one would be, never an hour later when the clock catches up.
RocketMQ (TransactionalMessageServiceImpl.check) counts from the producer's born
timestamp and asks about a message born in the future at once; waiting one timeout
spares a producer being asked while its local transaction still runs (an UNKNOW that
counts as one of ``transaction_check_max`` checks). Once read, the age no longer
depends on the wall clock: a clock set back while running delays no message read
before, and one first read after waits one timeout from that read. A clock ahead of
the one that stamped the messages (a new master's, or one set forward) makes checks
come early, by at most the skew.

**Observed.** ``TransactionService.check_passes`` counts the passes the check loop
completed (``check_once`` run to its end: not one that raised, nor one a test made by
hand); the broker's metrics serve it as ``hamq_broker_transaction_check_passes_total``.
A pass completed after an instant looked at every half message as it stood then: a
test that says "nothing was asked" waits for two more passes than it saw, the first
of which may have begun before.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Callable, Mapping

import trio

from hamq.broker.clients import ClientChannel, ProducerManager
from hamq.broker.config import BrokerConfig
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode, SerializeType
from hamq.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from hamq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    encode_properties,
    pack_host,
)
from hamq.protocol.record import StoredMessage, make_record_template
from hamq.remoting import RemotingError, parse_address
from hamq.store import MessageStore, MessageToStore, PutMessageResult, StoreError, copy_to_store
from hamq.store.consume_queue import ConsumeQueue

log = logging.getLogger(__name__)

#: the consumer group whose offsets in the half and op queues are the check's progress
PROGRESS_GROUP = "CID_RMQ_SYS_TRANS"
#: the tag of op records ("removed")
REMOVE_TAG = "d"
#: END_TRANSACTION's commitOrRollback
COMMIT, ROLLBACK, UNKNOWN = (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_ROLLBACK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
)
#: transactions whose outcome this master remembers (older ones: the index)
SETTLED_KEPT = 100_000
#: check-backs under way at once (each a oneway request to one producer)
CHECKS_IN_FLIGHT = 256
#: how long one check-back request may wait for room on the producer's connection
CHECK_SEND_TIMEOUT_S = 3.0
#: half messages looked at per check pass (the next pass goes on)
CHECK_BATCH = 10_000


def is_transactional(properties: dict[str, str], sys_flag: int) -> bool:
    """A send of a half message: TRAN_MSG=true (what RocketMQ's broker looks at) or the
    PREPARED sysflag (what the producer sets with it)."""
    flagged = properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"
    return flagged or sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED


def half_message(message: MessageToStore, producer_group: str) -> MessageToStore:
    """``message`` as a half message: under the half topic, queue 0, its real place and
    producer group in its properties, its transaction bits cleared (RocketMQ's
    parseHalfMessageInner)."""
    properties = dict(message.properties)
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    properties.setdefault(PROPERTY_PRODUCER_GROUP, producer_group)
    message.topic, message.queue_id, message.properties = TRANS_HALF_TOPIC, 0, properties
    message.properties_text = None
    message.sys_flag &= ~SYSFLAG_TRANSACTION_MASK
    return message


def _real_place(half: StoredMessage) -> tuple[str, int] | None:
    topic = half.properties.get(PROPERTY_REAL_TOPIC)
    queue = half.properties.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not queue.isdigit():
        return None
    return topic, int(queue)


class OpenSince:
    """Since when each half message past the progress offset counts as open, for one
    master term (the module docstring's "Clocks"): Trio time (s), fixed when a check
    pass first reads the message. Holds one entry per half message read and not yet
    passed by the progress offset (at most CHECK_BATCH)."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}

    def age_ms(self, offset: int, store_timestamp: int, wall_ms: int, now_s: float) -> float:
        """How long half message ``offset`` has been open (ms) at Trio time ``now_s``.
        At its first read: since ``now_s`` less the time its ``store_timestamp`` lies
        before ``wall_ms`` (this broker's clock now), never less than that (a timestamp
        ahead of the clock counts as now); later reads go on from there."""
        since = self._since.get(offset)
        if since is None:
            since = self._since[offset] = now_s - max(0, wall_ms - store_timestamp) / 1000
        return (now_s - since) * 1000

    def forget_below(self, offset: int) -> None:
        """The progress offset moved to ``offset``: the half messages below are done."""
        if any(known < offset for known in self._since):
            self._since = {known: t for known, t in self._since.items() if known >= offset}


class _Look(enum.Enum):
    """What the check pass made of one half message."""

    DONE = "done"  # settled, checked back, discarded or unreadable: the progress may pass it
    NOT_DUE = "not due"  # open, and younger than its timeout: the pass goes on past it
    REFUSED = "refused"  # the store refused a write: the rest waits for the next pass


def op_offsets(body: bytes) -> list[int]:
    """The half queue offsets an op record settles (one, or RocketMQ 5's comma list);
    ValueError if the body is not that."""
    return [int(part) for part in body.decode("ascii").split(",") if part.strip()]


class TransactionService:
    """The broker's transactions: END_TRANSACTION's effects and, on a master, the
    check-back loop. One per broker; roles.py starts and stops the loop."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        offsets: ConsumerOffsetManager,
        producers: ProducerManager,
        *,
        clock: Callable[[], int],
        store_host: Callable[[], tuple[str, int]],
    ) -> None:
        self.config = config
        self.store = store
        self.offsets = offsets
        self.producers = producers
        self._clock = clock
        self._store_host = store_host
        #: UNIQ_KEY -> committed (True) or rolled back (False), as this master decided
        self.settled: collections.OrderedDict[str, bool] = collections.OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._checking = trio.CancelScope()
        self._in_flight = 0
        self._master = False
        #: this master term's ages of the half messages past the progress offset
        self._open_since = OpenSince()
        self.committed = self.rolled_back = self.checks_sent = self.discarded = 0
        self.duplicates = 0
        #: passes the check loop completed (module docstring: "Observed")
        self.check_passes = 0

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    @property
    def checking(self) -> bool:
        """Whether the check-back loop runs (on a master)."""
        return self._master

    async def set_master(self, master: bool) -> None:
        """Check back while master (roles.py calls this with the store's scheduler)."""
        self._checking.cancel()
        self._master = master
        if master:
            assert self._nursery is not None, "the transaction service is not running"
            self._open_since = OpenSince()  # (offsets may name other records now)
            self._checking = trio.CancelScope()
            self._nursery.start_soon(self._check_loop, self._checking)
        else:
            self.settled.clear()  # (the next master decides; its index remembers)

    async def _check_loop(self, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                await trio.sleep(self.config.transaction_check_interval_s)
                try:
                    while await self._check_pass():  # (a backlog: batch after batch)
                        pass
                except (StoreError, OSError) as exc:
                    log.error("transaction check failed: %s; trying again next time", exc)

    async def _check_pass(self) -> bool:
        """``check_once``, counted in ``check_passes`` when it completes."""
        more = await self.check_once()
        self.check_passes += 1
        return more

    # ------------------------------------------------------------------ end
    def end(self, header: EndTransactionRequestHeader, peer: str) -> None:
        """END_TRANSACTION's effect; RequestError names why it was refused."""
        state = header.commit_or_rollback
        if state == UNKNOWN:
            log.info(
                "transaction %s of %s from %s: the producer does not know yet%s",
                header.transaction_id or header.msg_id,
                header.producer_group,
                peer,
                " (check-back answer)" if header.from_transaction_check else "",
            )
            return
        if state not in (COMMIT, ROLLBACK):
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"commitOrRollback {state} is not 8 (commit), 12 (rollback) or 0 (unknown)",
            )
        half = self._half_message(header)
        self.settle(half, commit=state == COMMIT, why=f"END_TRANSACTION from {peer}")

    def _half_message(self, header: EndTransactionRequestHeader) -> StoredMessage:
        """The half message an END_TRANSACTION names, if it is one of its group's."""
        try:
            half = self.store.look_message_by_offset(header.commit_log_offset)
        except StoreError:
            half = None
        problem = None
        if half is None or half.topic != TRANS_HALF_TOPIC:
            problem = f"no half message at commit log offset {header.commit_log_offset}"
        elif half.queue_offset != header.tran_state_table_offset:
            problem = (
                f"the half message at {header.commit_log_offset} has queue offset "
                f"{half.queue_offset}, not {header.tran_state_table_offset}"
            )
        elif half.properties.get(PROPERTY_PRODUCER_GROUP) != header.producer_group:
            problem = (
                f"the half message at {header.commit_log_offset} is not of producer group "
                f"{header.producer_group}"
            )
        elif header.msg_id and header.msg_id not in (half.msg_id, half.offset_msg_id):
            problem = f"the half message at {header.commit_log_offset} is not {header.msg_id}"
        if problem is not None:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"Find prepared transaction message failed: {problem}"
            )
        assert half is not None
        return half

    def settle(self, half: StoredMessage, *, commit: bool, why: str) -> None:
        """Commit or roll back ``half``'s transaction, unless it is settled already; then
        settle ``half`` itself with an op record."""
        uniq = half.msg_id
        before = self.outcome(half)
        if before is not None:
            self.duplicates += 1
            if before != commit:
                log.warning(
                    "transaction %s was %s before: %s to %s ignored (%s)",
                    uniq,
                    "committed" if before else "rolled back",
                    "commit" if commit else "rollback",
                    half.offset_msg_id,
                    why,
                )
        elif commit:
            self._store_or_raise(self._committed(half), f"committing transaction {uniq}")
            self._remember(uniq, True)
            self.committed += 1
        else:
            self._remember(uniq, False)
            self.rolled_back += 1
        self._store_or_raise(self._op(half.queue_offset), f"settling half message {uniq}")

    def outcome(self, half: StoredMessage) -> bool | None:
        """How ``half``'s transaction ended: committed (True), rolled back (False), or
        not yet (None; a rollback decided by another master is not known here, and a
        half message rolled back looks open: the producer is asked again)."""
        uniq = half.msg_id
        known = self.settled.get(uniq)
        if known is not None:
            return known
        place = _real_place(half)
        if place is None:
            return None
        for found in self.store.query_message(place[0], uniq, 4):
            if found.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_COMMIT:
                self._remember(uniq, True)
                return True
        return None

    def _remember(self, uniq: str, committed: bool) -> None:
        self.settled[uniq] = committed
        self.settled.move_to_end(uniq)
        while len(self.settled) > SETTLED_KEPT:
            self.settled.popitem(last=False)

    def _committed(self, half: StoredMessage) -> MessageToStore:
        """The message a commit stores: the half message in its real place."""
        place = _real_place(half)
        if place is None:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"the half message at {half.physical_offset} names no real topic and queue",
            )
        properties = dict(half.properties)
        for name in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED):
            properties.pop(name, None)
        transaction_bits = half.sys_flag & ~SYSFLAG_TRANSACTION_MASK
        return copy_to_store(
            half,
            *place,
            properties,
            sys_flag=transaction_bits | SYSFLAG_TRANSACTION_COMMIT,
            prepared_transaction_offset=half.physical_offset,
        )

    def _op(self, half_queue_offset: int) -> MessageToStore:
        return MessageToStore(
            topic=TRANS_OP_HALF_TOPIC,
            queue_id=0,
            body=str(half_queue_offset).encode(),
            properties={PROPERTY_TAGS: REMOVE_TAG},
            born_timestamp=self._clock(),
            born_host=self._store_host(),
            store_host=self._store_host(),
        )

    def _store_or_raise(self, message: MessageToStore, what: str) -> PutMessageResult:
        result = self.store.put_message_nowait(message)
        if result.append is None:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"{what}: {result.status.value}: {result.remark}"
            )
        return result

    # ------------------------------------------------------------------ check-back
    async def check_once(self) -> bool:
        """One pass over up to CHECK_BATCH half messages past the progress offset (module
        docstring); True if it got through all CHECK_BATCH with more to look at (the
        loop then goes on at once)."""
        half_queue = self.store.consume_queue(TRANS_HALF_TOPIC, 0)
        if half_queue is None:
            return False
        op_queue = self.store.consume_queue(TRANS_OP_HALF_TOPIC, 0)
        half_start = max(
            self.offsets.query(PROGRESS_GROUP, TRANS_HALF_TOPIC, 0), half_queue.min_offset
        )
        op_start = op_end = 0
        if op_queue is not None:
            op_start = max(
                self.offsets.query(PROGRESS_GROUP, TRANS_OP_HALF_TOPIC, 0), op_queue.min_offset
            )
            op_end = op_queue.max_offset
        # what the op records settle: half offset -> settled; per op record, the
        # highest half offset it names (it is done with once the half offset passes it)
        settled: set[int] = set()
        highest: list[int] = []
        for op_offset in range(op_start, op_end):
            assert op_queue is not None
            named = self._read_op(op_queue, op_offset)
            settled.update(o for o in named if o >= half_start)
            highest.append(max(named, default=-1))
            if op_offset % 1000 == 999:
                await trio.lowlevel.checkpoint()
        wall_ms, now_s = self._clock(), trio.current_time()
        batch_end = min(half_queue.max_offset, half_start + CHECK_BATCH)
        half_next: int | None = None  # the first half message not done
        for offset in range(half_start, batch_end):
            look = (
                _Look.DONE if offset in settled else self._look(half_queue, offset, wall_ms, now_s)
            )
            if look is not _Look.DONE and half_next is None:
                half_next = offset
            if look is _Look.REFUSED:
                break
            if offset % 100 == 99:
                await trio.lowlevel.checkpoint()
        if half_next is None:
            half_next = batch_end
        self._open_since.forget_below(half_next)
        op_next = op_start
        for named_highest in highest:
            if named_highest >= half_next:
                break
            op_next += 1
        self.offsets.commit(PROGRESS_GROUP, TRANS_HALF_TOPIC, 0, half_next)
        if op_queue is not None:
            self.offsets.commit(PROGRESS_GROUP, TRANS_OP_HALF_TOPIC, 0, op_next)
        return half_next == batch_end < half_queue.max_offset

    def _read_op(self, op_queue: ConsumeQueue, op_offset: int) -> list[int]:
        entry = op_queue.entry(op_offset)
        if entry is None:
            return []
        try:
            op = self.store.look_message_by_offset(entry[0], entry[1])
            return op_offsets(op.body)
        except (StoreError, ValueError, UnicodeDecodeError) as exc:
            log.error("transaction op record %d cannot be read, passed over: %s", op_offset, exc)
            return []

    def _look(self, half_queue: ConsumeQueue, offset: int, wall_ms: int, now_s: float) -> _Look:
        """Look at half message ``offset`` (not settled by an op record) at wall clock
        ``wall_ms`` and Trio time ``now_s``: pass it over if its transaction is settled
        or it cannot be read, discard it after too many checks, else check it back if it
        is due (its age: ``OpenSince``)."""
        entry = half_queue.entry(offset)
        if entry is None:
            return _Look.DONE
        try:
            half = self.store.look_message_by_offset(entry[0], entry[1])
        except StoreError as exc:
            log.error("half message %d cannot be read, passed over: %s", offset, exc)
            return _Look.DONE
        if self.outcome(half) is not None:
            return _Look.DONE  # (a copy of a transaction settled through another copy)
        checks = _count(half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES))
        if checks >= self.config.transaction_check_max:
            return _Look.DONE if self._discard(half) else _Look.REFUSED
        wait_ms = self.config.transaction_timeout_s * 1000
        if checks == 0:
            immunity = _count(half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME))
            wait_ms = max(wait_ms, immunity * 1000)
        if self._open_since.age_ms(offset, half.store_timestamp, wall_ms, now_s) < wait_ms:
            return _Look.NOT_DUE
        return _Look.DONE if self._check_back(half, checks + 1) else _Look.REFUSED

    def _move(
        self, half: StoredMessage, topic: str, properties: Mapping[str, str], what: str
    ) -> PutMessageResult | None:
        """Store a copy of ``half`` under ``topic`` (queue 0), then the op record that
        settles ``half``; None (logged) if the store refused either."""
        try:
            copy = self._store_or_raise(
                copy_to_store(half, topic, 0, properties), f"{what} half message {half.msg_id}"
            )
            self._store_or_raise(
                self._op(half.queue_offset), f"settling half message {half.msg_id}"
            )
        except RequestError as exc:
            log.warning("%s", exc)
            return None
        return copy

    def _discard(self, half: StoredMessage) -> bool:
        if self._move(half, TRANS_CHECK_MAX_TIME_TOPIC, half.properties, "discarding") is None:
            return False
        self.discarded += 1
        log.warning(
            "transaction %s of producer group %s for %s: no answer after %d checks; "
            "discarded to %s",
            half.msg_id,
            half.properties.get(PROPERTY_PRODUCER_GROUP),
            half.properties.get(PROPERTY_REAL_TOPIC),
            self.config.transaction_check_max,
            TRANS_CHECK_MAX_TIME_TOPIC,
        )
        return True

    def _check_back(self, half: StoredMessage, checks: int) -> bool:
        """Put ``half`` back with ``checks``, settle the original, ask a producer."""
        properties = {**half.properties, PROPERTY_TRANSACTION_CHECK_TIMES: str(checks)}
        copy = self._move(half, TRANS_HALF_TOPIC, properties, "putting back")
        if copy is None:
            return False
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        channel = self.producers.available_channel(group)
        if channel is None:
            log.info(
                "transaction %s: no producer of group %s connected to ask (check %d of %d)",
                half.msg_id,
                group,
                checks,
                self.config.transaction_check_max,
            )
            return True
        if self._in_flight >= CHECKS_IN_FLIGHT:
            log.warning(
                "transaction %s: %d checks under way, asked next time", half.msg_id, self._in_flight
            )
            return True
        request = self._check_request(half, properties, copy)
        if request is not None:
            assert self._nursery is not None
            self._in_flight += 1
            self._nursery.start_soon(self._ask, channel, request, half.msg_id)
        return True

    def _check_request(
        self, half: StoredMessage, properties: dict[str, str], copy: PutMessageResult
    ) -> RemotingCommand | None:
        """CHECK_TRANSACTION_STATE for the put-back copy: the header names the copy, the
        body is the message in its real place (as RocketMQ sends it)."""
        append = copy.append
        place = _real_place(half)
        if append is None or place is None:
            log.error("transaction %s names no real topic and queue: not checked", half.msg_id)
            return None
        store_host = self._store_host()
        template = make_record_template(
            topic=place[0],
            queue_id=place[1],
            body=half.body,
            flag=half.flag,
            properties=encode_properties(properties),
            sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=pack_host(*parse_address(half.born_host)),
            store_host=pack_host(*store_host),
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.prepared_transaction_offset,
        )
        body = template.encode(
            queue_offset=append.queue_offset,
            physical_offset=append.physical_offset,
            store_timestamp=append.store_timestamp,
        )
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=append.queue_offset,
            commit_log_offset=append.physical_offset,
            msg_id=half.properties.get(PROPERTY_UNIQ_KEY),
            transaction_id=half.properties.get(PROPERTY_UNIQ_KEY),
            offset_msg_id=append.offset_msg_id,
        )
        return RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header, body=body)

    async def _ask(self, channel: ClientChannel, request: RemotingCommand, uniq: str) -> None:
        # as the producer speaks (its heartbeat said), oneway as RocketMQ sends it
        request.serialize_type = channel.connection.attributes.get(
            "serialize_type", SerializeType.JSON
        )
        try:
            await channel.connection.invoke_oneway(request, CHECK_SEND_TIMEOUT_S)
            self.checks_sent += 1
            log.info("transaction %s: asked producer %s", uniq, channel.client_id)
        except RemotingError as exc:
            log.warning(
                "transaction %s: asking producer %s failed: %s", uniq, channel.client_id, exc
            )
        finally:
            self._in_flight -= 1


def _count(text: str | None) -> int:
    """A count property (check times, immunity seconds); 0 if absent or not a count."""
    return int(text) if text is not None and text.strip().isdigit() else 0
