"""Administration and lookups: topics, the tables a slave copies, messages by key or id,
the broker's own state and configuration.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_ALL_TOPIC_CONFIG (21),
GET_TOPIC_STATS_INFO (202), GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45),
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200),
QUERY_MESSAGE (12), VIEW_MESSAGE_BY_ID (33), GET_BROKER_RUNTIME_INFO (28, a KVTable),
GET_BROKER_CONFIG (26) / UPDATE_BROKER_CONFIG (25) (live_config.py: what may change while
the broker runs), GET_BROKER_HA_STATUS (907: the replication side, as JSON).
Topic changes re-register the broker with its nameservers at once (the topic
manager's change listeners).

GET_TOPIC_STATS_INFO: per queue (the larger of the read and write counts) its min and
max offset and the store time of its newest message (0: none).
"""

from __future__ import annotations

import json
import logging

import attrs

from hamq.broker.context import BrokerContext
from hamq.broker.live_config import LIVE_KEYS, LiveConfig
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import (
    MAX_QUEUE_NUMS,
    KVTable,
    MessageQueue,
    SubscriptionGroupConfig,
    TopicConfig,
    TopicOffset,
    TopicStatsTable,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetBrokerConfigResponseHeader,
    GetTopicStatsInfoRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)
from hamq.protocol.message import SYSTEM_TOPICS, TOPIC_DELETION_TOPIC, group_error
from hamq.remoting import Connection, Dispatcher
from hamq.store import StoreError
from hamq.store.schedule import encode_delay_offsets

log = logging.getLogger(__name__)


class AdminProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.live_config = LiveConfig(ctx)

    def install(self, dispatcher: Dispatcher) -> None:
        d = dispatcher
        d.register(RequestCode.UPDATE_AND_CREATE_TOPIC, self.create_topic)
        d.register_async(RequestCode.DELETE_TOPIC_IN_BROKER, self.delete_topic)
        d.register(RequestCode.GET_ALL_TOPIC_CONFIG, self.all_topics)
        d.register(RequestCode.GET_TOPIC_STATS_INFO, self.topic_stats)
        d.register(RequestCode.GET_ALL_CONSUMER_OFFSET, self.all_offsets)
        d.register(RequestCode.GET_ALL_DELAY_OFFSET, self.all_delay_offsets)
        d.register(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.all_groups)
        d.register(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.update_group)
        d.register(RequestCode.QUERY_MESSAGE, self.query_message)
        d.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message)
        d.register(RequestCode.GET_BROKER_RUNTIME_INFO, self.runtime_info)
        d.register(RequestCode.GET_BROKER_HA_STATUS, self.ha_status)
        d.register(RequestCode.GET_BROKER_CONFIG, self.broker_config)
        d.register(RequestCode.UPDATE_BROKER_CONFIG, self.update_broker_config)

    def create_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(CreateTopicRequestHeader)
        if header.topic in SYSTEM_TOPICS:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"The topic[{header.topic}] is conflict with system topic.",
            )
        for name, value in (
            ("readQueueNums", header.read_queue_nums),
            ("writeQueueNums", header.write_queue_nums),
        ):
            if not 1 <= value <= MAX_QUEUE_NUMS:
                raise RequestError(
                    ResponseCode.INVALID_PARAMETER, f"{name} {value} is not in 1..{MAX_QUEUE_NUMS}"
                )
        if not 0 <= header.perm <= 15:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER, f"perm {header.perm} is not in 0..15"
            )
        config = TopicConfig(
            header.topic,
            header.read_queue_nums,
            header.write_queue_nums,
            header.perm,
            header.topic_filter_type,
            header.topic_sys_flag or 0,
            header.order,
        )
        try:
            self.ctx.topics.update(config)
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        return request.response_to()

    async def delete_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """The topic's messages first (the store's deletion record: its queues are
        destroyed, and its consumer offsets and statistics go with them, here and on
        the slaves as the record reaches them), then its configuration. A store that
        cannot take the deletion now (a slave, a full disk) leaves everything as it was."""
        header = request.header(DeleteTopicRequestHeader)
        if header.topic in SYSTEM_TOPICS or header.topic == TOPIC_DELETION_TOPIC:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{header.topic} is a system topic")
        try:
            await self.ctx.store.delete_topic(header.topic)
        except StoreError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        self.ctx.topics.delete(header.topic)
        return request.response_to()

    def all_topics(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response_to(body=encode_body(self.ctx.topics.snapshot()))

    def topic_stats(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetTopicStatsInfoRequestHeader)
        ctx, topic = self.ctx, header.topic
        config = ctx.topics.table.get(topic)
        if config is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        stats = TopicStatsTable()
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            high = ctx.store.max_offset_in_queue(topic, queue_id)
            newest = ctx.store.message_store_time(topic, queue_id, high - 1) if high else 0
            stats.offset_table[MessageQueue(topic, ctx.config.broker_name, queue_id)] = TopicOffset(
                ctx.store.min_offset_in_queue(topic, queue_id), high, max(newest, 0)
            )
        return request.response_to(body=encode_body(stats))

    def all_offsets(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response_to(body=encode_body(self.ctx.offsets.snapshot()))

    def all_delay_offsets(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        offsets = self.ctx.store.durable_delay_offsets()
        return request.response_to(body=encode_delay_offsets(offsets))

    def all_groups(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response_to(body=encode_body(self.ctx.subscriptions.snapshot()))

    def update_group(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        config = decode_body(SubscriptionGroupConfig, request.body)
        problem = group_error(config.group_name)
        if problem is not None:
            raise RequestError(ResponseCode.INVALID_PARAMETER, problem)
        self.ctx.subscriptions.update(config)
        return request.response_to()

    def query_message(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(QueryMessageRequestHeader)
        records = self.ctx.store.query_records(
            header.topic, header.key, header.max_num, header.begin_timestamp, header.end_timestamp
        )
        if not records:
            return request.response_to(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
            )
        timestamp, offset = self.ctx.store.index_last_update()
        response_header = QueryMessageResponseHeader(
            index_last_update_timestamp=timestamp, index_last_update_phyoffset=offset
        )
        return request.response_to(header=response_header, body=b"".join(records))

    def view_message(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(ViewMessageRequestHeader)
        try:
            record = bytes(self.ctx.store.record_at(header.offset))
        except StoreError:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {header.offset}"
            ) from None
        return request.response_to(body=record)

    def runtime_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        stats = attrs.asdict(self.ctx.store.statistics())
        table = {key: str(value) for key, value in stats.items()}
        # (the store's own statistics say SLAVE: every broker's store starts as one, and
        # only takes sends when the broker becomes master)
        table["role"] = self.ctx.roles.broker_role.value
        table["brokerAddr"] = self.ctx.address
        counted = self.ctx.stats  # (since the broker started; the metrics have them by topic)
        table["messagesIn"] = str(counted.messages_in)
        table["messagesOut"] = str(counted.messages_out)
        table["sendsRefused"] = str(sum(counted.sends_refused.values()))
        table["pullRequests"] = str(sum(counted.pulls.values()))
        return request.response_to(body=encode_body(KVTable(table)))

    def ha_status(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response_to(body=json.dumps(self.ctx.ha_status()).encode())

    def broker_config(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        live = self.live_config
        header = GetBrokerConfigResponseHeader(live.version, ",".join(sorted(LIVE_KEYS)))
        return request.response_to(header=header, body=live.text().encode())

    def update_broker_config(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            text = bytes(request.body).decode()
        except UnicodeDecodeError as exc:
            raise RequestError(ResponseCode.INVALID_PARAMETER, f"not UTF-8: {exc}") from None
        changed = self.live_config.update(text)
        log.info("configuration changed by %s: %s", conn.peer, changed)
        return request.response_to()
