"""The nameserver's route table: pure state, no I/O, time passed in.

What it knows (RocketMQ's RouteInfoManager, docs/PROTOCOL.md#bodies):
- topic -> broker name -> QueueData (queue counts and permission), from the
  registrations of each broker group's master;
- broker name -> BrokerData (cluster, addresses by broker id; id 0 is the master);
- cluster -> broker names;
- live brokers by address: when last heard, their timeout, HA address, topic-table
  version, and the connection they registered over.

Invariants: a broker is live until ``timeout_ms`` passes without a registration or
heartbeat, or its connection closes; removing the last address of a broker name
removes the name from its cluster and its queues from every topic, and a topic with
no queues left is gone. Only masters' registrations change queue data; a broker id
that moves to a new address (a slave promoted) replaces the old entry. A retry topic
not registered yet is answered as it is about to be (``retry_route``).
"""

from __future__ import annotations

import logging

import attrs

from hamq.protocol.bodies import (
    MASTER_ID,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    TopicConfig,
    TopicRouteData,
)
from hamq.protocol.message import DEFAULT_TOPIC, is_retry_topic

log = logging.getLogger(__name__)

#: a broker not heard from for this long is dropped (RocketMQ: 120 s)
DEFAULT_BROKER_TIMEOUT_MS = 120_000


@attrs.define
class BrokerLive:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    ha_server_addr: str
    last_update_ms: int
    timeout_ms: int
    data_version: DataVersion
    #: what the broker registered over (a connection); its closing drops the broker
    connection: object = None


@attrs.frozen
class RegisterResult:
    """For a slave: where its master is (remoting and HA addresses)."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


class RouteTable:
    def __init__(self) -> None:
        self.topics: dict[str, dict[str, QueueData]] = {}
        self.brokers: dict[str, BrokerData] = {}
        self.clusters: dict[str, set[str]] = {}
        self.live: dict[str, BrokerLive] = {}

    # ------------------------------------------------------------------ changes
    def register_broker(
        self,
        *,
        cluster: str,
        broker_name: str,
        broker_id: int,
        addr: str,
        ha_server_addr: str,
        topics: dict[str, TopicConfig],
        data_version: DataVersion,
        now_ms: int,
        timeout_ms: int = DEFAULT_BROKER_TIMEOUT_MS,
        connection: object = None,
    ) -> RegisterResult:
        self.clusters.setdefault(cluster, set()).add(broker_name)
        data = self.brokers.get(broker_name)
        if data is None:
            data = self.brokers[broker_name] = BrokerData(cluster, broker_name, {})
        data.cluster = cluster
        for other_id, other_addr in list(data.broker_addrs.items()):
            if other_addr == addr and other_id != broker_id:
                del data.broker_addrs[other_id]  # the same broker under a new id (promoted)
        first = data.broker_addrs.get(broker_id) != addr
        data.broker_addrs[broker_id] = addr
        previous = self.live.get(addr)
        if broker_id == MASTER_ID and (
            first or previous is None or previous.data_version != data_version
        ):
            for topic, config in topics.items():
                self.topics.setdefault(topic, {})[broker_name] = QueueData(
                    broker_name,
                    config.read_queue_nums,
                    config.write_queue_nums,
                    config.perm,
                    config.topic_sys_flag,
                )
        self.live[addr] = BrokerLive(
            cluster,
            broker_name,
            broker_id,
            addr,
            ha_server_addr,
            now_ms,
            timeout_ms,
            data_version,
            connection,
        )
        if first:
            log.info("broker registered: %s %s id %d at %s", cluster, broker_name, broker_id, addr)
        if broker_id == MASTER_ID:
            return RegisterResult()
        master_addr = data.broker_addrs.get(MASTER_ID)
        master = self.live.get(master_addr) if master_addr else None
        return RegisterResult(master_addr, master.ha_server_addr if master else None)

    def data_version_of(self, addr: str) -> DataVersion | None:
        """The topic-table version the broker at ``addr`` last registered; None if it is
        not registered (after this nameserver restarted, say)."""
        live = self.live.get(addr)
        return live.data_version if live is not None else None

    def heartbeat(self, addr: str, now_ms: int, timeout_ms: int | None = None) -> bool:
        """Refresh a live broker; False if it is not registered (it must register)."""
        live = self.live.get(addr)
        if live is None:
            return False
        live.last_update_ms = now_ms
        if timeout_ms:
            live.timeout_ms = timeout_ms
        return True

    def unregister_broker(self, *, broker_name: str, addr: str, broker_id: int) -> None:
        log.info("broker unregistered: %s id %d at %s", broker_name, broker_id, addr)
        self._remove(addr, broker_name)

    def scan_inactive(self, now_ms: int) -> list[str]:
        """Drop brokers not heard from within their timeout; returns their addresses."""
        expired = [
            live for live in self.live.values() if now_ms - live.last_update_ms > live.timeout_ms
        ]
        for live in expired:
            log.warning(
                "broker %s at %s not heard from for %d ms: dropped",
                live.broker_name,
                live.addr,
                now_ms - live.last_update_ms,
            )
            self._remove(live.addr, live.broker_name)
        return [live.addr for live in expired]

    def connection_closed(self, connection: object) -> list[str]:
        """Drop every broker that registered over ``connection``; returns their addresses."""
        gone = [live for live in self.live.values() if live.connection is connection]
        for live in gone:
            log.info("broker %s at %s: its connection closed, dropped", live.broker_name, live.addr)
            self._remove(live.addr, live.broker_name)
        return [live.addr for live in gone]

    def delete_topic(self, topic: str) -> bool:
        return self.topics.pop(topic, None) is not None

    def _remove(self, addr: str, broker_name: str) -> None:
        self.live.pop(addr, None)
        data = self.brokers.get(broker_name)
        if data is None:
            return
        for broker_id, broker_addr in list(data.broker_addrs.items()):
            if broker_addr == addr:
                del data.broker_addrs[broker_id]
        if data.broker_addrs:
            return
        del self.brokers[broker_name]
        names = self.clusters.get(data.cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.clusters[data.cluster]
        for topic in list(self.topics):
            queues = self.topics[topic]
            queues.pop(broker_name, None)
            if not queues:
                del self.topics[topic]

    # ------------------------------------------------------------------ queries
    def route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic``: its queues and the brokers serving them, None if none."""
        queues = self.topics.get(topic)
        if not queues:
            return None
        queue_datas = [attrs.evolve(q) for _, q in sorted(queues.items())]
        broker_datas = [
            BrokerData(data.cluster, data.broker_name, dict(sorted(data.broker_addrs.items())))
            for name in sorted(queues)
            if (data := self.brokers.get(name)) is not None
        ]
        return TopicRouteData(queue_datas=queue_datas, broker_datas=broker_datas)

    def retry_route(self, topic: str) -> TopicRouteData | None:
        """The route a consumer group's retry topic will have before it exists.

        A broker creates ``%RETRY%group`` at the group's first heartbeat, but clients
        look its route up before they send one (RocketMQ's C++ client then waits for
        its next rebalance, 10-20 s, to consume retries). So an unknown retry topic is
        answered as the brokers will have it: one queue on each broker that creates
        topics on demand (the brokers of TBW102, the auto-create template)."""
        template = self.topics.get(DEFAULT_TOPIC) if is_retry_topic(topic) else None
        if not template:
            return None
        queue_datas = [
            QueueData(name, 1, 1, PERM_READ | PERM_WRITE)
            for name, q in sorted(template.items())
            if q.perm & PERM_INHERIT
        ]
        if not queue_datas:
            return None
        broker_datas = [
            BrokerData(data.cluster, data.broker_name, dict(sorted(data.broker_addrs.items())))
            for q in queue_datas
            if (data := self.brokers.get(q.broker_name)) is not None
        ]
        return TopicRouteData(queue_datas=queue_datas, broker_datas=broker_datas)

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={
                name: BrokerData(data.cluster, name, dict(sorted(data.broker_addrs.items())))
                for name, data in sorted(self.brokers.items())
            },
            cluster_addr_table={c: sorted(names) for c, names in sorted(self.clusters.items())},
        )

    def topic_names(self) -> list[str]:
        return sorted(self.topics)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        names = self.clusters.get(cluster, set())
        return sorted(t for t, queues in self.topics.items() if names & queues.keys())
