"""HamqDataSource: hamq topics as Spark DataFrames (PySpark's Python data source API).

    from hamq.spark import HamqDataSource
    spark.dataSource.register(HamqDataSource)
    df = spark.read.format("hamq").option("topic", "orders").load()

Where each part runs: ``reader``/``streamReader``/``writer`` and the planning calls
(``partitions``, ``initialOffset``, ``latestOffset``, ``commit``) run in Spark's Python
planner processes on the driver, each asking the nameservers and brokers in a short
Trio run of its own; ``read`` and ``write`` run in executors, each with a hamq client of
its own created there (objects Spark pickles hold only options and offsets).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import trio
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from hamq.client import InvalidArgumentError, PullConsumer
from hamq.spark.bridge import iterate_in_trio
from hamq.spark.columns import SCHEMA
from hamq.spark.options import (
    QueueKey,
    ReadOptions,
    WriteOptions,
    offsets_from_json,
    offsets_to_json,
    parse_read_options,
    parse_write_options,
)
from hamq.spark.planning import (
    Bounds,
    QueueRange,
    commit_offsets,
    fetch_bounds,
    fetch_starting_bounds,
    latest_offsets,
    plan_batch,
    start_offsets,
    stream_ranges,
)
from hamq.spark.reading import read_range
from hamq.spark.writing import SinkReport, check_sink_schema, summed, write_batches

log = logging.getLogger(__name__)

R = TypeVar("R")


class HamqDataSource(DataSource):
    """The "hamq" format: batch and streaming reads of topics, and a sink."""

    @classmethod
    def name(cls) -> str:
        return "hamq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return HamqReader(_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return HamqStreamReader(_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> HamqWriter:
        return HamqWriter(_write_options(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> HamqStreamWriter:
        return HamqStreamWriter(_write_options(self.options, schema, overwrite))


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise InvalidArgumentError(
            "the hamq source has a schema of its own (it cannot take another: select "
            f"columns after load()): {SCHEMA.simpleString()}"
        )


def _read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    parsed = parse_read_options(options, streaming=streaming)
    parsed.access.client_options()  # a bad tlsCaFile named now, on the driver
    return parsed


def _write_options(options: Mapping[str, str], schema: StructType, overwrite: bool) -> WriteOptions:
    if overwrite:
        raise InvalidArgumentError(
            "a topic cannot be overwritten: write to hamq with mode append (the messages "
            "are added to the topic)"
        )
    parsed = parse_write_options(options)
    check_sink_schema(schema, parsed)
    parsed.access.client_options()  # a bad tlsCaFile named now, not in each executor
    return parsed


def _with_consumer(options: ReadOptions, work: Callable[[PullConsumer], Awaitable[R]]) -> R:
    """``work`` with a PullConsumer, in a Trio run of its own (planning on the driver)."""

    clients = options.access.client_options()

    async def main() -> R:
        async with PullConsumer(options.pull_group, options.namesrv, **clients) as consumer:
            return await work(consumer)

    return trio.run(main)


def _read(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    qrange = partition.value
    if not isinstance(qrange, QueueRange):  # Spark's stand-in when there is nothing to read
        return iter(())
    return iterate_in_trio(
        lambda emit: read_range(options, qrange, emit), name=f"hamq-read-{qrange.key}"
    )


# ---------------------------------------------------------------- batch


class HamqReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options

        async def plan(consumer: PullConsumer) -> list[QueueRange]:
            return plan_batch(options, *await fetch_starting_bounds(consumer, options))

        return [InputPartition(r) for r in _with_consumer(options, plan)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


# ---------------------------------------------------------------- streaming


class HamqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are JSON: topic → broker → queue id → next offset to read."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        #: availableNow: where the run stops (the queues' ends when it began)
        self.target: dict[QueueKey, int] | None = None
        #: the queues' ends as the last latestOffset saw them
        self.seen: dict[QueueKey, int] = {}

    def _bounds(self, *, tolerate_failures: bool) -> dict[QueueKey, Bounds]:
        options = self.options
        return _with_consumer(
            options,
            lambda c: fetch_bounds(c, options.topics, tolerate_failures=tolerate_failures),
        )

    def initialOffset(self) -> dict[str, Any]:
        options = self.options

        async def initial(consumer: PullConsumer) -> dict[QueueKey, int]:
            return start_offsets(options, *await fetch_starting_bounds(consumer, options))

        return offsets_to_json(_with_consumer(options, initial))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {k: b.max for k, b in self._bounds(tolerate_failures=False).items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start, "the stream's start offset")
        bounds = self._bounds(tolerate_failures=True)
        self.seen = {k: b.max for k, b in bounds.items()}
        end = latest_offsets(
            begin,
            bounds,
            max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            target=self.target,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return offsets_to_json(self.seen) if self.seen else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = stream_ranges(
            offsets_from_json(start, "the batch's start offset"),
            offsets_from_json(end, "the batch's end offset"),
        )
        return [InputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        if self.options.group:
            offsets = offsets_from_json(end, "the committed offset")
            _with_consumer(self.options, lambda c: commit_offsets(c, offsets))


# ---------------------------------------------------------------- sink


@dataclass
class HamqCommitMessage(WriterCommitMessage):
    report: SinkReport


def _report(messages: list[WriterCommitMessage | None]) -> SinkReport:
    return summed(m.report if isinstance(m, HamqCommitMessage) else None for m in messages)


def _log_written(messages: list[WriterCommitMessage | None], what: str) -> None:
    report = _report(messages)
    if set(report.counts) - {"SEND_OK"}:
        log.warning("the hamq sink wrote %s in %s", report, what)
    else:
        log.info("the hamq sink wrote %s in %s", report, what)


class HamqWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HamqCommitMessage:
        return HamqCommitMessage(write_batches(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_written(messages, "a batch write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("a hamq batch write failed; its finished tasks sent %s", _report(messages))


class HamqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HamqCommitMessage:
        return HamqCommitMessage(write_batches(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_written(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        report = _report(messages)
        log.warning("hamq micro-batch %d failed; its finished tasks sent %s", batchId, report)
