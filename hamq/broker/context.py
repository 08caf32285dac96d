"""What the broker's processors share: configuration, store, managers, clock."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from hamq.broker.clients import ConsumerManager, ProducerManager, RebalanceLockManager
from hamq.broker.config import BrokerConfig
from hamq.broker.long_polling import PullHoldService
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.subscriptions import SubscriptionGroupManager
from hamq.broker.topics import TopicConfigManager
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
    #: set once the processors exist (the hold service runs pulls through them)
    pull_holds: PullHoldService | None = None
    #: the port the broker listens on (known once bound: the configuration may say 0)
    port: int = 0

    @property
    def address(self) -> str:
        """``ip:port`` of this broker as clients reach it (STOREHOST)."""
        return format_address(self.config.advertised_host, self.port)

    @property
    def store_host(self) -> tuple[str, int]:
        return (self.config.advertised_host, self.port)
