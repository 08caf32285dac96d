"""The replicas' half of a send's durability wait: who a put waits for, and their acks.

The store decides when a put is answered (hamq/store/durability.py); this module is the
``ReplicaWaiter`` the broker injects into it, and decides everything replication adds:

- whether a put waits for replicas, by its ``ReplicaPolicy`` (``policy_for``; the
  broker's role sets it, hamq/broker/roles.py): NONE on an ASYNC_MASTER and on a
  slave; ONE_SLAVE on a SYNC_MASTER — one slave's ack, and SLAVE_NOT_AVAILABLE at once
  when no slave is in sync (connected, and less than ``max_gap_not_in_sync_bytes``
  behind: RocketMQ's isSlaveOK); SYNC_STATE_SET in controller mode with
  allAckInSyncStateSet — every other member of the SyncStateSet (and every joining
  slave) must ack, and with no other member a put waits for none (the controllers
  keep the set to who is in sync, so there is always someone to wait for);
- what counts as acked: ONE_SLAVE the best admitted slave's ack, SYNC_STATE_SET the
  least of the members' (each ack at most what was sent on that connection: master.py);
- how long a put waits: ``[ha] sync_timeout_s``, then FLUSH_SLAVE_TIMEOUT.

Waiting (``AckWaiters``), one bookkeeping, no task per put, no polling:
- ``notify(offset, callback, timeout_s)``: ``callback(True)`` when an ack passes
  ``offset``, ``callback(False)`` when the timeout passes first. Timeouts are kept in a
  deque — every send waits the same ``sync_timeout_s``, so deadlines come in order —
  and ``run`` expires them;
- ``acked(offset)`` — on every slave report — takes every waiter at or below ``offset``
  off the heap, in order.
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
import logging
from collections.abc import Callable, Iterable

import trio

from hamq.store import BrokerRole

log = logging.getLogger(__name__)


class _Waiter:
    __slots__ = ("callback", "deadline", "done", "offset")

    def __init__(self, offset: int, callback: Callable[[bool], None], deadline: float) -> None:
        self.offset = offset
        self.callback = callback
        self.deadline = deadline
        self.done = False

    def finish(self, acked: bool) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.callback(acked)
        except Exception:
            log.exception("a replication waiter failed")


class AckWaiters:
    def __init__(self) -> None:
        self.acked_offset = -1
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._deadlines: collections.deque[_Waiter] = collections.deque()
        self._sequence = itertools.count()
        self._new_deadline = trio.Event()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._deadlines if not w.done)

    def acked(self, offset: int) -> None:
        """A replica has everything below ``offset``."""
        if offset <= self.acked_offset:
            return
        self.acked_offset = offset
        heap = self._heap
        while heap and heap[0][0] <= offset:
            heapq.heappop(heap)[2].finish(True)

    def notify(
        self, offset: int, callback: Callable[[bool], None], timeout_s: float
    ) -> _Waiter | None:
        """``callback(True)`` once a replica acks ``offset``, ``callback(False)`` after
        ``timeout_s``; at once if it is acked already (None is returned then)."""
        if self.acked_offset >= offset:
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


class ReplicaPolicy(enum.Enum):
    """Who a put waits for (set by the broker's role, hamq/broker/roles.py)."""

    #: nobody: an ASYNC_MASTER, or a slave
    NONE = "none"
    #: one in-sync slave: a SYNC_MASTER
    ONE_SLAVE = "one slave"
    #: every other member of the SyncStateSet: controller mode with allAckInSyncStateSet
    SYNC_STATE_SET = "SyncStateSet"


def policy_for(master_role: BrokerRole, *, all_ack_in_sync_state_set: bool) -> ReplicaPolicy:
    """Who a master's puts wait for: its SyncStateSet (controller mode's
    allAckInSyncStateSet), one slave (a SYNC_MASTER), or nobody (an ASYNC_MASTER)."""
    if all_ack_in_sync_state_set:
        return ReplicaPolicy.SYNC_STATE_SET
    if master_role is BrokerRole.SYNC_MASTER:
        return ReplicaPolicy.ONE_SLAVE
    return ReplicaPolicy.NONE


class GroupTransfer:
    """The store's ``ReplicaWaiter`` (hamq/store/durability.py) on a master.

    ``in_sync()`` says whether an admitted slave is in sync; ``acked_upto()`` gives
    (broker id, what counts of its acks) for every admitted slave; ``end()`` is the
    log's end. The HA service (master.py) provides the three."""

    def __init__(
        self,
        timeout_s: float,
        *,
        in_sync: Callable[[], bool],
        acked_upto: Callable[[], Iterable[tuple[int, int]]],
        end: Callable[[], int],
    ) -> None:
        self.timeout_s = timeout_s
        self.acks = AckWaiters()
        self.policy = ReplicaPolicy.NONE
        #: SYNC_STATE_SET: the members other than this broker that must ack
        self.must_ack: frozenset[int] = frozenset()
        self._in_sync = in_sync
        self._acked_upto = acked_upto
        self._end = end

    def set_policy(
        self, policy: ReplicaPolicy, members: frozenset[int] = frozenset(), self_id: int = 0
    ) -> None:
        """Puts wait for ``policy``'s replicas from now on (``members`` but ``self_id``:
        the SyncStateSet and the slaves joining it, for SYNC_STATE_SET)."""
        self.policy = policy
        self.must_ack = (
            members - {self_id} if policy is ReplicaPolicy.SYNC_STATE_SET else frozenset()
        )
        self.acks.acked(self.replicated_offset())

    # ------------------------------------------------------------------ ReplicaWaiter
    def waits(self) -> bool:
        policy = self.policy
        if policy is ReplicaPolicy.ONE_SLAVE:
            return True
        return policy is ReplicaPolicy.SYNC_STATE_SET and bool(self.must_ack)

    def available(self) -> bool:
        return self.policy is ReplicaPolicy.SYNC_STATE_SET or self._in_sync()

    def notify(self, end_offset: int, callback: Callable[[bool], None]) -> None:
        self.acks.notify(end_offset, callback, self.timeout_s)

    # ------------------------------------------------------------------ acks
    def slave_acked(self, offset: int) -> None:
        """A slave's ack now counts up to ``offset``: wake the puts it covers (with a
        SyncStateSet, the ones every member's acks cover)."""
        if self.policy is ReplicaPolicy.SYNC_STATE_SET:
            offset = self.replicated_offset()
        self.acks.acked(offset)

    def replicated_offset(self) -> int:
        """SYNC_STATE_SET: what every member that must ack has (-1 if one has nothing of
        this master's; the log's end if none must); else the best slave's ack."""
        if self.policy is not ReplicaPolicy.SYNC_STATE_SET:
            return max((acked for _id, acked in self._acked_upto()), default=-1)
        if not self.must_ack:
            return self._end()
        acked: dict[int, int] = {}
        for broker_id, upto in self._acked_upto():
            acked[broker_id] = max(acked.get(broker_id, -1), upto)
        return min(acked.get(member, -1) for member in self.must_ack)
