"""The sink: DataFrame rows sent as messages with hamq's producer, from each executor.

Columns (only ``body`` is required; other columns are left alone, as Spark's Kafka
sink does):

    body        binary or string    the message body (not null)
    topic       string              where it goes; the ``topic`` option wins if given
    keys        string or array     keys to find it by (a string: space-separated)
    tags        string              its tag
    properties  map<string,string>  user properties
    queue_id    int                 the queue: with ``broker``, that broker's queue;
                                    without, the queue_id-th of the topic's queues
    broker      string              (with queue_id) the broker group

Rows go in order, ``batchSize`` at a time per run of rows for one topic and queue,
each run as one batch request. Every SendStatus counts (a slave that did not confirm in
time still means the master stored it); a send that fails (after the producer's own
retries) fails the task with the broker's reason, and Spark may run it again: delivery
is at least once.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from hamq.client import InvalidArgumentError, Message, MessageQueue
from hamq.client.blocking import Producer
from hamq.spark.options import WriteOptions

#: the most body bytes one batch request carries (the broker takes up to 4 MiB)
BATCH_BYTES = 1024 * 1024

_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_COLUMN_TYPES: dict[str, tuple[str, tuple[type[DataType], ...]]] = {
    "body": ("binary or string", (BinaryType, StringType)),
    "topic": ("string", (StringType,)),
    "keys": ("string or array<string>", (StringType, ArrayType)),
    "tags": ("string", (StringType,)),
    "properties": ("map<string,string>", (MapType,)),
    "queue_id": ("an integer", _INTEGERS),
    "broker": ("string", (StringType,)),
}


@attrs.frozen
class SinkReport:
    """What one partition (or, summed, one write) sent: messages per SendStatus name."""

    counts: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {count}" for name, count in sorted(self.counts.items()))
        return f"{self.total} messages ({parts or 'none'})"


def summed(reports: Iterable[SinkReport | None]) -> SinkReport:
    counts: collections.Counter[str] = collections.Counter()
    for report in reports:
        if report is not None:
            counts.update(report.counts)
    return SinkReport(dict(counts))


def check_sink_schema(schema: StructType, options: WriteOptions) -> None:
    """InvalidArgumentError naming the column, for a DataFrame the sink cannot send."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise InvalidArgumentError(
            f"the hamq sink needs a body column (binary or string); the columns are "
            f"{', '.join(fields) or 'none'}"
        )
    if options.topic is None and "topic" not in fields:
        raise InvalidArgumentError(
            'say where the messages go: .option("topic", "name") or a topic column'
        )
    if "broker" in fields and "queue_id" not in fields:
        raise InvalidArgumentError("a broker column goes with a queue_id column")
    for name, data_type in fields.items():
        if name not in _COLUMN_TYPES:
            continue
        wanted, types = _COLUMN_TYPES[name]
        ok = isinstance(data_type, types)
        if isinstance(data_type, ArrayType):
            ok = ok and isinstance(data_type.elementType, StringType)
        if isinstance(data_type, MapType):
            ok = isinstance(data_type.keyType, StringType) and isinstance(
                data_type.valueType, StringType
            )
        if not ok:
            raise InvalidArgumentError(
                f"column {name} is {data_type.simpleString()}; the hamq sink takes {wanted}"
            )


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> SinkReport:
    """Send every row of ``batches``; the counts per SendStatus."""
    counts: collections.Counter[str] = collections.Counter()
    with Producer(options.group, options.namesrv, **options.access.client_options()) as producer:
        sender = _Sender(producer, options, counts)
        for batch in batches:
            for row in _rows(batch, options):
                sender.add(*row)
        sender.flush()
    return SinkReport(dict(counts))


_Row = tuple[Message, str | None, int | None]


def _rows(batch: pa.RecordBatch, options: WriteOptions) -> Iterator[_Row]:
    """(message, broker, queue id) per row."""
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    empty: list[Any] = [None] * batch.num_rows
    bodies = columns["body"]
    topics = columns.get("topic", empty)
    keys = columns.get("keys", empty)
    tags = columns.get("tags", empty)
    properties = columns.get("properties", empty)
    queue_ids = columns.get("queue_id", empty)
    brokers = columns.get("broker", empty)
    for i, body in enumerate(bodies):
        topic = options.topic or topics[i]
        if body is None:
            raise InvalidArgumentError(f"a row for topic {topic} has a null body")
        if topic is None:
            raise InvalidArgumentError("a row has a null topic and no topic option is set")
        message = Message(
            topic,
            body,
            tags=tags[i],
            keys=keys[i],
            properties=dict(properties[i] or ()),
        )
        yield message, brokers[i], queue_ids[i]


class _Sender:
    """Runs of rows for one topic and queue, sent as batch requests."""

    def __init__(
        self, producer: Producer, options: WriteOptions, counts: collections.Counter[str]
    ) -> None:
        self.producer = producer
        self.batch_size = options.batch_size
        self.counts = counts
        self.pending: list[Message] = []
        self.pending_bytes = 0
        self.target: tuple[str, str | None, int | None] | None = None
        self.queues: dict[str, list[MessageQueue]] = {}

    def add(self, message: Message, broker: str | None, queue_id: int | None) -> None:
        target = (message.topic, broker, queue_id)
        size = len(message.body)
        if self.pending and (
            target != self.target
            or len(self.pending) >= self.batch_size
            or self.pending_bytes + size > BATCH_BYTES
        ):
            self.flush()
        self.target = target
        self.pending.append(message)
        self.pending_bytes += size

    def flush(self) -> None:
        if not self.pending or self.target is None:
            return
        topic, broker, queue_id = self.target
        queue = None if queue_id is None else self._queue(topic, broker, queue_id)
        result = self.producer.send_batch(self.pending, queue=queue)
        self.counts[result.status.name] += len(self.pending)
        self.pending = []
        self.pending_bytes = 0

    def _queue(self, topic: str, broker: str | None, queue_id: int) -> MessageQueue:
        queues = self.queues.get(topic)
        if queues is None:
            queues = self.queues[topic] = self.producer.queues(topic)
        if broker is None:
            if queue_id < 0:
                raise InvalidArgumentError(f"queue_id {queue_id} is negative")
            return queues[queue_id % len(queues)]
        wanted = MessageQueue(topic, broker, queue_id)
        if wanted not in queues:
            raise InvalidArgumentError(
                f"topic {topic} has no writable queue {queue_id} on broker {broker} "
                f"(it has {', '.join(f'{q.broker_name}/{q.queue_id}' for q in queues)})"
            )
        return wanted
