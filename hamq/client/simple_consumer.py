"""SimpleConsumer: RocketMQ 5's pop consumption (the broker hands out messages, each
invisible to the rest of the group until acked or its invisible time runs out).

    async with SimpleConsumer("my-group", namesrv="127.0.0.1:9876") as consumer:
        consumer.subscribe("orders", "paid || refunded")
        for message in await consumer.receive(max_messages=16, invisible_s=30):
            handle(message)
            await consumer.ack(message)

``receive`` pops (POP_MESSAGE) from every broker of the subscribed topics in turn, each
from all its queues, waiting up to ``await_s`` for a message (long polling); it returns
what the first broker with messages gave (an empty list when none had any in time). A
message not acked within its invisible time is delivered again (``attempt`` + 1: its
reconsume times + 1), to any member of the group; after the group's retries
(``retryMaxTimes``, 16) it goes to ``%DLQ%<group>``. ``change_invisible_duration``
moves a message's return time (a new receipt handle: the message is updated). A
message delivered again comes from the group's pop retry topic: ``message.topic`` is
the topic it was sent to all the same. Acking a message whose time ran out (it is being
delivered again), or twice, raises BrokerError (NO_MESSAGE).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio

from hamq.client.config import ClientConfig, client_config
from hamq.client.consumer import check_expression
from hamq.client.errors import NETWORK_ERRORS, BrokerError, InvalidArgumentError, NoRouteError
from hamq.client.instance import ClientInstance, InstanceOwner
from hamq.client.message import MessageExt, check_group, check_timeout, check_topic, inflate
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import MASTER_ID
from hamq.protocol.headers import (
    ChangeInvisibleTimeResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from hamq.protocol.message import parse_tags
from hamq.protocol.pop import (
    MAX_POP_MESSAGES,
    PROPERTY_RECEIPT_HANDLE,
    ReceiptHandle,
    ack_header,
    change_invisible_header,
    changed_handle,
    read_popped,
)
from hamq.protocol.record import decode_messages
from hamq.remoting import RemotingError, RemotingTimeoutError

#: how long a pop waits for a message by default (RocketMQ 5's awaitDuration)
AWAIT_S = 20.0
#: how long a receive waits, at most, on a broker group that has no master now
NO_MASTER_WAIT_S = 1.0


def receipt_handle(message: MessageExt) -> ReceiptHandle:
    """The receipt handle of a message ``receive`` gave; InvalidArgumentError if it has none."""
    text = message.properties.get(PROPERTY_RECEIPT_HANDLE)
    if text is None:
        raise InvalidArgumentError(f"message {message.msg_id} was not received by a SimpleConsumer")
    return ReceiptHandle.parse(text)


def attempt(message: MessageExt) -> int:
    """Which delivery of the message this is (1: the first)."""
    return message.reconsume_times + 1


class SimpleConsumer(InstanceOwner):
    _kind = "consumer"

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        *,
        await_s: float = AWAIT_S,
        from_last: bool = False,
        fifo: bool = False,
        **client_options: Any,
    ) -> None:
        check_group(group)
        self.group = group
        #: FIFO pops: a queue's messages in order, the queue locked to the group until
        #: they are acked or their time runs out (then the same ones come again)
        self.fifo = fifo
        #: a group new to a queue starts at its end (else at its first message)
        self.from_last = from_last
        self.await_s = check_timeout("await_s", await_s)
        self.config = client_config(namesrv, **client_options)
        #: topic -> tag expression
        self.subscriptions: dict[str, str] = {}
        self._turn = itertools.count(random.randrange(1 << 16))

    def subscribe(self, topic: str, expression: str = "*") -> None:
        check_topic(topic)
        check_expression(expression)
        self.subscriptions[topic] = expression

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)

    async def receive(
        self, max_messages: int = 16, invisible_s: float = 30.0, *, await_s: float | None = None
    ) -> list[MessageExt]:
        """Up to ``max_messages`` (1-32) messages of the subscribed topics, invisible to
        the group for ``invisible_s`` unless acked; [] if none came within ``await_s``."""
        if not self.subscriptions:
            raise InvalidArgumentError("subscribe to a topic before receiving")
        if not 1 <= max_messages <= MAX_POP_MESSAGES:
            raise InvalidArgumentError(
                f"max_messages {max_messages} is not in 1..{MAX_POP_MESSAGES}"
            )
        check_timeout("invisible_s", invisible_s)
        wait = self.await_s if await_s is None else await_s
        if wait < 0:
            raise InvalidArgumentError(f"await_s {wait} is negative")
        instance = self.instance
        targets: list[tuple[str, str]] = []  # (topic, broker name)
        for topic in self.subscriptions:
            queues = await instance.subscribe_queues(topic)
            targets += sorted({(topic, q.broker_name) for q in queues})
        if not targets:
            raise NoRouteError(f"no broker holds {', '.join(self.subscriptions)}")
        first = next(self._turn) % len(targets)
        failed: BaseException | None = None
        for topic, broker in targets[first:] + targets[:first]:
            try:
                found = await self._pop(
                    instance, topic, broker, max_messages, invisible_s, wait / len(targets)
                )
            except RemotingError as exc:  # (the broker is gone: a fresh route next time)
                failed = exc
                with contextlib.suppress(*NETWORK_ERRORS):
                    await instance.refresh_route_after_failure(topic)
                continue
            if found:
                return found
        if failed is not None and len(targets) == 1:
            raise failed
        return []

    async def _pop(
        self,
        instance: ClientInstance,
        topic: str,
        broker: str,
        most: int,
        invisible_s: float,
        wait_s: float,
    ) -> list[MessageExt]:
        addr = instance.broker_addr(broker, MASTER_ID, only_this=True)
        if addr is None:  # (no master now: its messages wait for the next one)
            with contextlib.suppress(*NETWORK_ERRORS):
                await instance.refresh_route_after_failure(topic)
            await anyio.sleep(min(wait_s, NO_MASTER_WAIT_S))
            return []
        expression = self.subscriptions[topic]
        header = PopMessageRequestHeader(
            consumer_group=self.group,
            topic=topic,
            queue_id=-1,
            max_msg_nums=most,
            invisible_time=int(invisible_s * 1000),
            poll_time=int(wait_s * 1000),
            born_time=time.time_ns() // 1_000_000,
            init_mode=1 if self.from_last else 0,
            exp_type="TAG",
            exp=expression,
            order=self.fifo,
            # (a FIFO pop asked again after a lost answer gets the same messages)
            attempt_id=uuid.uuid4().hex if self.fifo else None,
        )
        request = self.instance.request(RequestCode.POP_MESSAGE, header)
        timeout_s = wait_s + self.config.request_timeout_s
        try:
            response = await instance.invoke(addr, request, timeout_s)
        except RemotingTimeoutError:
            if not self.fifo:
                raise
            request = self.instance.request(RequestCode.POP_MESSAGE, header)
            response = await instance.invoke(addr, request, timeout_s)
        if response.code in (ResponseCode.POLLING_TIMEOUT, ResponseCode.PULL_NOT_FOUND):
            return []
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr)
        answer = response.header(PopMessageResponseHeader)
        tags = parse_tags(expression)
        messages = []
        popped = decode_messages(response.body)
        read_popped(answer, popped, broker, topic)
        for message in popped:
            if tags is not None and message.tags not in tags:
                await self.ack(message)  # (a tag hash collision: not the consumer's)
                continue
            messages.append(inflate(message))
        return messages

    async def ack(self, message: MessageExt) -> None:
        """The message is done with; BrokerError if it was not in flight (acked already,
        or its invisible time ran out: it is delivered again)."""
        handle = receipt_handle(message)
        addr = await self._master(message.topic, handle)
        header = ack_header(self.group, message.topic, handle)
        await self._ask(addr, self.instance.request(RequestCode.ACK_MESSAGE, header))

    async def ack_many(self, messages: Sequence[MessageExt]) -> None:
        """Ack several messages, one BATCH_ACK_MESSAGE per broker (RocketMQ's batch ack:
        messages no longer in flight are passed over, as the broker does; BrokerError
        only when none of a broker's were)."""
        by_broker: dict[str, dict[tuple[str, str, int, int, int], list[int]]] = {}
        info: dict[tuple[str, str, int, int, int], ReceiptHandle] = {}
        for message in messages:
            handle = receipt_handle(message)
            key = (message.topic, handle.kind, handle.queue_id, handle.ck_offset, handle.pop_time)
            by_broker.setdefault(handle.broker_name, {}).setdefault(key, []).append(handle.offset)
            info[key] = handle
        for broker, groups in by_broker.items():
            acks = []
            for key, offsets in groups.items():
                handle = info[key]
                bits = 0
                for offset in offsets:
                    bits |= 1 << (offset - handle.ck_offset)
                acks.append(
                    {
                        "c": self.group,
                        "t": key[0],
                        "r": handle.kind,
                        "q": handle.queue_id,
                        "so": handle.ck_offset,
                        "pt": handle.pop_time,
                        "it": handle.invisible_time,
                        "rq": handle.revive_queue,
                        "b": base64.b64encode(
                            bits.to_bytes((bits.bit_length() + 7) // 8, "little")
                        ).decode(),
                    }
                )
            addr = await self._master(next(iter(groups))[0], info[next(iter(groups))])
            body = json.dumps({"acks": acks, "brokerName": broker}).encode()
            await self._ask(addr, self.instance.request(RequestCode.BATCH_ACK_MESSAGE, body=body))

    async def change_invisible_duration(self, message: MessageExt, invisible_s: float) -> None:
        """The message comes back ``invisible_s`` from now instead (unless acked before);
        its receipt handle is replaced by the new one."""
        check_timeout("invisible_s", invisible_s)
        handle = receipt_handle(message)
        addr = await self._master(message.topic, handle)
        header = change_invisible_header(self.group, message.topic, handle, int(invisible_s * 1000))
        response = await self._ask(
            addr, self.instance.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header)
        )
        answer = response.header(ChangeInvisibleTimeResponseHeader)
        message.properties[PROPERTY_RECEIPT_HANDLE] = str(changed_handle(handle, answer))

    async def _ask(self, addr: str, request: RemotingCommand) -> RemotingCommand:
        """``request``'s answer; BrokerError unless it is SUCCESS."""
        response = await self.instance.invoke(addr, request)
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr)
        return response

    async def _master(self, topic: str, handle: ReceiptHandle) -> str:
        instance = self.instance
        addr = instance.broker_addr(handle.broker_name, MASTER_ID, only_this=True)
        if addr is None:
            await instance.update_route(topic)
            addr = instance.broker_addr(handle.broker_name, MASTER_ID, only_this=True)
        if addr is None:
            raise NoRouteError(f"broker {handle.broker_name} has no master now")
        return addr


__all__ = ["SimpleConsumer", "attempt", "receipt_handle"]
