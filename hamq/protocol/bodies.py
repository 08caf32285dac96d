"""JSON bodies of remoting commands: routes, registrations, heartbeats, offsets, locks.

The shapes are RocketMQ's (docs/PROTOCOL.md#bodies): camelCase keys, as Java's
fastjson writes them and as the C++ and Java clients read them. One private cattrs
converter does the mapping. Decoding is lenient where clients differ:
- unknown keys are ignored (Java 5.x adds fields the C++ client never sends);
- enums arrive as names (Java: ``"CONSUME_PASSIVELY"``) or ordinals (C++: ``1``);
- map keys that are numbers in Java (``brokerAddrs``: broker id -> address) arrive
  quoted (``{"0": ...}``) or, from old nameservers, unquoted; hamq always writes them
  quoted (docs/PROTOCOL.md#bodies);
- ``topicSysFlag`` is also accepted under its 4.4-era misspelling ``topicSynFlag``.
A body that is not JSON, or misses a required field, raises ``BodyError`` naming it.

Maps keyed by MessageQueue (ConsumeStats, TopicStatsTable, ResetOffsetBody,
GetConsumerStatusBody) are written as fastjson writes them, which is not JSON: the key
is the queue object itself, inline, its fields in alphabetical order —
``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:5}}`` — so that RocketMQ's
own admin tools read them. Decoding takes that form and the JSON one with the key as a
string holding the object (``{"{\"brokerName\":...}":5}``). fastjson.py reads and writes
that dialect; this module maps it to and from the classes.

``encode_body(obj)`` gives compact UTF-8 JSON bytes; ``decode_body(cls, data)`` the
object. Enums are written by name, as Java writes them.
"""

from __future__ import annotations

import enum
import json
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from hamq.protocol import fastjson
from hamq.protocol.codes import LanguageCode, ResponseCode
from hamq.protocol.errors import RequestError

T = TypeVar("T")

MASTER_ID = 0

# topic permissions (docs/PROTOCOL.md#bodies: QueueData)
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
#: the most read or write queues a topic may have on one broker
MAX_QUEUE_NUMS = 1024


class BodyError(RequestError):
    """A body that is not the JSON its command needs; the text names what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.INVALID_PARAMETER, message)


# ====================================================================== enums


class ConsumeType(enum.Enum):
    CONSUME_ACTIVELY = 0  # pull
    CONSUME_PASSIVELY = 1  # push
    CONSUME_POP = 2


class MessageModel(enum.Enum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


# ====================================================================== nameserver


def _wire(key: str) -> dict[str, str]:
    return {"wire": key}


@attrs.define
class DataVersion:
    """A broker's topic-table version; it changes whenever a topic does."""

    state_version: int = 0
    timestamp: int = 0
    counter: int = 0

    def next(self, now_ms: int) -> DataVersion:
        return DataVersion(self.state_version, now_ms, self.counter + 1)


@attrs.define
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = attrs.field(factory=dict)


@attrs.define
class TopicConfigSerializeWrapper:
    topic_config_table: dict[str, TopicConfig] = attrs.field(factory=dict)
    data_version: DataVersion = attrs.field(factory=DataVersion)


@attrs.define
class SyncStateSet:
    """A broker group's in-sync replicas (controller requests' bodies)."""

    sync_state_set: list[int] = attrs.field(factory=list)
    sync_state_set_epoch: int = 0


@attrs.define
class EpochEntryBody:
    epoch: int
    start_offset: int
    end_offset: int


@attrs.define
class EpochEntryCache:
    """GET_BROKER_EPOCH_CACHE (1007): a broker's epoch table and log end."""

    cluster_name: str
    broker_name: str
    broker_id: int
    epoch_list: list[EpochEntryBody] = attrs.field(factory=list)
    max_offset: int = 0


@attrs.define
class RegisterBrokerBody:
    """REGISTER_BROKER's body: every topic the broker serves."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = attrs.field(
        factory=TopicConfigSerializeWrapper
    )
    filter_server_list: list[str] = attrs.field(factory=list)


@attrs.define
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@attrs.define
class BrokerData:
    cluster: str
    broker_name: str
    #: broker id -> "ip:port"; id 0 is the master
    broker_addrs: dict[int, str] = attrs.field(factory=dict)

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)


@attrs.define
class TopicRouteData:
    queue_datas: list[QueueData] = attrs.field(factory=list)
    broker_datas: list[BrokerData] = attrs.field(factory=list)
    filter_server_table: dict[str, list[str]] = attrs.field(factory=dict)
    order_topic_conf: str | None = None


@attrs.define
class ClusterInfo:
    broker_addr_table: dict[str, BrokerData] = attrs.field(factory=dict)
    cluster_addr_table: dict[str, list[str]] = attrs.field(factory=dict)


@attrs.define
class TopicList:
    topic_list: list[str] = attrs.field(factory=list)
    broker_addr: str | None = None


# ====================================================================== clients


@attrs.define
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    tags_set: list[str] = attrs.field(factory=list)
    code_set: list[int] = attrs.field(factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False


@attrs.define
class ConsumerData:
    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscription_data_set: list[SubscriptionData] = attrs.field(factory=list)
    unit_mode: bool = False


@attrs.define
class ProducerData:
    group_name: str


@attrs.define
class HeartbeatData:
    """HEART_BEAT's body (docs/PROTOCOL.md#bodies)."""

    client_id: str = attrs.field(metadata=_wire("clientID"))
    producer_data_set: list[ProducerData] = attrs.field(factory=list)
    consumer_data_set: list[ConsumerData] = attrs.field(factory=list)


@attrs.define
class ConsumerListBody:
    consumer_id_list: list[str] = attrs.field(factory=list)


@attrs.frozen
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@attrs.define
class LockBatchRequestBody:
    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = attrs.field(factory=list)
    only_this_broker: bool = False


@attrs.define
class LockBatchResponseBody:
    lock_ok_mq_set: list[MessageQueue] = attrs.field(factory=list, metadata=_wire("lockOKMQSet"))


@attrs.define
class UnlockBatchRequestBody:
    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = attrs.field(factory=list)
    only_this_broker: bool = False


# ====================================================================== slave sync


@attrs.define
class ConsumerOffsetSerializeWrapper:
    """GET_ALL_CONSUMER_OFFSET's body: ``topic@group`` -> queue id -> offset.
    ``reset_table`` is hamq's addition (RocketMQ ignores it): ``topic@group`` -> queue
    id -> when (ms) an operator last reset that offset, so that a slave takes the
    reset even though it otherwise never moves an offset back."""

    offset_table: dict[str, dict[int, int]] = attrs.field(factory=dict)
    data_version: DataVersion = attrs.field(factory=DataVersion)
    reset_table: dict[str, dict[int, int]] = attrs.field(factory=dict)


@attrs.define
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = MASTER_ID
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    attributes: dict[str, str] = attrs.field(factory=dict)


@attrs.define
class SubscriptionGroupWrapper:
    subscription_group_table: dict[str, SubscriptionGroupConfig] = attrs.field(factory=dict)
    data_version: DataVersion = attrs.field(factory=DataVersion)


# ====================================================================== admin


@attrs.define
class OffsetWrapper:
    """One queue of GET_CONSUME_STATS: the queue's end (``broker_offset``, the next
    offset to be written), the group's committed offset (a pop group's: where it pops
    next), and the store time (ms) of the last message it consumed (0: none)."""

    broker_offset: int
    consumer_offset: int
    pull_offset: int = 0
    last_timestamp: int = 0
    #: hamq's own (other readers pass it over): messages the group popped and has not
    #: acked yet, their invisible time not run out (pop consumption)
    in_flight: int = 0


@attrs.define
class ConsumeStats:
    """GET_CONSUME_STATS (208)'s body; ``offset_table`` is keyed by queue (inline keys)."""

    offset_table: dict[MessageQueue, OffsetWrapper] = attrs.field(factory=dict)
    consume_tps: float = 0.0


@attrs.define
class TopicOffset:
    """One queue of GET_TOPIC_STATS_INFO: its offsets, and the store time (ms) of its
    newest message (0: none)."""

    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0


@attrs.define
class TopicStatsTable:
    """GET_TOPIC_STATS_INFO (202)'s body; ``offset_table`` is keyed by queue (inline keys)."""

    offset_table: dict[MessageQueue, TopicOffset] = attrs.field(factory=dict)
    topic_put_tps: float = 0.0


@attrs.define
class Connection:
    """A client connected to a broker, as GET_CONSUMER_CONNECTION_LIST names it."""

    client_id: str
    client_addr: str
    language: LanguageCode = LanguageCode.JAVA
    version: int = 0


@attrs.define
class ConsumerConnection:
    """GET_CONSUMER_CONNECTION_LIST (203)'s body: a group's members at one broker, their
    subscriptions (topic -> subscription), and how the group consumes."""

    connection_set: list[Connection] = attrs.field(factory=list)
    subscription_table: dict[str, SubscriptionData] = attrs.field(factory=dict)
    consume_type: ConsumeType | None = None
    message_model: MessageModel | None = None
    consume_from_where: ConsumeFromWhere | None = None


@attrs.define
class ResetOffsetBody:
    """RESET_CONSUMER_CLIENT_OFFSET (220)'s body, and INVOKE_BROKER_TO_RESET_OFFSET's
    answer: queue -> the offset the group goes on from (inline keys)."""

    offset_table: dict[MessageQueue, int] = attrs.field(factory=dict)


@attrs.define
class MessageQueueForC:
    topic: str
    broker_name: str
    queue_id: int
    offset: int


@attrs.define
class ResetOffsetBodyForC:
    """RESET_CONSUMER_CLIENT_OFFSET's body for C++ clients (they cannot read inline keys)."""

    offset_table: list[MessageQueueForC] = attrs.field(factory=list)


@attrs.define
class GetConsumerStatusBody:
    """GET_CONSUMER_STATUS_FROM_CLIENT (221)'s answer: the client's offsets
    (``message_queue_table``); INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223)'s: client id
    -> its offsets (``consumer_table``)."""

    message_queue_table: dict[MessageQueue, int] = attrs.field(factory=dict)
    consumer_table: dict[str, dict[MessageQueue, int]] = attrs.field(factory=dict)


@attrs.define
class KVTable:
    """GET_BROKER_RUNTIME_INFO (28)'s body: name -> value, both strings."""

    table: dict[str, str] = attrs.field(factory=dict)


def decode_reset_offsets(data: bytes | bytearray | memoryview) -> dict[MessageQueue, int]:
    """A RESET_CONSUMER_CLIENT_OFFSET body in either form (ResetOffsetBody, or the C++
    clients' list); BodyError if it is neither."""
    raw = _load(ResetOffsetBody, data)
    if isinstance(raw, dict) and isinstance(raw.get("offsetTable"), list):
        listed = _structure(raw, ResetOffsetBodyForC).offset_table
        return {MessageQueue(q.topic, q.broker_name, q.queue_id): q.offset for q in listed}
    return _structure(raw, ResetOffsetBody).offset_table


#: bodies with maps keyed by MessageQueue: written with inline object keys (fastjson's way)
_OBJECT_KEYED = (ConsumeStats, TopicStatsTable, ResetOffsetBody, GetConsumerStatusBody)


# ====================================================================== the converter

_ALIASES: dict[str, str] = {"topicSysFlag": "topicSynFlag"}


def _wire_name(field: attrs.Attribute[Any]) -> str:
    explicit = field.metadata.get("wire")
    if explicit is not None:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _renames(cls: type) -> dict[str, Any]:
    return {a.name: override(rename=_wire_name(a)) for a in attrs.fields(cls)}


def _structure_enum(value: Any, cls: type[enum.Enum]) -> enum.Enum:
    if isinstance(value, str):
        try:
            return cls[value]
        except KeyError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    names = ", ".join(member.name for member in cls)
    raise ValueError(f"{value!r} is not a {cls.__name__} ({names}, or their ordinals)")


def _structure_int(value: Any, _type: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise ValueError(f"{value!r} is not an integer")


def _structure_str(value: Any, _type: object) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"{value!r} is not a string")


def _structure_bool(value: Any, _type: object) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise ValueError(f"{value!r} is not a boolean")


def _structure_float(value: Any, _type: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a number")


def _queue_key(queue: MessageQueue) -> fastjson.ObjectKey:
    return fastjson.ObjectKey(
        json.dumps(
            {"brokerName": queue.broker_name, "queueId": queue.queue_id, "topic": queue.topic},
            separators=(",", ":"),
            ensure_ascii=False,
        )
    )


def _queue_keyed(tp: Any) -> bool:
    return typing.get_origin(tp) is dict and typing.get_args(tp)[:1] == (MessageQueue,)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _structure_enum
    )
    conv.register_unstructure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, enum.Enum), lambda member: member.name
    )
    # (an IntEnum is an int too: without its own hook the int one would take it)
    conv.register_structure_hook(LanguageCode, _structure_enum)

    def structure_factory(cls: type) -> Callable[[Any, Any], Any]:
        attrs.resolve_types(cls)
        inner: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, conv, **_renames(cls))

        def structure(data: Any, target: Any) -> Any:
            if not isinstance(data, dict):
                raise ValueError(f"{cls.__name__} must be a JSON object, not {type(data).__name__}")
            for key, alias in _ALIASES.items():
                if key not in data and alias in data:
                    data = {**data, key: data[alias]}
            return inner(data, target)

        return structure

    def unstructure_factory(cls: type) -> Callable[[Any], Any]:
        attrs.resolve_types(cls)
        return make_dict_unstructure_fn(cls, conv, **_renames(cls))

    conv.register_structure_hook_factory(attrs.has, structure_factory)
    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)

    # a MessageQueue as a map key: an object (inline, or in a string holding its JSON)
    queue_fields: Callable[[Any, Any], Any] = structure_factory(MessageQueue)

    def structure_queue(data: Any, target: Any) -> MessageQueue:
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except (ValueError, RecursionError):
                raise ValueError(f"{data[:80]!r} is not a MessageQueue") from None
        queue: MessageQueue = queue_fields(data, target)
        return queue

    def unstructure_queue_keyed(tp: Any) -> Callable[[Any], Any]:
        value_type = typing.get_args(tp)[1]
        return lambda table: {
            _queue_key(queue): conv.unstructure(value, value_type) for queue, value in table.items()
        }

    conv.register_structure_hook(MessageQueue, structure_queue)
    conv.register_unstructure_hook_factory(_queue_keyed, unstructure_queue_keyed)
    return conv


_CONVERTER = _make_converter()


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def encode_body(obj: object) -> bytes:
    """Compact JSON of a body object (enums by name, numeric map keys quoted, nulls out;
    maps keyed by MessageQueue with inline object keys, as fastjson writes them)."""
    data = _without_nulls(_CONVERTER.unstructure(obj))
    if isinstance(obj, _OBJECT_KEYED):
        return fastjson.dumps(data).encode()
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _load(cls: type, data: bytes | bytearray | memoryview | str) -> Any:
    """The body's JSON (or fastjson's) as plain values; BodyError if it is neither."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode()
    except UnicodeDecodeError as exc:
        raise BodyError(f"{cls.__name__} body is not UTF-8: {exc}") from None
    try:
        return json.loads(text)
    except RecursionError:  # '[[[[...': refused in one line, no traceback
        raise BodyError(f"{cls.__name__} body is nested too deeply") from None
    except ValueError:
        try:
            return fastjson.loads(text)
        except RecursionError:
            raise BodyError(f"{cls.__name__} body is nested too deeply") from None
        except ValueError as exc:
            raise BodyError(f"{cls.__name__} body is not JSON: {exc}") from None


def _structure(raw: Any, cls: type[T]) -> T:
    try:
        return _CONVERTER.structure(raw, cls)
    except ClassValidationError as exc:
        problems = "; ".join(cattrs.transform_error(exc, path=cls.__name__))
        raise BodyError(problems) from None
    except (ValueError, TypeError) as exc:
        raise BodyError(f"{cls.__name__} body: {exc}") from None


def decode_body(cls: type[T], data: bytes | bytearray | memoryview | str) -> T:
    """The body as ``cls``; BodyError names what is wrong."""
    return _structure(_load(cls, data), cls)
