"""What the admin calls return: plain frozen values, each with ``to_json``.

AdminClient's methods (hamq/client/admin.py) and the controller and broker calls
(hamq/client/controller_calls.py) build these from what a server answered; nothing
here talks to a server or knows a client instance, so a view can be built and printed
from any answer (``epochs_from_ha_status`` from a saved HA status, say).

What ``to_json`` gives (``hamq ... --json`` prints it): keys that are field names in
camelCase (``json_name``; RocketMQ's spelling), keys that are names (topics, clusters,
settings, properties) as they are; values with their types. Where the wire carries
text, the text is read back: a KVTable value (``kv_value``) by its form, since
RocketMQ's KVTable holds strings only. Queues are listed in (topic, broker name, queue
id) order (``queue_order``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from hamq.client.message import MessageExt
from hamq.protocol.bodies import (
    ConsumeFromWhere,
    ConsumeType,
    EpochEntryCache,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)


@attrs.frozen
class QueueStatus:
    """A readable queue of a topic and its offsets (``queue_status``)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int


def _queue_json(queue: MessageQueue) -> dict[str, Any]:
    return {"topic": queue.topic, "brokerName": queue.broker_name, "queueId": queue.queue_id}


def queue_order(queue: MessageQueue) -> tuple[str, str, int]:
    """The key views list queues by: topic, broker name, queue id."""
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
    #: popped and not acked yet (pop consumption: a SimpleConsumer's group)
    in_flight: int = 0

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            **_queue_json(self.queue),
            "brokerOffset": self.broker_offset,
            "consumerOffset": self.consumer_offset,
            "lag": self.lag,
            "inFlight": self.in_flight,
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
                for q, offset in sorted(self.offsets.items(), key=lambda i: queue_order(i[0]))
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


_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def setting_name(key: str) -> str:
    """A broker setting's name as its configuration spells it: snake_case
    (``slaveReadEnable``, RocketMQ's spelling, is ``slave_read_enable``)."""
    return _CAMEL.sub(lambda m: "_" + str(m.group(1)).lower(), key).lower()


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
