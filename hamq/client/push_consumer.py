"""PushConsumer: a member of a consumer group; messages are handed to a handler.

    consumer = PushConsumer("my-group", namesrv="127.0.0.1:9876")
    consumer.subscribe("demo", "a || b")

    async def handle(messages):            # or a plain function
        ...
        return ConsumeResult.SUCCESS        # None counts as SUCCESS

    async with consumer.consuming(handle):  # or: await nursery.start(consumer.run, handle)
        ...

How it works (RocketMQ's push consumer, clustering model):
- Rebalance: at start, every ``rebalance_interval_s`` (20 s; every 2 s while a
  subscribed topic does not exist yet), and at once when a broker says the group's
  members changed, the member asks a broker for the group's client
  ids and takes its share of each subscribed topic's queues (``allocate_average``).
  It also always consumes its group's retry topic ``%RETRY%group``.
- Per queue it owns, two tasks: one long-polls the broker (held up to
  ``suspend_timeout_s``, 15 s) and puts batches into a small bounded channel; one
  hands them to the handler, in queue order, ``consume_batch_size`` at a time.
- Offsets: the next offset after the last handled message, committed to the broker
  every ``persist_offset_interval_s`` (5 s), with each pull, when the queue goes to
  another member, and at the end. A queue it never committed starts where
  ``consume_from`` says (LAST_OFFSET: new messages only; FIRST_OFFSET; TIMESTAMP).
  Delivery is at least once: a member that dies before committing, or a queue handed
  over while its new owner reads the old offset, may deliver a message twice.
- Offsets reset by an operator (the broker's RESET_CONSUMER_CLIENT_OFFSET, after it
  committed them): each queue named that this member holds stops — what it pulled
  and had not handled yet is dropped, a handler still running is cancelled — and
  starts again from the new offset, which is committed again at once (a commit of
  the old offset that crossed the reset on its way is overwritten). Resets and
  rebalances take turns (a lock), so a queue is never served twice.
- Failure (concurrent mode): a handler that answers RECONSUME_LATER or raises has its
  messages sent back (CONSUMER_SEND_MSG_BACK) to be delivered again from the retry
  topic after a delay that grows with each attempt; after ``max_reconsume_times``
  (16) the broker moves them to ``%DLQ%group``. The send-back goes to the current
  master of the broker group the message was pulled from (by broker name, as
  RocketMQ's client does: after a failover the message's store host may be a slave),
  once more after a fresh route lookup if that names another master; if it still
  fails, the message is sent to ``%RETRY%group`` as a new message through a producer
  (RocketMQ's fallback: RETRY_TOPIC, reconsume times + 1, delay level 3 + reconsume
  times). Only messages neither way took are handled again here, after a pause.
- Orderly mode (``orderly=True``): the member locks each queue at its broker before
  consuming it (LOCK_BATCH_MQ, renewed every 20 s), and a failed batch is retried in
  place after ``suspend_current_queue_s`` so that order holds; past
  ``max_reconsume_times`` (if set) the messages go to the DLQ.
- Handlers: a coroutine function (``async def``) runs in the event loop, Trio's or
  asyncio's, as a task of the consumer; any other callable runs in a worker thread,
  at most ``consume_thread_max`` (20) at once, so a slow or blocking handler never
  stalls the loop. A sync handler still running when the consumer stops is left to
  finish on its own; its messages were not committed, so they come again (at least
  once).
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hamq.client.consumer import PullCaller, check_expression
from hamq.client.errors import NETWORK_ERRORS, ClientError, InvalidArgumentError, NoRouteError
from hamq.client.instance import ClientConfig, ClientInstance, client_config
from hamq.client.message import (
    ConsumeResult,
    Message,
    MessageExt,
    PullStatus,
    check_group,
    check_topic,
)
from hamq.client.producer import Producer
from hamq.client.rebalance import allocate_average
from hamq.protocol import RemotingCommand, RequestCode, RequestError
from hamq.protocol.bodies import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumerListBody,
    ConsumeType,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    UnlockBatchRequestBody,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
)
from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT,
    is_retry_topic,
    java_string_hash,
    parse_tags,
    retry_topic,
)

log = logging.getLogger(__name__)

#: pause after a failed pull before the next (Java: pullTimeDelayMillsWhenException)
PULL_BACKOFF_S = 3.0
#: pause before handling messages again whose send-back failed
SEND_BACK_RETRY_S = 5.0
#: a lock the client got counts as held this long unless renewed (Java: 30 s)
LOCK_VALID_S = 30.0
#: how often to look again for a subscribed topic that does not exist yet
MISSING_TOPIC_RETRY_S = 2.0
#: how long a stop may take to commit offsets and say goodbye
CLOSE_TIMEOUT_S = 5.0
#: the producer group of the producer that sends retries no broker took back (Java's)
INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
#: a retry sent through that producer waits this delay level plus its reconsume times
RETRY_BASE_DELAY_LEVEL = 3

Handler = Callable[[list[MessageExt]], "ConsumeResult | Awaitable[ConsumeResult | None] | None"]


class ConsumeFrom(enum.Enum):
    """Where a group starts on a queue it never committed an offset for."""

    LAST_OFFSET = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    FIRST_OFFSET = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    TIMESTAMP = ConsumeFromWhere.CONSUME_FROM_TIMESTAMP


@attrs.define(eq=False)
class _QueueState:
    queue: MessageQueue
    expression: str
    #: the next offset to hand to the handler (what gets committed)
    offset: int
    #: the next offset to pull
    pull_offset: int
    committed: int = -1
    #: (offset, broker address) of the last commit that went through
    committed_at: tuple[int, str | None] | None = None
    scope: anyio.CancelScope = attrs.field(factory=anyio.CancelScope)
    finished: anyio.Event = attrs.field(factory=anyio.Event)
    locked_until: float = -math.inf
    #: set (and replaced) whenever the lock is renewed
    relocked: anyio.Event = attrs.field(factory=anyio.Event)
    #: replaced by a state with reset offsets: its offsets are never committed again
    superseded: bool = False

    async def wait_locked(self) -> None:
        """Orderly mode: until this member holds the queue's lock."""
        while self.locked_until <= anyio.current_time():
            await self.relocked.wait()

    def lock_renewed(self, until: float) -> None:
        self.locked_until = until
        self.relocked.set()
        self.relocked = anyio.Event()


@attrs.frozen
class _Batch:
    """One pull's messages and where the queue goes on after them (filtered ones
    skipped)."""

    messages: list[MessageExt]
    next_offset: int


@attrs.frozen
class PushConsumerStatistics:
    client_id: str
    group: str
    queues: tuple[str, ...]
    consumed: int
    sent_back: int
    rebalances: int
    offsets: dict[str, int]


class PushConsumer:
    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        *,
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        orderly: bool = False,
        max_reconsume_times: int = -1,
        pull_batch_size: int = 32,
        consume_batch_size: int = 1,
        rebalance_interval_s: float = 20.0,
        persist_offset_interval_s: float = 5.0,
        suspend_timeout_s: float = 15.0,
        lock_renew_interval_s: float = 20.0,
        suspend_current_queue_s: float = 1.0,
        consume_thread_max: int = 20,
        **client_options: Any,
    ) -> None:
        if not group:
            raise InvalidArgumentError("the consumer group is empty")
        check_group(group)
        if isinstance(consume_from, str):
            try:
                consume_from = ConsumeFrom[consume_from.upper()]
            except KeyError:
                raise InvalidArgumentError(
                    f"consume_from {consume_from!r} is not one of "
                    + ", ".join(c.name for c in ConsumeFrom)
                ) from None
        if consume_from is ConsumeFrom.TIMESTAMP and consume_timestamp_ms is None:
            raise InvalidArgumentError("consume_from TIMESTAMP needs consume_timestamp_ms")
        for name, value, low, high in (
            ("pull_batch_size", pull_batch_size, 1, 1024),
            ("consume_batch_size", consume_batch_size, 1, 1024),
            ("max_reconsume_times", max_reconsume_times, -1, 2**31 - 1),
            ("consume_thread_max", consume_thread_max, 1, 1024),
        ):
            if not low <= value <= high:
                raise InvalidArgumentError(f"{name} {value} is not in {low}..{high}")
        for name, seconds in (
            ("rebalance_interval_s", rebalance_interval_s),
            ("persist_offset_interval_s", persist_offset_interval_s),
            ("lock_renew_interval_s", lock_renew_interval_s),
        ):
            if seconds <= 0:
                raise InvalidArgumentError(f"{name} must be positive, not {seconds}")
        if suspend_timeout_s < 0 or suspend_current_queue_s < 0:
            raise InvalidArgumentError("suspend times may not be negative")
        self.group = group
        self.config = client_config(namesrv, **client_options)
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self.orderly = orderly
        self.max_reconsume_times = max_reconsume_times
        self.pull_batch_size = pull_batch_size
        self.consume_batch_size = consume_batch_size
        self.rebalance_interval_s = rebalance_interval_s
        self.persist_offset_interval_s = persist_offset_interval_s
        self.suspend_timeout_s = suspend_timeout_s
        self.lock_renew_interval_s = lock_renew_interval_s
        self.suspend_current_queue_s = suspend_current_queue_s
        self.subscriptions: dict[str, str] = {}
        self._sub_version = 0
        self._instance: ClientInstance | None = None
        self._caller: PullCaller | None = None
        self._states: dict[MessageQueue, _QueueState] = {}
        self._handler: Handler = _no_handler
        self._handler_is_async = False
        #: worker threads for sync handlers (made in the loop that runs the consumer)
        self.consume_thread_max = consume_thread_max
        self._threads: anyio.CapacityLimiter | None = None
        self._nursery: anyio.abc.TaskGroup | None = None
        self._rebalance_wakeup = anyio.Event()
        #: held while queues are assigned or reset: they take turns
        self._assigning = anyio.Lock()
        #: subscribed topics no nameserver knows yet: looked for every few seconds
        self._missing_topics: set[str] = set()
        self._running = False
        #: sends the retries no broker took back; started when first needed
        self._producer: Producer | None = None
        self._producer_lock = anyio.Lock()
        self.consumed = 0
        self.sent_back = 0
        self.rebalances = 0

    # ------------------------------------------------------------------ set-up
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``'s messages whose tag is in ``expression`` (``a || b``, ``*``)."""
        if self._running:
            raise ClientError("subscribe before the consumer runs")
        check_topic(topic)
        check_expression(expression)
        self.subscriptions[topic] = expression.strip() or "*"

    def _all_subscriptions(self) -> dict[str, str]:
        return {**self.subscriptions, retry_topic(self.group): "*"}

    def consumer_data(self) -> ConsumerData:
        """For heartbeats (ClientInstance)."""
        subscriptions = []
        for topic, expression in self._all_subscriptions().items():
            tags = sorted(parse_tags(expression) or ())
            subscriptions.append(
                SubscriptionData(
                    topic,
                    expression,
                    tags_set=tags,
                    code_set=[java_string_hash(t) for t in tags],
                    sub_version=self._sub_version,
                )
            )
        return ConsumerData(
            self.group,
            ConsumeType.CONSUME_PASSIVELY,
            MessageModel.CLUSTERING,
            self.consume_from.value,
            subscriptions,
        )

    def members_changed(self) -> None:
        """The broker said the group changed: rebalance now."""
        self._rebalance_wakeup.set()

    def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """A broker reset the group's offsets in ``topic``: go on from ``offsets`` in the
        queues of it this member holds (ClientInstance; see the module doc)."""
        if self._nursery is not None:
            self._nursery.start_soon(self._reset, topic, dict(offsets))

    def consume_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """The next offset to handle in each queue of ``topic`` this member holds."""
        return {q: s.offset for q, s in self._states.items() if q.topic == topic}

    @property
    def client_id(self) -> str:
        if self._instance is None:
            raise ClientError("the consumer is not running")
        return self._instance.client_id

    @property
    def assigned(self) -> list[MessageQueue]:
        """The queues this member consumes now (its retry queue included)."""
        return sorted(self._states, key=lambda q: (q.topic, q.broker_name, q.queue_id))

    def statistics(self) -> PushConsumerStatistics:
        return PushConsumerStatistics(
            client_id=self._instance.client_id if self._instance else "",
            group=self.group,
            queues=tuple(str(q) for q in self.assigned),
            consumed=self.consumed,
            sent_back=self.sent_back,
            rebalances=self.rebalances,
            offsets={str(q): s.offset for q, s in self._states.items()},
        )

    # ------------------------------------------------------------------ running
    @asynccontextmanager
    async def consuming(self, handler: Handler) -> AsyncIterator[PushConsumer]:
        """Consume while the block runs; stop (offsets committed) when it ends."""
        async with anyio.create_task_group() as nursery:
            await nursery.start(self.run, handler)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    async def run(
        self,
        handler: Handler,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Consume until cancelled; ``started()`` after the first rebalance."""
        if not self.subscriptions:
            raise InvalidArgumentError("subscribe to a topic before running the consumer")
        if not callable(handler):
            raise InvalidArgumentError(f"the handler {handler!r} is not callable")
        if self._running:
            raise ClientError("the consumer is already running")
        self._running = True
        self._handler = handler
        self._handler_is_async = _is_coroutine_function(handler)
        self._threads = anyio.CapacityLimiter(self.consume_thread_max)
        self._sub_version = int(anyio.current_time() * 1000)
        try:
            async with ClientInstance(self.config) as instance:
                self._instance = instance
                self._caller = PullCaller(instance, self.group)
                instance.consumers[self.group] = self
                try:
                    async with anyio.create_task_group() as nursery:
                        self._nursery = nursery
                        for topic in self._all_subscriptions():
                            await self._route(topic)
                        await instance.heartbeat()
                        await self._rebalance()
                        nursery.start_soon(self._rebalance_loop)
                        nursery.start_soon(self._persist_loop)
                        if self.orderly:
                            nursery.start_soon(self._lock_loop)
                        task_status.started()
                finally:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
                        await self._close(instance)
        finally:
            self._running = False
            self._nursery = None
            self._instance = None
            self._caller = None
            self._producer = None
            self._states = {}

    async def _close(self, instance: ClientInstance) -> None:
        states = list(self._states.values())
        await self._commit(states)
        if self.orderly:
            await self._unlock([s.queue for s in states])
        instance.consumers.pop(self.group, None)
        await instance.unregister(consumer_group=self.group)

    async def _route(self, topic: str) -> list[MessageQueue]:
        assert self._instance is not None
        try:
            return await self._instance.subscribe_queues(topic)
        except NoRouteError:
            return []
        except NETWORK_ERRORS as exc:
            log.warning("route of %s: %s", topic, exc)
            return []

    # ------------------------------------------------------------------ rebalance
    async def _rebalance_loop(self) -> None:
        while True:
            wait_s = self.rebalance_interval_s
            if self._missing_topics:
                wait_s = min(wait_s, MISSING_TOPIC_RETRY_S)
            with anyio.move_on_after(wait_s):
                await self._rebalance_wakeup.wait()
            self._rebalance_wakeup = anyio.Event()
            await self._rebalance()

    async def _client_ids(self, queues: list[MessageQueue]) -> list[str] | None:
        assert self._instance is not None
        instance = self._instance
        for name in sorted({q.broker_name for q in queues}):
            addr = instance.broker_addr(name)
            if addr is None:
                continue
            request = instance.request(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                GetConsumerListByGroupRequestHeader(self.group),
            )
            try:
                response = await instance.invoke_ok(addr, request)
                return sorted(decode_body(ConsumerListBody, response.body).consumer_id_list)
            except NETWORK_ERRORS as exc:
                log.info("consumer list of %s from %s: %s", self.group, addr, exc)
        return None

    async def _reset(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Serve the queues of ``topic`` named in ``offsets`` afresh from those offsets."""
        async with self._assigning:
            old = [s for q, s in self._states.items() if q.topic == topic and q in offsets]
            for state in old:
                state.superseded = True
                state.scope.cancel()
            fresh = []
            for state in old:
                await state.finished.wait()
                offset = offsets[state.queue]
                new = _QueueState(
                    state.queue,
                    state.expression,
                    offset,
                    offset,
                    committed=offset,
                    locked_until=state.locked_until,
                )
                self._states[state.queue] = new
                assert self._nursery is not None
                self._nursery.start_soon(self._serve_queue, new)
                fresh.append(new)
                log.info(
                    "%s: offset of %s reset from %d to %d",
                    self.group,
                    state.queue,
                    state.offset,
                    offset,
                )
        await self._commit(fresh)

    async def _rebalance(self) -> None:
        """Take this member's share of every subscribed topic; drop what is not ours."""
        async with self._assigning:
            await self._rebalance_now()

    async def _rebalance_now(self) -> None:
        assert self._instance is not None
        me = self._instance.client_id
        wanted: dict[MessageQueue, str] = {}
        undecided: set[str] = set()
        self._missing_topics = set()
        for topic, expression in self._all_subscriptions().items():
            queues = await self._route(topic)
            if not queues:
                self._missing_topics.add(topic)
                continue
            ids = await self._client_ids(queues)
            if ids is not None and me not in ids:
                await self._instance.heartbeat()  # the broker has not heard of us yet
                ids = await self._client_ids(queues)
            if ids is None:
                undecided.add(topic)  # keep what we have until we know
                continue
            for queue in allocate_average(queues, ids, me):
                wanted[queue] = expression
        self.rebalances += 1
        gone = [s for q, s in self._states.items() if q not in wanted and q.topic not in undecided]
        if gone:
            await self._drop(gone)
        new = [q for q in wanted if q not in self._states]
        if self.orderly and new:
            locked = await self._lock(new)
            new = [q for q in new if q in locked]
        for queue in new:
            try:
                start = await self._start_offset(queue)
            except NETWORK_ERRORS as exc:
                log.warning("no start offset for %s yet: %s", queue, exc)
                continue
            state = _QueueState(queue, wanted[queue], start, start, committed=start)
            if self.orderly:
                state.locked_until = anyio.current_time() + LOCK_VALID_S
            self._states[queue] = state
            assert self._nursery is not None
            self._nursery.start_soon(self._serve_queue, state)
        if gone or new:
            log.info(
                "%s rebalanced: %d queue(s): %s",
                me,
                len(self._states),
                ", ".join(str(q) for q in self.assigned),
            )

    async def _drop(self, states: list[_QueueState]) -> None:
        for state in states:
            state.scope.cancel()
        for state in states:
            await state.finished.wait()
            del self._states[state.queue]
        await self._commit(states)
        if self.orderly:
            await self._unlock([s.queue for s in states])

    async def _start_offset(self, queue: MessageQueue) -> int:
        assert self._caller is not None
        committed = await self._caller.query_offset(queue)
        if committed is not None and committed >= 0:
            return committed
        if is_retry_topic(queue.topic):
            return 0
        if self.consume_from is ConsumeFrom.LAST_OFFSET:
            return await self._caller.max_offset(queue)
        if self.consume_from is ConsumeFrom.FIRST_OFFSET:
            return await self._caller.min_offset(queue)
        assert self.consume_timestamp_ms is not None
        return await self._caller.search_offset(queue, self.consume_timestamp_ms)

    # ------------------------------------------------------------------ offsets
    async def _persist_loop(self) -> None:
        while True:
            await anyio.sleep(self.persist_offset_interval_s)
            await self._commit(list(self._states.values()))

    async def _commit(self, states: list[_QueueState]) -> None:
        assert self._caller is not None
        assert self._instance is not None
        for state in states:
            if state.superseded:
                continue  # its offsets were reset: the old ones are never committed again
            # what changed, or what the broker it would go to has not had: after a master
            # was down and consumers committed to the slave, the master learns them back
            offset = state.offset
            target = self._instance.broker_addr(state.queue.broker_name)
            if (offset, target) == state.committed_at:
                continue
            try:
                addr = await self._caller.commit_offset(state.queue, offset)
                state.committed = offset
                state.committed_at = (offset, addr)
            except NETWORK_ERRORS as exc:
                log.warning("committing offset %d of %s failed: %s", offset, state.queue, exc)

    # ------------------------------------------------------------------ orderly locks
    async def _lock(self, queues: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ at each queue's broker; the queues this member now holds."""
        locked: set[MessageQueue] = set()
        for response in await self._per_broker(RequestCode.LOCK_BATCH_MQ, queues):
            try:
                locked |= set(decode_body(LockBatchResponseBody, response.body).lock_ok_mq_set)
            except RequestError as exc:
                log.warning("a lock answer did not decode: %s", exc)
        return locked

    async def _unlock(self, queues: list[MessageQueue]) -> None:
        await self._per_broker(RequestCode.UNLOCK_BATCH_MQ, queues)

    async def _per_broker(
        self, code: RequestCode, queues: list[MessageQueue]
    ) -> list[RemotingCommand]:
        """Send a lock or unlock request for ``queues`` to each of their brokers; the
        answers that came (failures are logged)."""
        assert self._instance is not None
        instance = self._instance
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        answers = []
        for name, group in by_broker.items():
            addr = instance.broker_addr(name)
            if addr is None:
                continue
            body_type = (
                LockBatchRequestBody
                if code == RequestCode.LOCK_BATCH_MQ
                else UnlockBatchRequestBody
            )
            body = encode_body(body_type(self.group, instance.client_id, group))
            try:
                answers.append(await instance.invoke_ok(addr, instance.request(code, body=body)))
            except NETWORK_ERRORS as exc:
                log.warning("%s at %s failed: %s", code.name, addr, exc)
        return answers

    async def _lock_loop(self) -> None:
        while True:
            await anyio.sleep(self.lock_renew_interval_s)
            states = list(self._states.values())
            locked = await self._lock([s.queue for s in states])
            now = anyio.current_time()
            for state in states:
                if state.queue in locked:
                    state.lock_renewed(now + LOCK_VALID_S)
                elif state.locked_until > now:
                    log.warning("lost the lock of %s", state.queue)

    # ------------------------------------------------------------------ per queue
    async def _serve_queue(self, state: _QueueState) -> None:
        try:
            with state.scope:
                send, receive = anyio.create_memory_object_stream[_Batch](2)
                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(self._pull_loop, state, send)
                    nursery.start_soon(self._consume_loop, state, receive)
        finally:
            state.finished.set()

    async def _pull_loop(self, state: _QueueState, send: MemoryObjectSendStream[_Batch]) -> None:
        assert self._caller is not None
        async with send:
            while True:
                if self.orderly:
                    await state.wait_locked()  # not ours to consume until the lock is back
                commit = state.offset if state.offset > 0 else 0
                try:
                    result = await self._caller.pull(
                        state.queue,
                        state.expression,
                        state.pull_offset,
                        self.pull_batch_size,
                        timeout_s=self.suspend_timeout_s + self.config.request_timeout_s + 2.0,
                        sys_flag=PULL_FLAG_SUBSCRIPTION
                        | (PULL_FLAG_COMMIT_OFFSET if commit else 0),
                        commit_offset=commit,
                        suspend_s=self.suspend_timeout_s,
                        sub_version=self._sub_version,
                    )
                except NETWORK_ERRORS as exc:
                    log.warning("pulling %s failed: %s", state.queue, exc)
                    await anyio.sleep(PULL_BACKOFF_S)
                    continue
                if commit:
                    state.committed = max(state.committed, commit)
                if result.status is PullStatus.OFFSET_ILLEGAL:
                    log.warning(
                        "offset %d of %s is out of range [%d, %d]: going on from %d",
                        state.pull_offset,
                        state.queue,
                        result.min_offset,
                        result.max_offset,
                        result.next_begin_offset,
                    )
                    if state.offset == state.pull_offset:
                        state.offset = result.next_begin_offset
                state.pull_offset = result.next_begin_offset
                if result.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                    # (an empty batch: all filtered out; the offset still moves on)
                    await send.send(_Batch(result.messages, result.next_begin_offset))

    async def _consume_loop(
        self, state: _QueueState, receive: MemoryObjectReceiveStream[_Batch]
    ) -> None:
        async with receive:
            async for batch in receive:
                messages = batch.messages
                for i in range(0, len(messages), self.consume_batch_size):
                    chunk = messages[i : i + self.consume_batch_size]
                    if self.orderly:
                        await self._consume_orderly(state, chunk)
                    else:
                        await self._consume_concurrently(state.queue, chunk)
                    state.offset = chunk[-1].queue_offset + 1
                    self.consumed += len(chunk)
                state.offset = max(state.offset, batch.next_offset)

    async def _handle(self, messages: list[MessageExt]) -> ConsumeResult:
        visible = [_original_topic(m) for m in messages]
        try:
            outcome = await self._call_handler(visible)
        except Exception:
            log.exception("the handler of %s failed; retrying its messages later", self.group)
            return ConsumeResult.RECONSUME_LATER
        if outcome is None:
            return ConsumeResult.SUCCESS
        if not isinstance(outcome, ConsumeResult):
            log.error("the handler returned %r, not a ConsumeResult; retrying later", outcome)
            return ConsumeResult.RECONSUME_LATER
        return outcome

    async def _call_handler(self, messages: list[MessageExt]) -> object:
        if self._handler_is_async:
            return await self._handler(messages)  # type: ignore[misc]
        outcome = await anyio.to_thread.run_sync(
            self._handler, messages, limiter=self._threads, abandon_on_cancel=True
        )
        if isinstance(outcome, Awaitable):  # a plain function that returned a coroutine
            outcome = await outcome
        return outcome

    async def _consume_concurrently(self, queue: MessageQueue, messages: list[MessageExt]) -> None:
        while messages:
            if await self._handle(messages) is ConsumeResult.SUCCESS:
                return
            # the ones that could not be sent back are handled here again later
            messages = await self._send_back(queue, messages, delay_level=0)
            if messages:
                await anyio.sleep(SEND_BACK_RETRY_S)

    async def _consume_orderly(self, state: _QueueState, messages: list[MessageExt]) -> None:
        attempts = 0
        while True:
            await state.wait_locked()
            if await self._handle(messages) is ConsumeResult.SUCCESS:
                return
            attempts += 1
            if 0 <= self.max_reconsume_times < attempts:
                messages = await self._send_back(state.queue, messages, delay_level=-1)  # DLQ
                if not messages:
                    return
            await anyio.sleep(self.suspend_current_queue_s)

    async def _send_back(
        self, queue: MessageQueue, messages: list[MessageExt], *, delay_level: int
    ) -> list[MessageExt]:
        """Send each message (pulled from ``queue``) back for a retry (``delay_level``
        0: the broker's choice; -1: to the DLQ): CONSUMER_SEND_MSG_BACK to the queue's
        master — after the first failure of a call, once more after a fresh route
        lookup if it names another master — else a new message to the retry topic. The
        messages neither way took."""
        assert self._instance is not None
        instance = self._instance
        failed = []
        looked_up = False
        for message in messages:
            try:
                addr = self._send_back_addr(queue, message)
                try:
                    await self._send_msg_back(addr, message, delay_level)
                except NETWORK_ERRORS as exc:
                    if looked_up:
                        raise
                    looked_up = True  # (once per call: a batch asks the nameserver once)
                    log.info("sending %s back to %s failed: %s", message.msg_id, addr, exc)
                    with contextlib.suppress(*NETWORK_ERRORS):
                        await instance.update_route(queue.topic)
                    master = instance.broker_addr(queue.broker_name, only_this=True)
                    if master is None or master == addr:
                        raise
                    await self._send_msg_back(master, message, delay_level)
            except NETWORK_ERRORS as exc:
                log.warning(
                    "sending %s back for retry failed (%s); sending it to %s instead",
                    message.msg_id,
                    exc,
                    retry_topic(self.group),
                )
                try:
                    await self._send_to_retry_topic(message, delay_level)
                except NETWORK_ERRORS as again:
                    log.warning("sending %s to the retry topic failed: %s", message.msg_id, again)
                    failed.append(message)
                    continue
            self.sent_back += 1
        return failed

    def _send_back_addr(self, queue: MessageQueue, message: MessageExt) -> str:
        """The master of ``queue``'s broker group (RocketMQ's client: by broker name;
        after a failover the message's store host may be a slave), else the store host."""
        assert self._instance is not None
        master = self._instance.broker_addr(queue.broker_name, only_this=True)
        return master or message.store_host

    async def _send_msg_back(self, addr: str, message: MessageExt, delay_level: int) -> None:
        """CONSUMER_SEND_MSG_BACK of ``message`` to ``addr``; NETWORK_ERRORS if it fails."""
        assert self._instance is not None
        instance = self._instance
        header = ConsumerSendMsgBackRequestHeader(
            offset=message.physical_offset,
            group=self.group,
            delay_level=delay_level,
            origin_msg_id=message.msg_id,
            origin_topic=_original_topic(message).topic,
            max_reconsume_times=(
                self.max_reconsume_times if self.max_reconsume_times >= 0 else None
            ),
        )
        await instance.invoke_ok(addr, instance.request(RequestCode.CONSUMER_SEND_MSG_BACK, header))

    async def _send_to_retry_topic(self, message: MessageExt, delay_level: int) -> None:
        """RocketMQ's fallback when no broker takes a send-back: the message, as a new
        one, to ``%RETRY%group`` through a producer, with RETRY_TOPIC, ORIGIN_MESSAGE_ID
        and reconsume times + 1; delayed by level 3 + reconsume times (to the DLQ,
        ``delay_level`` -1: past the maximum reconsume times, which the broker takes as
        the DLQ's)."""
        original = _original_topic(message)
        properties = dict(message.properties)
        tags = properties.pop(PROPERTY_TAGS, None)
        keys = properties.pop(PROPERTY_KEYS, "")
        wait = properties.pop(PROPERTY_WAIT, None) != "false"
        for name in (PROPERTY_DELAY, PROPERTY_TRANSACTION_PREPARED):
            properties.pop(name, None)
        properties[PROPERTY_RETRY_TOPIC] = original.topic
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
        if delay_level < 0:
            most = max(self.max_reconsume_times, 0)
            reconsume, level = most + 1, 0
        else:
            most = self.max_reconsume_times
            reconsume = message.reconsume_times + 1
            # 0 is a value here, not a missing one: the broker's choice, 3 + reconsume times
            level = (
                delay_level if delay_level > 0 else RETRY_BASE_DELAY_LEVEL + message.reconsume_times
            )
        properties[PROPERTY_RECONSUME_TIME] = str(reconsume)
        if most >= 0:
            properties[PROPERTY_MAX_RECONSUME_TIMES] = str(most)
        retry = Message(
            retry_topic(self.group),
            message.body,
            tags=tags,
            keys=keys,
            flag=message.flag,
            delay_level=level,
            wait_store_msg_ok=wait,
            properties=properties,
        )
        producer = await self._retry_producer()
        await producer.send(retry)

    async def _retry_producer(self) -> Producer:
        """The producer of the retries no broker took back, started on first use in
        this consumer's nursery (it stops with the consumer)."""
        async with self._producer_lock:
            if self._producer is None:
                assert self._nursery is not None
                self._producer = await self._nursery.start(self._run_producer)
            return self._producer

    async def _run_producer(self, *, task_status: anyio.abc.TaskStatus[Producer]) -> None:
        async with Producer(INNER_PRODUCER_GROUP, self.config) as producer:
            task_status.started(producer)
            await anyio.sleep_forever()


def _original_topic(message: MessageExt) -> MessageExt:
    """A message from the retry topic shows its original topic, as RocketMQ's do."""
    original = message.properties.get(PROPERTY_RETRY_TOPIC)
    if original and is_retry_topic(message.topic):
        return attrs.evolve(message, topic=original)
    return message


def _is_coroutine_function(handler: Handler) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def _no_handler(messages: list[MessageExt]) -> ConsumeResult:
    raise RuntimeError("the consumer is not running")
