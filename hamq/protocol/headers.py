"""Typed request/response headers: the ext fields of each command, as frozen attrs classes.

Field names are RocketMQ's header fields in snake_case; the wire key is the camelCase
form unless a field's metadata names it (converter.py). A field without a default is
required on decode (RocketMQ's ``@CFNotNull``); ``X | None = None`` is optional and
left out on encode when None. Units: timestamps in ms since the epoch, ``*_millis`` in
ms, offsets are commit-log byte offsets (``commit_log_offset``, ``offset`` of
VIEW_MESSAGE_BY_ID) or consume-queue indexes (``queue_offset``, ``commit_offset``).
Facts: docs/PROTOCOL.md#ext-fields-per-request and RocketMQ's ``*RequestHeader`` classes.

Use with ``RemotingCommand.request(code, header)``, ``cmd.header(Class)`` and
``request.response_to(code, header=...)``. The send's headers also travel under
SEND_MESSAGE_V2's one-letter keys and have a converter-free codec for the hot path:
that is send_fields.py. ``ALL_HEADERS`` lists every class here.
"""

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


# ====================================================================== controller (5.x)


@attrs.frozen
class GetNextBrokerIdRequestHeader:
    """CONTROLLER_GET_NEXT_BROKER_ID (1012)."""

    cluster_name: str
    broker_name: str


@attrs.frozen
class GetNextBrokerIdResponseHeader:
    cluster_name: str
    broker_name: str
    next_broker_id: int


@attrs.frozen
class ApplyBrokerIdRequestHeader:
    """CONTROLLER_APPLY_BROKER_ID (1013): a broker claims an id with its check code."""

    cluster_name: str
    broker_name: str
    applied_broker_id: int
    register_check_code: str


@attrs.frozen
class RegisterBrokerToControllerRequestHeader:
    """CONTROLLER_REGISTER_BROKER (1003). ``register_check_code`` and ``ha_server_addr``
    are hamq's: the id's owner, and where slaves replicate from when it is master."""

    cluster_name: str
    broker_name: str
    broker_id: int
    broker_address: str
    register_check_code: str | None = None
    ha_server_addr: str | None = None
    invoke_time: int | None = None


@attrs.frozen
class ReplicaInfoResponseHeader:
    """The answer of CONTROLLER_REGISTER_BROKER, CONTROLLER_GET_REPLICA_INFO and
    CONTROLLER_ELECT_MASTER, and NOTIFY_BROKER_ROLE_CHANGED's header (body: the
    SyncStateSet); BROKER_HEARTBEAT's answer too. ``master_ha_address`` and
    ``leader_contact_ms`` are hamq's: the second only in a heartbeat's answer from the
    Raft leader, how long ago it last heard from a majority of the controllers (a
    broker's lease counts from then; no other answer renews it)."""

    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None
    master_ha_address: str | None = None
    leader_contact_ms: int | None = None


@attrs.frozen
class GetReplicaInfoRequestHeader:
    """CONTROLLER_GET_REPLICA_INFO (1004)."""

    broker_name: str


@attrs.frozen
class AlterSyncStateSetRequestHeader:
    """CONTROLLER_ALTER_SYNC_STATE_SET (1001); body: the new set with the current epoch."""

    broker_name: str
    master_broker_id: int
    master_epoch: int
    invoke_time: int | None = None


@attrs.frozen
class ElectMasterRequestHeader:
    """CONTROLLER_ELECT_MASTER (1002): ``designate_elect`` names ``broker_id``."""

    cluster_name: str
    broker_name: str
    broker_id: int | None = None
    designate_elect: bool = False
    invoke_time: int | None = None


@attrs.frozen
class GetMetaDataResponseHeader:
    """CONTROLLER_GET_METADATA_INFO (1005)."""

    group: str | None = None
    controller_leader_id: str | None = None
    controller_leader_address: str | None = None
    is_leader: bool = False
    peers: str | None = None


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


@attrs.define
class SendMessageRequestHeader:
    """SEND_MESSAGE (10); SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) carry the
    same fields under one-letter keys (send_fields.py's ``from_v2_fields`` /
    ``to_v2_fields``). Not frozen, as the send's answer is not: one of each is built for
    every send, and a frozen class's ``__init__`` costs four times as much."""

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


@attrs.define
class SendMessageResponseHeader:
    """Reply to a send: the offset msg id (docs/PROTOCOL.md#message-ids), queue and queue offset."""

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


#: PULL_MESSAGE sysFlag bits (docs/PROTOCOL.md#pulling)
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
class GetConsumeStatsRequestHeader:
    """GET_CONSUME_STATS (208): a group's progress in ``topic``, or (no topic) in every
    topic it committed offsets for; ``topic_list`` (``a;b;``) names several instead."""

    consumer_group: str
    topic: str | None = None
    topic_list: str | None = None


@attrs.frozen
class ResetOffsetRequestHeader:
    """INVOKE_BROKER_TO_RESET_OFFSET (222), admin -> broker, and RESET_CONSUMER_CLIENT_OFFSET
    (220), broker -> consumer: the group's offsets in ``topic`` go to the first message
    stored at or after ``timestamp`` (ms; -1: the end of each queue). ``is_force``
    False moves offsets back only. Java 5: ``queue_id`` >= 0 with ``offset`` resets that
    one queue to that offset."""

    topic: str
    group: str
    timestamp: int
    is_force: bool = False
    queue_id: int | None = None
    offset: int | None = None


@attrs.frozen
class ResetOffsetResponseHeader:
    """hamq's addition to INVOKE_BROKER_TO_RESET_OFFSET's answer (RocketMQ's has none):
    how many of the group's online consumers were told."""

    notified_clients: int | None = None


@attrs.frozen
class GetConsumerStatusRequestHeader:
    """GET_CONSUMER_STATUS_FROM_CLIENT (221), broker -> consumer, and
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223): a group's offsets in ``topic`` as its
    consumers hold them (``client_addr``: only that client)."""

    topic: str
    group: str
    client_addr: str | None = None


@attrs.frozen
class GetBrokerConfigResponseHeader:
    """GET_BROKER_CONFIG (26)'s answer: ``version`` is the configuration's data version
    (JSON). hamq adds ``live_keys``: the keys UPDATE_BROKER_CONFIG takes, comma-separated."""

    version: str
    live_keys: str | None = None


@attrs.frozen
class QueryDataVersionRequestHeader:
    """QUERY_DATA_VERSION (322); body: the broker's topic-table DataVersion (JSON)."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


@attrs.frozen
class QueryDataVersionResponseHeader:
    """QUERY_DATA_VERSION's answer: whether the nameserver's copy of the broker's topic
    table differs from the version asked about (or it does not know the broker: it must
    register); body: the nameserver's DataVersion, if it has one."""

    changed: bool = False


@attrs.frozen
class PopMessageRequestHeader:
    """POP_MESSAGE (200050): up to ``max_msg_nums`` (at most 32) messages of ``topic``
    (``queue_id`` -1: any queue) and of the group's pop retry topic, invisible to the
    group for ``invisible_time`` ms unless acked; ``poll_time`` ms of long polling;
    ``init_mode`` 0 starts a new group at the queue's first message, 1 at its end;
    ``exp_type``/``exp`` filter by tags; ``order``: FIFO (the queue locked until acked)."""

    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time: int
    poll_time: int
    born_time: int
    init_mode: int
    exp_type: str | None = None
    exp: str | None = None
    order: bool | None = None
    attempt_id: str | None = None


@attrs.frozen
class PopMessageResponseHeader:
    """POP_MESSAGE's answer: body, the messages' records back to back (as a pull's);
    ``start_offset_info`` and ``msg_offset_info`` say which queue offsets each came from
    (the client builds each message's receipt handle from them: hamq/protocol/pop.py)."""

    pop_time: int
    invisible_time: int
    revive_qid: int
    rest_num: int
    start_offset_info: str | None = None
    msg_offset_info: str | None = None
    order_count_info: str | None = None


@attrs.frozen
class AckMessageRequestHeader:
    """ACK_MESSAGE (200051): the message at ``offset`` of ``topic``/``queue_id`` popped
    with the receipt handle ``extra_info`` is done with."""

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int


@attrs.frozen
class ChangeInvisibleTimeRequestHeader:
    """CHANGE_MESSAGE_INVISIBLETIME (200053): the popped message comes back
    ``invisible_time`` ms from now unless acked (a new receipt handle: the answer's
    pop time and invisible time, the message's offset as the handle's first field)."""

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int
    invisible_time: int


@attrs.frozen
class NotificationRequestHeader:
    """NOTIFICATION (200054): whether the group has messages to pop in ``topic``'s queue
    (-1: any), waiting up to ``poll_time`` ms for one."""

    consumer_group: str
    topic: str
    queue_id: int
    poll_time: int
    born_time: int
    order: bool | None = None
    attempt_id: str | None = None


@attrs.frozen
class NotificationResponseHeader:
    has_msg: bool = False
    polling_full: bool = False


@attrs.frozen
class PollingInfoRequestHeader:
    """POLLING_INFO (200055): how many pops wait at ``topic``'s queue (-1: any)."""

    consumer_group: str
    topic: str
    queue_id: int


@attrs.frozen
class PollingInfoResponseHeader:
    polling_num: int


@attrs.frozen
class ChangeInvisibleTimeResponseHeader:
    pop_time: int
    invisible_time: int
    revive_qid: int


#: Every header class, for tests and tooling: each attrs class defined above (kept last,
#: so that a header added anywhere in this module is in it).
ALL_HEADERS: tuple[type, ...] = tuple(
    obj
    for obj in list(globals().values())
    if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == __name__
)
