"""When a stored message counts as safe: a put's durability wait, decided here only.

This is RocketMQ's ``handleDiskFlushAndHA``: one object a put waits on, joining its
two waits. The send path makes one call *before* it puts — ``Durability.ticket(wait)``
— which answers whether the put waits and for what: None when it is answered PUT_OK at
once (the message's WAIT property is "false", or neither wait applies), else a
``Ticket``. Once the put (or a group of puts, which then share one ticket and one wait)
has appended up to an end offset, ``Ticket.wait(end, answer)`` calls
``answer(status, remark)`` exactly once, when:

- the disk, with SYNC_FLUSH: the group-commit fsync that covers the end (flush.py) came,
  for at most ``[store] sync_flush_timeout_s``: else FLUSH_DISK_TIMEOUT;
- the replicas, when the injected ``ReplicaGate`` says a put waits for them now
  (hamq/ha/group_transfer.py decides who: a SYNC_MASTER one in-sync slave, a
  controller-mode master with allAckInSyncStateSet every other member of its
  SyncStateSet). With none to wait for the answer is SLAVE_NOT_AVAILABLE (after the
  disk, if it must); otherwise an ack past the end within the gate's ``timeout_s``, else
  FLUSH_SLAVE_TIMEOUT.

Both waits run at once, and the replicas' status wins over the disk's (RocketMQ's
``thenCombine``): SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT, then FLUSH_DISK_TIMEOUT,
then PUT_OK. The message is stored in every case — the status says what is not yet
certain, and the remark (one wording for each, below) says so. A replicas' status says
the message is on this master only: it reaches the slaves later if this broker stays
master, but a broker elected master before it has the message does not have it, and
this one truncates its log to the new master's when it follows it — the message is then
gone (a producer that needs it sends it again).

The store owns both waits: the flush's waiters are the flush service's, the replicas'
are here (``replica_acks``); the HA side only reports into them — ``replicated(offset)``
after each ack that counts, ``abandon_replica_waits()`` when acks can no longer make a
put safe (the broker stopped being master or lost its lease). No task per put: both
waits are callbacks, called by the flush round or the ack that covers the end, or by
the timer of the waiters' deadline queue (offset_waiters.py). The store never imports
replication: the broker hands it the gate.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

import trio

from hamq.store.config import FlushDiskType, StoreConfig
from hamq.store.flush import FlushService
from hamq.store.offset_waiters import OffsetWaiters


class PutMessageStatus(enum.Enum):
    """What a put answers (RocketMQ's PutMessageStatus)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    WHEEL_TIMER_MSG_ILLEGAL = "WHEEL_TIMER_MSG_ILLEGAL"
    WHEEL_TIMER_FLOW_CONTROL = "WHEEL_TIMER_FLOW_CONTROL"


#: what a put's answer says when it did not get what it waited for (the message is stored)
REPLICAS_CAVEAT = "dropped if a broker without it becomes master first"
SLAVE_NOT_AVAILABLE_REMARK = (
    "no slave in sync (none connected, or too far behind): stored on this master only "
    f"({REPLICAS_CAVEAT})"
)


def flush_timeout_remark(timeout_s: float) -> str:
    return f"not on disk within {timeout_s:g}s; stored"


def replica_timeout_remark(timeout_s: float) -> str:
    return f"no slave had it within {timeout_s:g}s: stored on this master only ({REPLICAS_CAVEAT})"


class ReplicaGate(Protocol):
    """Whether puts wait for replicas (implemented by hamq/ha/group_transfer.py)."""

    #: how long a put waits for the replicas' ack
    timeout_s: float

    def waits(self) -> bool:
        """Does a put wait for replicas now (this broker's role and replication mode)?"""

    def available(self) -> bool:
        """Is there a replica to wait for (else the answer is SLAVE_NOT_AVAILABLE)?"""


#: a put's answer: its status and the remark that goes with it ("" for PUT_OK)
Answer = Callable[[PutMessageStatus, str], None]


class Ticket:
    """What one put, or a group of puts, waits for: decided when it is made
    (``Durability.ticket``), waited on once (``wait``)."""

    __slots__ = (
        "_answer", "_disk_ok", "_durability", "_flush", "_left", "_replicas", "_replicas_ok",
    )  # fmt: skip

    def __init__(
        self, durability: Durability, flush: FlushService | None, replicas: ReplicaGate | None
    ) -> None:
        self._durability = durability
        self._flush = flush
        self._replicas = replicas
        self._answer: Answer | None = None
        self._left = 0
        self._disk_ok = self._replicas_ok = True

    def wait(self, end_offset: int, answer: Answer) -> None:
        """The put(s) appended up to ``end_offset``: ``answer(status, remark)`` once they
        are as safe as the ticket says, or once waiting ran out (exactly once, maybe at
        once). A put that stored nothing drops its ticket instead."""
        if self._answer is not None:
            raise RuntimeError("a durability ticket is waited on once")
        self._answer = answer
        durability, flush, replicas = self._durability, self._flush, self._replicas
        timeout_s = durability.config.sync_flush_timeout_s
        if replicas is not None and not replicas.available():
            # stored, but no replica to wait for: answered so, after the disk if it must
            if flush is None:
                answer(PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK)
            else:
                flush.notify_flushed(end_offset, self._no_replicas, timeout_s)
            return
        self._left = (flush is not None) + (replicas is not None)
        if replicas is not None:
            durability.replica_acks.notify(end_offset, self._replicas_done, replicas.timeout_s)
        if flush is not None:
            flush.notify_flushed(end_offset, self._disk_done, timeout_s)

    async def result(self, end_offset: int) -> tuple[PutMessageStatus, str]:
        """``wait``, awaited: the status and remark."""
        answered = trio.Event()
        outcome: list[tuple[PutMessageStatus, str]] = []

        def answer(status: PutMessageStatus, remark: str) -> None:
            outcome.append((status, remark))
            answered.set()

        self.wait(end_offset, answer)
        await answered.wait()
        return outcome[0]

    def _no_replicas(self, _disk_ok: bool) -> None:
        assert self._answer is not None
        self._answer(PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK)

    def _disk_done(self, ok: bool) -> None:
        self._disk_ok = ok
        self._one_done()

    def _replicas_done(self, ok: bool) -> None:
        self._replicas_ok = ok
        self._one_done()

    def _one_done(self) -> None:
        self._left -= 1
        if self._left == 0:
            assert self._answer is not None
            self._answer(*self.status())

    def status(self) -> tuple[PutMessageStatus, str]:
        """The answer once both waits are over: the replicas' status wins over the disk's."""
        if not self._replicas_ok:
            assert self._replicas is not None
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT, replica_timeout_remark(
                self._replicas.timeout_s
            )
        if not self._disk_ok:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT, flush_timeout_remark(
                self._durability.config.sync_flush_timeout_s
            )
        return PutMessageStatus.PUT_OK, ""


class Durability:
    """The store's side of a put's answer: what it waits for, and what it says."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.sync_flush = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        #: the group commit (set once the store runs)
        self.flush: FlushService | None = None
        #: who else must have a message before it counts (None: nobody, as on a slave)
        self.replicas: ReplicaGate | None = None
        #: puts waiting for the replicas' acks (``replicated`` moves them on)
        self.replica_acks = OffsetWaiters()

    def ticket(self, wait_store_ok: bool) -> Ticket | None:
        """What a put of a message with this WAIT (``wait_store_ok``) will wait for: None
        when it is PUT_OK as soon as it is appended. Asked before the put (a caller that
        must hold a place for the answer holds it first)."""
        if not wait_store_ok:
            return None
        flush = self.flush if self.sync_flush else None
        replicas = self.replicas
        if replicas is not None and not replicas.waits():
            replicas = None
        if flush is None and replicas is None:
            return None
        return Ticket(self, flush, replicas)

    # ------------------------------------------------------------------ the HA side reports
    def replicated(self, offset: int) -> None:
        """The replicas a put waits for have everything below ``offset``."""
        self.replica_acks.reached(offset)

    @property
    def replicated_offset(self) -> int:
        """What the replicas a put waits for have (-1: nothing known)."""
        return self.replica_acks.reached_offset

    @property
    def waiting_for_replicas(self) -> int:
        """How many puts wait for the replicas now."""
        return self.replica_acks.waiting

    def abandon_replica_waits(self) -> int:
        """Answer every put waiting for replicas now as not replicated (its status is
        FLUSH_SLAVE_TIMEOUT): no ack can make it safe any more. Returns how many waited."""
        return self.replica_acks.give_up()
