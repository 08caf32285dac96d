"""Clients and offsets: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP,
LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, and the offset requests (shared/PROTOCOL.md §5.4-5.8).

A heartbeat registers each consumer in its group (creating the group's retry topic,
one queue, as RocketMQ does) and each producer in its group; a tag subscription that
does not parse (``a ||``) refuses the whole heartbeat (SUBSCRIPTION_PARSE_FAILED).
QUERY_CONSUMER_OFFSET answers a group that never committed with offset 0 when the
queue still starts at 0 (deliver from the beginning, as Java does while message 0 is
in memory), else QUERY_NOT_FOUND so that the client starts where its consume-from
setting says; a request with ``setZeroIfNotFound`` false (Java 5 and hamq clients)
always gets QUERY_NOT_FOUND then.
"""

from __future__ import annotations

from hamq.broker.clients import ClientChannel
from hamq.broker.context import BrokerContext
from hamq.broker.subscriptions import check_group
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import (
    ConsumerListBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    SubscriptionData,
    UnlockBatchRequestBody,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    GetConsumerListByGroupRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from hamq.protocol.message import TagExpressionError, parse_tags, retry_topic, topic_error
from hamq.remoting import Connection, Dispatcher


def _check_subscription(group: str, subscription: SubscriptionData) -> None:
    """A tag subscription must parse (SUBSCRIPTION_PARSE_FAILED); other expression
    types are refused when a pull uses them."""
    if (subscription.expression_type or "TAG").upper() != "TAG":
        return
    try:
        parse_tags(subscription.sub_string)
    except TagExpressionError as exc:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            f"parse the consumer's subscription failed, group {group} "
            f"topic {subscription.topic}: {exc}",
        ) from None


class ClientProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def install(self, dispatcher: Dispatcher) -> None:
        d = dispatcher
        d.register(RequestCode.HEART_BEAT, self.heartbeat)
        d.register(RequestCode.UNREGISTER_CLIENT, self.unregister)
        d.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.consumer_list)
        d.register(RequestCode.LOCK_BATCH_MQ, self.lock)
        d.register(RequestCode.UNLOCK_BATCH_MQ, self.unlock)
        d.register(RequestCode.QUERY_CONSUMER_OFFSET, self.query_offset)
        d.register(RequestCode.UPDATE_CONSUMER_OFFSET, self.update_offset)
        d.register(RequestCode.GET_MAX_OFFSET, self.max_offset)
        d.register(RequestCode.GET_MIN_OFFSET, self.min_offset)
        d.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset)
        d.register(RequestCode.GET_EARLIEST_MSG_STORETIME, self.earliest_time)

    # ------------------------------------------------------------------ clients
    def heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        data = decode_body(HeartbeatData, request.body)
        for name in [c.group_name for c in data.consumer_data_set] + [
            p.group_name for p in data.producer_data_set
        ]:
            check_group(name)  # all of them before any is registered
        for consumer in data.consumer_data_set:
            problem = topic_error(retry_topic(consumer.group_name))
            if problem is not None:
                raise RequestError(
                    ResponseCode.INVALID_PARAMETER,
                    f"group {consumer.group_name!r} cannot have a retry topic: {problem}",
                )
            for subscription in consumer.subscription_data_set:
                _check_subscription(consumer.group_name, subscription)
        conn.attributes["serialize_type"] = request.serialize_type  # for notifications
        now = self.ctx.clock()
        channel = ClientChannel(data.client_id, conn, request.language, request.version, now)
        for consumer in data.consumer_data_set:
            group = self.ctx.subscriptions.find(consumer.group_name)
            if group is not None and self.ctx.is_master:  # a slave copies its master's
                self.ctx.topics.ensure(retry_topic(consumer.group_name), group.retry_queue_nums)
            self.ctx.consumers.register(consumer, channel)
        for producer in data.producer_data_set:
            self.ctx.producers.register(producer.group_name, channel)
        return request.response_to()

    def unregister(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(UnregisterClientRequestHeader)
        if header.producer_group:
            self.ctx.producers.unregister(header.producer_group, header.client_id)
        if header.consumer_group:
            self.ctx.consumers.unregister(header.consumer_group, header.client_id)
        return request.response_to()

    def consumer_list(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetConsumerListByGroupRequestHeader)
        ids = self.ctx.consumers.client_ids(header.consumer_group)
        if not ids:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {header.consumer_group}"
            )
        return request.response_to(body=encode_body(ConsumerListBody(ids)))

    def lock(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = decode_body(LockBatchRequestBody, request.body)
        held = self.ctx.locks.lock(
            body.consumer_group, body.mq_set, body.client_id, self.ctx.clock()
        )
        return request.response_to(body=encode_body(LockBatchResponseBody(held)))

    def unlock(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = decode_body(UnlockBatchRequestBody, request.body)
        self.ctx.locks.unlock(body.consumer_group, body.mq_set, body.client_id)
        return request.response_to()

    # ------------------------------------------------------------------ offsets
    def query_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(QueryConsumerOffsetRequestHeader)
        offset = self.ctx.offsets.query(header.consumer_group, header.topic, header.queue_id)
        if offset < 0:
            if header.set_zero_if_not_found is not False and (
                self.ctx.store.min_offset_in_queue(header.topic, header.queue_id) <= 0
            ):
                offset = 0
            else:
                return request.response_to(
                    ResponseCode.QUERY_NOT_FOUND,
                    "Not found, maybe this group consumer boot first",
                )
        return request.response_to(header=OffsetResponseHeader(offset))

    def update_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(UpdateConsumerOffsetRequestHeader)
        check_group(header.consumer_group)
        if header.commit_offset < 0:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER, f"commitOffset {header.commit_offset} is negative"
            )
        self.ctx.offsets.commit(
            header.consumer_group, header.topic, header.queue_id, header.commit_offset
        )
        return request.response_to()

    def max_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetMaxOffsetRequestHeader)
        offset = self.ctx.store.max_offset_in_queue(header.topic, header.queue_id)
        return request.response_to(header=OffsetResponseHeader(offset))

    def min_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetMinOffsetRequestHeader)
        offset = self.ctx.store.min_offset_in_queue(header.topic, header.queue_id)
        return request.response_to(header=OffsetResponseHeader(offset))

    def search_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(SearchOffsetRequestHeader)
        upper = (header.boundary_type or "LOWER").upper() == "UPPER"
        offset = self.ctx.store.offset_by_time(
            header.topic, header.queue_id, header.timestamp, upper=upper
        )
        return request.response_to(header=OffsetResponseHeader(offset))

    def earliest_time(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetEarliestMsgStoretimeRequestHeader)
        stamp = self.ctx.store.earliest_message_time(header.topic, header.queue_id)
        if stamp < 0:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"no message in {header.topic}/{header.queue_id}",
            )
        return request.response_to(header=GetEarliestMsgStoretimeResponseHeader(stamp))
