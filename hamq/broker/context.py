"""What the broker's processors share: configuration, store, managers, clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from hamq.broker.clients import ConsumerManager, ProducerManager, RebalanceLockManager
from hamq.broker.config import BrokerConfig
from hamq.broker.long_polling import PullHoldService
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.roles import Roles
from hamq.broker.stats import BrokerStats
from hamq.broker.subscriptions import SubscriptionGroupManager
from hamq.broker.topics import TopicConfigManager
from hamq.ha import HAService
from hamq.protocol.message import MessageIdGenerator
from hamq.remoting import format_address
from hamq.store import MessageStore


@attrs.define
class BrokerContext:
    config: BrokerConfig
    store: MessageStore
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    subscriptions: SubscriptionGroupManager
    consumers: ConsumerManager
    producers: ProducerManager
    locks: RebalanceLockManager
    clock: Callable[[], int]
    ids: MessageIdGenerator
    #: the role (master, slave, starting), the id registered with, refused sends
    roles: Roles
    #: set once the processors exist (the hold service runs pulls through them)
    pull_holds: PullHoldService | None = None
    #: the port the broker listens on (known once bound: the configuration may say 0)
    port: int = 0
    #: a master's HA service (None on a slave)
    ha: HAService | None = None
    #: the gRPC port (known once bound; 0: gRPC is off)
    grpc_port: int = 0
    #: the HA port (known once bound on a master)
    ha_port: int = 0
    #: what GET_BROKER_HA_STATUS answers (the node fills it in)
    ha_status: Callable[[], dict[str, Any]] = lambda: {}
    #: what the broker counts (messages in and out, send answers, pulls)
    stats: BrokerStats = attrs.field(factory=BrokerStats)
    #: (group, topic, queue id) -> messages popped and not acked yet (hamq/broker/pop.py)
    pops_in_flight: Callable[[str, str, int], int] = lambda _g, _t, _q: 0

    @property
    def address(self) -> str:
        """``ip:port`` of this broker as clients reach it (STOREHOST)."""
        return format_address(self.config.advertised_host, self.port)

    @property
    def ha_address(self) -> str:
        return format_address(self.config.advertised_host, self.ha_port or self.config.ha_port)

    @property
    def store_host(self) -> tuple[str, int]:
        return (self.config.advertised_host, self.port)
