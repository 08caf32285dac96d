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
  master of the broker group the message was pulled from, else to ``%RETRY%group``
  as a new message through a producer (RocketMQ's fallback; hamq/client/send_back.py
  says how). Only messages neither way took are handled again here, after a pause.
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

This module holds what outlives a run: the group, its settings and subscriptions, and
the counters of ``statistics``. A run (``run``, or ``consuming``) makes a PushRun
(hamq/client/push_run.py) that holds everything that exists only while the consumer
consumes, and drops it when the consumer stops.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import attrs

from hamq.client.config import ClientConfig, client_config
from hamq.client.consumer import check_expression
from hamq.client.errors import ClientError, InvalidArgumentError
from hamq.client.instance import ClientInstance
from hamq.client.message import check_group, check_topic
from hamq.client.push_run import Handler, PushRun
from hamq.protocol.bodies import ConsumeFromWhere, MessageQueue

#: how long a stop may take to commit offsets and say goodbye
CLOSE_TIMEOUT_S = 5.0


class ConsumeFrom(enum.Enum):
    """Where a group starts on a queue it never committed an offset for."""

    LAST_OFFSET = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    FIRST_OFFSET = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    TIMESTAMP = ConsumeFromWhere.CONSUME_FROM_TIMESTAMP


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
        #: how many worker threads a sync handler may use at once
        self.consume_thread_max = consume_thread_max
        #: ``run`` was called and has not returned
        self._running = False
        #: the run under way, once it has its client instance and task group
        self._run: PushRun | None = None
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

    def consume_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """The next offset to handle in each queue of ``topic`` this member holds."""
        return self._run.consume_offsets(topic) if self._run is not None else {}

    @property
    def client_id(self) -> str:
        if self._run is None:
            raise ClientError("the consumer is not running")
        return self._run.instance.client_id

    @property
    def assigned(self) -> list[MessageQueue]:
        """The queues this member consumes now (its retry queue included)."""
        return self._run.assigned if self._run is not None else []

    def statistics(self) -> PushConsumerStatistics:
        run = self._run
        return PushConsumerStatistics(
            client_id=run.instance.client_id if run is not None else "",
            group=self.group,
            queues=tuple(str(q) for q in self.assigned),
            consumed=self.consumed,
            sent_back=self.sent_back,
            rebalances=self.rebalances,
            offsets={str(q): s.offset for q, s in run.states.items()} if run is not None else {},
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
        """Consume until cancelled; ``started()`` after the first rebalance. The run's
        state (hamq/client/push_run.py) is dropped when it returns; offsets are
        committed and the group left first, within CLOSE_TIMEOUT_S."""
        if not self.subscriptions:
            raise InvalidArgumentError("subscribe to a topic before running the consumer")
        if not callable(handler):
            raise InvalidArgumentError(f"the handler {handler!r} is not callable")
        if self._running:
            raise ClientError("the consumer is already running")
        self._running = True
        try:
            async with ClientInstance(self.config) as instance:
                run: PushRun | None = None
                try:
                    async with anyio.create_task_group() as nursery:
                        run = self._run = PushRun(self, instance, nursery, handler)
                        await run.start()
                        task_status.started()
                finally:
                    if run is not None:
                        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
                            await run.close()
        finally:
            self._running = False
            self._run = None
