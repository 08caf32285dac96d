"""Clients and offsets: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP,
LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, and the offset requests (docs/PROTOCOL.md#offsets,
docs/PROTOCOL.md#clients-and-consumer-groups);
and the same for operators: GET_CONSUMER_CONNECTION_LIST (203), GET_CONSUME_STATS (208),
INVOKE_BROKER_TO_RESET_OFFSET (222), INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223).

A heartbeat registers each consumer in its group (creating the group's retry topic,
one queue, as RocketMQ does — on a slave too) and each producer in its group; a tag
subscription that does not parse (``a ||``) refuses the whole heartbeat
(SUBSCRIPTION_PARSE_FAILED).
QUERY_CONSUMER_OFFSET answers a group that never committed with offset 0 when the
queue still starts at 0 (deliver from the beginning, as Java does while message 0 is
in memory), else QUERY_NOT_FOUND so that the client starts where its consume-from
setting says; a request with ``setZeroIfNotFound`` false (Java 5 and hamq clients)
always gets QUERY_NOT_FOUND then.

GET_CONSUME_STATS: per readable queue of each topic the group committed offsets in
(or the one topic asked; topics the online group does not subscribe to are left
out, as RocketMQ does) the queue's end, the group's offset (0 if none) and the store
time of the last message it consumed (the one before its offset; 0 if none).

INVOKE_BROKER_TO_RESET_OFFSET (master only): each readable queue of the topic goes to
the first offset stored at or after the timestamp (-1: the queue's end); without
``isForce`` an offset only moves back. The offsets are committed here first — so a
group with no member online resets too, and starts from them — then each online
member is told (RESET_CONSUMER_CLIENT_OFFSET, client_calls.py) so that it goes on
from them at once. (RocketMQ 4 answers CONSUMER_NOT_ONLINE then, and its tools commit
the offsets themselves; RocketMQ 5 commits on the broker as well.) The answer is
ResetOffsetBody with the offsets, and ``notifiedClients``.
"""

from __future__ import annotations

import logging

from hamq.broker.client_calls import consumer_status, tell_reset
from hamq.broker.clients import ClientChannel
from hamq.broker.context import BrokerContext
from hamq.broker.subscriptions import check_group
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import (
    Connection as ConnectionInfo,
)
from hamq.protocol.bodies import (
    ConsumerConnection,
    ConsumerListBody,
    ConsumeStats,
    GetConsumerStatusBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetWrapper,
    ResetOffsetBody,
    SubscriptionData,
    UnlockBatchRequestBody,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    GetConsumerConnectionListRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetConsumerStatusRequestHeader,
    GetConsumeStatsRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    ResetOffsetRequestHeader,
    ResetOffsetResponseHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from hamq.protocol.message import TagExpressionError, parse_tags, retry_topic, topic_error
from hamq.remoting import Connection, Dispatcher

log = logging.getLogger(__name__)


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
        d.register(RequestCode.GET_CONSUMER_CONNECTION_LIST, self.connections)
        d.register(RequestCode.GET_CONSUME_STATS, self.consume_stats)
        d.register_async(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, self.reset_offset)
        d.register_async(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, self.consumer_status)

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
            if group is not None:
                # on a slave too, as RocketMQ's heartbeat does: a new group reading from
                # the slave while the master is down pulls its retry topic there (an empty
                # queue, not TOPIC_NOT_EXIST); the master's table replaces it at the next
                # metadata sync, where the group's heartbeat has created it as well
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

    # ------------------------------------------------------------------ for operators
    def connections(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetConsumerConnectionListRequestHeader)
        info = self.ctx.consumers.group_info(header.consumer_group)
        if info is None or not info.channels:
            raise RequestError(
                ResponseCode.CONSUMER_NOT_ONLINE,
                f"the consumer group[{header.consumer_group}] not online",
            )
        body = ConsumerConnection(
            [
                ConnectionInfo(c.client_id, c.connection.peer, c.language, c.version)
                for c in sorted(info.channels.values(), key=lambda c: c.client_id)
            ],
            dict(info.subscriptions),
            info.consume_type,
            info.message_model,
            info.consume_from_where,
        )
        return request.response_to(body=encode_body(body))

    def _stats_topics(self, header: GetConsumeStatsRequestHeader) -> list[str]:
        if header.topic_list:
            return [t for t in header.topic_list.split(";") if t]
        group = header.consumer_group
        topics = [header.topic] if header.topic else self.ctx.offsets.topics_of(group)
        info = self.ctx.consumers.group_info(group)
        if info is not None and info.subscriptions:
            topics = [t for t in topics if t in info.subscriptions]
        return topics

    def consume_stats(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetConsumeStatsRequestHeader)
        ctx, group = self.ctx, header.consumer_group
        stats = ConsumeStats()
        for topic in self._stats_topics(header):
            config = ctx.topics.table.get(topic)
            if config is None:
                continue
            for queue_id in range(config.read_queue_nums):
                consumed = max(ctx.offsets.query(group, topic, queue_id), 0)
                last = ctx.store.message_store_time(topic, queue_id, consumed - 1)
                stats.offset_table[MessageQueue(topic, ctx.config.broker_name, queue_id)] = (
                    OffsetWrapper(
                        broker_offset=ctx.store.max_offset_in_queue(topic, queue_id),
                        consumer_offset=consumed,
                        pull_offset=consumed,
                        last_timestamp=max(last, 0),
                        in_flight=ctx.pops_in_flight(group, topic, queue_id),
                    )
                )
        return request.response_to(body=encode_body(stats))

    async def reset_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(ResetOffsetRequestHeader)
        ctx, group, topic = self.ctx, header.group, header.topic
        check_group(group)
        if not ctx.roles.is_master:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "Can not reset offset in slave broker")
        config = ctx.topics.table.get(topic)
        if config is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"Topic {topic} does not exist")
        if header.queue_id is not None and header.queue_id >= 0:
            if header.queue_id >= config.read_queue_nums:
                raise RequestError(
                    ResponseCode.INVALID_PARAMETER,
                    f"queueId {header.queue_id} is not in 0..{config.read_queue_nums - 1}",
                )
            queue_ids = [header.queue_id]
        else:
            queue_ids = list(range(config.read_queue_nums))
        offsets: dict[MessageQueue, int] = {}
        for queue_id in queue_ids:
            low = ctx.store.min_offset_in_queue(topic, queue_id)
            high = ctx.store.max_offset_in_queue(topic, queue_id)
            if header.offset is not None and header.offset >= 0 and len(queue_ids) == 1:
                if not low <= header.offset <= high:
                    raise RequestError(
                        ResponseCode.INVALID_PARAMETER,
                        f"offset {header.offset} is not in [{low}, {high}] "
                        f"({topic} queue {queue_id})",
                    )
                target = header.offset
            elif header.timestamp < 0:
                target = high
            else:
                target = ctx.store.offset_by_time(topic, queue_id, header.timestamp)
            committed = ctx.offsets.query(group, topic, queue_id)
            if not header.is_force and 0 <= committed <= target:
                target = committed  # without force, offsets only move back
            offsets[MessageQueue(topic, ctx.config.broker_name, queue_id)] = target
        now = ctx.clock()
        for queue, offset in offsets.items():
            ctx.offsets.reset(group, topic, queue.queue_id, offset, now)
        log.info(
            "group %s: offsets of %s reset to %s (timestamp %d, asked by %s)",
            group,
            topic,
            {q.queue_id: o for q, o in offsets.items()},
            header.timestamp,
            conn.peer,
        )
        told = await tell_reset(ctx.consumers.channels(group), header, offsets)
        return request.response_to(
            header=ResetOffsetResponseHeader(told), body=encode_body(ResetOffsetBody(offsets))
        )

    async def consumer_status(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetConsumerStatusRequestHeader)
        channels = self.ctx.consumers.channels(header.group)
        if not channels:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"No Any Consumer online in the consumer group: [{header.group}]",
            )
        table = await consumer_status(channels, header)
        return request.response_to(body=encode_body(GetConsumerStatusBody(consumer_table=table)))
