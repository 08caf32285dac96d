"""PULL_MESSAGE (11): messages of one queue from an offset (docs/PROTOCOL.md#pulling).

- Filtering by tags: the subscription comes from the request when its sys flag says so
  (0x4), else from the group's last heartbeat; ``*`` takes everything, ``a || b``
  takes messages whose consume-queue tag hash is a's or b's (Java's String.hashCode;
  clients check the TAGS themselves again). SQL92 filters are refused by name, and so
  is a malformed expression (``a ||``): SUBSCRIPTION_PARSE_FAILED.
- Commit flag (0x1): the request's commitOffset is stored for the group first.
- Store status -> response code as RocketMQ maps them: FOUND 0; NO_MATCHED_MESSAGE and
  MESSAGE_WAS_REMOVING 20; an empty queue or an offset one past the end 19 (21 if the
  offset was not 0 for an empty queue); offsets out of range 21. The remark is the
  status name; the body is the records back to back.
- A damaged record (it does not decode, or its body CRC fails with the store's
  ``check_crc_on_read``) is passed over by the store and counted here (metrics:
  hamq_broker_damaged_records_skipped); the next offset is past it, so the consumer
  goes on. A batch of damaged records only is MESSAGE_WAS_REMOVING: retry at once.
- suggestWhichBrokerId: the master, unless slave reads are on and the consumer is far
  behind the head (``slave_read_lag_bytes``): then a slave. A slave serves pulls too
  (consumers come when their master is down); it never commits a pull's offset.
- Suspend flag (0x2): a pull that would answer 19 waits in the hold service until a
  message arrives or its timeout passes (long polling).
"""

from __future__ import annotations

from hamq.broker.context import BrokerContext
from hamq.broker.stats import code_name
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import MASTER_ID, PERM_READ, SubscriptionGroupConfig, TopicConfig
from hamq.protocol.headers import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
)
from hamq.protocol.message import TagExpressionError, parse_tags, tags_code
from hamq.remoting import Connection, Dispatcher
from hamq.store import GetMessageResult, GetMessageStatus

_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def _response_code(status: GetMessageStatus, queue_offset: int) -> int:
    """The store's status as RocketMQ answers it; a queue that is not there or empty
    is PULL_NOT_FOUND for offset 0, else PULL_OFFSET_MOVED."""
    if status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_NOT_FOUND if queue_offset == 0 else ResponseCode.PULL_OFFSET_MOVED
    return _CODES[status]


def tag_filter(expression: str | None) -> frozenset[int] | None:
    """Tag hashes a subscription expression accepts; None accepts everything.
    TagExpressionError for a malformed expression."""
    tags = parse_tags(expression)
    return None if tags is None else frozenset(tags_code(t) for t in tags)


def consuming_group(ctx: BrokerContext, group: str) -> SubscriptionGroupConfig:
    """A consuming group's config (pulls, pops); it must exist and be allowed to consume."""
    config = ctx.subscriptions.find(group)
    if config is None:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group [{group}] does not exist",
        )
    if not config.consume_enable:
        raise RequestError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
    return config


class PullProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def install(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(RequestCode.PULL_MESSAGE, self.pull)

    def pull(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        stats = self.ctx.stats
        try:
            response = self.process(request, conn, allow_suspend=True)
        except RequestError as exc:
            stats.pulled(code_name(exc.code))
            raise
        stats.pulled("HELD" if response is None else code_name(response.code))
        return response

    def execute_held(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """A held pull, run again (no more waiting)."""
        response = self.process(request, conn, allow_suspend=False)
        assert response is not None
        return response

    def process(
        self, request: RemotingCommand, conn: Connection, *, allow_suspend: bool
    ) -> RemotingCommand | None:
        """The answer to a pull, or None when it is held for a message to arrive (only
        when ``allow_suspend``: not for a held pull run again). RequestError for a
        refused pull (group, topic, queue, subscription); nothing is changed then."""
        header = request.header(PullMessageRequestHeader)
        group = self._group(header)
        self._check_queue(header, self._topic(header))
        codes = self._filter(header)
        if allow_suspend:  # first run only: a held pull's commit is stale by its re-run
            self._commit(header)
        ctx = self.ctx
        result = ctx.store.get_message(
            header.consumer_group,
            header.topic,
            header.queue_id,
            header.queue_offset,
            header.max_msg_nums,
            tag_codes=codes,
        )
        if result.skipped:
            ctx.stats.skipped_damaged(header.topic, result.skipped)
        code = _response_code(result.status, header.queue_offset)
        if (
            code == ResponseCode.PULL_NOT_FOUND
            and allow_suspend
            and self._hold(request, conn, header, codes)
        ):
            return None
        return self._answer(request, header, group, result, code)

    def _group(self, header: PullMessageRequestHeader) -> SubscriptionGroupConfig:
        return consuming_group(self.ctx, header.consumer_group)

    def _topic(self, header: PullMessageRequestHeader) -> TopicConfig:
        """The topic's config; on a slave, a stand-in for a replicated queue whose
        topic the metadata sync has not copied yet."""
        ctx = self.ctx
        topic = ctx.topics.get(header.topic)
        if topic is None and not ctx.roles.is_master:
            # replicated messages whose topic config the metadata sync has not copied yet
            queue = ctx.store.consume_queue(header.topic, header.queue_id)
            if queue is not None:
                topic = TopicConfig(header.topic, header.queue_id + 1, 0, PERM_READ)
        if topic is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{header.topic}] not exist, apply first please!",
            )
        return topic

    @staticmethod
    def _check_queue(header: PullMessageRequestHeader, topic: TopicConfig) -> None:
        """The topic must be readable and the queue one of its read queues."""
        if not topic.perm & PERM_READ:
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"the topic[{header.topic}] pulling message is forbidden",
            )
        if not 0 <= header.queue_id < topic.read_queue_nums:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                f"topicConfig.readQueueNums:[{topic.read_queue_nums}]",
            )

    def _commit(self, header: PullMessageRequestHeader) -> None:
        """Store the request's commitOffset for the group when its flag says so (a
        master only: a slave never commits a pull's offset)."""
        ctx = self.ctx
        if (
            header.sys_flag & PULL_FLAG_COMMIT_OFFSET
            and ctx.roles.is_master
            and header.commit_offset >= 0
        ):
            ctx.offsets.commit(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )

    def _hold(
        self,
        request: RemotingCommand,
        conn: Connection,
        header: PullMessageRequestHeader,
        codes: frozenset[int] | None,
    ) -> bool:
        """Hand a pull that found nothing to the hold service when its suspend flag
        asks for a wait (at most ``long_polling_max_s``); True if it was held."""
        ctx = self.ctx
        if not header.sys_flag & PULL_FLAG_SUSPEND or ctx.pull_holds is None:
            return False
        wait_s = min(header.suspend_timeout_millis / 1000, ctx.config.long_polling_max_s)
        if not wait_s > 0:
            return False
        responder = conn.defer(request)
        ctx.pull_holds.hold(
            responder, header.topic, header.queue_id, header.queue_offset, wait_s, codes
        )
        return True

    def _answer(
        self,
        request: RemotingCommand,
        header: PullMessageRequestHeader,
        group: SubscriptionGroupConfig,
        result: GetMessageResult,
        code: int,
    ) -> RemotingCommand:
        """The response: offsets, where to pull next, and the records when found."""
        response_header = PullMessageResponseHeader(
            suggest_which_broker_id=self._suggest(group, result.lag_bytes),
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
        )
        body = b""
        if code == ResponseCode.SUCCESS:
            body = result.body
            self.ctx.stats.delivered(header.topic, result.message_count, len(body))
        return request.response_to(code, result.status.value, header=response_header, body=body)

    def _suggest(self, group: SubscriptionGroupConfig, lag_bytes: int) -> int:
        """Where the consumer should pull next (RocketMQ's rule): with slave reads on, a
        consumer this far behind the head goes to a slave (the group's
        ``which_broker_when_consume_slowly``), others to the group's broker id;
        without, always the master."""
        if not self.ctx.config.slave_read_enable:
            return MASTER_ID
        if lag_bytes > self.ctx.config.slave_read_lag_bytes:
            return group.which_broker_when_consume_slowly
        return group.broker_id

    def _filter(self, header: PullMessageRequestHeader) -> frozenset[int] | None:
        if header.sys_flag & PULL_FLAG_SUBSCRIPTION:
            expression_type = header.expression_type or "TAG"
            expression = header.subscription
        else:
            registered = self.ctx.consumers.subscription(header.consumer_group, header.topic)
            if registered is None:
                raise RequestError(
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist, group {header.consumer_group} "
                    f"topic {header.topic}",
                )
            expression_type = registered.expression_type
            expression = registered.sub_string
        if expression_type.upper() != "TAG":
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"{expression_type} filters are not supported; subscribe by tags",
            )
        try:
            return tag_filter(expression)
        except TagExpressionError as exc:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription failed, group {header.consumer_group} "
                f"topic {header.topic}: {exc}",
            ) from None
