"""Long polling: pulls that found nothing wait for a message instead of returning empty.

A PULL_MESSAGE with the suspend flag that finds no new message is not answered at
once: its Responder is held here, keyed by (topic, queue id), until
- a message is dispatched to that queue at or past the pull's offset: the pull is
  run again and answered with what it finds, or
- its deadline passes (the request's ``suspendTimeoutMillis``, capped by
  ``long_polling_max_s``): it is run again and answered, normally with PULL_NOT_FOUND.
Holds whose connection closed are dropped. One task serves every hold; arrivals come
from the store's dispatch listener, which only marks the queue.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable

import attrs
import trio

from hamq.protocol import RemotingCommand
from hamq.remoting import Connection, Responder
from hamq.store import DispatchRequest

log = logging.getLogger(__name__)

#: run a held pull again without suspending: (request, connection) -> the answer
Execute = Callable[[RemotingCommand, Connection], RemotingCommand]


@attrs.define(eq=False)
class HeldPull:
    responder: Responder
    topic: str
    queue_id: int
    offset: int
    deadline: float


class PullHoldService:
    def __init__(self, execute: Execute) -> None:
        self._execute = execute
        self._held: dict[tuple[str, int], list[HeldPull]] = {}
        self._deadlines: list[tuple[float, int, HeldPull]] = []
        self._sequence = itertools.count()
        self._arrived: set[tuple[str, int]] = set()
        self._wakeup = trio.Event()
        self.answered_on_arrival = 0
        self.answered_on_timeout = 0

    @property
    def held(self) -> int:
        return sum(len(h) for h in self._held.values())

    def hold(
        self, responder: Responder, topic: str, queue_id: int, offset: int, wait_s: float
    ) -> None:
        deadline = trio.current_time() + wait_s
        pull = HeldPull(responder, topic, queue_id, offset, deadline)
        self._held.setdefault((topic, queue_id), []).append(pull)
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), pull))
        self._wakeup.set()

    def on_dispatch(self, request: DispatchRequest) -> None:
        """Store dispatch listener: a message reached (topic, queue id)."""
        key = (request.topic, request.queue_id)
        if key in self._held:
            self._arrived.add(key)
            self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                self._wakeup = trio.Event()
                self._answer_arrivals()
                self._answer_expired()
                self._drop_answered()
                if self._deadlines:
                    with trio.move_on_at(self._deadlines[0][0]):
                        await self._wakeup.wait()
                else:
                    await self._wakeup.wait()
        finally:
            # shutting down: nobody will answer these any more
            for pulls in self._held.values():
                for pull in pulls:
                    pull.responder.discard()

    def _answer(self, pull: HeldPull) -> None:
        if pull.responder.done:
            return
        try:
            response = self._execute(pull.responder.request, pull.responder.connection)
        except Exception as exc:
            log.exception("a held pull failed")
            response = pull.responder.request.response_to(1, f"{type(exc).__name__}: {exc}")
        pull.responder.send(response)

    def _answer_arrivals(self) -> None:
        arrived, self._arrived = self._arrived, set()
        for key in arrived:
            pulls = self._held.pop(key, [])
            for pull in pulls:
                self._answer(pull)
                self.answered_on_arrival += 1

    def _answer_expired(self) -> None:
        now = trio.current_time()
        while self._deadlines and self._deadlines[0][0] <= now:
            _deadline, _seq, pull = heapq.heappop(self._deadlines)
            if not pull.responder.done:
                self._answer(pull)
                self.answered_on_timeout += 1

    def _drop_answered(self) -> None:
        for key in list(self._held):
            pulls = [
                p
                for p in self._held[key]
                if not p.responder.done and not p.responder.connection.closed
            ]
            if pulls:
                self._held[key] = pulls
            else:
                del self._held[key]
        while self._deadlines and (
            self._deadlines[0][2].responder.done
            or self._deadlines[0][2].responder.connection.closed
        ):
            heapq.heappop(self._deadlines)
