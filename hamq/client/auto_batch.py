"""Sends that wait behind others go as one batch (the producer's ``auto_batch``).

RocketMQ 5's producer has ``autoBatch`` (off by default): sends are held up to
``batchMaxDelayMs`` (10 ms) and go as one SEND_BATCH_MESSAGE, each send then getting
its own SendResult split from the batch's. hamq's producer does the same without the
hold. A send to a topic with fewer than ``in_flight`` sends (alone or batches) under way
leads at once: it lets the tasks ready to run go first (one checkpoint: the tasks one
batch's end woke send their next messages then), and goes with the sends that came
meanwhile. Past ``in_flight`` a send waits, and when one of those ends the first send
waiting leads the others waiting (up to ``max_bytes``) as one batch. A producer sending
one message at a time never waits; one with many sends under way sends fewer, larger
requests, which costs the client and the broker far less per message.

Each send keeps what it would have alone: its own UNIQ_KEY, SendResult (its offset
message id and queue offset, the batch's queue and status) and time out. A batch that
fails (every try of it, by the producer's retry policy, within the shortest time left to
its sends) is sent again message by message, each with its own time left, so a refusal
or a failure reaches only the sends it belongs to. Only plain sends are batched: none
with a selector or a queue, a delay level, a transaction, a compressed body, or to a
retry topic (RocketMQ's canBatch); a send's WAIT property is kept by batching only sends
that agree on it.

A lane's state is changed only between awaits, on the producer's event loop.
"""

from __future__ import annotations

from collections import deque

import attrs

from hamq.client.errors import SendError
from hamq.client.message import SendResult
from hamq.protocol.message import BatchEntry
from hamq.remoting.loop import EventLike

#: sends to one topic under way at once before the next ones wait to go as a batch (2:
#: one is answered while the next fills; against 4, 64 sends at once go in batches of
#: about 24 instead of 17, and the peers harness's replicated publish took 10% less
#: server CPU a message)
AUTO_BATCH_IN_FLIGHT = 2
#: the most body and property bytes one batch takes (RocketMQ's batchMaxBytes default)
AUTO_BATCH_MAX_BYTES = 32 * 1024
#: what each entry of a batch adds to its body and properties (encode_batch)
ENTRY_OVERHEAD = 22


@attrs.define(eq=False)
class Waiter:
    """A send in a lane: it leads a batch, or waits to be woken to lead one or with its
    outcome."""

    entry: BatchEntry
    #: its UNIQ_KEY
    uniq_key: str
    #: what it adds to a batch's body
    size: int
    #: when its send times out, on the loop's clock
    deadline: float
    event: EventLike
    #: it leads a batch (and holds one of the lane's places in flight)
    lead: bool = False
    result: SendResult | None = None
    #: the batch it went in failed with this: the send goes again alone
    failure: SendError | None = None
    #: its outcome is set (a result or a failure)
    done: bool = False


class Lane:
    """The sends of one topic and WAIT flag that may go as one batch, at most ``limit``
    (sends alone or batches) under way at once."""

    __slots__ = ("gathering", "in_flight", "limit", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: sends (alone or batches) under way, and leaders about to send one
        self.in_flight = 0
        self.waiting: deque[Waiter] = deque()
        #: a leader holds a place and has not taken the sends waiting yet: sends that
        #: come meanwhile wait for it to take them rather than lead batches of their own
        #: (sends woken together would otherwise split into a batch and lone sends)
        self.gathering = False

    def free(self) -> bool:
        """Whether a new send may lead at once: a place in flight is free, no send is
        waiting before it and no leader is gathering."""
        return self.in_flight < self.limit and not self.waiting and not self.gathering

    def lead(self, leader: Waiter) -> None:
        """``leader`` takes a place in flight, and gathers until ``take``."""
        leader.lead = True
        self.in_flight += 1
        self.gathering = True

    def ended(self) -> None:
        """A send or batch of this lane ended: its place goes to the next leader."""
        self.in_flight -= 1
        self._next_leader()

    def abandoned(self) -> None:
        """A leader was cancelled before it took anyone: its place goes on."""
        self.gathering = False
        self.ended()

    def _next_leader(self) -> None:
        """The first send waiting, if any, is woken to lead the next batch when a place
        is free and no other leader gathers."""
        if self.waiting and self.in_flight < self.limit and not self.gathering:
            leader = self.waiting.popleft()
            self.lead(leader)
            leader.event.set()

    def take(self, leader: Waiter, max_bytes: int) -> list[Waiter]:
        """The leader and the sends waiting after it that fit in ``max_bytes``, in order."""
        members = [leader]
        size = leader.size
        waiting = self.waiting
        while waiting and size + waiting[0].size <= max_bytes:
            member = waiting.popleft()
            size += member.size
            members.append(member)
        self.gathering = False
        self._next_leader()  # (sends past max_bytes lead the next batch, if a place is free)
        return members

    def forget(self, waiter: Waiter) -> None:
        """A waiting send was cancelled before a batch took it."""
        try:
            self.waiting.remove(waiter)
        except ValueError:
            pass


def split_results(batch: SendResult, uniq_keys: list[str]) -> list[SendResult]:
    """Each send's part of a batch's result: its own UNIQ_KEY and, when the broker named
    one offset message id per message (as hamq's and RocketMQ's do), its own offset
    message id and queue offset (the batch's first plus its place); otherwise the
    batch's (RocketMQ's splitSendResults)."""
    offset_ids = batch.offset_msg_id.split(",")
    if len(offset_ids) != len(uniq_keys):
        offset_ids = [batch.offset_msg_id] * len(uniq_keys)
        first, step = batch.queue_offset, 0
    else:
        first, step = batch.queue_offset, 1
    status, queue, region = batch.status, batch.queue, batch.region_id
    return [
        SendResult(status, key, offset_id, queue, first + step * index, key, region)
        for index, (key, offset_id) in enumerate(zip(uniq_keys, offset_ids, strict=True))
    ]
