"""When a stored message counts as safe: a send's durability wait, decided here only.

This is RocketMQ's ``handleDiskFlushAndHA``. Once a put has appended its message(s),
the answer waits — unless the message's WAIT property is "false" — for:

- the disk, with SYNC_FLUSH: the group-commit fsync that covers the message's end
  (flush.py), for at most ``[store] sync_flush_timeout_s``: else FLUSH_DISK_TIMEOUT;
- the replicas, when the injected ``ReplicaWaiter`` says a put waits for them now
  (hamq/ha/group_transfer.py decides who: a SYNC_MASTER one in-sync slave, a
  controller-mode master with allAckInSyncStateSet every other member of its
  SyncStateSet). With none to wait for the answer is SLAVE_NOT_AVAILABLE at once;
  otherwise an ack past the message's end within the replicas' timeout, else
  FLUSH_SLAVE_TIMEOUT.

Both waits run at once, and the replicas' status wins over the disk's (RocketMQ's
``thenCombine``): SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT, then FLUSH_DISK_TIMEOUT,
then PUT_OK. The message is stored in every case — the status says what is not yet
certain, and the remark (one wording for each, below) says so. A replicas' status says
the message is on this master only: it reaches the slaves later if this broker stays
master, but a broker elected master before it has the message does not have it, and
this one truncates its log to the new master's when it follows it — the message is then
gone (a producer that needs it sends it again).

No task per put: both waits are callbacks, called by the flush round or the ack that
covers the message, or by the timer of the deadline queue each side keeps (both sides
keep their waiters in an ``OffsetWaiters``, below). The
store never imports replication: the broker hands it a ``ReplicaWaiter``.
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from hamq.store.config import FlushDiskType, StoreConfig

if TYPE_CHECKING:
    from hamq.store.flush import FlushService

log = logging.getLogger(__name__)


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


class ReplicaWaiter(Protocol):
    """Who a put waits for besides the disk (implemented by hamq/ha/group_transfer.py)."""

    #: how long a put waits for the replicas' ack
    timeout_s: float

    def waits(self) -> bool:
        """Does a put wait for replicas now (this broker's role and replication mode)?"""

    def available(self) -> bool:
        """Is there a replica to wait for (else the answer is SLAVE_NOT_AVAILABLE)?"""

    def notify(self, end_offset: int, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once the replicas have everything below ``end_offset``,
        ``callback(False)`` after ``timeout_s``."""


#: a put's answer: its status and the remark that goes with it ("" for PUT_OK)
Answer = Callable[[PutMessageStatus, str], None]


class _Waiter:
    __slots__ = ("callback", "deadline", "done", "offset")

    def __init__(self, offset: int, callback: Callable[[bool], None], deadline: float) -> None:
        self.offset = offset
        self.callback = callback
        self.deadline = deadline
        self.done = False

    def finish(self, reached: bool) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.callback(reached)
        except Exception:
            log.exception("a durability waiter failed")


class OffsetWaiters:
    """Puts waiting for an offset to be reached — by the fsync (flush.py) or by the
    replicas' acks (hamq/ha/group_transfer.py) — each with a timeout.

    ``notify(offset, callback, timeout_s)``: ``callback(True)`` once ``reached`` passes
    ``offset`` (at once if it has), ``callback(False)`` when the timeout passes first.
    Waiters sit on a heap by offset, so ``reached`` takes them off in order; timeouts
    are kept in a deque — every put waits the same timeout, so deadlines come in order
    — and ``run`` expires them. No task per waiter, no polling."""

    def __init__(self) -> None:
        #: everything below this offset is reached (-1: nothing yet)
        self.reached_offset = -1
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._deadlines: collections.deque[_Waiter] = collections.deque()
        self._sequence = itertools.count()
        self._new_deadline = trio.Event()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._deadlines if not w.done)

    @property
    def pending(self) -> bool:
        """Is anyone still waiting (or a finished waiter not yet dropped)?"""
        return bool(self._heap)

    def reached(self, offset: int) -> None:
        """Everything below ``offset`` is there: answer who waited for it."""
        if offset <= self.reached_offset:
            return
        self.reached_offset = offset
        heap = self._heap
        while heap and (heap[0][0] <= offset or heap[0][2].done):
            heapq.heappop(heap)[2].finish(True)

    def give_up(self) -> int:
        """Answer every waiter now as not reached (``callback(False)``): what they wait
        for can no longer count (the replicas' acks of a broker that stopped being master,
        or lost its lease). Returns how many were waiting."""
        heap, self._heap = self._heap, []
        waiting = [waiter for _, _, waiter in heap if not waiter.done]
        for waiter in waiting:
            waiter.finish(False)
        return len(waiting)

    def reset(self, offset: int) -> None:
        """After a truncation: nothing from ``offset`` on is reached any more."""
        self.reached_offset = min(self.reached_offset, offset)

    def notify(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> _Waiter | None:
        """``callback(True)`` once ``offset`` is reached, ``callback(False)`` after
        ``timeout_s``; at once if it is reached already (None is returned then)."""
        if self.reached_offset >= offset:
            callback(True)
            return None
        waiter = _Waiter(offset, callback, trio.current_time() + timeout_s)
        heapq.heappush(self._heap, (offset, next(self._sequence), waiter))
        if self._deadlines and waiter.deadline < self._deadlines[-1].deadline:
            # a shorter timeout than the ones before it: keep the deque in order
            self._deadlines.append(waiter)
            self._deadlines = collections.deque(sorted(self._deadlines, key=lambda w: w.deadline))
        else:
            self._deadlines.append(waiter)
        if len(self._deadlines) == 1:
            self._new_deadline.set()
        return waiter

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Expire waiters whose timeout passed, and drop finished ones."""
        task_status.started()
        while True:
            while self._deadlines and self._deadlines[0].done:
                self._deadlines.popleft()
            if not self._deadlines:
                self._new_deadline = trio.Event()
                await self._new_deadline.wait()
                continue
            first = self._deadlines[0]
            await trio.sleep_until(first.deadline)
            now = trio.current_time()
            while self._deadlines and self._deadlines[0].deadline <= now:
                self._deadlines.popleft().finish(False)
            if len(self._heap) > 2 * len(self._deadlines) + 1024:
                self._heap = [w for w in self._heap if not w[2].done]
                heapq.heapify(self._heap)


class _Pending:
    """One put waiting for its disk and/or replicas: answers once both are known."""

    __slots__ = ("answer", "disk_ok", "durability", "left", "replicas_ok")

    def __init__(self, durability: Durability, answer: Answer, left: int) -> None:
        self.durability = durability
        self.answer = answer
        self.left = left
        self.disk_ok = True
        self.replicas_ok = True

    def disk(self, ok: bool) -> None:
        self.disk_ok = ok
        self._one_done()

    def replicas(self, ok: bool) -> None:
        self.replicas_ok = ok
        self._one_done()

    def _one_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.answer(*self.durability.status(disk_ok=self.disk_ok, replicas_ok=self.replicas_ok))


class Durability:
    """The store's side of a put's answer: what it waits for, and what it says."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.sync_flush = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        #: the group commit (set once the store runs)
        self.flush: FlushService | None = None
        #: who else must have a message before it counts (None: nobody, as on a slave)
        self.replicas: ReplicaWaiter | None = None

    def waits(self, wait_store_ok: bool) -> bool:
        """Will a put of a message with this WAIT (``wait_store_ok``) wait at all? (A
        caller that must hold a place for the answer asks before it puts.)"""
        if not wait_store_ok:
            return False
        return self.sync_flush or (self.replicas is not None and self.replicas.waits())

    def wait(self, end_offset: int, wait_store_ok: bool, answer: Answer) -> bool:
        """After a put appended up to ``end_offset``: call ``answer(status, remark)`` once
        it is as safe as configured, or once waiting ran out. False (and ``answer`` is
        never called) when there is nothing to wait for: the put is PUT_OK now."""
        if not wait_store_ok:
            return False
        flush = self.flush if self.sync_flush else None
        replicas = self.replicas if self.replicas is not None and self.replicas.waits() else None
        if flush is None and replicas is None:
            return False
        if replicas is not None and not replicas.available():
            # stored, but no replica to wait for: answered at once, after the disk if it must
            if flush is None:
                answer(PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK)
            else:
                flush.notify_flushed(
                    end_offset,
                    lambda _ok: answer(
                        PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK
                    ),
                    self.config.sync_flush_timeout_s,
                )
            return True
        pending = _Pending(self, answer, (flush is not None) + (replicas is not None))
        if replicas is not None:
            replicas.notify(end_offset, pending.replicas)
        if flush is not None:
            flush.notify_flushed(end_offset, pending.disk, self.config.sync_flush_timeout_s)
        return True

    def status(self, *, disk_ok: bool, replicas_ok: bool) -> tuple[PutMessageStatus, str]:
        """The answer once both waits are over: the replicas' status wins over the disk's."""
        if not replicas_ok:
            assert self.replicas is not None
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT, replica_timeout_remark(
                self.replicas.timeout_s
            )
        if not disk_ok:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT, flush_timeout_remark(
                self.config.sync_flush_timeout_s
            )
        return PutMessageStatus.PUT_OK, ""
