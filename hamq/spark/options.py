"""The options of the "hamq" data source, parsed and checked (pure: no Spark, no I/O).

Spark hands a data source its options as strings under lower-cased names; the names
follow Spark's Kafka source where they mean the same thing. Every mistake is reported
with the option's name, and an option the source does not know is a mistake (a typo
would otherwise be ignored in silence).

Offsets name a queue by topic, broker name and queue id. As options they are
``earliest``, ``latest`` or JSON: ``{"broker-a": {"0": 42, "1": -2}}`` for a single
topic, ``{"orders": {"broker-a": {"0": 42}}}`` with the topic first (required when
several topics are read); -2 means the queue's earliest offset and -1 its latest, as in
Kafka. A queue the JSON does not name starts at its earliest offset (``startingOffsets``)
and ends at its latest (``endingOffsets``). Streaming checkpoints hold the topic-first
form with every queue.

A cluster with ACL or TLS on (README "Security"): ``accessKey`` / ``secretKey`` name
the account every request is signed with, ``tls`` and ``tlsCaFile`` make the
connections TLS, the servers' certificates checked against that CA (else the
system's). Both go to every client the source makes, on the driver and in the
executors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from hamq.client import InvalidArgumentError, RemotingConfig, TlsConfig, credentials_from
from hamq.client.message import check_group, check_topic

EARLIEST = -2
LATEST = -1
#: the most messages one pull asks for (the broker may answer with fewer)
MAX_PULL_BATCH = 1024
#: options Spark itself adds: ``load(path)`` / ``save(path)``, a stream's checkpoint
SPARK_OWN_OPTIONS = frozenset({"path", "checkpointlocation"})
#: the pull group when none is given (brokers create it on first use)
DEFAULT_READER_GROUP = "HAMQ_SPARK_READER"
DEFAULT_WRITER_GROUP = "HAMQ_SPARK_WRITER"


@attrs.frozen(order=True)
class QueueKey:
    """One queue of one broker group: the unit of offsets and of input partitions."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker}/{self.queue_id}"


@attrs.frozen
class OffsetSpec:
    """Where reading starts (or ends): ``default`` for every queue (EARLIEST or LATEST)
    except those ``queues`` names (an offset, EARLIEST or LATEST each)."""

    default: int
    queues: Mapping[QueueKey, int] = attrs.field(factory=dict)


@attrs.frozen
class Access:
    """How the source's clients reach the servers: the ACL account they sign with and
    TLS. Pickled to the executors with the rest of the options (the secret key too:
    they sign as well); never shown by ``repr``."""

    access_key: str | None = None
    secret_key: str | None = attrs.field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: str | None = None

    def client_options(self) -> dict[str, Any]:
        """Options of hamq's clients: ``Producer(group, namesrv, **access.client_options())``.
        Reads the CA file (each call: executors have their own file system):
        InvalidArgumentError naming ``tlsCaFile`` when it cannot be used."""
        options: dict[str, Any] = {}
        if self.access_key is not None:
            options.update(access_key=self.access_key, secret_key=self.secret_key)
        if self.tls or self.tls_ca_file is not None:
            ca_file = Path(self.tls_ca_file) if self.tls_ca_file is not None else None
            try:
                options["remoting"] = RemotingConfig(tls=TlsConfig(ca_file=ca_file))
            except ValueError as exc:
                raise InvalidArgumentError(f"tlsCaFile: {exc}") from None
        return options


@attrs.frozen
class ReadOptions:
    namesrv: str
    topics: tuple[str, ...]
    group: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    read_from_slave: bool
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    pull_batch_size: int
    access: Access = Access()

    @property
    def pull_group(self) -> str:
        return self.group or DEFAULT_READER_GROUP


@attrs.frozen
class WriteOptions:
    namesrv: str
    topic: str | None
    group: str
    batch_size: int
    access: Access = Access()


#: what both reading and writing take: the cluster, and how to reach it
_ACCESS_OPTIONS = {
    "accesskey": "accessKey",
    "secretkey": "secretKey",
    "tls": "tls",
    "tlscafile": "tlsCaFile",
}
_READ_OPTIONS = {
    "namesrv": "namesrv",
    "topic": "topic",
    "group": "group",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "startingtimestamp": "startingTimestamp",
    "readfromslave": "readFromSlave",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "pullbatchsize": "pullBatchSize",
    **_ACCESS_OPTIONS,
}
_WRITE_OPTIONS = {
    "namesrv": "namesrv",
    "topic": "topic",
    "group": "group",
    "batchsize": "batchSize",
    **_ACCESS_OPTIONS,
}


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Options of ``spark.read`` (``streaming`` False) or ``spark.readStream``."""
    given = _lower(options, _READ_OPTIONS)
    if streaming and "endingoffsets" in given:
        raise InvalidArgumentError(
            "endingOffsets is for batch queries (spark.read); a stream reads on and on"
        )
    if not streaming and "maxoffsetspertrigger" in given:
        raise InvalidArgumentError(
            "maxOffsetsPerTrigger is for streaming queries (spark.readStream)"
        )
    topics = _topics(given)
    starting_timestamp = _int(given, "startingtimestamp", low=0)
    if starting_timestamp is not None and "startingoffsets" in given:
        raise InvalidArgumentError(
            "give startingOffsets or startingTimestamp, not both (they say the same thing)"
        )
    group = given.get("group")
    if group is not None:
        _checked("group", check_group, group)
    return ReadOptions(
        namesrv=_namesrv(given),
        topics=topics,
        group=group,
        starting=parse_offset_spec(
            "startingOffsets",
            given.get("startingoffsets", "latest" if streaming else "earliest"),
            topics,
            missing=EARLIEST,
        ),
        ending=parse_offset_spec(
            "endingOffsets", given.get("endingoffsets", "latest"), topics, missing=LATEST
        ),
        starting_timestamp=starting_timestamp,
        read_from_slave=_bool(given, "readfromslave", False),
        max_offsets_per_trigger=_int(given, "maxoffsetspertrigger", low=1),
        fail_on_data_loss=_bool(given, "failondataloss", True),
        pull_batch_size=_int(given, "pullbatchsize", low=1, high=MAX_PULL_BATCH) or MAX_PULL_BATCH,
        access=_access(given),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Options of ``df.write`` / ``df.writeStream``."""
    given = _lower(options, _WRITE_OPTIONS)
    topic = given.get("topic") or given.get("path")
    if topic is not None:
        _checked("topic", check_topic, topic)
    group = given.get("group", DEFAULT_WRITER_GROUP)
    _checked("group", check_group, group)
    return WriteOptions(
        namesrv=_namesrv(given),
        topic=topic,
        group=group,
        batch_size=_int(given, "batchsize", low=1, high=MAX_PULL_BATCH) or 128,
        access=_access(given),
    )


# ---------------------------------------------------------------- offsets


def parse_offset_spec(
    option: str, text: str, topics: tuple[str, ...], *, missing: int
) -> OffsetSpec:
    """``earliest``, ``latest`` or JSON (see the module's text); queues the JSON leaves
    out get ``missing``."""
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidArgumentError(
            f'{option} is "earliest", "latest" or JSON like {{"broker-a": {{"0": 42}}}}, '
            f"not {text!r}"
        ) from None
    if not isinstance(value, dict) or not value:
        raise InvalidArgumentError(f"{option}: the JSON is not an object naming brokers")
    if all(_is_object_of_objects(v) for v in value.values()):
        by_topic = value
    elif len(topics) == 1:
        by_topic = {topics[0]: value}
    else:
        raise InvalidArgumentError(
            f"{option}: with several topics, the JSON names the topic first: "
            f'{{"{topics[0]}": {{"broker-a": {{"0": 42}}}}}}'
        )
    queues: dict[QueueKey, int] = {}
    for topic, brokers in by_topic.items():
        if topic not in topics:
            raise InvalidArgumentError(
                f"{option} names topic {topic!r}, which is not read (topic: {', '.join(topics)})"
            )
        queues.update(_broker_offsets(f"{option}[{topic}]", topic, brokers, special=True))
    return OffsetSpec(missing, queues)


def _is_object_of_objects(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, Any]:
    """Offsets as a streaming checkpoint holds them: topic → broker → queue id → offset."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key in sorted(offsets):
        out.setdefault(key.topic, {}).setdefault(key.broker, {})[str(key.queue_id)] = offsets[key]
    return out


def offsets_from_json(value: Any, what: str = "the offset") -> dict[QueueKey, int]:
    """What ``offsets_to_json`` made (read back from a checkpoint)."""
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} is not a JSON object: {value!r}")
    offsets: dict[QueueKey, int] = {}
    for topic, brokers in value.items():
        offsets.update(_broker_offsets(f"{what}[{topic}]", topic, brokers, special=False))
    return offsets


def _broker_offsets(where: str, topic: str, brokers: Any, *, special: bool) -> dict[QueueKey, int]:
    if not isinstance(topic, str) or not isinstance(brokers, dict):
        raise InvalidArgumentError(f"{where} is not an object of brokers")
    low = EARLIEST if special else 0
    out = {}
    for broker, queues in brokers.items():
        if not isinstance(queues, dict):
            raise InvalidArgumentError(f"{where}[{broker}] is not an object of queue ids")
        for queue_id, offset in queues.items():
            if not (isinstance(queue_id, str) and queue_id.isdigit()):
                raise InvalidArgumentError(f"{where}[{broker}]: {queue_id!r} is not a queue id")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < low:
                allowed = "an offset, -2 (earliest) or -1 (latest)" if special else "an offset"
                raise InvalidArgumentError(
                    f"{where}[{broker}][{queue_id}] is {offset!r}, not {allowed}"
                )
            out[QueueKey(topic, broker, int(queue_id))] = offset
    return out


# ---------------------------------------------------------------- option values


def _lower(options: Mapping[str, str], known: Mapping[str, str]) -> dict[str, str]:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(given) - set(known) - SPARK_OWN_OPTIONS)
    if unknown:
        raise InvalidArgumentError(
            f"the hamq data source has no option {', '.join(unknown)} "
            f"(it knows {', '.join(known.values())})"
        )
    return given


def _namesrv(given: Mapping[str, str]) -> str:
    addrs = [a.strip() for a in given.get("namesrv", "127.0.0.1:9876").replace(";", ",").split(",")]
    addrs = [a for a in addrs if a]
    if not addrs:
        raise InvalidArgumentError("namesrv names no nameserver (host:port, comma-separated)")
    return ";".join(addrs)


def _access(given: Mapping[str, str]) -> Access:
    """accessKey and secretKey (both or neither), tls and tlsCaFile (which implies tls).
    The CA file is not read here (pure): ``Access.client_options`` reads it."""
    access_key = given.get("accesskey") or None
    secret_key = given.get("secretkey") or None
    try:
        credentials_from(access_key, secret_key)
    except ValueError as exc:
        raise InvalidArgumentError(f"accessKey / secretKey: {exc}") from None
    ca_file = given.get("tlscafile", "").strip() or None
    if "tlscafile" in given and ca_file is None:
        raise InvalidArgumentError("tlsCaFile is empty: give the PEM file of the servers' CA")
    tls = _bool(given, "tls", ca_file is not None)
    if ca_file is not None and not tls:
        raise InvalidArgumentError("tlsCaFile is for TLS connections: drop tls=false")
    return Access(access_key, secret_key, tls, ca_file)


def _topics(given: Mapping[str, str]) -> tuple[str, ...]:
    text = given.get("topic") or given.get("path")
    if not text:
        raise InvalidArgumentError('say which topic to read: .option("topic", "name")')
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    for topic in topics:
        _checked("topic", check_topic, topic)
    if not topics:
        raise InvalidArgumentError(f"topic {text!r} names no topic")
    return topics


def _checked(option: str, check: Callable[[str], object], value: str) -> None:
    """``check(value)``; its InvalidArgumentError names ``option``."""
    try:
        check(value)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{option}: {exc}") from None


def _bool(given: Mapping[str, str], name: str, default: bool) -> bool:
    text = given.get(name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise InvalidArgumentError(f"{_name(name)} is true or false, not {text!r}")


def _int(given: Mapping[str, str], name: str, *, low: int, high: int | None = None) -> int | None:
    text = given.get(name)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidArgumentError(f"{_name(name)} is a whole number, not {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f"at least {low}"
        raise InvalidArgumentError(f"{_name(name)} is {value}; it must be {bound}")
    return value


def _name(lowered: str) -> str:
    return _READ_OPTIONS.get(lowered) or _WRITE_OPTIONS.get(lowered) or lowered
