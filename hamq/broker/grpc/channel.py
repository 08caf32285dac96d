"""LocalChannel: a gRPC client's requests, as remoting requests, through the broker's
own processor table.

RocketMQ's proxy in "local mode" does the same (its LocalChannel): each gRPC call is
turned into the remoting request a 4.x client would send, dispatched in process, and
the answer turned back. So a gRPC send, pop, ack or transaction is decided where a
remoting one is (the processors, the ACL guard, SEND_OK's durability), by one path.

One channel per HTTP/2 connection: it stands for the client as a remoting connection
would (heartbeats register it as a producer or consumer, its close unregisters it).
The processors see it as a ``Connection``: what they call on one (respond, defer,
spawn, at_group_end, invoke_oneway) is answered here in memory. What the broker asks of
the client (a transaction check-back) goes to ``on_request``: the endpoint writes it
on the client's Telemetry stream.

Requests are dispatched in groups, as a remoting connection dispatches the requests of
one read: they are queued, and dispatched in the order they were queued,
YIELD_EVERY_COMMANDS at a time, each such chunk one group (``at_group_end``: the sends
among them are stored and wait for their durability together). Who dispatches them:
- the calls answered by callback are submitted by the server's reader (in the order of
  their streams) with the read's end as their moment (``submit``'s ``at_end``: the
  reader dispatches them once the read's events are handled, and writes the answers
  decided at once itself, no task woken);
- the others (``request``, from a call's task) are dispatched by the channel's own task
  when it next runs: the tasks a read started run in one pass of the scheduler, so
  theirs are queued by then.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import trio

from hamq.protocol import RemotingCommand, RequestError, ResponseCode
from hamq.remoting import Connection, Dispatcher
from hamq.remoting.connection import YIELD_EVERY_COMMANDS
from hamq.remoting.errors import RemotingConnectionClosed
from hamq.remoting.responder import Responder

log = logging.getLogger(__name__)

#: requests one channel may have in flight (held pops included), as a connection has
MAX_IN_FLIGHT = 1024


#: what a request's answer is handed to (None: the channel closed first)
OnAnswer = Callable[[RemotingCommand | None], None]


class LocalChannel(Connection):
    """A gRPC connection, as the broker's processors see a client connection."""

    def __init__(
        self,
        peer: str,
        dispatcher: Dispatcher,
        nursery: trio.Nursery,
        on_request: Callable[[RemotingCommand], bool],
    ) -> None:
        # (Connection's own state is a socket's; none of it is used here)
        self.peer = peer
        self.attributes: dict[str, Any] = {}
        self._dispatcher = dispatcher
        self._tasks = nursery
        self._on_request = on_request
        #: what each request (by opaque) still waiting for its answer hands it to
        self._waiters: dict[int, OnAnswer] = {}
        #: requests waiting for their group's dispatch
        self._queued: list[RemotingCommand] = []
        self._dispatching = False
        self._wakeup = trio.Event()
        #: a read's end will dispatch what is queued (``submit``'s ``at_end``)
        self._at_end = False
        #: requests dispatched, and the groups they were dispatched in
        self.requests = 0
        self.request_groups = 0
        #: callbacks for the end of the group being dispatched (None: no group is)
        self._group_callbacks: list[Callable[[], None]] | None = None
        self._opaques = itertools.count(1)
        self._in_flight = 0
        self._closed = False
        self._close_reason = ""
        self._close_listeners: list[Callable[[Connection], None]] = []

    def __repr__(self) -> str:
        return f"<LocalChannel {self.peer} {'closed' if self._closed else 'open'}>"

    # ------------------------------------------------------------------ asking
    def submit(
        self,
        request: RemotingCommand,
        on_answer: OnAnswer,
        at_end: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """Queue ``request`` for its group's dispatch; its answer goes to ``on_answer``
        (a held pop's when it comes; None if the channel closes first). ``at_end``
        (the server's ``Call.at_read_end``) says when the group is dispatched: else the
        channel's task dispatches it when it next runs. RemotingConnectionClosed if the
        channel is closed."""
        if self._closed:
            raise RemotingConnectionClosed(self.peer, "the gRPC connection closed")
        request.opaque = next(self._opaques)
        self._waiters[request.opaque] = on_answer
        self._queued.append(request)
        if at_end is None:
            self._wake()
        elif not self._at_end:
            self._at_end = True
            at_end(self._read_ended)

    def _read_ended(self) -> None:
        self._at_end = False
        if self._queued and not self._closed:
            self._dispatch_queued()
        if self._queued:
            self._wake()  # (the rest: the channel's task, a group at a time)

    def _wake(self) -> None:
        if not self._dispatching:
            self._dispatching = True
            self._tasks.start_soon(self._dispatch_loop)
        self._wakeup.set()

    async def request(self, request: RemotingCommand) -> RemotingCommand:
        """``submit`` and wait for the answer. Cancelled (the gRPC call reset or past
        its deadline): the answer, if one comes, is dropped; what the broker did
        stands, as for a remoting client that left. RemotingConnectionClosed if the
        channel is closed, or closes while it waits."""
        done = trio.Event()
        answers: list[RemotingCommand | None] = []

        def on_answer(response: RemotingCommand | None) -> None:
            answers.append(response)
            done.set()

        self.submit(request, on_answer)
        try:
            await done.wait()
        finally:
            self._waiters.pop(request.opaque, None)
        if answers[0] is None:  # (closed while it waited)
            raise RemotingConnectionClosed(self.peer, f"closed: {self._close_reason}")
        return answers[0]

    async def _dispatch_loop(self) -> None:
        while not self._closed:
            if self._queued:
                self._dispatch_queued()
                await trio.lowlevel.checkpoint()  # (the rest, and what answers queue: next)
            else:
                self._wakeup = trio.Event()
                await self._wakeup.wait()

    def _dispatch_queued(self) -> None:
        """The first YIELD_EVERY_COMMANDS queued, as one group."""
        group = self._queued[:YIELD_EVERY_COMMANDS]
        del self._queued[:YIELD_EVERY_COMMANDS]
        self._group_callbacks = []
        self.request_groups += 1
        try:
            for request in group:
                self.requests += 1
                self._dispatcher.dispatch(request, self)
        finally:
            callbacks, self._group_callbacks = self._group_callbacks, None
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("%s: finishing a group of requests failed", self.peer)

    # ------------------------------------------------------------------ Connection's
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def add_close_listener(self, listener: Callable[[Connection], None]) -> None:
        self._close_listeners.append(listener)

    def close(self, reason: str = "closed locally") -> None:
        """The gRPC connection ended: listeners (the client managers) are told once."""
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        self._wakeup.set()
        waiters, self._waiters = self._waiters, {}
        for on_answer in waiters.values():
            try:
                on_answer(None)
            except Exception:
                log.exception("%s: an answer's callback failed", self.peer)
        for listener in self._close_listeners:
            try:
                listener(self)
            except Exception:
                log.exception("close listener of %s failed", self.peer)

    def respond(
        self, request: RemotingCommand, response: RemotingCommand, *, flush: bool = True
    ) -> None:
        on_answer = self._waiters.pop(request.opaque, None)
        if on_answer is None:
            log.debug("%s: dropping %s, nobody waits for it", self.peer, response.describe())
            return
        response.opaque = request.opaque
        try:
            on_answer(response)
        except Exception:
            log.exception("%s: the callback of %s failed", self.peer, response.describe())

    def flush(self) -> None:
        return None

    def defer(self, request: RemotingCommand) -> Responder:
        if self._in_flight >= MAX_IN_FLIGHT:
            raise RequestError(
                ResponseCode.SYSTEM_BUSY,
                f"[OVERLOAD] {self._in_flight} requests already in flight on this gRPC "
                f"connection (limit {MAX_IN_FLIGHT}); try again later",
            )
        self._in_flight += 1
        return Responder(self, request)

    def _release(self) -> None:
        self._in_flight -= 1

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None:
        if self._closed:
            raise RemotingConnectionClosed(self.peer, "the gRPC connection closed")
        self._tasks.start_soon(fn, *args)

    def at_group_end(self, callback: Callable[[], None]) -> None:
        if self._group_callbacks is not None:
            self._group_callbacks.append(callback)
        else:
            callback()

    async def invoke_oneway(self, request: RemotingCommand, timeout_s: float) -> None:
        """What the broker asks of the client (CHECK_TRANSACTION_STATE): handed to
        ``on_request``, which never waits (a client that does not read its Telemetry
        stream loses the check; the broker asks again later)."""
        if self._closed or not self._on_request(request):
            raise RemotingConnectionClosed(self.peer, f"{request.describe()} not delivered")

    async def invoke(self, request: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Requests that want an answer (a consumer's running info, a direct
        consume): a gRPC client has no remoting answer to give."""
        return request.response_to(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            f"{request.describe()}: a gRPC client ({self.peer}) does not answer it",
        )
