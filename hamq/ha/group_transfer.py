"""The replicas' half of a send's durability wait: who a put waits for, and their acks.

The store decides when a put is answered (hamq/store/durability.py); this module is the
``ReplicaGate`` the broker injects into it, and decides everything replication adds:

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
- how long a put waits: ``[ha] sync_timeout_s``, then FLUSH_SLAVE_TIMEOUT (or less:
  the broker's role abandons the waits when it stops being master or loses its
  controller lease, hamq/broker/roles.py).

The waiting itself is the store's (durability.py): every slave report that moves what
counts as acked is reported into it (``replicated``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

from hamq.store import BrokerRole


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


def slave_ok(*, transferring: bool, ack_offset: int, log_end: int, max_gap: int) -> bool:
    """Is a slave in sync (RocketMQ's isSlaveOK): receiving the log (TRANSFER), it has
    acked something, and it is less than ``max_gap`` (``max_gap_not_in_sync_bytes``)
    behind the log's end. A SYNC_MASTER's put waits only if one is."""
    return transferring and ack_offset >= 0 and log_end - ack_offset < max_gap


class GroupTransfer:
    """The store's ``ReplicaGate`` (hamq/store/durability.py) on a master.

    ``in_sync()`` says whether an admitted slave is in sync; ``acked_upto()`` gives
    (broker id, what counts of its acks) for every admitted slave; ``end()`` is the
    log's end. The HA service (master.py) provides the three. ``replicated(offset)``
    reports to the store that the replicas a put waits for have everything below
    ``offset``."""

    def __init__(
        self,
        timeout_s: float,
        *,
        in_sync: Callable[[], bool],
        acked_upto: Callable[[], Iterable[tuple[int, int]]],
        end: Callable[[], int],
        replicated: Callable[[int], None],
    ) -> None:
        self.timeout_s = timeout_s
        self.policy = ReplicaPolicy.NONE
        #: SYNC_STATE_SET: the members other than this broker that must ack
        self.must_ack: frozenset[int] = frozenset()
        self._in_sync = in_sync
        self._acked_upto = acked_upto
        self._end = end
        self._replicated = replicated

    def set_policy(
        self, policy: ReplicaPolicy, members: frozenset[int] = frozenset(), self_id: int = 0
    ) -> None:
        """Puts wait for ``policy``'s replicas from now on (``members`` but ``self_id``:
        the SyncStateSet and the slaves joining it, for SYNC_STATE_SET)."""
        self.policy = policy
        self.must_ack = (
            members - {self_id} if policy is ReplicaPolicy.SYNC_STATE_SET else frozenset()
        )
        self._replicated(self.replicated_offset())

    # ------------------------------------------------------------------ ReplicaGate
    def waits(self) -> bool:
        policy = self.policy
        if policy is ReplicaPolicy.ONE_SLAVE:
            return True
        return policy is ReplicaPolicy.SYNC_STATE_SET and bool(self.must_ack)

    def available(self) -> bool:
        return self.policy is ReplicaPolicy.SYNC_STATE_SET or self._in_sync()

    # ------------------------------------------------------------------ acks
    def slave_acked(self, offset: int) -> None:
        """A slave's ack now counts up to ``offset``: wake the puts it covers (with a
        SyncStateSet, the ones every member's acks cover)."""
        if self.policy is ReplicaPolicy.SYNC_STATE_SET:
            offset = self.replicated_offset()
        self._replicated(offset)

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
