"""Reading one queue range in an executor: pulls from the broker, rows as Arrow batches.

Each input partition is a ``QueueRange``. ``read_range`` creates its own hamq
PullConsumer (a Trio client, never pickled), pulls ``start .. end - 1`` from the broker
group's master (or a slave: ``readFromSlave``, or the master's own suggestion, or the
master is down) and turns the records into ``pyarrow.RecordBatch`` rows (columns.py).
Bodies the producer compressed arrive inflated.

Pulls are pipelined: the offsets of a range are known in advance, so up to
``PULLS_IN_FLIGHT`` pulls of consecutive windows are under way at once, and an answer
is used when its window starts where reading is. Windows are as long as the broker
answers (it caps each answer at its max_transfer_count, 32 by default, and at a number
of bytes): a short answer sets the window length and starts the pipeline again from
where it ended.

A pull that fails (a broker went away) is tried again, with a fresh route, for up to
``RETRY_FOR_S``; a broker that says it has no more messages while the range is not
read yet is asked again (a slave: the master is asked) for as long. Offsets retention
deleted meanwhile are data loss (``failOnDataLoss``).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable

import attrs
import pyarrow as pa
import trio

from hamq.client import MASTER_ID, ClientError, PullConsumer, PullResult, PullStatus
from hamq.client.records import MessageFormatError
from hamq.spark.columns import Columns
from hamq.spark.options import ReadOptions
from hamq.spark.planning import (
    RETRY_FOR_S,
    TRANSIENT_ERRORS,
    QueueRange,
    commit_offsets,
    data_loss,
    message_queue,
)

#: rows per Arrow batch handed to Spark, unless their records reach BATCH_BYTES first
BATCH_ROWS = 8192
BATCH_BYTES = 64 * 1024 * 1024
PULL_TIMEOUT_S = 10.0
#: pulls of one range under way at once
PULLS_IN_FLIGHT = 4
#: the id of the slave a readFromSlave pull asks first (RocketMQ's slaves are 1, 2 ...)
FIRST_SLAVE_ID = 1


@attrs.define(eq=False)
class _Pull:
    """One window's pull, under way or answered."""

    offset: int
    count: int
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    result: PullResult | None = None
    error: Exception | None = None


async def read_range(
    options: ReadOptions, qrange: QueueRange, emit: Callable[[pa.RecordBatch], Awaitable[None]]
) -> None:
    """Emit the rows of ``qrange`` in queue order; then commit the group's offset
    (``group`` given)."""
    key = qrange.key
    queue = message_queue(key)
    rows = Columns(key.topic, key.broker, key.queue_id)
    clients = options.access.client_options()
    async with PullConsumer(options.pull_group, options.namesrv, **clients) as consumer:
        if options.read_from_slave:
            consumer.caller.suggested[queue] = FIRST_SLAVE_ID

        async def pull(window: _Pull) -> None:
            with window.scope:
                try:
                    window.result = await consumer.caller.pull(
                        queue, "*", window.offset, window.count,
                        timeout_s=PULL_TIMEOUT_S, decode=False,
                    )  # fmt: skip
                except TRANSIENT_ERRORS as exc:
                    window.error = exc
                window.done.set()

        async with trio.open_nursery() as nursery:
            pending: collections.deque[_Pull] = collections.deque()
            offset = ahead = qrange.start  # where reading is; where the next window starts
            step = options.pull_batch_size
            deadline = math.inf  # while pulls fail or find nothing: until when to keep trying
            while offset < qrange.end:
                while len(pending) < PULLS_IN_FLIGHT and ahead < qrange.end:
                    window = _Pull(ahead, min(step, qrange.end - ahead))
                    nursery.start_soon(pull, window)
                    pending.append(window)
                    ahead += window.count
                window = pending.popleft()
                await window.done.wait()
                result = window.result
                if result is not None and result.status is PullStatus.FOUND:
                    deadline = math.inf
                    try:
                        after = rows.add_records(result.raw, offset, qrange.end)
                    except MessageFormatError as exc:
                        raise ClientError(f"a pull answer for queue {key} is bad: {exc}") from None
                    offset = max(offset, after, result.next_begin_offset)
                    if len(rows) >= BATCH_ROWS or rows.size_bytes >= BATCH_BYTES:
                        await emit(rows.batch())
                    if offset == window.offset + window.count:
                        continue  # the pipeline goes on
                    step = max(1, offset - window.offset)  # the broker's cap on an answer
                elif result is None:
                    deadline = _retry_until(
                        deadline, f"pulling queue {key} at offset {offset}", window.error
                    )
                    await trio.sleep(0.2)
                elif result.status is PullStatus.NO_NEW_MSG:
                    deadline = _retry_until(
                        deadline,
                        f"queue {key} holds messages up to offset {result.max_offset - 1} at "
                        f"the broker, and the range needs them up to {qrange.end - 1}",
                        None,
                    )
                    if consumer.caller.suggested.get(queue, MASTER_ID) != MASTER_ID:
                        consumer.caller.suggested[queue] = MASTER_ID  # a slave behind: the master
                    else:
                        await trio.sleep(0.2)
                else:
                    offset = _skip(options, qrange, offset, result)
                # the windows under way start past where reading is now: drop them
                for stale in pending:
                    stale.scope.cancel()
                pending.clear()
                ahead = offset
        if rows:
            await emit(rows.batch())
        if options.group:
            await commit_offsets(consumer, {key: qrange.end})


def _skip(options: ReadOptions, qrange: QueueRange, offset: int, result: PullResult) -> int:
    """Where to go on from offsets the broker no longer has."""
    key = qrange.key
    if result.status is PullStatus.OFFSET_ILLEGAL and offset < result.min_offset:
        if qrange.from_earliest and offset == qrange.start:
            return result.min_offset
        what = f"messages {offset}..{result.min_offset - 1} of queue {key} were deleted"
        return data_loss(options.fail_on_data_loss, what, result.min_offset)
    if result.status is PullStatus.OFFSET_ILLEGAL:
        what = f"queue {key} ends at offset {result.max_offset}, before offset {offset}"
        return data_loss(options.fail_on_data_loss, what, qrange.end)
    # NO_MATCHED_MSG with no filter: the queue's entries point at deleted log records
    what = (
        f"messages {offset}..{result.next_begin_offset - 1} of queue {key} were deleted (retention)"
    )
    return data_loss(options.fail_on_data_loss, what, max(result.next_begin_offset, offset + 1))


def _retry_until(deadline: float, what: str, error: BaseException | None) -> float:
    """The deadline of a run of failed tries (set by the first); past it, ClientError."""
    now = trio.current_time()
    if deadline == math.inf:
        return now + RETRY_FOR_S
    if now > deadline:
        raise ClientError(
            f"{what}{f': {error}' if error else ''} (tried for {RETRY_FOR_S:g} s)"
        ) from error
    return deadline
