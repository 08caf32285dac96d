"""Long polling: pulls that found nothing wait for a message instead of returning empty.

A PULL_MESSAGE with the suspend flag that finds no new message is not answered at
once: its Responder is held here, keyed by (topic, queue id), until
- a message the pull would take (at or past its offset, a tag its subscription
  accepts) is dispatched to that queue: the pull is run again and answered with what
  it finds, or
- its deadline passes (the request's ``suspendTimeoutMillis``, capped by
  ``long_polling_max_s``): it is run again and answered, normally with PULL_NOT_FOUND.
Held pulls run again without suspending and without committing their offset again (a
stale commit would move the group back). Holds whose connection closed are dropped
unanswered. One task serves every hold; arrivals come from the store's dispatch
listener, which only notes them.
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
    #: the tag hashes its subscription accepts; None: every tag
    tag_codes: frozenset[int] | None
    deadline: float

    def wants(self, queue_offset: int, tags_code: int) -> bool:
        return queue_offset >= self.offset and (
            self.tag_codes is None or tags_code in self.tag_codes
        )

    @property
    def gone(self) -> bool:
        return self.responder.done or self.responder.connection.closed


class PullHoldService:
    def __init__(self, execute: Execute) -> None:
        self._execute = execute
        self._held: dict[tuple[str, int], list[HeldPull]] = {}
        self._deadlines: list[tuple[float, int, HeldPull]] = []
        self._sequence = itertools.count()
        #: (topic, queue id) -> (queue offset, tags code) of messages that arrived
        self._arrived: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._wakeup = trio.Event()
        self.answered_on_arrival = 0
        self.answered_on_timeout = 0

    @property
    def held(self) -> int:
        return sum(len(h) for h in self._held.values())

    def hold(
        self,
        responder: Responder,
        topic: str,
        queue_id: int,
        offset: int,
        wait_s: float,
        tag_codes: frozenset[int] | None = None,
    ) -> None:
        deadline = trio.current_time() + wait_s
        pull = HeldPull(responder, topic, queue_id, offset, tag_codes, deadline)
        self._held.setdefault((topic, queue_id), []).append(pull)
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), pull))
        self._wakeup.set()

    def on_dispatch(self, request: DispatchRequest) -> None:
        """Store dispatch listener: a message reached (topic, queue id)."""
        key = (request.topic, request.queue_id)
        if key in self._held:
            self._arrived.setdefault(key, []).append((request.queue_offset, request.tags_code))
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
        if pull.gone:
            return
        try:
            response = self._execute(pull.responder.request, pull.responder.connection)
        except Exception as exc:
            log.exception("a held pull failed")
            response = pull.responder.request.response_to(1, f"{type(exc).__name__}: {exc}")
        pull.responder.send(response)

    def _answer_arrivals(self) -> None:
        arrived, self._arrived = self._arrived, {}
        for key, messages in arrived.items():
            waiting = []
            for pull in self._held.get(key, []):
                if any(pull.wants(offset, code) for offset, code in messages):
                    self._answer(pull)
                    self.answered_on_arrival += 1
                else:
                    waiting.append(pull)
            self._held[key] = waiting

    def _answer_expired(self) -> None:
        now = trio.current_time()
        while self._deadlines and self._deadlines[0][0] <= now:
            _deadline, _seq, pull = heapq.heappop(self._deadlines)
            if not pull.gone:
                self._answer(pull)
                self.answered_on_timeout += 1

    def _drop_answered(self) -> None:
        for key in list(self._held):
            pulls = [p for p in self._held[key] if not p.gone]
            if pulls:
                self._held[key] = pulls
            else:
                del self._held[key]
        while self._deadlines and self._deadlines[0][2].gone:
            heapq.heappop(self._deadlines)
