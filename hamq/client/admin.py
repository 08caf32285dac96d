"""AdminClient: topics, routes, clusters, consumer groups, messages and brokers, as
``hamq topic`` and ``hamq admin`` use them.

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

"One address per broker" is the group's master, or while it has none the slave with
the lowest id. A broker that cannot be asked, or refuses, ends the call with its
error; ``ClientError`` subclasses throughout.

The result views (``to_json``) are in hamq/client/admin_views.py; the requests to
controllers, and a broker's epochs, which need no nameserver, in
hamq/client/controller_calls.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio

from hamq.client.admin_views import (
    BrokerConfigView,
    BrokerStatus,
    ConsumerProgress,
    FoundMessage,
    GroupConnection,
    GroupSummary,
    Member,
    QueueProgress,
    QueueStats,
    QueueStatus,
    ResetResult,
    queue_order,
)
from hamq.client.config import ClientConfig, client_config
from hamq.client.consumer import PullCaller
from hamq.client.errors import (
    NETWORK_ERRORS,
    BrokerError,
    ClientError,
    InvalidArgumentError,
    NoRouteError,
)
from hamq.client.instance import InstanceOwner
from hamq.client.message import MessageExt, check_group, check_topic, inflate
from hamq.client.route_cache import subscribe_queues
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import (
    MASTER_ID,
    MAX_QUEUE_NUMS,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    ConsumerConnection,
    ConsumerOffsetSerializeWrapper,
    ConsumeStats,
    KVTable,
    MessageQueue,
    ResetOffsetBody,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    TopicStatsTable,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetBrokerConfigResponseHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetTopicStatsInfoRequestHeader,
    OffsetResponseHeader,
    QueryMessageRequestHeader,
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
from hamq.remoting import RemotingError

#: how many messages QUERY_MESSAGE returns at most per broker (RocketMQ's default: 32)
QUERY_MAX_NUM = 64
#: the most deliveries after the first a group may allow before its DLQ
MAX_RETRY_TIMES = 1000
#: the widest time range a query asks for
_END_OF_TIME_MS = 2**63 - 1


class TopicNotExistError(InvalidArgumentError):
    """The topic is on no broker asked and no nameserver knows it."""


class TopicShrinkError(InvalidArgumentError):
    """Fewer queues would hide queues that hold messages; ``queues`` says how many each."""

    def __init__(self, message: str, queues: dict[MessageQueue, int]) -> None:
        super().__init__(message)
        self.queues = queues


class MessageNotFoundError(ClientError):
    """No broker holds a message by that id (or key)."""


def broker_addresses(datas: Iterable[BrokerData]) -> dict[str, str]:
    """Broker name -> the one address to ask: the master, else the lowest id."""
    chosen = {}
    for data in datas:
        if data.broker_addrs:
            master = data.broker_addrs.get(MASTER_ID)
            chosen[data.broker_name] = master or data.broker_addrs[min(data.broker_addrs)]
    return dict(sorted(chosen.items()))


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
        return sorted(found, key=lambda s: queue_order(s.queue))

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
                QueueProgress(q, w.broker_offset, w.consumer_offset, w.last_timestamp, w.in_flight)
                for q, w in stats.offset_table.items()
            ]
        queues.sort(key=lambda p: queue_order(p.queue))
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

    # ------------------------------------------------------------------ groups
    async def update_group(
        self,
        group: str,
        *,
        orderly: bool = False,
        retry_max_times: int = 16,
        cluster: str | None = None,
    ) -> list[str]:
        """Create (or replace) consumer group ``group``'s configuration on every master
        of ``cluster`` (default: of every cluster), as mqadmin's updateSubGroup:
        ``orderly`` (FIFO: a RocketMQ 5 client's pops keep each message group's order),
        ``retry_max_times`` (deliveries after the first before the DLQ). Returns the
        brokers changed; a broker that refuses raises BrokerError."""
        check_group(group)
        if not 0 <= retry_max_times <= MAX_RETRY_TIMES:
            raise InvalidArgumentError(
                f"retry_max_times {retry_max_times} is not in 0..{MAX_RETRY_TIMES}"
            )
        body = encode_body(
            SubscriptionGroupConfig(
                group_name=group,
                consume_message_orderly=orderly,
                retry_max_times=retry_max_times,
            )
        )
        targets = await self._masters(cluster)
        instance = self.instance
        for addr in targets:
            await instance.invoke_ok(
                addr, instance.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
            )
        return targets

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
