"""Waiting for replicas: a SYNC_MASTER send waits until a slave acks past its end.

Waiters are kept in a heap by the offset they need; ``acked(offset)`` — called by the
master's reader task for every slave report — wakes every waiter at or below it. No
polling: a waiter sleeps on its own Event until it is woken or its timeout passes.
"""

from __future__ import annotations

import heapq
import itertools

import trio


class AckWaiters:
    def __init__(self) -> None:
        self.acked_offset = -1
        self._heap: list[tuple[int, int, trio.Event]] = []
        self._sequence = itertools.count()

    def acked(self, offset: int) -> None:
        """A replica has everything below ``offset``."""
        if offset <= self.acked_offset:
            return
        self.acked_offset = offset
        heap = self._heap
        while heap and heap[0][0] <= offset:
            heapq.heappop(heap)[2].set()

    async def wait(self, offset: int, timeout_s: float) -> bool:
        """True once a replica acks ``offset`` (the end of a message); False on timeout."""
        if self.acked_offset >= offset:
            return True
        event = trio.Event()
        heapq.heappush(self._heap, (offset, next(self._sequence), event))
        with trio.move_on_after(timeout_s):
            await event.wait()
        if not event.is_set():
            self._heap = [w for w in self._heap if w[2] is not event]
            heapq.heapify(self._heap)
            return False
        return True

    @property
    def waiting(self) -> int:
        return len(self._heap)
