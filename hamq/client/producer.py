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
- A master that hangs (stopped, not dead: its connections stay open) is only noticed
  by a timeout. An address that timed out is avoided for as long as that try waited
  (a success clears it): other brokers are chosen first (RocketMQ's
  sendLatencyFaultEnable, per address). Each try waits at most
  ``send_attempt_timeout_s`` (10 s; None: the rest of ``send_timeout_s``, as RocketMQ's
  does); when set, a send whose only broker timed out waits, looking the route up
  again, until a new master elected meanwhile takes it or the time out has passed.
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
- Bodies over ``compress_over_bytes`` (4 KiB) go zlib-compressed (level 5, sysflag bits
  0 and 8-10); bodies over ``max_message_size`` (4 MiB) are refused before sending.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import attrs
import trio

from hamq.client.errors import (
    NETWORK_ERRORS,
    BrokerError,
    ClientError,
    InvalidArgumentError,
    NameServerUnavailableError,
    NoRouteError,
    SendError,
)
from hamq.client.instance import ClientConfig, ClientInstance, InstanceOwner, client_config
from hamq.client.message import (
    COMPRESSION_ZLIB,
    DEFAULT_MAX_MESSAGE_SIZE,
    Message,
    SendResult,
    SendStatus,
    check_message,
)
from hamq.client.route_cache import LatencyFaultTolerance, PublishInfo, TimedOutAddresses
from hamq.protocol import (
    RemotingCommand,
    RequestCode,
    RequestError,
    ResponseCode,
)
from hamq.protocol.bodies import MessageQueue
from hamq.protocol.headers import SendMessageRequestHeader, decode_send_response, send_v2_fields
from hamq.protocol.message import (
    DEFAULT_TOPIC,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    SYSTEM_TOPICS,
    BatchEntry,
    MessageIdGenerator,
    encode_batch,
    encode_properties,
    java_string_hash,
)
from hamq.protocol.send_timing import (
    BROKER_SEND_WAIT_S,
    BROKER_SYNC_FLUSH_WAIT_S,
    BROKER_SYNC_SLAVE_WAIT_S,
    SEND_ANSWER_MARGIN_S,
    SEND_ATTEMPT_TIMEOUT_S,
    SEND_TIMEOUT_S,
    send_wait_too_short,
)
from hamq.remoting import RemotingTimeoutError

log = logging.getLogger(__name__)

Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]
SendCallback = Callable[[SendResult | None, BaseException | None], object]

_RETRY_CODES = frozenset(
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


def _failover_explains(error: Exception) -> bool:
    """Whether a master failover may lift ``error``, so that sending again, past the
    retries, until the send timeout is worth it: lost connections, a route without a
    master, a slave's refusal (SERVICE_NOT_AVAILABLE) — not NO_PERMISSION (the ACL, a
    topic without write permission), which no failover changes."""
    return not (isinstance(error, BrokerError) and error.code == ResponseCode.NO_PERMISSION)


_STATUSES: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


#: pauses between tries once the retries are used up, while a failover may be under way
FAILOVER_PAUSE_S = 0.05
FAILOVER_PAUSE_MAX_S = 0.5


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
        ):
            if value < low:
                raise InvalidArgumentError(f"{name} {value} is below {low}")
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
        self._async_slots = trio.Semaphore(max_async_in_flight)
        self._async_pending = 0
        #: set (and replaced) whenever a send_async ends
        self._async_done = trio.Event()
        self._ids = MessageIdGenerator(self.config.client_ip)
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

    async def _stopping(self, instance: ClientInstance) -> None:
        with trio.CancelScope(shield=True):
            # sends started with send_async finish (or time out) and call back first
            with trio.move_on_after(self.send_timeout_s + self.config.request_timeout_s):
                while self._async_pending:
                    await self._async_done.wait()
            with trio.move_on_after(self.config.request_timeout_s):
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
        """Send and wait for the broker; SendError when every attempt failed."""
        request = self._request(message)
        result = await self._send(request, selector, arg, queue, timeout_s, oneway=False)
        assert result is not None
        return result

    async def send_oneway(
        self,
        message: Message,
        selector: Selector | None = None,
        arg: Any = None,
        *,
        queue: MessageQueue | None = None,
    ) -> None:
        """Send without waiting for an answer (one attempt; nothing says if it was stored)."""
        await self._send(self._request(message), selector, arg, queue, None, oneway=True)

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
        Bad input raises here, before anything starts."""
        self._check(message)
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
            except trio.Cancelled:
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
            self._async_done = trio.Event()

    async def send_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Messages of one topic in one request; each is stored as its own message, in
        one queue, in order. No delay levels; the batch's total size counts against
        ``max_message_size``. InvalidArgumentError, before anything is sent, for a
        batch ``check_batch`` refuses."""
        request = self._batch_request(messages)
        result = await self._send(request, None, None, queue, timeout_s, oneway=False)
        assert result is not None
        return result

    def check_batch(self, messages: Sequence[Message]) -> int:
        """The size in bytes of ``messages`` as one batch's body, or InvalidArgumentError
        if ``send_batch`` would refuse them: no message, several topics, a delay level,
        a message it would refuse alone, over ``max_message_size`` in all. Sends nothing."""
        return len(self._batch_request(messages).body)

    def _batch_request(self, messages: Sequence[Message]) -> _Request:
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
            properties = message.wire_properties()
            ids.append(properties.setdefault(PROPERTY_UNIQ_KEY, self._ids.next_id()))
            entries.append(BatchEntry(message.body, message.flag, encode_properties(properties)))
        body = encode_batch(entries)
        if len(body) > self.max_message_size:
            raise InvalidArgumentError(
                f"the batch of {len(messages)} messages is {len(body)} bytes, over the "
                f"maximum {self.max_message_size} bytes (max_message_size)"
            )
        return _Request(messages[0], topic, body, 0, {}, ids)

    # ------------------------------------------------------------------ the kernel
    def _check(self, message: Message) -> None:
        check_message(message, self.max_message_size)
        if message.topic in SYSTEM_TOPICS:
            raise InvalidArgumentError(
                f"sending to the system topic {message.topic} is not allowed"
            )

    def _request(self, message: Message) -> _Request:
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
        return _Request(message, message.topic, body, sys_flag, properties, [uniq])

    async def _send(
        self,
        request: _Request,
        selector: Selector | None,
        arg: Any,
        queue: MessageQueue | None,
        timeout_s: float | None,
        *,
        oneway: bool,
    ) -> SendResult | None:
        instance = self.instance
        timeout = timeout_s if timeout_s is not None else self.send_timeout_s
        deadline = trio.current_time() + timeout
        attempts: list[str] = []
        tries = 1 if oneway else 1 + self.retry_times_when_send_failed
        last_broker: str | None = None
        last_error: Exception | None = None
        attempt = -1
        pause = FAILOVER_PAUSE_S
        while True:
            attempt += 1
            if attempt >= tries:
                # every try failed in a way a master failover explains (refused or lost
                # connections, a route without a master, a slave's refusal): keep trying,
                # with pauses, until the send timeout
                if (
                    oneway
                    or last_error is None
                    or not _failover_explains(last_error)
                    or deadline - trio.current_time() <= pause
                ):
                    break
                await trio.sleep(pause)
                pause = min(pause * 2, FAILOVER_PAUSE_MAX_S)
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            try:
                info = instance.cached_publish_info(request.topic)
                if info is None:
                    with trio.fail_after(remaining):
                        info = await instance.publish_info(
                            request.topic, self.default_topic_queue_nums
                        )
                target = self._choose(info, request, selector, arg, queue, last_broker)
            except (NoRouteError, NameServerUnavailableError, trio.TooSlowError) as exc:
                attempts.append(f"route: {exc or 'timed out'}")
                last_error = exc
                if isinstance(exc, NoRouteError) and instance.routes.get(request.topic):
                    continue  # a known topic without a master now: a failover under way
                if attempt + 1 < tries and isinstance(exc, NameServerUnavailableError):
                    continue
                raise SendError(f"cannot send to topic {request.topic}", attempts) from exc
            last_broker = target.broker_name
            started = trio.current_time()
            addr = instance.broker_addr(target.broker_name)
            if (
                self.timed_out
                and self.send_attempt_timeout_s is not None
                and not oneway
                and addr is not None
                and self.timed_out.avoided(addr, started)
            ):
                # the route still names a broker that timed out (hung?) and the budget
                # has room for more tries: wait for a failover to name another master,
                # or for that broker's time out to pass
                attempts.append(f"{target}: {addr} timed out; waiting for another route")
                last_error = last_error or RemotingTimeoutError(addr, "timed out before")
                instance.forget_publish_info(request.topic)
                continue
            try_s = deadline - started
            if self.send_attempt_timeout_s is not None:
                try_s = min(try_s, self.send_attempt_timeout_s)
            try:
                result = await self._send_to(target, request, try_s, oneway)
            except NETWORK_ERRORS as exc:
                now = trio.current_time()
                self.faults.update(target.broker_name, now - started, now, failed=True)
                if isinstance(exc, RemotingTimeoutError):
                    self.timed_out.add(exc.addr, now, now - started)
                attempts.append(f"{target}: {exc}")
                last_error = exc
                if isinstance(exc, RequestError) or (
                    isinstance(exc, BrokerError) and exc.code not in _RETRY_CODES
                ):
                    raise SendError(f"sending to {target} was refused", attempts) from exc
                instance.forget_publish_info(request.topic)  # look the route up again
                log.info(
                    "send to %s failed (attempt %d of %d): %s", target, attempt + 1, tries, exc
                )
                continue
            if addr is not None and self.timed_out:
                self.timed_out.discard(addr)
            if self.faults.enabled:
                now = trio.current_time()
                self.faults.update(target.broker_name, now - started, now, failed=False)
            if (
                result is not None
                and result.status is not SendStatus.SEND_OK
                and self.retry_another_broker_when_not_store_ok
                and attempt + 1 < tries
            ):
                attempts.append(f"{target}: {result.status.value}")
                continue
            return result
        raise SendError(
            f"sending to topic {request.topic} failed within {timeout:g}s "
            f"({len(attempts)} attempt(s))",
            attempts,
        ) from last_error

    def _choose(
        self,
        info: PublishInfo,
        request: _Request,
        selector: Selector | None,
        arg: Any,
        queue: MessageQueue | None,
        last_broker: str | None,
    ) -> MessageQueue:
        if queue is not None:
            if queue.topic != request.topic:
                raise InvalidArgumentError(f"queue {queue} is not a queue of {request.topic}")
            return queue
        if selector is not None:
            chosen = selector(list(info.queues), request.message, arg)
            if not isinstance(chosen, MessageQueue) or chosen not in info.queues:
                raise InvalidArgumentError(
                    f"the selector returned {chosen!r}, not one of the topic's queues"
                )
            return chosen
        if not self.faults.enabled and not self.timed_out:
            return info.select(last_broker)  # (the common case: nothing to avoid)
        now = trio.current_time()
        instance = self.instance

        def available(broker: str) -> bool:
            addr = instance.broker_addr(broker)
            if addr is not None and self.timed_out.avoided(addr, now):
                return False
            return self.faults.available(broker, now)

        return info.select(last_broker, available)

    async def _send_to(
        self,
        target: MessageQueue,
        request: _Request,
        timeout_s: float,
        oneway: bool,
    ) -> SendResult | None:
        instance = self.instance
        addr = await instance.find_broker_addr(target)
        header = SendMessageRequestHeader(
            producer_group=self.group,
            topic=request.topic,
            default_topic=DEFAULT_TOPIC,
            default_topic_queue_nums=self.default_topic_queue_nums,
            queue_id=target.queue_id,
            sys_flag=request.sys_flag,
            born_timestamp=int(time.time() * 1000),
            flag=0 if request.batch else request.message.flag,
            properties=encode_properties(request.properties),
            reconsume_times=0,
            unit_mode=False,
            batch=request.batch,
            broker_name=target.broker_name,
        )
        command = RemotingCommand.request(
            RequestCode.SEND_BATCH_MESSAGE if request.batch else RequestCode.SEND_MESSAGE_V2,
            ext_fields=send_v2_fields(header),
            body=request.body,
            serialize_type=self.config.serialize_type,
        )
        if oneway:
            await instance.remoting.invoke_oneway(addr, command, timeout_s)
            return None
        response = await instance.invoke(addr, command, max(timeout_s, 0.001))
        status = _STATUSES.get(response.code)
        if status is None:
            raise BrokerError(response.code, response.remark, addr)
        answer = decode_send_response(response.ext_fields)
        queue = MessageQueue(target.topic, target.broker_name, answer.queue_id)
        return SendResult(
            status=status,
            msg_id=",".join(request.ids),
            offset_msg_id=answer.msg_id,
            queue=queue,
            queue_offset=answer.queue_offset,
            transaction_id=answer.transaction_id,
            region_id=answer.msg_region,
        )


@attrs.frozen
class _Request:
    """What one send puts on the wire, the same for every attempt."""

    message: Message
    topic: str
    body: bytes
    sys_flag: int
    #: the message's properties; empty for a batch (each entry carries its own)
    properties: dict[str, str]
    #: the UNIQ_KEY of each message
    ids: list[str]

    @property
    def batch(self) -> bool:
        return not self.properties
