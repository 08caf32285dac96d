"""Who belongs in a controller-mode master's SyncStateSet: pure decisions, time passed in.

The SyncStateSet holds the replicas that have every message the master acknowledged;
the controllers elect a new master only from it, and with allAckInSyncStateSet a send
is SEND_OK only once every member has it (group_transfer.py). So a member that stops
acking holds every send until it leaves, and a slave that joins must not miss one.

**Behind** (``AckClock``): how long ago the oldest byte the master handed the kernel
for a slave, and the slave has not acked, was sent (0 when it has acked everything
sent to it). It is measured per connection from marks (end offset, time) taken as the
kernel takes the bytes: a slave that stopped acking (cut off, stopped, hung) is behind
by the time since it stopped, however busy or idle the log is; a healthy slave under
load is behind by a round trip. (Bytes not yet sent do not count: a slave whose socket
the kernel stopped taking bytes for has unacked ones in it, which do.)

**The rules** (``SyncStateSetKeeper.decide``), with ``max_behind_s`` the broker's
``ha_max_time_slave_not_catchup_s``:

- a member stays while its connection is behind by at most ``max_behind_s``, or while it
  has had no connection for at most ``max_behind_s`` (a slave restarting);
- a slave not in the set first *joins*: from then on sends wait for it too (the caller
  adds the joining ones to who must ack), and it is wanted in the set once it has acked
  everything up to the log's end when it joined — so a member has every acknowledged
  message. It may start to join only when it is connected, has reported *since it last
  left* the set or a join (a slave that went silent is not taken back on its old ack),
  is behind by at most ``max_behind_s``, within ``join_lag_bytes`` of the log's end, and
  its back-off has passed;
- a join that has not reached its offset within ``max_behind_s`` (or whose slave falls
  behind, or goes) is given up: sends stop waiting for it, and the slave may try again
  after a back-off that starts at ``max_behind_s`` and doubles, up to
  ``JOIN_BACKOFF_MAX_S``, until a join succeeds. A slow slave thus holds sends for at
  most ``max_behind_s`` per back-off, never for good.

The keeper only decides; replicas.py (hamq/broker) asks the controllers to change the
set and tells the HA service who must ack.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import attrs

#: marks closer together than this are merged (the merged bytes count as sent at the
#: first one's time: a slave looks behind by at most this much more than it is)
MARK_MERGE_S = 0.05
#: at most this many marks per connection (beyond, new bytes join the newest mark)
MAX_MARKS = 4096
#: the longest a slave whose joins keep failing waits before it may try again
JOIN_BACKOFF_MAX_S = 60.0


class AckClock:
    """When the bytes sent to one slave left, and which of them it has not acked."""

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        #: [end offset, when the kernel took bytes up to it], oldest first, all unacked
        self._marks: collections.deque[list[float]] = collections.deque()

    def sent(self, end: int, now: float) -> None:
        """The kernel took this slave's bytes up to ``end`` at ``now``."""
        marks = self._marks
        if marks and (now - marks[-1][1] < MARK_MERGE_S or len(marks) >= MAX_MARKS):
            marks[-1][0] = max(marks[-1][0], end)
        else:
            marks.append([end, now])

    def acked(self, upto: int) -> None:
        """The slave's acks count up to ``upto``."""
        marks = self._marks
        while marks and marks[0][0] <= upto:
            marks.popleft()

    def behind_s(self, now: float) -> float:
        """How long ago its oldest unacked byte was sent (0.0: it has acked all)."""
        return max(0.0, now - self._marks[0][1]) if self._marks else 0.0


@attrs.frozen
class SlaveFacts:
    """What the keeper needs to know of one connected slave (its newest connection)."""

    #: what counts of its acks (-1: nothing yet)
    acked_upto: int
    #: AckClock.behind_s
    behind_s: float
    #: when it last reported (-inf: not yet)
    last_report: float = -math.inf


@attrs.frozen
class Decision:
    #: the set this master wants (itself included); the caller asks the controllers
    #: for it when it differs from theirs
    wanted: frozenset[int]
    #: slaves joining: sends wait for them as for members
    joining: frozenset[int]


@attrs.define
class _Join:
    #: the log's end when it started: it joins once it has acked up to here
    offset: int
    started: float


class SyncStateSetKeeper:
    """The set a master wants, from its slaves' facts (the module doc has the rules).
    One per broker; ``reset`` when it stops or starts being master."""

    def __init__(self, max_behind_s: float, join_lag_bytes: int) -> None:
        self.max_behind_s = max_behind_s
        self.join_lag_bytes = join_lag_bytes
        self._joining: dict[int, _Join] = {}
        #: broker id -> when it last left the set or a join (it must report after that)
        self._left: dict[int, float] = {}
        #: broker id -> when a member's connection went away
        self._gone_since: dict[int, float] = {}
        #: broker id -> (no join before, the next back-off)
        self._backoff: dict[int, tuple[float, float]] = {}

    @property
    def joining(self) -> frozenset[int]:
        return frozenset(self._joining)

    def reset(self) -> None:
        """Forget everything (this broker's role changed)."""
        self._joining.clear()
        self._left.clear()
        self._gone_since.clear()
        self._backoff.clear()

    def adopted(self, members: frozenset[int]) -> None:
        """The controllers' set is ``members``: the joining ones in it have joined."""
        for member in members:
            if self._joining.pop(member, None) is not None:
                self._backoff.pop(member, None)

    def decide(
        self,
        self_id: int,
        members: frozenset[int],
        slaves: Mapping[int, SlaveFacts],
        log_end: int,
        now: float,
    ) -> Decision:
        """The set wanted now, and who is joining (both may change ``self``'s state:
        joins started, given up). ``members``: the controllers' set; ``slaves``: the
        connected slaves (in TRANSFER) by broker id; ``log_end``: the log's end."""
        limit = self.max_behind_s
        wanted = {self_id}
        for member in members - {self_id}:
            facts = slaves.get(member)
            if facts is None:
                since = self._gone_since.setdefault(member, now)
                keep = now - since <= limit
            else:
                self._gone_since.pop(member, None)
                keep = facts.behind_s <= limit
            if keep:
                wanted.add(member)
            else:
                self._left.setdefault(member, now)
        for broker_id in list(self._gone_since):
            if broker_id not in members:
                del self._gone_since[broker_id]
        for broker_id, facts in slaves.items():
            if broker_id in members or broker_id == self_id:
                if broker_id in wanted:
                    self._left.pop(broker_id, None)
                continue
            join = self._joining.get(broker_id)
            if join is None:
                if self._may_join(broker_id, facts, log_end, now):
                    self._joining[broker_id] = _Join(log_end, now)
            elif facts.behind_s > limit:
                self._give_up(broker_id, now)
            elif facts.acked_upto >= join.offset:
                wanted.add(broker_id)  # (joining until the controllers' set has it)
            elif now - join.started > limit:
                self._give_up(broker_id, now)
        for broker_id in list(self._joining):
            if broker_id not in slaves:
                del self._joining[broker_id]
                self._left[broker_id] = now
        return Decision(frozenset(wanted), frozenset(self._joining))

    def _may_join(self, broker_id: int, facts: SlaveFacts, log_end: int, now: float) -> bool:
        return (
            facts.last_report > self._left.get(broker_id, -math.inf)
            and facts.behind_s <= self.max_behind_s
            and facts.acked_upto >= 0
            and log_end - facts.acked_upto <= self.join_lag_bytes
            and now >= self._backoff.get(broker_id, (-math.inf, 0.0))[0]
        )

    def _give_up(self, broker_id: int, now: float) -> None:
        del self._joining[broker_id]
        self._left[broker_id] = now
        _, backoff = self._backoff.get(broker_id, (0.0, self.max_behind_s))
        self._backoff[broker_id] = (now + backoff, min(backoff * 2, JOIN_BACKOFF_MAX_S))
