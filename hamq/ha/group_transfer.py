"""Waiting for replicas: a SYNC_MASTER send is answered once a slave acks past its end.

Two ways to wait, one bookkeeping:
- ``notify(offset, callback, timeout_s)``: no task at all; ``callback(True)`` runs
  when an ack passes ``offset``, ``callback(False)`` when the timeout passes first
  (the send path answers from the callback). Timeouts are kept in a deque — every
  send waits the same ``sync_timeout_s``, so deadlines come in order — and ``run``
  expires them.
- ``await wait(offset, timeout_s)``: the same, for a task.
``acked(offset)`` — called by the master for every slave report — takes every waiter
at or below ``offset`` off the heap, in order. No polling anywhere.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
from collections.abc import Callable

import trio

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

    async def wait(self, offset: int, timeout_s: float) -> bool:
        """True once a replica acks ``offset`` (the end of a message); False on timeout
        (its own scope; ``run`` need not be running)."""
        if self.acked_offset >= offset:
            return True
        result: list[bool] = []
        event = trio.Event()

        def done(acked: bool) -> None:
            result.append(acked)
            event.set()

        waiter = self.notify(offset, done, timeout_s)
        with trio.move_on_after(timeout_s):
            await event.wait()
        if waiter is not None and not waiter.done:
            waiter.done = True  # gave up (or was cancelled): skipped from now on
        return bool(result and result[0])

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
