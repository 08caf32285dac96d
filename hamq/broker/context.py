"""What the broker's processors share: configuration, store, managers, clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from hamq.broker.clients import ConsumerManager, ProducerManager, RebalanceLockManager
from hamq.broker.config import BrokerConfig
from hamq.broker.long_polling import PullHoldService
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.stats import BrokerStats
from hamq.broker.subscriptions import SubscriptionGroupManager
from hamq.broker.topics import TopicConfigManager
from hamq.ha import HAService
from hamq.protocol.message import MessageIdGenerator
from hamq.remoting import format_address
from hamq.store import BrokerRole, MessageStore


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
    #: set once the processors exist (the hold service runs pulls through them)
    pull_holds: PullHoldService | None = None
    #: the port the broker listens on (known once bound: the configuration may say 0)
    port: int = 0
    #: a master's HA service (None on a slave)
    ha: HAService | None = None
    #: the HA port (known once bound on a master)
    ha_port: int = 0
    #: what GET_BROKER_HA_STATUS answers (the node fills it in)
    ha_status: Callable[[], dict[str, Any]] = lambda: {}
    #: the role now: the configured one, or (controller mode) what the controller says
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    #: the id now: configured, or (controller mode) 0 as master, else the controller's
    broker_id: int = 0
    #: the SyncStateSet is below minInSyncReplicas: why sends are refused (controller mode)
    sends_refused: str | None = None
    #: what the broker counts (messages in and out, send answers, pulls)
    stats: BrokerStats = attrs.field(factory=BrokerStats)

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0 and self.role.is_master

    def waits_for_replicas(self) -> bool:
        """Does a send wait for replicas' acks: SYNC_MASTER (one slave), or with
        allAckInSyncStateSet every other member of the SyncStateSet (if any)."""
        if not self.is_master or self.ha is None:
            return False
        if self.config.enable_controller_mode and self.config.all_ack_in_sync_state_set:
            return self.ha.needs_acks()
        return self.role is BrokerRole.SYNC_MASTER

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
