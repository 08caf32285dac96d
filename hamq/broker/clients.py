"""Who is connected: consumer groups, producer groups, and orderly consumers' locks.

Clients announce themselves with HEART_BEAT every 30 s. A client is dropped from its
groups when it unregisters, when its connection closes, or after
``client_channel_expired_s`` (120 s) without a heartbeat. Whenever the members of a
consumer group change, the group is told (NOTIFY_CONSUMER_IDS_CHANGED, oneway, to
each member), so that members rebalance at once. Subscriptions are kept per group
and topic, as the latest heartbeat states them.

Orderly consumers lock the queues they consume (LOCK_BATCH_MQ): a lock is held by one
client of a group, renewed by locking again, and lapses after
``rebalance_lock_max_live_s`` (60 s).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable

import attrs

from hamq.protocol import LanguageCode
from hamq.protocol.bodies import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)
from hamq.remoting import Connection

log = logging.getLogger(__name__)


@attrs.define
class ClientChannel:
    client_id: str
    connection: Connection
    language: LanguageCode
    version: int
    last_update_ms: int


@attrs.define
class ConsumerGroupInfo:
    group: str
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    channels: dict[str, ClientChannel] = attrs.field(factory=dict)
    subscriptions: dict[str, SubscriptionData] = attrs.field(factory=dict)


class ConsumerManager:
    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}
        #: called with a group's name whenever its members change
        self.on_change: list[Callable[[str], None]] = []

    def _notify(self, group: str) -> None:
        for listener in self.on_change:
            listener(group)

    def register(self, data: ConsumerData, channel: ClientChannel) -> bool:
        """A consumer's heartbeat; True (and the group is told) if membership changed."""
        info = self.groups.get(data.group_name)
        if info is None:
            info = self.groups[data.group_name] = ConsumerGroupInfo(
                data.group_name, data.consume_type, data.message_model, data.consume_from_where
            )
        info.consume_type = data.consume_type
        info.message_model = data.message_model
        info.consume_from_where = data.consume_from_where
        old = info.channels.get(channel.client_id)
        joined = old is None or old.connection is not channel.connection
        info.channels[channel.client_id] = channel
        info.subscriptions = {s.topic: s for s in data.subscription_data_set}
        if joined:
            log.info("consumer %s joined group %s", channel.client_id, data.group_name)
            self._notify(data.group_name)
        return joined

    def unregister(self, group: str, client_id: str) -> bool:
        info = self.groups.get(group)
        if info is None or info.channels.pop(client_id, None) is None:
            return False
        log.info("consumer %s left group %s", client_id, group)
        self._leave(info)
        return True

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        """The group while it has members (GET_CONSUMER_CONNECTION_LIST), else None."""
        return self.groups.get(group)

    def client_ids(self, group: str) -> list[str]:
        info = self.groups.get(group)
        return sorted(info.channels) if info else []

    def channels(self, group: str) -> list[ClientChannel]:
        info = self.groups.get(group)
        return list(info.channels.values()) if info else []

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return info.subscriptions.get(topic) if info else None

    def connection_closed(self, connection: Connection) -> None:
        for info in list(self.groups.values()):
            gone = [c for c in info.channels.values() if c.connection is connection]
            for channel in gone:
                del info.channels[channel.client_id]
                log.info(
                    "consumer %s left group %s (connection closed)", channel.client_id, info.group
                )
            if gone:
                self._leave(info)

    def scan_expired(self, now_ms: int, timeout_ms: int) -> None:
        for info in list(self.groups.values()):
            expired = [c for c in info.channels.values() if now_ms - c.last_update_ms > timeout_ms]
            for channel in expired:
                del info.channels[channel.client_id]
                log.warning(
                    "consumer %s of group %s silent for %d ms: dropped",
                    channel.client_id,
                    info.group,
                    now_ms - channel.last_update_ms,
                )
                channel.connection.close("client channel expired")
            if expired:
                self._leave(info)

    def _leave(self, info: ConsumerGroupInfo) -> None:
        if info.channels:
            self._notify(info.group)
        else:
            del self.groups[info.group]


class ProducerManager:
    def __init__(self) -> None:
        self.groups: dict[str, dict[str, ClientChannel]] = {}

    def register(self, group: str, channel: ClientChannel) -> None:
        self.groups.setdefault(group, {})[channel.client_id] = channel

    def available_channel(self, group: str) -> ClientChannel | None:
        """A connected producer of ``group`` to ask about its transactions (any one:
        they share the group's listener), None if none is connected."""
        members = self.groups.get(group)
        return random.choice(list(members.values())) if members else None

    def unregister(self, group: str, client_id: str) -> None:
        members = self.groups.get(group)
        if members is not None:
            members.pop(client_id, None)
            if not members:
                del self.groups[group]

    def connection_closed(self, connection: Connection) -> None:
        for group, members in list(self.groups.items()):
            for client_id in [i for i, c in members.items() if c.connection is connection]:
                del members[client_id]
            if not members:
                del self.groups[group]

    def scan_expired(self, now_ms: int, timeout_ms: int) -> None:
        for group, members in list(self.groups.items()):
            for client_id in [
                i for i, c in members.items() if now_ms - c.last_update_ms > timeout_ms
            ]:
                del members[client_id]
            if not members:
                del self.groups[group]


class RebalanceLockManager:
    def __init__(self, max_live_ms: int) -> None:
        self.max_live_ms = max_live_ms
        self._locks: dict[tuple[str, MessageQueue], tuple[str, int]] = {}

    def lock(
        self, group: str, queues: Iterable[MessageQueue], client_id: str, now_ms: int
    ) -> list[MessageQueue]:
        """Lock (or renew) what is free or already ours; returns the queues we hold."""
        held = []
        for queue in queues:
            owner = self._locks.get((group, queue))
            if owner is None or owner[0] == client_id or now_ms - owner[1] > self.max_live_ms:
                self._locks[(group, queue)] = (client_id, now_ms)
                held.append(queue)
        return held

    def unlock(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> None:
        for queue in queues:
            owner = self._locks.get((group, queue))
            if owner is not None and owner[0] == client_id:
                del self._locks[(group, queue)]

    def owner(self, group: str, queue: MessageQueue, now_ms: int) -> str | None:
        owner = self._locks.get((group, queue))
        if owner is None or now_ms - owner[1] > self.max_live_ms:
            return None
        return owner[0]
