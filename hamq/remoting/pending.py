"""Our requests waiting for their responses, and their deadlines: what ``Connection.invoke``
keeps per request instead of a cancel scope (hamq/remoting/connection.py).

A ``Pending`` is one request's wait: the response or the error that ends it, and the
event that wakes its caller. ``RequestDeadlines`` holds the deadlines of the waits that
are not over yet (sans-IO: times are passed in), and ``expire`` is the connection's
expiry task: asleep until the earliest deadline, it ends the waits that ran out (their
callers raise RemotingTimeoutError).

Requests mostly come with the same timeout, so their deadlines come in order: they go
to a deque, its head the earliest. One whose deadline is before the last one's (a
shorter timeout) goes to a heap instead. A wait that ended (``settled``) stays where it
is until it reaches the head, and ``drop_settled`` takes it off there: no search per
response, and what is kept is the requests in flight plus those answered after a slower
one still waiting.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from collections.abc import Callable

from hamq.protocol import RemotingCommand
from hamq.remoting.loop import EventLike, LoopPrimitives


class Pending:
    """One request waiting for its response."""

    __slots__ = ("deadline", "done", "error", "response", "settled")

    def __init__(self, event: Callable[[], EventLike]) -> None:
        self.done = event()
        self.response: RemotingCommand | None = None
        self.error: Exception | None = None
        #: when the wait times out (``RequestDeadlines``), inf: never
        self.deadline = math.inf
        #: the wait is over (answered, failed, timed out, or its caller gave up)
        self.settled = False


class RequestDeadlines:
    """The deadlines of the waits not over yet, earliest first."""

    def __init__(self) -> None:
        self._in_order: collections.deque[Pending] = collections.deque()
        self._out_of_order: list[tuple[float, int, Pending]] = []
        self._sequence = itertools.count()
        self._wakeup: EventLike | None = None
        #: is the expiry task running (else a wait must time itself out)
        self.expiring = False

    def __len__(self) -> int:
        return len(self._in_order) + len(self._out_of_order)

    def add(self, pending: Pending, deadline: float) -> None:
        """Keep ``pending``'s deadline (the expiry task looks again if it is the earliest)."""
        pending.deadline = deadline
        in_order = self._in_order
        if not in_order or deadline >= in_order[-1].deadline:
            in_order.append(pending)
        else:
            heapq.heappush(self._out_of_order, (deadline, next(self._sequence), pending))
        if deadline <= self.earliest() and self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def expire(self, loop: LoopPrimitives) -> None:
        """The expiry task: end the waits whose deadline passed, asleep until the
        earliest one (one task per connection instead of a cancel scope per request)."""
        self.expiring = True
        try:
            while True:
                now = loop.current_time()
                for pending in self.due(now):
                    pending.settled = True
                    pending.done.set()
                self._wakeup = wakeup = loop.event()
                with loop.move_on_after(self.earliest() - now):  # (inf: until woken)
                    await wakeup.wait()
        finally:
            self.expiring = False

    def earliest(self) -> float:
        """The earliest deadline kept (of a wait maybe over already); inf if none is."""
        first = self._in_order[0].deadline if self._in_order else math.inf
        if self._out_of_order and self._out_of_order[0][0] < first:
            return self._out_of_order[0][0]
        return first

    def drop_settled(self) -> None:
        """Forget the waits at the head that are over."""
        in_order, out_of_order = self._in_order, self._out_of_order
        while in_order and in_order[0].settled:
            in_order.popleft()
        while out_of_order and out_of_order[0][2].settled:
            heapq.heappop(out_of_order)

    def due(self, now: float) -> list[Pending]:
        """Take the waits not over yet whose deadline is ``now`` or before (those over
        already are dropped on the way)."""
        due: list[Pending] = []
        in_order, out_of_order = self._in_order, self._out_of_order
        while in_order and (in_order[0].settled or in_order[0].deadline <= now):
            pending = in_order.popleft()
            if not pending.settled:
                due.append(pending)
        while out_of_order and (out_of_order[0][2].settled or out_of_order[0][0] <= now):
            pending = heapq.heappop(out_of_order)[2]
            if not pending.settled:
                due.append(pending)
        return due
