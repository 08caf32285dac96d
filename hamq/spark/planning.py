"""Which offsets a read covers: the driver's side of the data source.

The queues of the topics and their min/max offsets come from the nameservers' routes
and the brokers (``fetch_bounds``, Trio, through hamq's PullConsumer); what to read
follows from them and the options by pure functions: ``plan_batch`` for ``spark.read``,
``initial_offsets`` / ``latest_offsets`` / ``stream_ranges`` for ``spark.readStream``.

Data loss is an offset the user asked for that retention has already deleted (below
the queue's min offset), or a checkpoint's offset past the queue's end (the queue lost
messages, e.g. a master failed over before its slave had them). ``failOnDataLoss``
true (the default) makes either an error naming the queue and offsets; false skips to
what is there, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

import attrs
import trio

from hamq.client import MessageQueue, RemotingError
from hamq.client.consumer import PullConsumer
from hamq.client.errors import (
    NETWORK_ERRORS,
    ClientError,
    InvalidArgumentError,
    NameServerUnavailableError,
    NoRouteError,
)
from hamq.spark.options import EARLIEST, LATEST, OffsetSpec, QueueKey, ReadOptions

log = logging.getLogger(__name__)

#: offset requests under way at once while planning
_CONCURRENT_REQUESTS = 16
#: how long a broker that fails is asked again (with a fresh route) before giving up
RETRY_FOR_S = 30.0
#: failures worth another try: no answer, no nameserver, no route (a broker group
#: between a master's death and its slave taking the route); a broker's refusal is not
TRANSIENT_ERRORS = (RemotingError, NameServerUnavailableError, NoRouteError)


class DataLossError(ClientError):
    """Offsets a read needs are gone (see the module's text); failOnDataLoss=false skips
    them instead."""


@attrs.frozen
class Bounds:
    """A queue's offsets now: messages ``min`` .. ``max - 1`` are there."""

    min: int
    max: int


@attrs.frozen(order=True)
class QueueRange:
    """Messages ``start`` .. ``end - 1`` of one queue: one input partition.
    ``from_earliest``: a queue the stream found after it started; reading begins at the
    queue's min offset whatever it is by then (not data loss)."""

    key: QueueKey
    start: int
    end: int
    from_earliest: bool = False

    @property
    def count(self) -> int:
        return self.end - self.start


# ---------------------------------------------------------------- asking the brokers


async def fetch_bounds(
    consumer: PullConsumer, topics: tuple[str, ...], *, tolerate_failures: bool = False
) -> dict[QueueKey, Bounds]:
    """Every readable queue of ``topics`` with its min and max offset.

    A topic no nameserver knows is an error. A broker that does not answer is asked
    again, with a fresh route, for up to ``RETRY_FOR_S`` (a master that just died leaves
    the route to its slave) and is then an error; with ``tolerate_failures``
    (streaming) it is asked once and its queues are left out, with a warning."""
    queues = []
    for topic in topics:
        try:
            queues += await consumer.queues(topic)
        except NoRouteError:
            raise NoRouteError(
                f"topic {topic!r} is not known to the nameservers "
                f"({', '.join(consumer.config.namesrv_addrs)}): create it first "
                "(hamq topic create)"
            ) from None
    bounds: dict[QueueKey, Bounds] = {}
    limiter = trio.CapacityLimiter(_CONCURRENT_REQUESTS)
    patience = 0.0 if tolerate_failures else RETRY_FOR_S

    async def one(queue: MessageQueue) -> None:
        key = queue_key(queue)
        give_up = trio.current_time() + patience
        async with limiter:
            while True:
                try:
                    low = await consumer.min_offset(queue)
                    bounds[key] = Bounds(low, await consumer.max_offset(queue))
                    return
                except TRANSIENT_ERRORS as exc:
                    if trio.current_time() >= give_up:
                        if not tolerate_failures:
                            raise ClientError(
                                f"the offsets of queue {key} are not known: {exc}"
                            ) from exc
                        log.warning("the offsets of queue %s are not known now: %s", key, exc)
                        return
                with contextlib.suppress(*NETWORK_ERRORS):
                    await consumer.caller.instance.refresh_route_after_failure(queue.topic)
                await trio.sleep(0.2)

    async with trio.open_nursery() as nursery:
        for queue in queues:
            nursery.start_soon(one, queue)
    return bounds


async def search_offsets(
    consumer: PullConsumer, keys: list[QueueKey], timestamp_ms: int
) -> dict[QueueKey, int]:
    """Per queue, the first offset stored at or after ``timestamp_ms``."""
    found: dict[QueueKey, int] = {}
    limiter = trio.CapacityLimiter(_CONCURRENT_REQUESTS)

    async def one(key: QueueKey) -> None:
        async with limiter:
            found[key] = await consumer.search_offset(message_queue(key), timestamp_ms)

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    return found


async def fetch_starting_bounds(
    consumer: PullConsumer, options: ReadOptions
) -> tuple[dict[QueueKey, Bounds], dict[QueueKey, int] | None]:
    """The bounds of the queues read, and the offsets ``startingTimestamp`` finds in
    them (None without it)."""
    bounds = await fetch_bounds(consumer, options.topics)
    if options.starting_timestamp is None:
        return bounds, None
    return bounds, await search_offsets(consumer, sorted(bounds), options.starting_timestamp)


async def commit_offsets(consumer: PullConsumer, offsets: Mapping[QueueKey, int]) -> None:
    """Commit the group's offsets to the brokers (for monitoring: hamq reads from its
    own checkpoints); a broker that does not take them is a warning, not an error."""
    limiter = trio.CapacityLimiter(_CONCURRENT_REQUESTS)

    async def one(key: QueueKey, offset: int) -> None:
        async with limiter:
            try:
                await consumer.commit_offset(message_queue(key), offset)
            except NETWORK_ERRORS as exc:
                log.warning("committing offset %d of queue %s failed: %s", offset, key, exc)

    async with trio.open_nursery() as nursery:
        for key, offset in offsets.items():
            nursery.start_soon(one, key, offset)


def queue_key(queue: MessageQueue) -> QueueKey:
    return QueueKey(queue.topic, queue.broker_name, queue.queue_id)


def message_queue(key: QueueKey) -> MessageQueue:
    return MessageQueue(key.topic, key.broker, key.queue_id)


# ---------------------------------------------------------------- batch reads


def plan_batch(
    options: ReadOptions,
    bounds: Mapping[QueueKey, Bounds],
    searched: Mapping[QueueKey, int] | None = None,
) -> list[QueueRange]:
    """The non-empty ranges of a batch read; ``searched``: the starts startingTimestamp
    found."""
    starts = start_offsets(options, bounds, searched)
    _check_named(options.ending, bounds, "endingOffsets")
    ranges = []
    for key, b in sorted(bounds.items()):
        end = _resolve(options.ending, key, b)
        if end > b.max:
            raise InvalidArgumentError(
                f"endingOffsets asks for queue {key} up to offset {end}, but it holds "
                f"messages only up to offset {b.max - 1} (its max offset is {b.max})"
            )
        start = starts[key]
        if end < start:
            raise InvalidArgumentError(
                f"endingOffsets {end} of queue {key} is before its starting offset {start}"
            )
        if end > start:
            ranges.append(QueueRange(key, start, end))
    return ranges


def start_offsets(
    options: ReadOptions,
    bounds: Mapping[QueueKey, Bounds],
    searched: Mapping[QueueKey, int] | None = None,
) -> dict[QueueKey, int]:
    """Where reading starts in each queue (startingOffsets or startingTimestamp);
    offsets retention deleted, or past a queue's end, are data loss."""
    _check_named(options.starting, bounds, "startingOffsets")
    starts = {}
    for key, b in sorted(bounds.items()):
        start = searched[key] if searched is not None else _resolve(options.starting, key, b)
        if start < b.min:
            start = data_loss(
                options.fail_on_data_loss,
                f"queue {key} starts at offset {b.min} now: messages {start}..{b.min - 1} "
                "were deleted (retention)",
                b.min,
            )
        elif start > b.max:
            start = data_loss(
                options.fail_on_data_loss,
                f"queue {key} ends at offset {b.max}, before the starting offset {start}",
                b.max,
            )
        starts[key] = start
    return starts


def data_loss(fail: bool, what: str, instead: int) -> int:
    """DataLossError (``fail``), else a warning and ``instead``."""
    if fail:
        raise DataLossError(f"{what}; set failOnDataLoss to false to skip what is missing")
    log.warning("%s: reading on from offset %d (failOnDataLoss is false)", what, instead)
    return instead


def _resolve(spec: OffsetSpec, key: QueueKey, bounds: Bounds) -> int:
    value = spec.queues.get(key, spec.default)
    if value == EARLIEST:
        return bounds.min
    if value == LATEST:
        return bounds.max
    return value


def _check_named(spec: OffsetSpec, bounds: Mapping[QueueKey, Bounds], option: str) -> None:
    unknown = sorted(set(spec.queues) - set(bounds))
    if unknown:
        have = ", ".join(str(k) for k in sorted(bounds)) or "none"
        raise InvalidArgumentError(
            f"{option} names queue {unknown[0]}, which the route does not have (the queues: {have})"
        )


# ---------------------------------------------------------------- streaming reads


def latest_offsets(
    start: Mapping[QueueKey, int],
    bounds: Mapping[QueueKey, Bounds],
    *,
    max_rows: int | None,
    target: Mapping[QueueKey, int] | None,
    fail_on_data_loss: bool,
) -> dict[QueueKey, int]:
    """The end of the next micro-batch.

    Every queue of ``start`` stays (a queue the brokers did not answer for keeps its
    offset); a queue new in the route joins from its min offset. ``target`` (a trigger
    of availableNow) caps each queue and leaves out queues that came later. ``max_rows``
    (maxOffsetsPerTrigger) caps the batch's messages, shared among the queues in
    proportion to what each has waiting."""
    end = dict(start)
    base = {}
    for key, b in sorted(bounds.items()):
        top = b.max
        if target is not None:
            if key not in target:
                continue
            top = min(top, target[key])
        if key in start and b.max < start[key]:
            end[key] = data_loss(
                fail_on_data_loss,
                f"queue {key} ends at offset {b.max}, before the stream's offset {start[key]} "
                "(it lost messages: a failover to a slave that lacked them?)",
                b.max,
            )
            continue
        base[key] = start.get(key, b.min)
        end[key] = max(top, base[key])
    if max_rows is not None:
        waiting = {key: end[key] - base[key] for key in base}
        for key, share in _shares(waiting, max_rows).items():
            end[key] = base[key] + share
    return end


def _shares(waiting: Mapping[QueueKey, int], limit: int) -> dict[QueueKey, int]:
    """At most ``limit`` in all, in proportion to ``waiting`` (largest remainders get
    the leftover units; ties go in key order)."""
    total = sum(waiting.values())
    if total <= limit:
        return dict(waiting)
    shares, remainders = {}, []
    for key, count in waiting.items():
        shares[key], remainder = divmod(count * limit, total)
        remainders.append((-remainder, key))
    for _, key in sorted(remainders)[: limit - sum(shares.values())]:
        shares[key] += 1
    return shares


def stream_ranges(start: Mapping[QueueKey, int], end: Mapping[QueueKey, int]) -> list[QueueRange]:
    """The non-empty ranges of a micro-batch; a queue ``start`` lacks begins at its
    earliest message."""
    ranges = []
    for key, stop in sorted(end.items()):
        begin = start.get(key)
        if begin is None:
            if stop > 0:
                ranges.append(QueueRange(key, 0, stop, from_earliest=True))
        elif stop > begin:
            ranges.append(QueueRange(key, begin, stop))
    return ranges
