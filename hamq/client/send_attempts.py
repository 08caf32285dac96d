"""The tries of one send: where each goes, how long it may wait, and when the send
is over (``Attempts``); and what a send puts on the wire, the same for every try
(``SendRequest``).

The whole retry and failover policy of a producer's send is here (RocketMQ's
sendDefaultImpl loop, plus riding out a failover; ``Attempts`` says the rules). The
producer (hamq/client/producer.py) builds the request, asks ``Attempts`` for each
try, sends it, and reports how it ended; nothing here sends. What the policy reads of
its producer is ``Sender``: the client instance (routes, the nameservers' view of
masters), the fault tables it updates, and the retry settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import attrs

from hamq.client.errors import (
    BrokerError,
    InvalidArgumentError,
    NameServerUnavailableError,
    NoMasterError,
    NoRouteError,
    SendError,
)
from hamq.client.instance import ClientInstance
from hamq.client.message import Message, SendResult, SendStatus
from hamq.client.route_cache import LatencyFaultTolerance, PublishInfo, TimedOutAddresses
from hamq.protocol import RequestError, ResponseCode
from hamq.protocol.bodies import MessageQueue
from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    is_retry_topic,
)
from hamq.remoting import RemotingTimeoutError

log = logging.getLogger(__name__)

#: an ordered send's choice of queue: ``selector(queues, message, arg)`` (hash_selector)
Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]

#: the refusals a try is retried after (RocketMQ's); any other ends the send
RETRY_CODES = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
    }
)


def failover_explains(error: Exception) -> bool:
    """Whether a master failover may lift ``error``, so that sending again, past the
    retries, until the send timeout is worth it: lost connections, a route without a
    master, a slave's refusal (SERVICE_NOT_AVAILABLE) — not NO_PERMISSION (the ACL, a
    topic without write permission), which no failover changes."""
    return not (isinstance(error, BrokerError) and error.code == ResponseCode.NO_PERMISSION)


#: pauses between tries once the retries are used up, while a failover may be under way
FAILOVER_PAUSE_S = 0.05
FAILOVER_PAUSE_MAX_S = 0.5


class Sender(Protocol):
    """What the tries of a send read of their producer (a Producer is one)."""

    faults: LatencyFaultTolerance
    timed_out: TimedOutAddresses
    default_topic_queue_nums: int
    retry_times_when_send_failed: int
    retry_another_broker_when_not_store_ok: bool
    send_attempt_timeout_s: float | None

    @property
    def instance(self) -> ClientInstance: ...


@attrs.frozen
class SendRequest:
    """What one send puts on the wire, the same for every attempt."""

    message: Message
    topic: str
    body: bytes
    sys_flag: int
    #: the message's properties; empty for a batch (each entry carries its own)
    properties: dict[str, str]
    #: the UNIQ_KEY of each message
    ids: list[str]
    #: SEND_BATCH_MESSAGE (``body`` is encoded entries, see ``encode_batch``), not one
    #: message: said here, never guessed from ``properties``
    batch: bool = attrs.field(kw_only=True)

    @property
    def batchable(self) -> bool:
        """Whether this single message may go in an automatic batch: not compressed,
        no delay level or delivery time, not transactional, not to a retry topic
        (RocketMQ's canBatch)."""
        properties = self.properties
        return (
            not self.batch
            and not self.sys_flag
            and PROPERTY_DELAY not in properties
            and PROPERTY_TIMER_DELIVER_MS not in properties
            and PROPERTY_TIMER_DELAY_MS not in properties
            and PROPERTY_TRANSACTION_PREPARED not in properties
            and not is_retry_topic(self.topic)
        )


@attrs.frozen
class Try:
    """One try of a send: the queue it goes to, its broker's address (None: not in
    the route table; the send looks it up), when it started, how long it may wait."""

    number: int
    target: MessageQueue
    addr: str | None
    started: float
    wait_s: float


class Attempts:
    """The tries of one send, as an async iterator: ``async for attempt in attempts``
    yields where each try goes and how long it may wait; the sender says how it ended
    (``failed``, ``answered``). The whole retry and failover policy (RocketMQ's
    sendDefaultImpl loop, plus riding out a failover) is here:

    - ``tries``: 1 + ``retry_times_when_send_failed`` (1 for a oneway send); each try
      avoids the broker of the one before when the topic has another (and, with
      ``latency_fault_tolerance`` or a timed-out address, brokers to avoid).
    - A route lookup that fails uses a try: for a known topic whose route has no master
      now (a failover under way) the next try follows; a nameserver that does not
      answer is tried again while tries are left; otherwise the send ends (SendError).
    - An address that timed out (hung?) is not tried again while it is avoided, when
      tries are bounded (``send_attempt_timeout_s``): the route is looked up again.
    - A failed try is retried (route looked up again) for a connection failure or
      timeout and a refusal in ``RETRY_CODES``; another refusal, or an answer that
      does not decode, ends the send at once. A stored answer short of SEND_OK is
      retried only with ``retry_another_broker_when_not_store_ok``, while tries last.
    - Past the tries, a last failure ``failover_explains`` (not NO_PERMISSION) is
      tried again with pauses (FAILOVER_PAUSE_S doubling to FAILOVER_PAUSE_MAX_S),
      and nothing goes past the deadline (``timeout_s`` from the start).

    Error contract: ``__anext__`` and ``failed`` raise SendError (the attempts so far,
    the failure as cause) when the send must end; ``__anext__`` also lets a selector's
    InvalidArgumentError through. Nothing is left behind but the producer's fault
    tables and the route cache, as each try left them.
    """

    __slots__ = (
        "began",
        "clock",
        "deadline",
        "last_broker",
        "last_error",
        "log",
        "number",
        "oneway",
        "pause_s",
        "producer",
        "queue",
        "request",
        "selector",
        "selector_arg",
        "timeout_s",
        "tries",
    )

    def __init__(
        self,
        producer: Sender,
        request: SendRequest,
        selector: Selector | None,
        selector_arg: Any,
        queue: MessageQueue | None,
        timeout_s: float,
        *,
        oneway: bool,
    ) -> None:
        self.producer = producer
        self.request = request
        self.selector = selector
        self.selector_arg = selector_arg
        self.queue = queue
        self.timeout_s = timeout_s
        self.oneway = oneway
        #: the loop's clock (AnyIO's costs a backend lookup per call)
        self.clock = producer.instance.loop.current_time
        #: when the send began (``first`` starts its first try then: no time passed)
        self.began = self.clock()
        self.deadline = self.began + timeout_s
        self.tries = 1 if oneway else 1 + producer.retry_times_when_send_failed
        #: the try under way (0 for the first)
        self.number = -1
        #: each failed try, for SendError
        self.log: list[str] = []
        self.last_error: Exception | None = None
        self.last_broker: str | None = None
        self.pause_s = FAILOVER_PAUSE_S

    def __aiter__(self) -> Attempts:
        return self

    async def __anext__(self) -> Try:
        while True:
            self.number += 1
            if self.number >= self.tries and not await self._failover_pause():
                raise StopAsyncIteration
            remaining = self.deadline - self.clock()
            if remaining <= 0:
                raise StopAsyncIteration
            target = await self._target(remaining)
            if target is None:
                continue
            attempt = self._start(target, self.clock())
            if attempt is not None:
                return attempt

    def first(self) -> Try | None:
        """The first try, when nothing must be awaited to choose it (the topic's route is
        cached): what ``__anext__`` would give, without its coroutine. None otherwise:
        ``async for`` then goes on with whichever try is next."""
        info = self.producer.instance.cached_publish_info(self.request.topic)
        if info is None or self.deadline <= self.began:
            return None
        self.number = 0
        target = self._choose(info)
        self.last_broker = target.broker_name
        return self._start(target, self.began)

    @property
    def retries_left(self) -> bool:
        return self.number + 1 < self.tries

    async def _failover_pause(self) -> bool:
        """Past the tries: pause and go on (True) when every try failed in a way a
        master failover explains (refused or lost connections, a route without a
        master, a slave's refusal) and the deadline leaves room; else False."""
        if (
            self.oneway
            or self.last_error is None
            or not failover_explains(self.last_error)
            or self.deadline - self.clock() <= self.pause_s
        ):
            return False
        await anyio.sleep(self.pause_s)
        self.pause_s = min(self.pause_s * 2, FAILOVER_PAUSE_MAX_S)
        return True

    async def _target(self, remaining_s: float) -> MessageQueue | None:
        """The queue this try goes to, looking the route up if it is not cached; None
        when the lookup failed in a way the next try may mend."""
        instance = self.producer.instance
        topic = self.request.topic
        try:
            info = instance.cached_publish_info(topic)
            if info is None:
                with anyio.fail_after(remaining_s):
                    info = await instance.publish_info(
                        topic, self.producer.default_topic_queue_nums
                    )
            target = self._choose(info)
        except (NoRouteError, NameServerUnavailableError, TimeoutError) as exc:
            self._failed(f"route: {exc or 'timed out'}", exc)
            if isinstance(exc, NoMasterError):
                return None  # a known topic without a master now: a failover under way
            if self.retries_left and isinstance(exc, NameServerUnavailableError):
                return None
            raise SendError(f"cannot send to topic {topic}", self.log) from exc
        self.last_broker = target.broker_name
        return target

    def _choose(self, info: PublishInfo) -> MessageQueue:
        """The queue given, the selector's choice, or the next queue of a broker that
        is neither the last one tried nor avoided (when another is left)."""
        request = self.request
        if self.queue is not None:
            if self.queue.topic != request.topic:
                raise InvalidArgumentError(f"queue {self.queue} is not a queue of {request.topic}")
            return self.queue
        if self.selector is not None:
            chosen = self.selector(list(info.queues), request.message, self.selector_arg)
            if not isinstance(chosen, MessageQueue) or chosen not in info.queues:
                raise InvalidArgumentError(
                    f"the selector returned {chosen!r}, not one of the topic's queues"
                )
            return chosen
        producer = self.producer
        if not producer.faults.enabled and not producer.timed_out:
            return info.select(self.last_broker)  # (the common case: nothing to avoid)
        now = self.clock()
        instance = producer.instance

        def available(broker: str) -> bool:
            addr = instance.broker_addr(broker, only_this=True)
            if addr is not None and producer.timed_out.avoided(addr, now):
                return False
            return producer.faults.available(broker, now)

        return info.select(self.last_broker, available)

    def _start(self, target: MessageQueue, started: float) -> Try | None:
        """The try to ``target``, starting at ``started`` (now), or None when its
        broker's address timed out before and is still avoided: the route still names a
        hung broker, so wait for a failover to name another master (the route is looked
        up again) or for that time out to pass."""
        producer = self.producer
        addr = producer.instance.broker_addr(target.broker_name, only_this=True)
        if (
            producer.timed_out
            and producer.send_attempt_timeout_s is not None
            and not self.oneway
            and addr is not None
            and producer.timed_out.avoided(addr, started)
        ):
            self.log.append(f"{target}: {addr} timed out; waiting for another route")
            self.last_error = self.last_error or RemotingTimeoutError(addr, "timed out before")
            producer.instance.forget_publish_info(self.request.topic)
            return None
        wait_s = self.deadline - started
        if producer.send_attempt_timeout_s is not None:
            wait_s = min(wait_s, producer.send_attempt_timeout_s)
        return Try(self.number, target, addr, started, wait_s)

    def _failed(self, what: str, error: Exception) -> None:
        self.log.append(what)
        self.last_error = error

    def failed(self, attempt: Try, error: Exception) -> None:
        """``attempt`` got no answer or a refusal: note it against its broker (and
        address, for a timeout); SendError if it ends the send, else the route is
        looked up again for the next try."""
        producer = self.producer
        target = attempt.target
        now = self.clock()
        producer.faults.update(target.broker_name, now - attempt.started, now, failed=True)
        if isinstance(error, RemotingTimeoutError):
            producer.timed_out.add(error.addr, now, now - attempt.started)
        self._failed(f"{target}: {error}", error)
        if isinstance(error, BrokerError) and error.code == ResponseCode.SERVICE_NOT_AVAILABLE:
            producer.instance.master_refused(error.addr)  # (deposed? the module doc)
        if isinstance(error, RequestError) or (
            isinstance(error, BrokerError) and error.code not in RETRY_CODES
        ):
            raise SendError(f"sending to {target} was refused", self.log) from error
        producer.instance.forget_publish_info(self.request.topic)  # look the route up again
        log.info(
            "send to %s failed (attempt %d of %d): %s",
            target,
            attempt.number + 1,
            self.tries,
            error,
        )

    def answered(self, attempt: Try, result: SendResult | None) -> bool:
        """``attempt`` was answered (or, oneway, sent): its broker is well again.
        True when that settles the send; False to try another broker with a status
        short of SEND_OK (``retry_another_broker_when_not_store_ok``, tries left)."""
        producer = self.producer
        if attempt.addr is not None:
            producer.instance.master_answered(attempt.addr)
            if producer.timed_out:
                producer.timed_out.discard(attempt.addr)
        if result is not None and result.status is not SendStatus.SEND_OK:
            # its master's replicas did not confirm it: a master cut off from them, or
            # deposed, answers so; the route is looked up again meanwhile
            producer.instance.refresh_route_soon(self.request.topic)
        if producer.faults.enabled:
            now = self.clock()
            producer.faults.update(
                attempt.target.broker_name, now - attempt.started, now, failed=False
            )
        if (
            result is not None
            and result.status is not SendStatus.SEND_OK
            and producer.retry_another_broker_when_not_store_ok
            and self.retries_left
        ):
            self.log.append(f"{attempt.target}: {result.status.value}")
            return False
        return True

    def exhausted(self) -> SendError:
        """What the send raises when the tries (or the time) ran out."""
        return SendError(
            f"sending to topic {self.request.topic} failed within {self.timeout_s:g}s "
            f"({len(self.log)} attempt(s))",
            self.log,
        )
