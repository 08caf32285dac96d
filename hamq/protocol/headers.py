"""Typed request/response headers: the ext fields of each command, as frozen attrs classes.

Field names are RocketMQ's header fields in snake_case; the wire key is the camelCase
form unless a field's metadata names it (converter.py). A field without a default is
required on decode (RocketMQ's ``@CFNotNull``); ``X | None = None`` is optional and
left out on encode when None. Units: timestamps in ms since the epoch, ``*_millis`` in
ms, offsets are commit-log byte offsets (``commit_log_offset``, ``offset`` of
VIEW_MESSAGE_BY_ID) or consume-queue indexes (``queue_offset``, ``commit_offset``).
Facts: shared/PROTOCOL.md §4-5 and RocketMQ's ``*RequestHeader`` classes.

Use with ``RemotingCommand.request(code, header)``, ``cmd.header(Class)`` and
``request.response_to(code, header=...)``.
"""

from collections.abc import Mapping

import attrs


def _wire(key: str) -> dict[str, str]:
    return {"wire": key}


# ====================================================================== nameserver


@attrs.frozen
class RegisterBrokerRequestHeader:
    """REGISTER_BROKER (103): a broker announces itself to a nameserver, every 30 s."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: int
    heartbeat_timeout_millis: int | None = None
    enable_acting_master: bool | None = None
    compressed: bool = False
    body_crc32: int = 0
    zone_name: str | None = None


@attrs.frozen
class RegisterBrokerResponseHeader:
    """Filled for a slave whose master is registered: where to replicate from."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


@attrs.frozen
class UnregisterBrokerRequestHeader:
    """UNREGISTER_BROKER (104)."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


@attrs.frozen
class BrokerHeartbeatRequestHeader:
    """BROKER_HEARTBEAT (904), 5.x: refreshes a broker's last-heard time."""

    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int | None = None
    epoch: int | None = None
    max_offset: int | None = None
    confirm_offset: int | None = None
    heartbeat_timeout_mills: int | None = None
    election_priority: int | None = None


@attrs.frozen
class GetRouteInfoRequestHeader:
    """GET_ROUTEINFO_BY_TOPIC (105)."""

    topic: str
    accept_standard_json_only: bool | None = None


@attrs.frozen
class GetTopicsByClusterRequestHeader:
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str


@attrs.frozen
class DeleteTopicRequestHeader:
    """DELETE_TOPIC_IN_BROKER (215) / DELETE_TOPIC_IN_NAMESRV (216)."""

    topic: str


# ====================================================================== producer


@attrs.frozen
class SendMessageRequestHeader:
    """SEND_MESSAGE (10); SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) carry the
    same fields under one-letter keys (``from_v2_fields`` / ``to_v2_fields``)."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool | None = None
    batch: bool | None = None
    max_reconsume_times: int | None = None
    #: 5.x: RocketMQ's RpcRequestHeader carries the broker name as ``bname``
    broker_name: str | None = attrs.field(default=None, metadata=_wire("bname"))


#: SEND_MESSAGE_V2's one-letter keys -> SEND_MESSAGE's keys (PROTOCOL.md §5.2).
SEND_V2_KEYS: Mapping[str, str] = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "bname",
}
_SEND_V1_KEYS = {full: short for short, full in SEND_V2_KEYS.items()}


def from_v2_fields(fields: Mapping[str, str]) -> dict[str, str]:
    """SEND_MESSAGE_V2 ext fields renamed to SEND_MESSAGE's keys (others kept)."""
    return {SEND_V2_KEYS.get(key, key): value for key, value in fields.items()}


def to_v2_fields(fields: Mapping[str, str]) -> dict[str, str]:
    """SEND_MESSAGE ext fields renamed to SEND_MESSAGE_V2's one-letter keys."""
    return {_SEND_V1_KEYS.get(key, key): value for key, value in fields.items()}


@attrs.frozen
class SendMessageResponseHeader:
    """Reply to a send: the offset msg id (PROTOCOL.md §6.4), queue and queue offset."""

    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None
    msg_region: str | None = attrs.field(default=None, metadata=_wire("MSG_REGION"))
    trace_on: str | None = attrs.field(default=None, metadata=_wire("TRACE_ON"))


@attrs.frozen
class EndTransactionRequestHeader:
    """END_TRANSACTION (37)."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    msg_id: str
    topic: str | None = None
    from_transaction_check: bool = False
    transaction_id: str | None = None


@attrs.frozen
class CheckTransactionStateRequestHeader:
    """CHECK_TRANSACTION_STATE (39), broker -> producer."""

    tran_state_table_offset: int
    commit_log_offset: int
    topic: str | None = None
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None


# ====================================================================== consumer


#: PULL_MESSAGE sysFlag bits (shared/PROTOCOL.md §5.3)
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4


@attrs.frozen
class PullMessageRequestHeader:
    """PULL_MESSAGE (11). ``sys_flag`` bits: 1 commit offset, 2 suspend (long poll),
    4 subscription in this request, 8 class filter, 16 lite pull."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    sub_version: int
    subscription: str | None = None
    expression_type: str | None = None
    max_msg_bytes: int | None = None


@attrs.frozen
class PullMessageResponseHeader:
    """Reply to a pull; clients need all four required fields as strings."""

    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    offset_delta: int | None = None
    topic_sys_flag: int | None = None
    group_sys_flag: int | None = None
    forbidden_type: int | None = None


@attrs.frozen
class QueryConsumerOffsetRequestHeader:
    """QUERY_CONSUMER_OFFSET (14)."""

    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None


@attrs.frozen
class UpdateConsumerOffsetRequestHeader:
    """UPDATE_CONSUMER_OFFSET (15)."""

    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


@attrs.frozen
class OffsetResponseHeader:
    """Reply to QUERY_CONSUMER_OFFSET, GET_MAX_OFFSET, GET_MIN_OFFSET and
    SEARCH_OFFSET_BY_TIMESTAMP: one consume-queue offset."""

    offset: int


@attrs.frozen
class GetMaxOffsetRequestHeader:
    """GET_MAX_OFFSET (30): the queue's next offset."""

    topic: str
    queue_id: int
    committed: bool = True


@attrs.frozen
class GetMinOffsetRequestHeader:
    """GET_MIN_OFFSET (31)."""

    topic: str
    queue_id: int


@attrs.frozen
class SearchOffsetRequestHeader:
    """SEARCH_OFFSET_BY_TIMESTAMP (29); ``boundary_type`` LOWER (default) or UPPER."""

    topic: str
    queue_id: int
    timestamp: int
    boundary_type: str | None = None


@attrs.frozen
class GetEarliestMsgStoretimeRequestHeader:
    """GET_EARLIEST_MSG_STORETIME (32)."""

    topic: str
    queue_id: int


@attrs.frozen
class GetEarliestMsgStoretimeResponseHeader:
    timestamp: int


@attrs.frozen
class ViewMessageRequestHeader:
    """VIEW_MESSAGE_BY_ID (33): ``offset`` is the commit-log offset of the message."""

    offset: int
    topic: str | None = None


@attrs.frozen
class QueryMessageRequestHeader:
    """QUERY_MESSAGE (12): messages whose KEYS (or UNIQ_KEY) contain ``key``."""

    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int


@attrs.frozen
class QueryMessageResponseHeader:
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


@attrs.frozen
class UnregisterClientRequestHeader:
    """UNREGISTER_CLIENT (35); the unused group comes as an empty string."""

    client_id: str = attrs.field(metadata=_wire("clientID"))
    producer_group: str | None = None
    consumer_group: str | None = None


@attrs.frozen
class ConsumerSendMsgBackRequestHeader:
    """CONSUMER_SEND_MSG_BACK (36): ``offset`` is the message's commit-log offset;
    ``delay_level`` 0 lets the broker choose 3 + reconsume times."""

    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


@attrs.frozen
class GetConsumerListByGroupRequestHeader:
    """GET_CONSUMER_LIST_BY_GROUP (38)."""

    consumer_group: str


@attrs.frozen
class NotifyConsumerIdsChangedRequestHeader:
    """NOTIFY_CONSUMER_IDS_CHANGED (40), broker -> consumer, oneway."""

    consumer_group: str


# ====================================================================== admin


@attrs.frozen
class CreateTopicRequestHeader:
    """UPDATE_AND_CREATE_TOPIC (17). ``perm``: 4 read | 2 write (6 = RW)."""

    topic: str
    default_topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int | None = None
    order: bool = False
    attributes: str | None = None
    force: bool = False


@attrs.frozen
class GetTopicStatsInfoRequestHeader:
    """GET_TOPIC_STATS_INFO (202)."""

    topic: str


@attrs.frozen
class GetConsumerConnectionListRequestHeader:
    """GET_CONSUMER_CONNECTION_LIST (203)."""

    consumer_group: str


@attrs.frozen
class DeleteSubscriptionGroupRequestHeader:
    """DELETE_SUBSCRIPTIONGROUP (207)."""

    group_name: str
    clean_offset: bool = False


@attrs.frozen
class WipeWritePermOfBrokerRequestHeader:
    """WIPE_WRITE_PERM_OF_BROKER (205) / ADD_WRITE_PERM_OF_BROKER (327)."""

    broker_name: str


@attrs.frozen
class QueryDataVersionRequestHeader:
    """QUERY_DATA_VERSION (322)."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


#: Every header class, for tests and tooling.
ALL_HEADERS: tuple[type, ...] = (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
    BrokerHeartbeatRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    DeleteTopicRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    EndTransactionRequestHeader,
    CheckTransactionStateRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    OffsetResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    SearchOffsetRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    ViewMessageRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    UnregisterClientRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    CreateTopicRequestHeader,
    GetTopicStatsInfoRequestHeader,
    GetConsumerConnectionListRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    QueryDataVersionRequestHeader,
)
