"""PushRun: one run of a PushConsumer, from its start to its stop.

A PushConsumer (hamq/client/push_consumer.py) holds what outlives a run: its group,
settings, subscriptions and counters. Everything that exists only while it consumes
lives here, made when the run starts and dropped when it stops, never half-set: the
client instance, the pull caller, the task group every per-run task runs in, the
worker threads for a sync handler, the queues it holds (``states``), the send-back
(hamq/client/send_back.py) and the rebalance's wake-up. The client instance knows the
run as the group's member (``instance.consumers``): heartbeats name its
subscriptions, and brokers' notifications (members changed, offsets reset) reach it.

Invariants:
- ``states`` holds one QueueState per queue this member consumes; its two tasks (pull,
  consume) run in the QueueState's cancel scope, and ``finished`` is set once both
  ended. A queue is served by one QueueState at a time: rebalances and resets hold
  ``_assigning`` while they change ``states``, and wait for an old state to finish
  before a new one for the same queue starts.
- A QueueState's ``offset`` (next to hand to the handler) is what gets committed; a
  superseded state (its offsets were reset) is never committed again.
- Orderly mode: a queue is consumed only while this member holds its broker lock
  (``locked_until`` in the future); the lock loop renews the locks of ``states``.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hamq.client.consumer import PullCaller
from hamq.client.errors import NETWORK_ERRORS, NoRouteError
from hamq.client.instance import ClientInstance
from hamq.client.message import ConsumeResult, MessageExt, PullStatus
from hamq.client.rebalance import allocate_average
from hamq.client.send_back import SendBack, original_topic
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
    GetConsumerListByGroupRequestHeader,
)
from hamq.protocol.message import is_retry_topic, java_string_hash, parse_tags, retry_topic

if TYPE_CHECKING:
    from hamq.client.push_consumer import PushConsumer

log = logging.getLogger(__name__)

#: pause after a failed pull before the next (Java: pullTimeDelayMillsWhenException)
PULL_BACKOFF_S = 3.0
#: pause before handling messages again whose send-back failed
SEND_BACK_RETRY_S = 5.0
#: a lock the client got counts as held this long unless renewed (Java: 30 s)
LOCK_VALID_S = 30.0
#: how often to look again for a subscribed topic that does not exist yet
MISSING_TOPIC_RETRY_S = 2.0

Handler = Callable[[list[MessageExt]], "ConsumeResult | Awaitable[ConsumeResult | None] | None"]


@attrs.define(eq=False)
class QueueState:
    """A queue this member consumes, for as long as one serving of it lasts."""

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
class Batch:
    """One pull's messages and where the queue goes on after them (filtered ones
    skipped)."""

    messages: list[MessageExt]
    next_offset: int


class PushRun:
    """One run of ``consumer`` (the module doc); ``start`` begins it, ``close`` ends it
    after its task group has ended."""

    def __init__(
        self,
        consumer: PushConsumer,
        instance: ClientInstance,
        nursery: anyio.abc.TaskGroup,
        handler: Handler,
    ) -> None:
        self.consumer = consumer
        self.instance = instance
        self.caller = PullCaller(instance, consumer.group)
        #: where every task of the run runs (cancelled when the consumer stops)
        self.nursery = nursery
        self.handler = handler
        self.handler_is_async = _is_coroutine_function(handler)
        #: worker threads for a sync handler
        self.threads = anyio.CapacityLimiter(consumer.consume_thread_max)
        #: the subscriptions' version in heartbeats: when this run started (ms)
        self.sub_version = int(anyio.current_time() * 1000)
        #: what the run consumes: the consumer's subscriptions, and its retry topic
        self.subscriptions = {**consumer.subscriptions, retry_topic(consumer.group): "*"}
        self.states: dict[MessageQueue, QueueState] = {}
        self.send_back = SendBack(instance, consumer.group, consumer.max_reconsume_times, nursery)
        self._rebalance_wakeup = anyio.Event()
        #: held while queues are assigned or reset: they take turns
        self._assigning = anyio.Lock()
        #: subscribed topics no nameserver knows yet: looked for every few seconds
        self._missing_topics: set[str] = set()

    async def start(self) -> None:
        """Join the group: look the routes up, say hello to the brokers, take this
        member's share of the queues, and start the background loops."""
        self.instance.consumers[self.consumer.group] = self
        for topic in self.subscriptions:
            await self._route(topic)
        await self.instance.heartbeat()
        await self._rebalance()
        self.nursery.start_soon(self._rebalance_loop)
        self.nursery.start_soon(self._persist_loop)
        if self.consumer.orderly:
            self.nursery.start_soon(self._lock_loop)

    # ------------------------------------------------------------------ the instance's member
    def consumer_data(self) -> ConsumerData:
        """For heartbeats (ClientInstance)."""
        subscriptions = []
        for topic, expression in self.subscriptions.items():
            tags = sorted(parse_tags(expression) or ())
            subscriptions.append(
                SubscriptionData(
                    topic,
                    expression,
                    tags_set=tags,
                    code_set=[java_string_hash(t) for t in tags],
                    sub_version=self.sub_version,
                )
            )
        return ConsumerData(
            self.consumer.group,
            ConsumeType.CONSUME_PASSIVELY,
            MessageModel.CLUSTERING,
            self.consumer.consume_from.value,
            subscriptions,
        )

    def members_changed(self) -> None:
        """The broker said the group changed: rebalance now."""
        self._rebalance_wakeup.set()

    def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """A broker reset the group's offsets in ``topic``: go on from ``offsets`` in the
        queues of it this member holds (ClientInstance; see PushConsumer's doc)."""
        self.nursery.start_soon(self._reset, topic, dict(offsets))

    def consume_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """The next offset to handle in each queue of ``topic`` this member holds."""
        return {q: s.offset for q, s in self.states.items() if q.topic == topic}

    @property
    def assigned(self) -> list[MessageQueue]:
        """The queues this member consumes now (its retry queue included)."""
        return sorted(self.states, key=lambda q: (q.topic, q.broker_name, q.queue_id))

    # ------------------------------------------------------------------ stop
    async def close(self) -> None:
        """After the run's task group ended: commit the offsets, give the orderly locks
        back, and leave the group (the brokers rebalance it). Failures are logged; the
        caller bounds how long this may take."""
        instance = self.instance
        states = list(self.states.values())
        await self._commit(states)
        if self.consumer.orderly:
            await self._unlock([s.queue for s in states])
        instance.consumers.pop(self.consumer.group, None)
        await instance.unregister(consumer_group=self.consumer.group)

    async def _route(self, topic: str) -> list[MessageQueue]:
        try:
            return await self.instance.subscribe_queues(topic)
        except NoRouteError:
            return []
        except NETWORK_ERRORS as exc:
            log.warning("route of %s: %s", topic, exc)
            return []

    # ------------------------------------------------------------------ rebalance
    async def _rebalance_loop(self) -> None:
        while True:
            wait_s = self.consumer.rebalance_interval_s
            if self._missing_topics:
                wait_s = min(wait_s, MISSING_TOPIC_RETRY_S)
            with anyio.move_on_after(wait_s):
                await self._rebalance_wakeup.wait()
            self._rebalance_wakeup = anyio.Event()
            await self._rebalance()

    async def _client_ids(self, queues: list[MessageQueue]) -> list[str] | None:
        instance = self.instance
        for name in sorted({q.broker_name for q in queues}):
            addr = instance.broker_addr(name)
            if addr is None:
                continue
            request = instance.request(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                GetConsumerListByGroupRequestHeader(self.consumer.group),
            )
            try:
                response = await instance.invoke_ok(addr, request)
                return sorted(decode_body(ConsumerListBody, response.body).consumer_id_list)
            except NETWORK_ERRORS as exc:
                log.info("consumer list of %s from %s: %s", self.consumer.group, addr, exc)
        return None

    async def _reset(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Serve the queues of ``topic`` named in ``offsets`` afresh from those offsets."""
        async with self._assigning:
            old = [s for q, s in self.states.items() if q.topic == topic and q in offsets]
            for state in old:
                state.superseded = True
                state.scope.cancel()
            fresh = []
            for state in old:
                await state.finished.wait()
                offset = offsets[state.queue]
                new = QueueState(
                    state.queue,
                    state.expression,
                    offset,
                    offset,
                    committed=offset,
                    locked_until=state.locked_until,
                )
                self.states[state.queue] = new
                self.nursery.start_soon(self._serve_queue, new)
                fresh.append(new)
                log.info(
                    "%s: offset of %s reset from %d to %d",
                    self.consumer.group,
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
        me = self.instance.client_id
        wanted: dict[MessageQueue, str] = {}
        undecided: set[str] = set()
        self._missing_topics = set()
        for topic, expression in self.subscriptions.items():
            queues = await self._route(topic)
            if not queues:
                self._missing_topics.add(topic)
                continue
            ids = await self._client_ids(queues)
            if ids is not None and me not in ids:
                await self.instance.heartbeat()  # the broker has not heard of us yet
                ids = await self._client_ids(queues)
            if ids is None:
                undecided.add(topic)  # keep what we have until we know
                continue
            for queue in allocate_average(queues, ids, me):
                wanted[queue] = expression
        self.consumer.rebalances += 1
        gone = [s for q, s in self.states.items() if q not in wanted and q.topic not in undecided]
        if gone:
            await self._drop(gone)
        new = [q for q in wanted if q not in self.states]
        if self.consumer.orderly and new:
            locked = await self._lock(new)
            new = [q for q in new if q in locked]
        for queue in new:
            try:
                start = await self._start_offset(queue)
            except NETWORK_ERRORS as exc:
                log.warning("no start offset for %s yet: %s", queue, exc)
                continue
            state = QueueState(queue, wanted[queue], start, start, committed=start)
            if self.consumer.orderly:
                state.locked_until = anyio.current_time() + LOCK_VALID_S
            self.states[queue] = state
            self.nursery.start_soon(self._serve_queue, state)
        if gone or new:
            log.info(
                "%s rebalanced: %d queue(s): %s",
                me,
                len(self.states),
                ", ".join(str(q) for q in self.assigned),
            )

    async def _drop(self, states: list[QueueState]) -> None:
        for state in states:
            state.scope.cancel()
        for state in states:
            await state.finished.wait()
            del self.states[state.queue]
        await self._commit(states)
        if self.consumer.orderly:
            await self._unlock([s.queue for s in states])

    async def _start_offset(self, queue: MessageQueue) -> int:
        committed = await self.caller.query_offset(queue)
        if committed is not None and committed >= 0:
            return committed
        if is_retry_topic(queue.topic):
            return 0
        where = self.consumer.consume_from.value
        if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return await self.caller.max_offset(queue)
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return await self.caller.min_offset(queue)
        assert self.consumer.consume_timestamp_ms is not None
        return await self.caller.search_offset(queue, self.consumer.consume_timestamp_ms)

    # ------------------------------------------------------------------ offsets
    async def _persist_loop(self) -> None:
        while True:
            await anyio.sleep(self.consumer.persist_offset_interval_s)
            await self._commit(list(self.states.values()))

    async def _commit(self, states: list[QueueState]) -> None:
        for state in states:
            if state.superseded:
                continue  # its offsets were reset: the old ones are never committed again
            # what changed, or what the broker it would go to has not had: after a master
            # was down and consumers committed to the slave, the master learns them back
            offset = state.offset
            target = self.instance.broker_addr(state.queue.broker_name)
            if (offset, target) == state.committed_at:
                continue
            try:
                addr = await self.caller.commit_offset(state.queue, offset)
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
        instance = self.instance
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
            body = encode_body(body_type(self.consumer.group, instance.client_id, group))
            try:
                answers.append(await instance.invoke_ok(addr, instance.request(code, body=body)))
            except NETWORK_ERRORS as exc:
                log.warning("%s at %s failed: %s", code.name, addr, exc)
        return answers

    async def _lock_loop(self) -> None:
        while True:
            await anyio.sleep(self.consumer.lock_renew_interval_s)
            states = list(self.states.values())
            locked = await self._lock([s.queue for s in states])
            now = anyio.current_time()
            for state in states:
                if state.queue in locked:
                    state.lock_renewed(now + LOCK_VALID_S)
                elif state.locked_until > now:
                    log.warning("lost the lock of %s", state.queue)

    # ------------------------------------------------------------------ per queue
    async def _serve_queue(self, state: QueueState) -> None:
        try:
            with state.scope:
                send, receive = anyio.create_memory_object_stream[Batch](2)
                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(self._pull_loop, state, send)
                    nursery.start_soon(self._consume_loop, state, receive)
        finally:
            state.finished.set()

    async def _pull_loop(self, state: QueueState, send: MemoryObjectSendStream[Batch]) -> None:
        async with send:
            while True:
                if self.consumer.orderly:
                    await state.wait_locked()  # not ours to consume until the lock is back
                commit = state.offset if state.offset > 0 else 0
                try:
                    result = await self.caller.pull(
                        state.queue,
                        state.expression,
                        state.pull_offset,
                        self.consumer.pull_batch_size,
                        timeout_s=self.consumer.suspend_timeout_s
                        + self.instance.config.request_timeout_s
                        + 2.0,
                        sys_flag=PULL_FLAG_SUBSCRIPTION
                        | (PULL_FLAG_COMMIT_OFFSET if commit else 0),
                        commit_offset=commit,
                        suspend_s=self.consumer.suspend_timeout_s,
                        sub_version=self.sub_version,
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
                    await send.send(Batch(result.messages, result.next_begin_offset))

    async def _consume_loop(
        self, state: QueueState, receive: MemoryObjectReceiveStream[Batch]
    ) -> None:
        async with receive:
            async for batch in receive:
                messages = batch.messages
                for i in range(0, len(messages), self.consumer.consume_batch_size):
                    chunk = messages[i : i + self.consumer.consume_batch_size]
                    if self.consumer.orderly:
                        await self._consume_orderly(state, chunk)
                    else:
                        await self._consume_concurrently(state.queue, chunk)
                    state.offset = chunk[-1].queue_offset + 1
                    self.consumer.consumed += len(chunk)
                state.offset = max(state.offset, batch.next_offset)

    async def _handle(self, messages: list[MessageExt]) -> ConsumeResult:
        visible = [original_topic(m) for m in messages]
        try:
            outcome = await self._call_handler(visible)
        except Exception:
            log.exception(
                "the handler of %s failed; retrying its messages later", self.consumer.group
            )
            return ConsumeResult.RECONSUME_LATER
        if outcome is None:
            return ConsumeResult.SUCCESS
        if not isinstance(outcome, ConsumeResult):
            log.error("the handler returned %r, not a ConsumeResult; retrying later", outcome)
            return ConsumeResult.RECONSUME_LATER
        return outcome

    async def _call_handler(self, messages: list[MessageExt]) -> object:
        if self.handler_is_async:
            return await self.handler(messages)  # type: ignore[misc]
        outcome = await anyio.to_thread.run_sync(
            self.handler, messages, limiter=self.threads, abandon_on_cancel=True
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

    async def _consume_orderly(self, state: QueueState, messages: list[MessageExt]) -> None:
        attempts = 0
        while True:
            await state.wait_locked()
            if await self._handle(messages) is ConsumeResult.SUCCESS:
                return
            attempts += 1
            if 0 <= self.consumer.max_reconsume_times < attempts:
                messages = await self._send_back(state.queue, messages, delay_level=-1)  # DLQ
                if not messages:
                    return
            await anyio.sleep(self.consumer.suspend_current_queue_s)

    async def _send_back(
        self, queue: MessageQueue, messages: list[MessageExt], *, delay_level: int
    ) -> list[MessageExt]:
        """``SendBack.send_back``, counted in the consumer's ``sent_back``: the messages
        no way took."""
        failed = await self.send_back.send_back(queue, messages, delay_level=delay_level)
        self.consumer.sent_back += len(messages) - len(failed)
        return failed


def _is_coroutine_function(handler: Handler) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
