"""Producer: send messages to the brokers that serve a topic.

    async with Producer("my-group", namesrv="127.0.0.1:9876") as producer:
        result = await producer.send(Message("demo", b"hello", tags="a"))

- ``send`` waits for the broker; its SendResult says SEND_OK or how storing fell short
  (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE: stored, not yet as
  durable as configured). A failed attempt (no connection, timeout, a broker refusal
  RocketMQ retries: SYSTEM_ERROR, SYSTEM_BUSY, SERVICE_NOT_AVAILABLE, TOPIC_NOT_EXIST,
  NO_PERMISSION) is retried ``retry_times_when_send_failed`` (2) more times on another
  broker when there is one, all within ``send_timeout_s`` (30 s); the message keeps its
  UNIQ_KEY across attempts. ``retry_another_broker_when_not_store_ok`` retries the
  short-of-durable statuses as well. When every try failed in a way a master failover
  explains (connections refused, lost or timed out, a known topic whose route has no
  master, a slave's refusal), the send keeps trying with pauses (50 ms doubling to
  0.5 s) until ``send_timeout_s``, looking the route up again before each try:
  producers ride out an automatic failover without the user's help.
- A master that hangs (stopped, not dead: its connections stay open) answers nothing.
  While a try has waited ``MASTER_CHECK_AFTER_S`` (1 s) or more, the producer looks its
  topic's route up again (at most once a second) and, once the route names another
  master for that broker group (the controllers elected one meanwhile), closes its
  connection to the old address: every try waiting there fails at once and goes again
  to the new master (hamq/client/master_watch.py). A deposed master that still answers says so
  itself (SERVICE_NOT_AVAILABLE: it is a slave now, or lost its controller lease),
  which is retried with the route looked up again — of another nameserver when the
  one in use still names that master, or none (cut off with it: hamq.client.instance).
  Sends go to a group's master only, never to another broker of the group. Otherwise
  the hang is noticed by a timeout: an address that timed out is avoided for as long
  as that try waited (a success clears it): other brokers are chosen first (RocketMQ's
  sendLatencyFaultEnable, per address). Each try waits at most
  ``send_attempt_timeout_s`` (10 s; None: the rest of ``send_timeout_s``, as RocketMQ's
  does); when set, a send whose only broker timed out waits, looking the route up
  again, until a new master elected meanwhile takes it or the time out has passed.
- An answer short of SEND_OK (FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE: the master's
  replicas did not confirm it, which a master cut off from them, or deposed, answers)
  has the topic's route looked up again in the background (at most once a second).
  These lookups, and the master watch's, keep the known route when no nameserver
  answers or knows the topic (one that has just restarted, before the brokers
  registered with it again), as RocketMQ's clients do.
- The rule for the per-try wait (hamq/protocol/send_timing.py): it must exceed the longest
  a broker waits before it answers — a SYNC_FLUSH broker's fsync (``[store]
  sync_flush_timeout_s``, 5 s) and a SYNC_MASTER's wait for its slave (``[ha]
  sync_timeout_s``, 3 s), which run at once — by a margin (1 s) for the answer to come
  back. Then the broker's own answer (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT: stored,
  short of durable) reaches the caller; a try given up before it would be retried and
  store the message twice. The defaults keep the rule (10 s a try, 30 s in all); a
  producer whose first try would wait less than 6 s (``min(send_timeout_s,
  send_attempt_timeout_s)``) logs one warning when it is made. A broker configured to
  wait longer than the defaults warns when it starts.
- ``send(msg, selector, arg)``: ordered messages. ``selector(queues, msg, arg)`` picks
  the queue (``hash_selector``: the same ``arg`` always gets the same queue); retries
  stay on that queue, so messages with one sharding key keep their order.
- ``send_async(msg, callback)`` returns once the send has started; ``callback(result,
  error)`` runs when it ends (a sync function or a coroutine function). Leaving the
  producer's block waits for sends under way; one cut short is called back with an
  error.
- ``send_oneway``: no answer is waited for; ``send_batch``: messages of one topic in one
  request (SEND_BATCH_MESSAGE), stored as separate messages in one queue
  (``check_batch`` says beforehand whether a batch would be refused, and its size).
- ``auto_batch`` (on): while ``auto_batch_in_flight`` (2) sends to a topic are under way,
  the next ones wait and go together as one SEND_BATCH_MESSAGE of at most
  ``auto_batch_max_bytes`` (32 KiB), each still with its own SendResult, failure and
  time out (hamq/client/auto_batch.py). One send at a time is never held back; sends
  with a selector or queue, a delay level or a compressed body always go alone.
- Bodies over ``compress_over_bytes`` (4 KiB) go zlib-compressed (level 5, sysflag bits
  0 and 8-10); bodies over ``max_message_size`` (4 MiB) are refused before sending.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio

from hamq.client.auto_batch import (
    AUTO_BATCH_IN_FLIGHT,
    AUTO_BATCH_MAX_BYTES,
    ENTRY_OVERHEAD,
    Lane,
    Waiter,
    split_results,
)
from hamq.client.config import ClientConfig, client_config
from hamq.client.errors import (
    NETWORK_ERRORS,
    BrokerError,
    ClientError,
    InvalidArgumentError,
    SendError,
)
from hamq.client.instance import ClientInstance, InstanceOwner
from hamq.client.master_watch import MasterWatch
from hamq.client.message import (
    COMPRESSION_ZLIB,
    DEFAULT_MAX_MESSAGE_SIZE,
    Message,
    SendResult,
    SendStatus,
    check_message,
    check_timeout,
)
from hamq.client.route_cache import LatencyFaultTolerance, TimedOutAddresses
from hamq.client.send_attempts import Attempts, Selector, SendRequest, Try
from hamq.protocol import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
from hamq.protocol.bodies import MessageQueue
from hamq.protocol.headers import SendMessageRequestHeader
from hamq.protocol.message import (
    DEFAULT_TOPIC,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
    SYSFLAG_COMPRESSED,
    SYSTEM_TOPICS,
    BatchEntry,
    MessageFormatError,
    MessageIdGenerator,
    encode_batch,
    encode_properties,
    java_string_hash,
)
from hamq.protocol.send_fields import decode_send_response, send_v2_fields
from hamq.protocol.send_timing import (
    BROKER_SEND_WAIT_S,
    BROKER_SYNC_FLUSH_WAIT_S,
    BROKER_SYNC_SLAVE_WAIT_S,
    SEND_ANSWER_MARGIN_S,
    SEND_ATTEMPT_TIMEOUT_S,
    SEND_TIMEOUT_S,
    send_wait_too_short,
)
from hamq.remoting.loop import EventLike

log = logging.getLogger(__name__)

SendCallback = Callable[[SendResult | None, BaseException | None], object]

_STATUSES: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


def hash_selector(queues: list[MessageQueue], message: Message, arg: Any) -> MessageQueue:
    """The same ``arg`` always picks the same queue (Java's SelectMessageQueueByHash).

    ``arg`` is an int, a str (Java's String.hashCode, so Java producers agree) or bytes.
    """
    if isinstance(arg, bool) or not isinstance(arg, int | str | bytes):
        raise InvalidArgumentError(
            f"hash_selector needs an int, str or bytes sharding key, not {type(arg).__name__}"
        )
    if isinstance(arg, int):
        key = arg
    elif isinstance(arg, str):
        key = java_string_hash(arg)
    else:
        key = zlib.crc32(arg)
    return queues[abs(key) % len(queues)]


class Producer(InstanceOwner):
    _kind = "producer"

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        *,
        send_timeout_s: float = SEND_TIMEOUT_S,
        retry_times_when_send_failed: int = 2,
        retry_another_broker_when_not_store_ok: bool = False,
        compress_over_bytes: int = 4096,
        compress_level: int = 5,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        default_topic_queue_nums: int = 4,
        latency_fault_tolerance: bool = False,
        max_async_in_flight: int = 10000,
        send_attempt_timeout_s: float | None = SEND_ATTEMPT_TIMEOUT_S,
        auto_batch: bool = True,
        auto_batch_in_flight: int = AUTO_BATCH_IN_FLIGHT,
        auto_batch_max_bytes: int = AUTO_BATCH_MAX_BYTES,
        **client_options: Any,
    ) -> None:
        if not group:
            raise InvalidArgumentError("the producer group is empty")
        for name, value, low in (
            ("send_timeout_s", send_timeout_s, 0.001),
            ("retry_times_when_send_failed", retry_times_when_send_failed, 0),
            ("compress_over_bytes", compress_over_bytes, 0),
            ("max_message_size", max_message_size, 1),
            ("default_topic_queue_nums", default_topic_queue_nums, 1),
            ("max_async_in_flight", max_async_in_flight, 1),
            ("auto_batch_in_flight", auto_batch_in_flight, 1),
            ("auto_batch_max_bytes", auto_batch_max_bytes, 1),
        ):
            if value < low:
                raise InvalidArgumentError(f"{name} {value} is below {low}")
        if auto_batch_max_bytes > max_message_size:
            raise InvalidArgumentError(
                f"auto_batch_max_bytes {auto_batch_max_bytes} is over max_message_size "
                f"{max_message_size}"
            )
        if not 0 <= compress_level <= 9:
            raise InvalidArgumentError(f"compress_level {compress_level} is not in 0..9")
        if send_attempt_timeout_s is not None and send_attempt_timeout_s <= 0:
            raise InvalidArgumentError(
                f"send_attempt_timeout_s {send_attempt_timeout_s} is not positive"
            )
        self.group = group
        self.config = client_config(namesrv, **client_options)
        self.send_timeout_s = send_timeout_s
        self.send_attempt_timeout_s = send_attempt_timeout_s
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self.faults = LatencyFaultTolerance(enabled=latency_fault_tolerance)
        self.timed_out = TimedOutAddresses()
        self._async_slots = anyio.Semaphore(max_async_in_flight)
        self._async_pending = 0
        #: set (and replaced) whenever a send_async ends
        self._async_done: EventLike = anyio.Event()
        self._ids = MessageIdGenerator(self.config.client_ip)
        self.auto_batch = auto_batch
        self.auto_batch_in_flight = auto_batch_in_flight
        self.auto_batch_max_bytes = auto_batch_max_bytes
        #: (topic, WAIT) -> the sends that may go as one batch (auto_batch.py)
        self._lanes: dict[tuple[str, bool], Lane] = {}
        #: the tries waiting for an answer, and the check that their broker is master
        self.master_watch = MasterWatch()
        self._warn_if_tries_are_short()

    @property
    def first_try_s(self) -> float:
        """How long the first try of a send waits for the broker's answer."""
        if self.send_attempt_timeout_s is None:
            return self.send_timeout_s
        return min(self.send_timeout_s, self.send_attempt_timeout_s)

    def _warn_if_tries_are_short(self) -> None:
        """One warning when a try would give up before a broker at its default waits
        answers (the rule in this module's docstring)."""
        try_s = self.first_try_s
        if not send_wait_too_short(try_s):
            return
        which = (
            "send_timeout_s"
            if self.send_attempt_timeout_s is None or self.send_timeout_s <= try_s
            else "send_attempt_timeout_s"
        )
        log.warning(
            "producer %s: a try waits at most %gs (%s) for the broker's answer; a broker "
            "may wait %gs before it answers by default (SYNC_FLUSH's fsync %gs, "
            "SYNC_MASTER's slave ack %gs), so a FLUSH_DISK_TIMEOUT or FLUSH_SLAVE_TIMEOUT "
            "would come as a client timeout and a retry could store the message twice: "
            "give each try at least %gs",
            self.group,
            try_s,
            which,
            BROKER_SEND_WAIT_S,
            BROKER_SYNC_FLUSH_WAIT_S,
            BROKER_SYNC_SLAVE_WAIT_S,
            BROKER_SEND_WAIT_S + SEND_ANSWER_MARGIN_S,
        )

    # ------------------------------------------------------------------ lifecycle
    def _started(self, instance: ClientInstance) -> None:
        instance.producer_groups.add(self.group)
        instance.nursery.start_soon(self.master_watch.run, instance)

    async def _stopping(self, instance: ClientInstance) -> None:
        with anyio.CancelScope(shield=True):
            # sends started with send_async finish (or time out) and call back first
            with anyio.move_on_after(self.send_timeout_s + self.config.request_timeout_s):
                while self._async_pending:
                    await self._async_done.wait()
            with anyio.move_on_after(self.config.request_timeout_s):
                await instance.unregister(producer_group=self.group)

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The queues ``topic`` is sent to (what a selector chooses from)."""
        info = await self.instance.publish_info(topic, self.default_topic_queue_nums)
        return list(info.queues)

    # ------------------------------------------------------------------ sending
    async def send(
        self,
        message: Message,
        selector: Selector | None = None,
        arg: Any = None,
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Send and wait for the broker; SendError when every attempt failed.

        ``timeout_s``: how long the whole send may take, retries included (None:
        ``send_timeout_s``); InvalidArgumentError unless it is positive."""
        timeout = self._timeout(timeout_s)
        request = self._request(message)
        if self.auto_batch and selector is None and queue is None and request.batchable:
            return await self._send_in_lane(request, timeout)
        return await self._send_alone(request, selector, arg, queue, timeout)

    async def _send_alone(
        self,
        request: SendRequest,
        selector: Selector | None,
        arg: Any,
        queue: MessageQueue | None,
        timeout_s: float,
    ) -> SendResult:
        """``_send`` of a request that waits for its answer (so there is a result)."""
        result = await self._send(request, selector, arg, queue, timeout_s, oneway=False)
        assert result is not None
        return result

    # ------------------------------------------------------------------ auto batch
    async def _send_in_lane(self, request: SendRequest, timeout_s: float) -> SendResult:
        """``send`` of a message that may go in a batch (auto_batch.py): it leads a batch
        at once while its lane has a place in flight, else waits for one to take it."""
        key = (request.topic, request.properties.get(PROPERTY_WAIT) != "false")
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(self.auto_batch_in_flight)
        loop = self.instance.loop
        properties = encode_properties(request.properties)
        waiter = Waiter(
            BatchEntry(request.body, request.message.flag, properties),
            request.ids[0],
            len(request.body) + len(properties) + ENTRY_OVERHEAD,
            loop.current_time() + timeout_s,
            loop.event(),
        )
        try:
            if lane.free():
                # it leads at once, after the tasks ready to run now: sends they start
                # meanwhile (those woken by one batch's end) go with it
                lane.lead(waiter)
                await loop.checkpoint()
            else:
                lane.waiting.append(waiter)
                await waiter.event.wait()
        except BaseException:
            if waiter.lead:
                lane.abandoned()  # its place goes to the next one waiting
                self._forget_if_idle(key, lane)
            elif not waiter.done:
                lane.forget(waiter)
            raise
        if waiter.lead:
            await self._send_batch_of(key, lane, waiter, request)
        if waiter.result is not None:
            return waiter.result
        return await self._send_again_alone(request, waiter, timeout_s)

    def _forget_if_idle(self, key: tuple[str, bool], lane: Lane) -> None:
        """An idle lane is dropped (a producer may send to many topics in turn)."""
        if not lane.in_flight and not lane.waiting and self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _send_batch_of(
        self, key: tuple[str, bool], lane: Lane, leader: Waiter, request: SendRequest
    ) -> None:
        """``leader`` holds a place in flight: send it and the sends waiting after it as
        one batch, and give each its outcome (a batch cut short, by a failure or the
        leader's cancellation, leaves each send to go again alone)."""
        members = lane.take(leader, self.auto_batch_max_bytes)
        try:
            time_left = min(self._time_left(member) for member in members)
            if time_left <= 0:
                return  # (each goes alone, with whatever time it has)
            if len(members) == 1:
                leader.result = await self._send_alone(request, None, None, None, time_left)
                return
            ids = [member.uniq_key for member in members]
            try:
                body = encode_batch(member.entry for member in members)
            except MessageFormatError:
                return  # (properties too long for a batch entry: each goes alone)
            batch = SendRequest(request.message, request.topic, body, 0, {}, ids, batch=True)
            try:
                result = await self._send_alone(batch, None, None, None, time_left)
            except SendError as exc:
                log.info(
                    "a batch of %d sends to %s failed, each goes again alone: %s",
                    len(members),
                    request.topic,
                    exc,
                )
                for member in members:
                    member.failure = exc
                return
            for member, own in zip(members, split_results(result, ids), strict=True):
                member.result = own
        finally:
            lane.ended()
            self._forget_if_idle(key, lane)
            for member in members[1:]:
                member.done = True
                member.event.set()

    def _time_left(self, waiter: Waiter) -> float:
        return waiter.deadline - self.instance.loop.current_time()

    async def _send_again_alone(
        self, request: SendRequest, waiter: Waiter, timeout_s: float
    ) -> SendResult:
        """A send whose batch failed or was not sent goes alone in the time it has left."""
        time_left = self._time_left(waiter)
        if time_left <= 0:
            raise SendError(
                f"sending to topic {request.topic} took longer than {timeout_s:g}s "
                "(it waited to go in a batch)",
                [] if waiter.failure is None else waiter.failure.attempts,
            ) from waiter.failure
        return await self._send_alone(request, None, None, None, time_left)

    async def send_oneway(
        self,
        message: Message,
        selector: Selector | None = None,
        arg: Any = None,
        *,
        queue: MessageQueue | None = None,
    ) -> None:
        """Send without waiting for an answer (one attempt; nothing says if it was stored)."""
        request = self._request(message)
        await self._send(request, selector, arg, queue, self.send_timeout_s, oneway=True)

    async def send_async(
        self,
        message: Message,
        callback: SendCallback,
        selector: Selector | None = None,
        arg: Any = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """Start a send and return; ``callback(result, None)`` or ``callback(None, error)``
        runs when it ends. Waits first while ``max_async_in_flight`` sends are under way.
        Bad input (``timeout_s`` as ``send``'s) raises here, before anything starts."""
        self._check(message)
        self._timeout(timeout_s)
        await self._async_slots.acquire()
        self._async_pending += 1
        self.instance.nursery.start_soon(
            self._send_and_call_back, message, callback, selector, arg, timeout_s
        )

    async def _send_and_call_back(
        self,
        message: Message,
        callback: SendCallback,
        selector: Selector | None,
        arg: Any,
        timeout_s: float | None,
    ) -> None:
        try:
            try:
                result = await self.send(message, selector, arg, timeout_s=timeout_s)
            except ClientError as exc:
                outcome = callback(None, exc)
            except anyio.get_cancelled_exc_class():
                try:
                    cut = callback(None, SendError("the producer closed during the send", []))
                    if isinstance(cut, Coroutine):
                        cut.close()  # nothing can be awaited any more
                except Exception:
                    log.exception("a send_async callback failed")
                raise
            else:
                outcome = callback(result, None)
            if isinstance(outcome, Awaitable):
                await outcome
        except Exception:
            log.exception("a send_async callback failed")
        finally:
            self._async_slots.release()
            self._async_pending -= 1
            self._async_done.set()
            self._async_done = self.instance.loop.event()

    async def send_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Messages of one topic in one request; each is stored as its own message, in
        one queue, in order. No delay levels or delivery times; the batch's total size
        counts against ``max_message_size``. InvalidArgumentError, before anything is sent, for a
        batch ``check_batch`` refuses (and for ``timeout_s`` as ``send``'s)."""
        timeout = self._timeout(timeout_s)
        return await self._send_alone(self._batch_request(messages), None, None, queue, timeout)

    def check_batch(self, messages: Sequence[Message]) -> int:
        """The size in bytes of ``messages`` as one batch's body, or InvalidArgumentError
        if ``send_batch`` would refuse them: no message, several topics, a delay level,
        a message it would refuse alone, over ``max_message_size`` in all. Sends nothing."""
        return len(self._batch_request(messages).body)

    def _batch_request(self, messages: Sequence[Message]) -> SendRequest:
        if not messages:
            raise InvalidArgumentError("send_batch got no message")
        topic = messages[0].topic
        entries = []
        ids = []
        for message in messages:
            self._check(message)
            if message.topic != topic:
                raise InvalidArgumentError(
                    f"a batch goes to one topic: {message.topic} is not {topic}"
                )
            if message.delay_level > 0:
                raise InvalidArgumentError("messages of a batch cannot have a delay level")
            if (message.deliver_at or message.deliver_after) is not None:
                raise InvalidArgumentError("messages of a batch cannot have a delivery time")
            properties = message.wire_properties()
            ids.append(properties.setdefault(PROPERTY_UNIQ_KEY, self._ids.next_id()))
            entries.append(BatchEntry(message.body, message.flag, encode_properties(properties)))
        body = encode_batch(entries)
        if len(body) > self.max_message_size:
            raise InvalidArgumentError(
                f"the batch of {len(messages)} messages is {len(body)} bytes, over the "
                f"maximum {self.max_message_size} bytes (max_message_size)"
            )
        return SendRequest(messages[0], topic, body, 0, {}, ids, batch=True)

    # ------------------------------------------------------------------ the kernel
    def _timeout(self, timeout_s: float | None) -> float:
        """A send's whole time: ``timeout_s`` when given (it must be positive: 0 is not
        "the default", which is None), else ``send_timeout_s``."""
        if timeout_s is None:
            return self.send_timeout_s
        return check_timeout("timeout_s", timeout_s)

    def _check(self, message: Message) -> None:
        check_message(message, self.max_message_size)
        if message.topic in SYSTEM_TOPICS:
            raise InvalidArgumentError(
                f"sending to the system topic {message.topic} is not allowed"
            )

    def _request(self, message: Message) -> SendRequest:
        """A single message as sent: compressed if large, with its UNIQ_KEY (kept over
        retries)."""
        self._check(message)
        body, sys_flag = message.body, 0
        if len(body) > self.compress_over_bytes:
            compressed = zlib.compress(body, self.compress_level)
            if len(compressed) < len(body):
                body, sys_flag = compressed, SYSFLAG_COMPRESSED | COMPRESSION_ZLIB
        properties = message.wire_properties()
        uniq = properties.setdefault(PROPERTY_UNIQ_KEY, self._ids.next_id())
        return SendRequest(message, message.topic, body, sys_flag, properties, [uniq], batch=False)

    async def _send(
        self,
        request: SendRequest,
        selector: Selector | None,
        arg: Any,
        queue: MessageQueue | None,
        timeout_s: float,
        *,
        oneway: bool,
    ) -> SendResult | None:
        """Try ``request`` where and while ``Attempts`` says (the retry and failover
        policy is all there); the first answer that settles it is returned.

        SendError (each attempt listed, the last failure as its cause) when a refusal
        ends the send or the attempts run out; InvalidArgumentError for a ``queue`` or
        a selector's choice not of the topic. A message may have been stored by a try
        that timed out, then again by a later one (under the same UNIQ_KEY)."""
        attempts = Attempts(self, request, selector, arg, queue, timeout_s, oneway=oneway)
        # the first try without the async iterator when its route is cached (most sends)
        attempt = attempts.first()
        if attempt is not None:
            try:
                result = await self._send_to(attempt, request, oneway)
            except NETWORK_ERRORS as exc:
                attempts.failed(attempt, exc)  # (raises SendError if that ends the send)
            else:
                if attempts.answered(attempt, result):
                    return result
        async for attempt in attempts:
            try:
                result = await self._send_to(attempt, request, oneway)
            except NETWORK_ERRORS as exc:
                attempts.failed(attempt, exc)  # (raises SendError if that ends the send)
                continue
            if attempts.answered(attempt, result):
                return result
        raise attempts.exhausted() from attempts.last_error

    async def _send_to(self, attempt: Try, request: SendRequest, oneway: bool) -> SendResult | None:
        target, timeout_s = attempt.target, attempt.wait_s
        instance = self.instance
        addr = await instance.find_master_addr(target)
        command = self._command(target, request)
        if oneway:
            await instance.remoting.invoke_oneway(addr, command, timeout_s)
            return None
        watch = self.master_watch
        key = watch.started(addr, attempt.started, target)
        try:
            response = await instance.invoke(addr, command, max(timeout_s, 0.001))
        finally:
            watch.ended(addr, key)
        status = _STATUSES.get(response.code)
        if status is None:
            raise BrokerError(response.code, response.remark, addr)
        answer = decode_send_response(response.ext_fields)
        queue = (  # (the broker names the queue sent to: a new one only if it names another)
            target
            if answer.queue_id == target.queue_id
            else MessageQueue(target.topic, target.broker_name, answer.queue_id)
        )
        return SendResult(  # (by position: one per send)
            status,
            request.ids[0] if len(request.ids) == 1 else ",".join(request.ids),  # msg_id
            answer.msg_id,  # offset_msg_id
            queue,
            answer.queue_offset,
            answer.transaction_id,
            answer.msg_region,  # region_id
        )

    def _command(self, target: MessageQueue, request: SendRequest) -> RemotingCommand:
        """The request for ``target``: SEND_BATCH_MESSAGE for a batch, else
        SEND_MESSAGE_V2 (a new command per try: each gets its own opaque)."""
        header = SendMessageRequestHeader(  # (by position: one per send, keywords cost more)
            self.group,  # producer_group
            request.topic,
            DEFAULT_TOPIC,  # default_topic
            self.default_topic_queue_nums,
            target.queue_id,
            request.sys_flag,
            int(time.time() * 1000),  # born_timestamp
            0 if request.batch else request.message.flag,
            encode_properties(request.properties),
            0,  # reconsume_times
            False,  # unit_mode
            request.batch,
            None,  # max_reconsume_times
            target.broker_name,
        )
        return RemotingCommand.request(
            RequestCode.SEND_BATCH_MESSAGE if request.batch else RequestCode.SEND_MESSAGE_V2,
            ext_fields=send_v2_fields(header),
            body=request.body,
            serialize_type=self.config.serialize_type,
        )
