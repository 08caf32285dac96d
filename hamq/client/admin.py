"""AdminClient: topics, routes, clusters, consumer groups, messages and brokers, as
``hamq topic`` and ``hamq admin`` use them; and the requests to controllers.

    async with AdminClient(namesrv="127.0.0.1:9876") as admin:
        await admin.create_topic("demo", queue_nums=4)
        route = await admin.topic_route("demo")
        progress = await admin.consumer_progress("my-group")

Topics are created on brokers (UPDATE_AND_CREATE_TOPIC to every master of a cluster,
or to one broker); the brokers register the change with their nameservers at once.
Lookups ask one nameserver, moving on when it fails.

What is checked before anything changes (the brokers take any change: RocketMQ's
clients must still be able to update topics, so the checks live here):
- shrinking a topic's queues hides the queues past the new count from consumers;
  ``create_topic`` asks each broker for its topic config (GET_ALL_TOPIC_CONFIG) and
  the hidden queues' offsets (GET_MIN_OFFSET / GET_MAX_OFFSET), and refuses
  (TopicShrinkError, naming each queue and its messages) when one still holds
  messages, unless ``force``;
- ``delete_topic`` of a topic no master broker has and no nameserver routes raises
  TopicNotExistError.

What an operator asks (mqadmin's daily commands), each with RocketMQ's request:
- ``topic_stats``: GET_TOPIC_STATS_INFO (202) at each broker of the topic's route;
- ``consumer_progress``: GET_CONSUME_STATS (208) at each broker (of the topic's route,
  or of the cluster);
- ``consumer_connection``: GET_CONSUMER_CONNECTION_LIST (203) at each broker, members
  merged by client id; ``consumer_groups``: every group the brokers know
  (GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_ALL_CONSUMER_OFFSET) or the topics name
  (``%RETRY%group``);
- ``reset_offset``: INVOKE_BROKER_TO_RESET_OFFSET (222) at each master of the topic;
- ``query_messages`` by key: QUERY_MESSAGE (12); ``find_message`` by id:
  VIEW_MESSAGE_BY_ID (33) for an offset message id, else the id as a UNIQ_KEY through
  QUERY_MESSAGE, in the topic given or in every topic;
- ``broker_status``: GET_BROKER_RUNTIME_INFO (28); ``broker_config`` /
  ``update_broker_config``: GET_BROKER_CONFIG (26) / UPDATE_BROKER_CONFIG (25).

What ``to_json`` gives (``hamq ... --json`` prints it): keys that are field names in
camelCase (``json_name``; RocketMQ's spelling), keys that are names (topics, clusters,
settings, properties) as they are; values with their types. Where the wire carries
text, the text is read back: a KVTable value (``kv_value``) by its form, since
RocketMQ's KVTable holds strings only.
"One address per broker" is the group's master, or while it has none the slave with
the lowest id. A broker that cannot be asked, or refuses, ends the call with its
error; ``ClientError`` subclasses throughout.

The controller requests (``sync_state_data``, ``elect_master``) and a broker's epochs
(``broker_epochs``) need no nameserver: they are module functions over a remoting
client of their own, each request bounded by REQUEST_TIMEOUT_S. Controllers are
asked in turn: one that cannot be reached, has no Raft quorum (CONTROLLER_NOT_LEADER)
or serves no controller (REQUEST_CODE_NOT_SUPPORTED) passes the question on to the
next; any other refusal ends the call with its code and remark, as does no
controller answering — except that ``elect_master`` of the broker that is the master
already succeeds, saying so (CONTROLLER_MASTER_STILL_EXIST naming that broker).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from hamq.acl import Credentials, signer
from hamq.client.consumer import PullCaller
from hamq.client.errors import (
    NETWORK_ERRORS,
    BrokerError,
    ClientError,
    InvalidArgumentError,
    NoRouteError,
)
from hamq.client.instance import ClientConfig, InstanceOwner, client_config
from hamq.client.message import MessageExt, check_group, check_timeout, check_topic, inflate
from hamq.client.route_cache import subscribe_queues
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode, code_name
from hamq.protocol.bodies import (
    MASTER_ID,
    MAX_QUEUE_NUMS,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    ConsumeFromWhere,
    ConsumerConnection,
    ConsumerOffsetSerializeWrapper,
    ConsumeStats,
    ConsumeType,
    EpochEntryCache,
    KVTable,
    MessageModel,
    MessageQueue,
    ResetOffsetBody,
    SubscriptionData,
    SubscriptionGroupWrapper,
    SyncStateSet,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    TopicStatsTable,
    decode_body,
)
from hamq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    ElectMasterRequestHeader,
    GetBrokerConfigResponseHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetTopicStatsInfoRequestHeader,
    OffsetResponseHeader,
    QueryMessageRequestHeader,
    ReplicaInfoResponseHeader,
    ResetOffsetRequestHeader,
    ResetOffsetResponseHeader,
    ViewMessageRequestHeader,
)
from hamq.protocol.message import (
    DEFAULT_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    MessageFormatError,
    parse_offset_msg_id,
)
from hamq.protocol.record import decode_messages
from hamq.remoting import RemotingClient, RemotingConfig, RemotingError

#: how long one request to a controller or a broker may take (the controller requests)
REQUEST_TIMEOUT_S = 3.0
#: how many messages QUERY_MESSAGE returns at most per broker (RocketMQ's default: 32)
QUERY_MAX_NUM = 64
#: the widest time range a query asks for
_END_OF_TIME_MS = 2**63 - 1


class TopicNotExistError(InvalidArgumentError):
    """The topic is on no broker asked and no nameserver knows it."""


class TopicShrinkError(InvalidArgumentError):
    """Fewer queues would hide queues that hold messages; ``queues`` says how many each."""

    def __init__(self, message: str, queues: dict[MessageQueue, int]) -> None:
        super().__init__(message)
        self.queues = queues


@attrs.frozen
class QueueStatus:
    queue: MessageQueue
    min_offset: int
    max_offset: int


class MessageNotFoundError(ClientError):
    """No broker holds a message by that id (or key)."""


def _queue_json(queue: MessageQueue) -> dict[str, Any]:
    return {"topic": queue.topic, "brokerName": queue.broker_name, "queueId": queue.queue_id}


def _queue_order(queue: MessageQueue) -> tuple[str, str, int]:
    return (queue.topic, queue.broker_name, queue.queue_id)


@attrs.frozen
class QueueStats:
    """A queue of a topic (GET_TOPIC_STATS_INFO): offsets, and when its newest message
    was stored (ms; 0: never)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_ms: int

    @property
    def messages(self) -> int:
        return self.max_offset - self.min_offset

    def to_json(self) -> dict[str, Any]:
        return {
            **_queue_json(self.queue),
            "minOffset": self.min_offset,
            "maxOffset": self.max_offset,
            "messages": self.messages,
            "lastUpdateTimestamp": self.last_update_ms,
        }


@attrs.frozen
class QueueProgress:
    """A group in one queue (GET_CONSUME_STATS): the queue's end, the group's committed
    offset, and the store time (ms; 0: none) of the last message it consumed."""

    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp_ms: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            **_queue_json(self.queue),
            "brokerOffset": self.broker_offset,
            "consumerOffset": self.consumer_offset,
            "lag": self.lag,
            "lastTimestamp": self.last_timestamp_ms,
        }


@attrs.frozen
class ConsumerProgress:
    group: str
    queues: tuple[QueueProgress, ...]
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)

    @property
    def last_timestamp_ms(self) -> int:
        return max((q.last_timestamp_ms for q in self.queues), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "queues": [q.to_json() for q in self.queues],
            "totalLag": self.total_lag,
            "consumeTps": self.consume_tps,
        }


@attrs.frozen
class Member:
    """A consumer connected to brokers: its id, address as a broker saw it, language
    and protocol version, and the brokers it is connected to."""

    client_id: str
    client_addr: str
    language: str
    version: int
    brokers: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "clientId": self.client_id,
            "clientAddr": self.client_addr,
            "language": self.language,
            "version": self.version,
            "brokers": list(self.brokers),
        }


@attrs.frozen
class GroupConnection:
    """A group's online members (GET_CONSUMER_CONNECTION_LIST, merged over brokers) and
    what it subscribes to (topic -> expression)."""

    group: str
    members: tuple[Member, ...]
    subscriptions: dict[str, SubscriptionData]
    consume_type: ConsumeType | None
    message_model: MessageModel | None
    consume_from_where: ConsumeFromWhere | None

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "consumeType": self.consume_type.name if self.consume_type else None,
            "messageModel": self.message_model.name if self.message_model else None,
            "consumeFromWhere": (self.consume_from_where.name if self.consume_from_where else None),
            "members": [m.to_json() for m in self.members],
            "subscriptions": [
                {"topic": topic, "expression": sub.sub_string, "subVersion": sub.sub_version}
                for topic, sub in sorted(self.subscriptions.items())
            ],
        }


@attrs.frozen
class GroupSummary:
    """One line per group: its members online, how it consumes, its total lag."""

    group: str
    members: int
    consume_type: ConsumeType | None
    message_model: MessageModel | None
    topics: tuple[str, ...]
    total_lag: int
    consume_tps: float

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "members": self.members,
            "consumeType": self.consume_type.name if self.consume_type else None,
            "messageModel": self.message_model.name if self.message_model else None,
            "topics": list(self.topics),
            "totalLag": self.total_lag,
            "consumeTps": self.consume_tps,
        }


@attrs.frozen
class ResetResult:
    """Where a group goes on in a topic after INVOKE_BROKER_TO_RESET_OFFSET, and how many
    online consumers the brokers told (summed over brokers: a member connected to two
    brokers counts twice)."""

    group: str
    topic: str
    timestamp_ms: int
    offsets: dict[MessageQueue, int]
    notified: int

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "topic": self.topic,
            "timestamp": self.timestamp_ms,
            "queues": [
                {**_queue_json(q), "offset": offset}
                for q, offset in sorted(self.offsets.items(), key=lambda i: _queue_order(i[0]))
            ],
            "notifiedClients": self.notified,
        }


@attrs.frozen
class FoundMessage:
    """A message as a broker keeps it (body inflated), and the broker it came from."""

    broker: str
    message: MessageExt

    def to_json(self, body_limit: int | None = None) -> dict[str, Any]:
        m = self.message
        text = m.body.decode("utf-8", errors="replace")
        shown = text if body_limit is None else text[:body_limit]
        return {
            "topic": m.topic,
            "brokerName": self.broker,
            "queueId": m.queue_id,
            "queueOffset": m.queue_offset,
            "commitLogOffset": m.physical_offset,
            "msgId": m.msg_id,
            "offsetMsgId": m.offset_msg_id,
            "tags": m.tags,
            "keys": m.keys,
            "bornHost": m.born_host,
            "bornTimestamp": m.born_timestamp,
            "storeHost": m.store_host,
            "storeTimestamp": m.store_timestamp,
            "reconsumeTimes": m.reconsume_times,
            "properties": dict(sorted(m.properties.items())),
            "bodySize": len(m.body),
            "body": shown,
            "bodyTruncated": len(shown) < len(text),
        }


_SNAKE = re.compile(r"_([a-z0-9])")
#: a JSON number (RFC 8259's grammar), as Java's String.valueOf and Python's str write one
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_KV_WORDS: dict[str, Any] = {
    "true": True,
    "True": True,
    "false": False,
    "False": False,
    "null": None,
    "None": None,
}


def json_name(key: str) -> str:
    """A field's name as ``to_json`` spells it: camelCase, RocketMQ's style
    (``commitlog_max_offset`` is ``commitlogMaxOffset``; ``brokerAddr`` stays)."""
    return _SNAKE.sub(lambda m: str(m.group(1)).upper(), key)


def _renamed(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """``items`` with their keys renamed by ``json_name``; a key whose new name another
    key already has (``max_offset`` beside ``maxOffset``) keeps its own."""
    pairs = list(items)
    renamed = {key: value for key, value in pairs if json_name(key) == key}
    for key, value in pairs:
        name = json_name(key)
        if name != key:
            renamed[key if name in renamed else name] = value
    return renamed


def camel_case_keys(value: Any) -> Any:
    """``value`` (decoded JSON) with the keys of its objects renamed by ``json_name``, at
    every depth: for objects whose keys are all field names, such as a broker's HA
    status."""
    if isinstance(value, list):
        return [camel_case_keys(v) for v in value]
    if isinstance(value, dict):
        return _renamed((str(k), camel_case_keys(v)) for k, v in value.items())
    return value


def kv_value(text: str) -> Any:
    """A KVTable value (GET_BROKER_RUNTIME_INFO's strings) with its type: a JSON number
    is that number (an integer unless it has a fraction or exponent), ``true`` /
    ``false`` a boolean and ``null`` None (also as Python writes them: ``True``,
    ``False``, ``None``); any other text is itself."""
    if text in _KV_WORDS:
        return _KV_WORDS[text]
    number = _JSON_NUMBER.fullmatch(text)
    if number is None:
        return text
    if number.group(1) is None and number.group(2) is None:
        return int(text)
    value = float(text)
    return value if math.isfinite(value) else text  # (1e999: no JSON number holds it)


@attrs.frozen
class BrokerStatus:
    """A broker's runtime statistics (GET_BROKER_RUNTIME_INFO): ``table`` as the broker
    sent it (RocketMQ's KVTable: name -> text); ``values`` the same with camelCase
    names and typed values (``json_name``, ``kv_value``), sorted by name."""

    address: str
    table: dict[str, str]

    @property
    def values(self) -> dict[str, Any]:
        return dict(sorted(_renamed((k, kv_value(v)) for k, v in self.table.items()).items()))

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "table": self.values}


@attrs.frozen
class BrokerConfigView:
    """A running broker's configuration (GET_BROKER_CONFIG): every setting as text, and
    which of them UPDATE_BROKER_CONFIG may change. ``version`` is RocketMQ's
    DataVersion, a JSON object as text."""

    address: str
    version: str
    values: dict[str, str]
    live_keys: tuple[str, ...]

    @property
    def version_json(self) -> Any:
        """``version`` decoded (the text itself if it is not JSON)."""
        try:
            return json.loads(self.version)
        except ValueError:
            return self.version

    def to_json(self, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``settings``: the values typed as the broker holds them (the client knows no
        broker's types: hamq.broker.live_config's ``typed_settings`` does); by
        default, as text."""
        values = self.values if settings is None else settings
        return {
            "address": self.address,
            "version": self.version_json,
            "config": dict(sorted(values.items())),
            "liveKeys": list(self.live_keys),
        }


def broker_addresses(datas: Iterable[BrokerData]) -> dict[str, str]:
    """Broker name -> the one address to ask: the master, else the lowest id."""
    chosen = {}
    for data in datas:
        if data.broker_addrs:
            master = data.broker_addrs.get(MASTER_ID)
            chosen[data.broker_name] = master or data.broker_addrs[min(data.broker_addrs)]
    return dict(sorted(chosen.items()))


_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def setting_name(key: str) -> str:
    """A broker setting's name as its configuration spells it: snake_case
    (``slaveReadEnable``, RocketMQ's spelling, is ``slave_read_enable``)."""
    return _CAMEL.sub(lambda m: "_" + str(m.group(1)).lower(), key).lower()


def parse_properties_text(text: str) -> dict[str, str]:
    """GET_BROKER_CONFIG's ``key=value`` lines (Java's properties, no escapes)."""
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


class AdminClient(InstanceOwner):
    _kind = "admin client"

    def __init__(
        self,
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        **client_options: Any,
    ) -> None:
        self.config = client_config(namesrv, **client_options)

    async def _namesrv(self, code: RequestCode, header: Any = None) -> bytes:
        instance = self.instance
        response = await instance.invoke_namesrv(instance.request(code, header))
        if response.code != 0:
            raise BrokerError(response.code, response.remark, instance.namesrv_addr)
        return response.body

    # ------------------------------------------------------------------ lookups
    async def cluster_info(self) -> ClusterInfo:
        return decode_body(ClusterInfo, await self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO))

    async def topic_list(self) -> list[str]:
        body = await self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return sorted(decode_body(TopicList, body).topic_list)

    async def topic_route(self, topic: str) -> TopicRouteData:
        check_topic(topic)
        route = await self.instance.update_route(topic)
        if route is None:
            raise NoRouteError(f"No topic route info in name server for the topic: {topic}")
        return route

    async def queue_status(self, topic: str) -> list[QueueStatus]:
        """Each readable queue of ``topic`` with its min and max offset."""
        route = await self.topic_route(topic)
        caller = PullCaller(self.instance, "")
        return [
            QueueStatus(q, await caller.min_offset(q), await caller.max_offset(q))
            for q in subscribe_queues(topic, route)
        ]

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        """A broker's runtime statistics (GET_BROKER_RUNTIME_INFO, a KVTable) as it sent
        them, name -> text, sorted."""
        instance = self.instance
        response = await instance.invoke_ok(
            addr, instance.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        )
        table = decode_body(KVTable, response.body or b"{}").table
        return dict(sorted(table.items()))

    async def broker_status(self, addr: str) -> BrokerStatus:
        """``broker_runtime_info`` with typed values (BrokerStatus.values)."""
        return BrokerStatus(addr, await self.broker_runtime_info(addr))

    async def ha_status(self, addr: str) -> dict[str, Any]:
        """A broker's replication status (GET_BROKER_HA_STATUS): its role and epochs; a
        master's slaves with their acks, lag and whether they are in sync; a slave's
        state, master and progress."""
        instance = self.instance
        response = await instance.invoke_ok(
            addr, instance.request(RequestCode.GET_BROKER_HA_STATUS)
        )
        try:
            status = json.loads(response.body)
        except ValueError as exc:
            raise BrokerError(0, f"the HA status is not JSON: {exc}", addr) from None
        if not isinstance(status, dict):
            raise BrokerError(0, "the HA status is not a JSON object", addr)
        return status

    async def all_broker_addrs(self) -> list[str]:
        """Every broker's address the nameserver knows (masters and slaves), sorted."""
        info = await self.cluster_info()
        return sorted(
            addr for data in info.broker_addr_table.values() for addr in data.broker_addrs.values()
        )

    async def _brokers(self, topic: str | None = None) -> dict[str, str]:
        """Broker name -> address to ask (``broker_addresses``): of ``topic``'s route
        (NoRouteError if it has none), else of every cluster."""
        if topic is not None:
            return broker_addresses((await self.topic_route(topic)).broker_datas)
        return broker_addresses((await self.cluster_info()).broker_addr_table.values())

    async def _ask(self, addr: str, code: RequestCode, header: Any = None) -> RemotingCommand:
        instance = self.instance
        return await instance.invoke_ok(addr, instance.request(code, header))

    # ------------------------------------------------------------------ topics, per queue
    async def topic_stats(self, topic: str) -> list[QueueStats]:
        """Every queue of ``topic`` on every broker of its route: offsets and the store
        time of its newest message (GET_TOPIC_STATS_INFO)."""
        check_topic(topic)
        found = []
        for addr in (await self._brokers(topic)).values():
            response = await self._ask(
                addr, RequestCode.GET_TOPIC_STATS_INFO, GetTopicStatsInfoRequestHeader(topic)
            )
            table = decode_body(TopicStatsTable, response.body).offset_table
            found += [
                QueueStats(q, t.min_offset, t.max_offset, t.last_update_timestamp)
                for q, t in table.items()
            ]
        return sorted(found, key=lambda s: _queue_order(s.queue))

    # ------------------------------------------------------------------ consumer groups
    async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumerProgress:
        """Where ``group`` is in each queue of ``topic`` (default: every topic it committed
        offsets in), from every broker (GET_CONSUME_STATS)."""
        check_group(group)
        if topic is not None:
            check_topic(topic)
        header = GetConsumeStatsRequestHeader(group, topic)
        queues: list[QueueProgress] = []
        tps = 0.0
        for addr in (await self._brokers(topic)).values():
            response = await self._ask(addr, RequestCode.GET_CONSUME_STATS, header)
            stats = decode_body(ConsumeStats, response.body)
            tps += stats.consume_tps
            queues += [
                QueueProgress(q, w.broker_offset, w.consumer_offset, w.last_timestamp)
                for q, w in stats.offset_table.items()
            ]
        queues.sort(key=lambda p: _queue_order(p.queue))
        return ConsumerProgress(group, tuple(queues), tps)

    async def consumer_connection(self, group: str) -> GroupConnection | None:
        """``group``'s online members, merged over every broker
        (GET_CONSUMER_CONNECTION_LIST); None if no broker has one (CONSUMER_NOT_ONLINE)."""
        check_group(group)
        header = GetConsumerConnectionListRequestHeader(group)
        instance = self.instance
        members: dict[str, tuple[Any, list[str]]] = {}
        latest: ConsumerConnection | None = None
        for addr in await self.all_broker_addrs():
            response = await instance.invoke(
                addr, instance.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, header)
            )
            if response.code == ResponseCode.CONSUMER_NOT_ONLINE:
                continue
            if response.code != ResponseCode.SUCCESS:
                raise BrokerError(response.code, response.remark, addr)
            latest = decode_body(ConsumerConnection, response.body)
            for connection in latest.connection_set:
                _, seen_at = members.setdefault(connection.client_id, (connection, []))
                seen_at.append(addr)
        if latest is None:
            return None
        return GroupConnection(
            group,
            tuple(
                Member(c.client_id, c.client_addr, c.language.name, c.version, tuple(at))
                for c, at in (members[i] for i in sorted(members))
            ),
            dict(latest.subscription_table),
            latest.consume_type,
            latest.message_model,
            latest.consume_from_where,
        )

    async def consumer_groups(self) -> list[str]:
        """Every consumer group the brokers know (subscription groups, groups with
        committed offsets) or a retry topic names, sorted."""
        groups: set[str] = set()
        for addr in (await self._brokers()).values():
            response = await self._ask(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
            groups |= set(
                decode_body(SubscriptionGroupWrapper, response.body).subscription_group_table
            )
            response = await self._ask(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
            offsets = decode_body(ConsumerOffsetSerializeWrapper, response.body).offset_table
            groups |= {key.partition("@")[2] for key in offsets if "@" in key}
        groups |= {
            topic.removeprefix(RETRY_GROUP_TOPIC_PREFIX)
            for topic in await self.topic_list()
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        }
        return sorted(g for g in groups if g)

    async def group_summary(self, group: str) -> GroupSummary:
        """``group``'s members online, subscriptions and total lag, in one line."""
        connection = await self.consumer_connection(group)
        progress = await self.consumer_progress(group)
        return GroupSummary(
            group,
            len(connection.members) if connection else 0,
            connection.consume_type if connection else None,
            connection.message_model if connection else None,
            tuple(sorted(connection.subscriptions)) if connection else (),
            progress.total_lag,
            progress.consume_tps,
        )

    async def reset_offset(
        self, group: str, topic: str, timestamp_ms: int, *, force: bool = True
    ) -> ResetResult:
        """Set ``group``'s offsets in ``topic`` to the first message stored at or after
        ``timestamp_ms`` (-1: the end of each queue) on every master of the topic
        (INVOKE_BROKER_TO_RESET_OFFSET); its online consumers go on from there. Without
        ``force`` an offset only moves back. A broker group without a master now raises
        ClientError (naming it) before anything is reset; a master that refuses raises
        BrokerError (the masters before it were reset)."""
        check_group(group)
        check_topic(topic)
        route = await self.topic_route(topic)
        masterless = sorted(d.broker_name for d in route.broker_datas if not d.master_addr())
        if masterless:
            raise ClientError(
                f"broker {', '.join(masterless)} has no master now; offsets are reset on "
                "masters only: try again once it has one"
            )
        header = ResetOffsetRequestHeader(topic, group, timestamp_ms, is_force=force)
        offsets: dict[MessageQueue, int] = {}
        notified = 0
        for data in sorted(route.broker_datas, key=lambda d: d.broker_name):
            addr = data.master_addr()
            assert addr is not None
            response = await self._ask(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header)
            offsets.update(decode_body(ResetOffsetBody, response.body).offset_table)
            notified += response.header(ResetOffsetResponseHeader).notified_clients or 0
        return ResetResult(group, topic, timestamp_ms, offsets, notified)

    # ------------------------------------------------------------------ messages
    async def _query(
        self, name: str, addr: str, topic: str, key: str, max_num: int
    ) -> list[FoundMessage]:
        instance = self.instance
        header = QueryMessageRequestHeader(topic, key, max_num, 0, _END_OF_TIME_MS)
        response = await instance.invoke(addr, instance.request(RequestCode.QUERY_MESSAGE, header))
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr)
        return [FoundMessage(name, m) for m in _decoded(response.body, addr)]

    async def _view(
        self, name: str, store_host: str, offset: int, info: ClusterInfo
    ) -> list[FoundMessage]:
        """VIEW_MESSAGE_BY_ID at the store host, else (down) at the others of its group:
        their logs are the same bytes."""
        data = info.broker_addr_table.get(name)
        others = sorted(set(data.broker_addrs.values()) - {store_host}) if data else []
        instance = self.instance
        for addr in [store_host, *others]:
            request = instance.request(
                RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset)
            )
            try:
                response = await instance.invoke(addr, request)
            except RemotingError:
                continue
            if response.code == ResponseCode.SUCCESS:
                return [FoundMessage(name, m) for m in _decoded(response.body, addr)]
        return []

    async def query_messages(
        self, topic: str, key: str, max_num: int = QUERY_MAX_NUM
    ) -> list[FoundMessage]:
        """Messages of ``topic`` with ``key`` among their KEYS (or as their UNIQ_KEY), from
        every broker of its route (QUERY_MESSAGE), oldest first."""
        check_topic(topic)
        if not key or " " in key:
            raise InvalidArgumentError(f"a key is one word, not {key!r}")
        found: list[FoundMessage] = []
        for name, addr in (await self._brokers(topic)).items():
            found += await self._query(name, addr, topic, key, max_num)
        return sorted(found, key=lambda f: (f.message.store_timestamp, f.message.queue_offset))

    async def find_message(self, msg_id: str, topic: str | None = None) -> list[FoundMessage]:
        """The message with id ``msg_id``: as an offset message id, the record at that
        commit-log offset of that broker (VIEW_MESSAGE_BY_ID), if the broker is one the
        nameserver knows; else as a message id (UNIQ_KEY), looked up by QUERY_MESSAGE in
        ``topic`` or in every topic. MessageNotFoundError if neither finds it."""
        if topic is not None:
            check_topic(topic)
        if not msg_id or not all(c in "0123456789abcdefABCDEF" for c in msg_id):
            raise InvalidArgumentError(f"a message id is hexadecimal, not {msg_id!r}")
        info = await self.cluster_info()
        names = {
            addr: data.broker_name
            for data in info.broker_addr_table.values()
            for addr in data.broker_addrs.values()
        }
        try:
            store_host, offset = parse_offset_msg_id(msg_id)
        except (MessageFormatError, ValueError):
            store_host, offset = "", -1
        if store_host in names:
            found = await self._view(names[store_host], store_host, offset, info)
            if found and (topic is None or any(f.message.topic == topic for f in found)):
                return found
        brokers = broker_addresses(info.broker_addr_table.values())
        topics = [topic] if topic is not None else await self.topic_list()
        found = []
        for name in topics:
            for broker, addr in brokers.items():
                found += [
                    f
                    for f in await self._query(broker, addr, name, msg_id, QUERY_MAX_NUM)
                    if msg_id.upper() in (f.message.msg_id.upper(), f.message.offset_msg_id)
                ]
        if not found:
            where = f"topic {topic}" if topic is not None else f"{len(topics)} topic(s)"
            raise MessageNotFoundError(
                f"no message with id {msg_id}: not an offset message id of a broker the "
                f"nameserver knows, nor a message id (UNIQ_KEY) in {where}"
            )
        return found

    # ------------------------------------------------------------------ broker config
    async def broker_config(self, addr: str) -> BrokerConfigView:
        """Every setting of the broker at ``addr`` as it runs (GET_BROKER_CONFIG)."""
        response = await self._ask(addr, RequestCode.GET_BROKER_CONFIG)
        header = response.header(GetBrokerConfigResponseHeader)
        live = tuple(k for k in (header.live_keys or "").split(",") if k)
        values = parse_properties_text(bytes(response.body).decode("utf-8", errors="replace"))
        return BrokerConfigView(addr, header.version, values, live)

    async def update_broker_config(self, addr: str, changes: Mapping[str, str]) -> None:
        """Change settings of the running broker at ``addr`` (UPDATE_BROKER_CONFIG), all or
        none: a key it refuses (unknown, not changeable while it runs, a bad value)
        raises InvalidArgumentError with the broker's reasons."""
        if not changes:
            raise InvalidArgumentError("no KEY=VALUE given")
        for key, value in changes.items():
            if not key or any(c in key for c in "=:\n") or "\n" in value:
                raise InvalidArgumentError(f"not a setting: {key}={value}")
        body = "".join(f"{key}={value}\n" for key, value in changes.items()).encode()
        instance = self.instance
        response = await instance.invoke(
            addr, instance.request(RequestCode.UPDATE_BROKER_CONFIG, body=body)
        )
        if response.code in (ResponseCode.INVALID_PARAMETER, ResponseCode.NO_PERMISSION):
            raise InvalidArgumentError(f"broker {addr} refused: {response.remark}")
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr)

    async def _masters(self, cluster: str | None) -> list[str]:
        info = await self.cluster_info()
        if cluster is not None and cluster not in info.cluster_addr_table:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise InvalidArgumentError(f"cluster {cluster!r} is not known (known: {known})")
        names = (
            info.cluster_addr_table[cluster]
            if cluster is not None
            else [n for names in info.cluster_addr_table.values() for n in names]
        )
        masters = []
        for name in sorted(set(names)):
            data = info.broker_addr_table.get(name)
            addr = data.master_addr() if data else None
            if addr:
                masters.append(addr)
        if not masters:
            raise NoRouteError(f"no master broker in {cluster or 'any cluster'}")
        return masters

    # ------------------------------------------------------------------ topics
    async def create_topic(
        self,
        topic: str,
        queue_nums: int = 8,
        *,
        perm: int = PERM_READ | PERM_WRITE,
        cluster: str | None = None,
        broker_addr: str | None = None,
        order: bool = False,
        force: bool = False,
    ) -> list[str]:
        """Create (or change) ``topic`` with ``queue_nums`` read and write queues on
        ``broker_addr``, or on every master of ``cluster`` (default: of every cluster).
        Returns the brokers it was created on.

        TopicShrinkError, before any broker is changed, when fewer queues would hide
        queues that still hold messages (``force``: hide them anyway). A broker that
        refuses raises BrokerError; the brokers before it in the list were changed."""
        check_topic(topic)
        if topic == DEFAULT_TOPIC:
            raise InvalidArgumentError(f"{topic} is a system topic")
        if not 1 <= queue_nums <= MAX_QUEUE_NUMS:
            raise InvalidArgumentError(f"queue_nums {queue_nums} is not in 1..{MAX_QUEUE_NUMS}")
        if not 0 <= perm <= 15:
            raise InvalidArgumentError(f"perm {perm} is not in 0..15")
        targets = [broker_addr] if broker_addr else await self._masters(cluster)
        if not force:
            await self._check_shrink(topic, queue_nums, targets)
        header = CreateTopicRequestHeader(
            topic=topic,
            default_topic=DEFAULT_TOPIC,
            read_queue_nums=queue_nums,
            write_queue_nums=queue_nums,
            perm=perm,
            order=order,
        )
        instance = self.instance
        for addr in targets:
            await instance.invoke_ok(
                addr, instance.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header)
            )
        return targets

    async def _topic_configs(self, addrs: list[str], topic: str) -> dict[str, TopicConfig]:
        """``topic``'s config at each broker of ``addrs`` that has it."""
        instance = self.instance
        found = {}
        for addr in addrs:
            response = await instance.invoke_ok(
                addr, instance.request(RequestCode.GET_ALL_TOPIC_CONFIG)
            )
            table = decode_body(TopicConfigSerializeWrapper, response.body).topic_config_table
            if topic in table:
                found[addr] = table[topic]
        return found

    async def _offset(self, addr: str, code: RequestCode, header: Any) -> int:
        instance = self.instance
        response = await instance.invoke_ok(addr, instance.request(code, header))
        return response.header(OffsetResponseHeader).offset

    async def _broker_names(self) -> dict[str, str]:
        """Broker address -> broker name, as the nameserver knows them (empty if it
        cannot be asked: the names only label queues in messages)."""
        try:
            info = await self.cluster_info()
        except NETWORK_ERRORS:
            return {}
        return {
            addr: data.broker_name
            for data in info.broker_addr_table.values()
            for addr in data.broker_addrs.values()
        }

    async def _check_shrink(self, topic: str, queue_nums: int, addrs: list[str]) -> None:
        """TopicShrinkError if ``queue_nums`` read queues would hide queues of ``topic``
        that hold messages at one of ``addrs``."""
        holding: dict[tuple[str, int], int] = {}
        for addr, config in (await self._topic_configs(addrs, topic)).items():
            for queue_id in range(queue_nums, config.read_queue_nums):
                low = await self._offset(
                    addr, RequestCode.GET_MIN_OFFSET, GetMinOffsetRequestHeader(topic, queue_id)
                )
                high = await self._offset(
                    addr, RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic, queue_id)
                )
                if high > low:
                    holding[(addr, queue_id)] = high - low
        if holding:
            names = await self._broker_names()
            queues = {
                MessageQueue(topic, names.get(addr, addr), queue_id): count
                for (addr, queue_id), count in holding.items()
            }
            held = ", ".join(
                f"{queue} holds {count} message(s)"
                for queue, count in sorted(
                    queues.items(), key=lambda item: (item[0].broker_name, item[0].queue_id)
                )
            )
            raise TopicShrinkError(
                f"topic {topic}: {queue_nums} queue(s) would hide queues that hold "
                f"messages from consumers: {held}",
                queues,
            )

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        """Delete ``topic`` from every master of ``cluster`` and from every nameserver.

        TopicNotExistError, before anything is deleted, when no master broker has the
        topic and the nameserver in use has no route for it."""
        check_topic(topic)
        instance = self.instance
        header = DeleteTopicRequestHeader(topic)
        targets = await self._masters(cluster)
        if not await self._topic_configs(targets, topic) and not await self._routed(topic):
            where = f" in cluster {cluster}" if cluster is not None else ""
            raise TopicNotExistError(
                f"topic {topic} does not exist{where}: no master broker has it "
                f"({', '.join(targets)}) and nameserver {instance.namesrv_addr} has no route"
            )
        for addr in targets:
            await instance.invoke_ok(
                addr, instance.request(RequestCode.DELETE_TOPIC_IN_BROKER, header)
            )
        errors: list[str] = []

        async def forget(addr: str) -> None:
            try:
                await instance.invoke_ok(
                    addr, instance.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, header)
                )
            except NETWORK_ERRORS as exc:
                errors.append(f"{addr}: {exc}")

        async with anyio.create_task_group() as nursery:
            for addr in self.config.namesrv_addrs:
                nursery.start_soon(forget, addr)
        if errors:
            raise ClientError(
                f"topic {topic} deleted from brokers, not from nameserver(s): " + "; ".join(errors)
            )
        return targets

    async def _routed(self, topic: str) -> bool:
        """Does the nameserver in use route ``topic`` to a broker?"""
        route = await self.instance.fetch_route(topic)
        return route is not None and bool(route.queue_datas)


def _decoded(body: bytes, addr: str) -> list[MessageExt]:
    """Records as stored (QUERY_MESSAGE / VIEW_MESSAGE_BY_ID), bodies inflated."""
    try:
        return [inflate(m) for m in decode_messages(body, check_crc=False)]
    except MessageFormatError as exc:
        raise BrokerError(
            ResponseCode.SYSTEM_ERROR, f"a message that is not: {exc}", addr
        ) from None


# ====================================================================== controllers

#: refusals that say "ask another controller"
_ASK_ANOTHER = (ResponseCode.CONTROLLER_NOT_LEADER, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)


async def ask_controllers(
    addrs: Sequence[str],
    code: RequestCode,
    header: Any = None,
    body: bytes = b"",
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
    answers: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
) -> tuple[str, RemotingCommand]:
    """The first controller's SUCCESS answer (or one of ``answers``), with its address
    (see the module doc); ClientError naming each controller and what it said when none
    gives one. Requests are signed with ``credentials`` (an ACL account) when given;
    ``remoting`` holds TLS. InvalidArgumentError unless ``timeout_s`` (each request's)
    is positive."""
    check_timeout("timeout_s", timeout_s)
    problems = []
    async with _client(credentials, remoting) as client:
        for addr in addrs:
            request = RemotingCommand.request(code, header, body=body)
            try:
                response = await client.invoke(addr, request, timeout_s)
            except RemotingError as exc:
                problems.append(str(exc))
                continue
            if response.code in answers:
                return addr, response
            refusal = _refusal(addr, response)
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                refusal += " (not a controller, nor a nameserver started with --controller?)"
            if response.code not in _ASK_ANOTHER:
                raise ClientError(refusal)
            problems.append(refusal)
    raise ClientError("no controller answered: " + "; ".join(problems))


def _refusal(addr: str, response: RemotingCommand) -> str:
    return (
        f"controller {addr} answered {code_name(response.code, response=True)}: "
        f"{response.remark or 'no reason given'}"
    )


def _not_understood(addr: str, exc: Exception) -> ClientError:
    return ClientError(f"controller {addr}: an answer that is not understood: {exc}")


def _client(credentials: Credentials | None, remoting: RemotingConfig | None) -> RemotingClient:
    """A client for one admin call: signing with ``credentials``, TLS per ``remoting``."""
    hook = signer(credentials) if credentials is not None else None
    return RemotingClient(config=remoting, rpc_hook=hook)


async def sync_state_data(
    addrs: Sequence[str],
    broker_names: Sequence[str] = (),
    *,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
) -> tuple[str, dict[str, Any]]:
    """CONTROLLER_GET_SYNC_STATE_DATA for ``broker_names`` (default: every broker group):
    the answering controller and its answer, whose ``replicasInfoTable`` is broker name
    -> master, epochs and SyncStateSet. Groups the controller does not know are left out
    of the table (``known_broker_groups`` says which it knows)."""
    body = json.dumps(list(broker_names)).encode()
    addr, response = await ask_controllers(
        addrs,
        RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
        body=body,
        credentials=credentials,
        remoting=remoting,
    )
    try:
        answer = json.loads(response.body)
        if not isinstance(answer, dict) or not isinstance(answer["replicasInfoTable"], dict):
            raise TypeError("replicasInfoTable is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise _not_understood(addr, exc) from None
    return addr, answer


async def known_broker_groups(
    addr: str, *, credentials: Credentials | None = None, remoting: RemotingConfig | None = None
) -> list[str]:
    """The broker groups the controller at ``addr`` knows."""
    _, answer = await sync_state_data([addr], credentials=credentials, remoting=remoting)
    return sorted(answer["replicasInfoTable"])


@attrs.frozen
class Election:
    """A broker group's master after CONTROLLER_ELECT_MASTER, as the controller said."""

    controller: str
    broker_name: str
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int | None
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int | None
    #: False: the broker named was the master already, and nothing changed
    elected: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "brokerName": self.broker_name,
            "masterBrokerId": self.master_broker_id,
            "masterAddress": self.master_address,
            "masterEpoch": self.master_epoch,
            "syncStateSet": list(self.sync_state_set),
            "syncStateSetEpoch": self.sync_state_set_epoch,
            "elected": self.elected,
        }


async def elect_master(
    addrs: Sequence[str],
    cluster: str,
    broker_name: str,
    broker_id: int,
    *,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
) -> Election:
    """Make broker ``broker_id`` of ``broker_name`` its master now (a designated
    election, CONTROLLER_ELECT_MASTER). A broker that is the master already is a
    success too: the Election says so (``elected`` False; the controller answered
    CONTROLLER_MASTER_STILL_EXIST naming it). ClientError with the controller's refusal
    otherwise."""
    header = ElectMasterRequestHeader(cluster, broker_name, broker_id, designate_elect=True)
    still = ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    addr, response = await ask_controllers(
        addrs,
        RequestCode.CONTROLLER_ELECT_MASTER,
        header,
        credentials=credentials,
        remoting=remoting,
        answers=frozenset({ResponseCode.SUCCESS, still}),
    )
    try:
        info = response.header(ReplicaInfoResponseHeader)
        members = decode_body(SyncStateSet, response.body) if response.body else None
    except (RequestError, ValueError) as exc:
        if response.code == still:  # (a controller that does not say who the master is)
            raise ClientError(_refusal(addr, response)) from None
        raise _not_understood(addr, exc) from None
    master = info.master_broker_id
    if response.code == still and master != broker_id:
        raise ClientError(_refusal(addr, response))
    return Election(
        addr,
        broker_name,
        master if master is not None and master >= 0 else None,
        info.master_address,
        info.master_epoch,
        tuple(sorted(members.sync_state_set)) if members else (),
        info.sync_state_set_epoch,
        elected=response.code == ResponseCode.SUCCESS,
    )


@attrs.frozen
class EpochTable:
    """A broker's epochs: (epoch, start offset, end offset) each; the last one ends at
    the log end, ``max_offset``."""

    broker_name: str
    broker_id: int | None
    role: str | None
    entries: tuple[tuple[int, int, int], ...]
    max_offset: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "brokerId": self.broker_id,
            "role": self.role,
            "epochs": [
                {"epoch": epoch, "startOffset": start, "endOffset": end}
                for epoch, start, end in self.entries
            ],
            "maxOffset": self.max_offset,
        }


def epochs_from_cache(cache: EpochEntryCache) -> EpochTable:
    entries = tuple((e.epoch, e.start_offset, e.end_offset) for e in cache.epoch_list)
    return EpochTable(cache.broker_name, cache.broker_id, None, entries, cache.max_offset)


def epochs_from_ha_status(status: dict[str, Any]) -> EpochTable:
    """From GET_BROKER_HA_STATUS: ``epochs`` [[epoch, start], ...] and the log end of
    its ``master`` or ``slave`` part."""
    max_offset = None
    for side in ("master", "slave"):
        part = status.get(side)
        if isinstance(part, dict) and isinstance(part.get("max_offset"), int):
            max_offset = part["max_offset"]
            break
    epochs = [(int(epoch), int(start)) for epoch, start in status.get("epochs") or []]
    entries = tuple(
        (epoch, start, epochs[i + 1][1] if i + 1 < len(epochs) else (max_offset or start))
        for i, (epoch, start) in enumerate(epochs)
    )
    broker_id = status.get("brokerId")
    controller = status.get("controller")
    if isinstance(controller, dict) and controller.get("brokerIdAtController") is not None:
        broker_id = controller["brokerIdAtController"]  # (a master registers as id 0)
    return EpochTable(
        str(status.get("broker")),
        broker_id if isinstance(broker_id, int) else None,
        str(status["role"]) if status.get("role") else None,
        entries,
        max_offset,
    )


async def broker_epochs(
    addr: str,
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
) -> EpochTable:
    """A broker's epochs: GET_BROKER_EPOCH_CACHE (1007), or from GET_BROKER_HA_STATUS
    (907) where the broker has no such request. ClientError if it cannot be asked,
    refuses, or answers what does not decode; InvalidArgumentError unless ``timeout_s``
    is positive."""
    check_timeout("timeout_s", timeout_s)
    async with _client(credentials, remoting) as client:

        async def ask(code: RequestCode) -> RemotingCommand:
            try:
                return await client.invoke(addr, RemotingCommand.request(code), timeout_s)
            except RemotingError as exc:
                raise ClientError(f"broker {exc}") from None

        def refused(response: RemotingCommand) -> ClientError:
            name = code_name(response.code, response=True)
            return ClientError(f"broker {addr} answered {name}: {response.remark or ''}")

        response = await ask(RequestCode.GET_BROKER_EPOCH_CACHE)
        try:
            if response.code == ResponseCode.SUCCESS:
                return epochs_from_cache(decode_body(EpochEntryCache, response.body))
            if response.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise refused(response)
            response = await ask(RequestCode.GET_BROKER_HA_STATUS)
            if response.code != ResponseCode.SUCCESS:
                raise refused(response)
            status = json.loads(response.body)
            if not isinstance(status, dict):
                raise TypeError("not a JSON object")
            return epochs_from_ha_status(status)
        except (RequestError, ValueError, TypeError) as exc:
            raise ClientError(f"broker {addr}: an answer that is not understood: {exc}") from None
