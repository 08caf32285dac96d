"""Puts waiting for an offset to be reached, each with a timeout: the bookkeeping both
halves of a put's durability wait share (hamq/store/durability.py).

The flush (flush.py) moves ``reached`` on after each fsync, the replicas' acks
(hamq/ha/group_transfer.py, through ``Durability.replicated``) after each slave report.
Waiters sit on a heap by offset, so ``reached`` takes them off in order; deadlines sit in a
deque in order, and ``run`` (one task per ``OffsetWaiters``) expires them. No task per
waiter, no polling. Each waiter's callback is called exactly once, True or False.
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
