"""AdminClient: topics, routes and clusters, as ``hamq topic`` and ``hamq admin`` use them.

    async with AdminClient(namesrv="127.0.0.1:9876") as admin:
        await admin.create_topic("demo", queue_nums=4)
        route = await admin.topic_route("demo")

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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from hamq.client.consumer import PullCaller
from hamq.client.errors import (
    NETWORK_ERRORS,
    BrokerError,
    ClientError,
    InvalidArgumentError,
    NoRouteError,
)
from hamq.client.instance import ClientConfig, InstanceOwner, client_config
from hamq.client.message import check_topic
from hamq.client.route_cache import subscribe_queues
from hamq.protocol import RequestCode
from hamq.protocol.bodies import (
    MAX_QUEUE_NUMS,
    PERM_READ,
    PERM_WRITE,
    ClusterInfo,
    MessageQueue,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    decode_body,
)
from hamq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    OffsetResponseHeader,
)
from hamq.protocol.message import DEFAULT_TOPIC


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
        instance = self.instance
        response = await instance.invoke_ok(
            addr, instance.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        )
        table = json.loads(response.body or b"{}").get("table", {})
        return {str(k): str(v) for k, v in table.items()}

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

        async with trio.open_nursery() as nursery:
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
