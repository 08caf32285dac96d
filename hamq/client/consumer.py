"""Pulling: the request every consumer makes, offsets, and PullConsumer.

``PullCaller`` is what PullConsumer and PushConsumer share: PULL_MESSAGE to the
broker that holds a queue (the master, or the broker id the last answer suggested —
``suggestWhichBrokerId``), messages decoded, bodies inflated, and filtered again by
their TAGS (brokers filter by tag hash, which can collide); and the offset requests
(QUERY/UPDATE_CONSUMER_OFFSET, GET_MIN/MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP).

``PullConsumer`` leaves the offsets to its user:

    async with PullConsumer("my-group", namesrv="127.0.0.1:9876") as consumer:
        for queue in await consumer.queues("demo"):
            result = await consumer.pull(queue, offset=0, expression="a || b")
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from hamq.client.config import ClientConfig, client_config
from hamq.client.errors import NETWORK_ERRORS, BrokerError, ClientError, InvalidArgumentError
from hamq.client.instance import ClientInstance, InstanceOwner
from hamq.client.message import PullResult, PullStatus, check_timeout, check_topic, inflate
from hamq.protocol import RequestCode, ResponseCode
from hamq.protocol.bodies import MASTER_ID, MessageQueue
from hamq.protocol.headers import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from hamq.protocol.message import (
    SYSFLAG_COMPRESSED,
    MessageFormatError,
    TagExpressionError,
    parse_tags,
)
from hamq.protocol.record import decode_messages
from hamq.remoting import RemotingError

log = logging.getLogger(__name__)

_PULL_STATUSES: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def check_expression(expression: str) -> None:
    if not isinstance(expression, str):
        raise InvalidArgumentError(
            f"a subscription expression is a str, not {type(expression).__name__}"
        )
    if "\x01" in expression or "\x02" in expression:
        raise InvalidArgumentError("a subscription expression may not hold \\x01 or \\x02")
    try:
        parse_tags(expression)
    except TagExpressionError as exc:
        raise InvalidArgumentError(str(exc)) from None


class PullCaller:
    def __init__(self, instance: ClientInstance, group: str) -> None:
        self.instance = instance
        self.group = group
        #: queue -> the broker id its last pull answer suggested
        self.suggested: dict[MessageQueue, int] = {}

    async def pull(
        self,
        queue: MessageQueue,
        expression: str,
        offset: int,
        max_nums: int,
        *,
        timeout_s: float,
        sys_flag: int = PULL_FLAG_SUBSCRIPTION,
        commit_offset: int = 0,
        suspend_s: float = 0.0,
        sub_version: int = 0,
        decode: bool = True,
    ) -> PullResult:
        """``decode`` False: the records stay as they came (``PullResult.raw``), bodies
        not inflated and tags not filtered again, for callers that decode themselves."""
        broker_id = self.suggested.get(queue, MASTER_ID)
        addr = await self.instance.find_broker_addr(queue, broker_id)
        header = PullMessageRequestHeader(
            consumer_group=self.group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            sys_flag=sys_flag | (PULL_FLAG_SUSPEND if suspend_s > 0 else 0),
            commit_offset=commit_offset,
            suspend_timeout_millis=int(suspend_s * 1000),
            sub_version=sub_version,
            subscription=expression,
            expression_type="TAG",
        )
        try:
            response = await self.instance.invoke(
                addr, self.instance.request(RequestCode.PULL_MESSAGE, header), timeout_s
            )
        except RemotingError:
            # the broker may be gone: the next pull goes to the master again, and a
            # fresh route lets it go to another (a slave, when the master is down)
            self.suggested.pop(queue, None)
            with contextlib.suppress(*NETWORK_ERRORS):
                await self.instance.refresh_route_after_failure(queue.topic)
            raise
        status = _PULL_STATUSES.get(response.code)
        if status is None:
            raise BrokerError(response.code, response.remark, addr)
        answer = response.header(PullMessageResponseHeader)
        self.suggested[queue] = answer.suggest_which_broker_id
        messages = []
        if status is PullStatus.FOUND and not decode:
            return PullResult(
                status,
                answer.next_begin_offset,
                answer.min_offset,
                answer.max_offset,
                suggest_which_broker_id=answer.suggest_which_broker_id,
                raw=response.body,
            )
        if status is PullStatus.FOUND:
            tags = parse_tags(expression)
            try:
                messages = decode_messages(response.body)
                if tags is not None:
                    messages = [m for m in messages if m.tags in tags]
                if any(m.sys_flag & SYSFLAG_COMPRESSED for m in messages):
                    messages = [inflate(m) for m in messages]
            except MessageFormatError as exc:
                raise BrokerError(
                    ResponseCode.SYSTEM_ERROR, f"a pull answer from {queue} is bad: {exc}", addr
                ) from None
        return PullResult(
            status,
            answer.next_begin_offset,
            answer.min_offset,
            answer.max_offset,
            messages,
            answer.suggest_which_broker_id,
        )

    # ------------------------------------------------------------------ offsets
    async def query_offset(self, queue: MessageQueue) -> int | None:
        """The group's committed offset; None if it never committed one."""
        addr = await self.instance.find_broker_addr(queue)
        header = QueryConsumerOffsetRequestHeader(
            self.group, queue.topic, queue.queue_id, set_zero_if_not_found=False
        )
        response = await self.instance.invoke(
            addr, self.instance.request(RequestCode.QUERY_CONSUMER_OFFSET, header)
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr)
        return response.header(OffsetResponseHeader).offset

    async def commit_offset(self, queue: MessageQueue, offset: int) -> str:
        """Commit at the queue's master (a slave when the master is gone); the address
        it went to."""
        addr = await self.instance.find_broker_addr(queue)
        header = UpdateConsumerOffsetRequestHeader(self.group, queue.topic, queue.queue_id, offset)
        await self.instance.invoke_ok(
            addr, self.instance.request(RequestCode.UPDATE_CONSUMER_OFFSET, header)
        )
        return addr

    async def _offset(self, code: RequestCode, queue: MessageQueue, header: Any) -> int:
        addr = await self.instance.find_broker_addr(queue)
        response = await self.instance.invoke_ok(addr, self.instance.request(code, header))
        return response.header(OffsetResponseHeader).offset

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self._offset(
            RequestCode.GET_MIN_OFFSET,
            queue,
            GetMinOffsetRequestHeader(queue.topic, queue.queue_id),
        )

    async def max_offset(self, queue: MessageQueue) -> int:
        return await self._offset(
            RequestCode.GET_MAX_OFFSET,
            queue,
            GetMaxOffsetRequestHeader(queue.topic, queue.queue_id),
        )

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset whose message was stored at or after ``timestamp_ms``."""
        return await self._offset(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            queue,
            SearchOffsetRequestHeader(queue.topic, queue.queue_id, timestamp_ms),
        )


class PullConsumer(InstanceOwner):
    _kind = "consumer"

    def __init__(
        self,
        group: str = "DEFAULT_CONSUMER",
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        **client_options: Any,
    ) -> None:
        if not group:
            raise InvalidArgumentError("the consumer group is empty")
        self.group = group
        self.config = client_config(namesrv, **client_options)
        self._caller: PullCaller | None = None

    def _started(self, instance: ClientInstance) -> None:
        self._caller = PullCaller(instance, self.group)

    @property
    def caller(self) -> PullCaller:
        if self._caller is None or self._instance is None:
            raise ClientError("the consumer is not started: use it as `async with`")
        return self._caller

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues (fresh from a nameserver)."""
        check_topic(topic)
        return await self.caller.instance.subscribe_queues(topic, refresh=True)

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        expression: str = "*",
        max_nums: int = 32,
        *,
        wait_s: float = 0.0,
        timeout_s: float = 10.0,
    ) -> PullResult:
        """Messages of ``queue`` from ``offset`` whose tags match ``expression``.

        ``wait_s`` > 0: when nothing is there yet, the broker holds the pull that long
        for a message to arrive (long polling). ``timeout_s`` (positive) bounds the
        request; with ``wait_s`` it is at least ``wait_s`` + 5 s."""
        check_expression(expression)
        check_timeout("timeout_s", timeout_s)
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative")
        if not 1 <= max_nums <= 1024:
            raise InvalidArgumentError(f"max_nums {max_nums} is not in 1..1024")
        if wait_s < 0:
            raise InvalidArgumentError(f"wait_s {wait_s} is negative")
        return await self.caller.pull(
            queue,
            expression,
            offset,
            max_nums,
            timeout_s=max(timeout_s, wait_s + 5.0) if wait_s else timeout_s,
            suspend_s=wait_s,
        )

    async def committed_offset(self, queue: MessageQueue) -> int | None:
        return await self.caller.query_offset(queue)

    async def commit_offset(self, queue: MessageQueue, offset: int) -> None:
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative")
        await self.caller.commit_offset(queue, offset)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self.caller.min_offset(queue)

    async def max_offset(self, queue: MessageQueue) -> int:
        return await self.caller.max_offset(queue)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return await self.caller.search_offset(queue, timestamp_ms)
