"""The processor table: request code -> the function that answers it.

Two kinds of processor, chosen at registration:
- ``register(code, fn)``: ``fn(request, conn) -> RemotingCommand | None`` runs inline
  in the connection's read loop and must not block. This is the fast path: no task
  per request. To answer later (long polling, group commit), it calls
  ``conn.defer(request)`` and returns None; the Responder answers when ready.
- ``register_async(code, fn)``: ``await fn(request, conn)`` runs in its own task under
  the connection, counted against the in-flight limit.

Answers (RocketMQ's rules, docs/PROTOCOL.md#dispatch-rules): an unknown code gets
REQUEST_CODE_NOT_SUPPORTED; a processor raising ``RequestError`` gets that code with
the message as remark; any other exception gets SYSTEM_ERROR with the reason as remark,
is logged with its traceback, and the connection stays up.

A ``guard`` (a server's ACL, hamq.acl.AclGuard) sees every request of a known code
before its processor: ``guard(request, conn)`` returns None to let it through, or the
answer to send instead (NO_PERMISSION). It runs inline, so it must not block; a guard
that raises refuses the request (SYSTEM_ERROR), it never lets it through.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from hamq.protocol import RemotingCommand, RequestError, ResponseCode, code_name
from hamq.remoting.connection import Connection
from hamq.remoting.responder import Responder

log = logging.getLogger(__name__)

InlineProcessor = Callable[[RemotingCommand, Connection], RemotingCommand | None]
AsyncProcessor = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand | None]]
Guard = Callable[[RemotingCommand, Connection], RemotingCommand | None]


def error_response(request: RemotingCommand, exc: Exception) -> RemotingCommand:
    """The answer to a request whose processor raised ``exc``."""
    if isinstance(exc, RequestError):
        return request.response_to(exc.code, str(exc))
    log.error("processor for %s failed", request.describe(), exc_info=exc)
    return request.response_to(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


class Dispatcher:
    def __init__(self, *, guard: Guard | None = None) -> None:
        self._inline: dict[int, InlineProcessor] = {}
        self._async: dict[int, AsyncProcessor] = {}
        #: checks each request before its processor (see the module's comment)
        self.guard = guard

    def register(self, code: int, processor: InlineProcessor) -> None:
        """Answer ``code`` inline; the processor must not block."""
        self._check_free(code)
        self._inline[code] = processor

    def register_async(self, code: int, processor: AsyncProcessor) -> None:
        """Answer ``code`` from a task of its own (for processors that must wait)."""
        self._check_free(code)
        self._async[code] = processor

    def _check_free(self, code: int) -> None:
        if code in self._inline or code in self._async:
            raise ValueError(f"a processor for {code_name(code, response=False)} is registered")

    @property
    def codes(self) -> frozenset[int]:
        return frozenset(self._inline) | frozenset(self._async)

    def dispatch(self, request: RemotingCommand, conn: Connection) -> None:
        """Handle one received request on ``conn``."""
        inline = self._inline.get(request.code)
        processor = self._async.get(request.code) if inline is None else None
        if inline is None and processor is None:
            conn.respond(
                request,
                request.response_to(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f" request type {request.code} not supported",
                ),
            )
            return
        if self.guard is not None:
            refusal = self._guarded(request, conn, self.guard)
            if refusal is not None:
                conn.respond(request, refusal)
                return
        if inline is not None:
            try:
                response = inline(request, conn)
            except Exception as exc:
                response = error_response(request, exc)
            if response is not None:
                conn.respond(request, response)
            return
        assert processor is not None
        try:
            responder = conn.defer(request)
        except RequestError as exc:
            conn.respond(request, error_response(request, exc))
            return
        conn.spawn(_run_async, processor, responder)

    @staticmethod
    def _guarded(
        request: RemotingCommand, conn: Connection, guard: Guard
    ) -> RemotingCommand | None:
        try:
            return guard(request, conn)
        except Exception as exc:
            log.error("the guard failed on %s", request.describe(), exc_info=exc)
            return request.response_to(
                ResponseCode.SYSTEM_ERROR, f"access check failed: {type(exc).__name__}: {exc}"
            )


async def _run_async(processor: AsyncProcessor, responder: Responder) -> None:
    request = responder.request
    try:
        response = await processor(request, responder.connection)
    except Exception as exc:
        response = error_response(request, exc)
    if response is None:
        responder.discard()
    else:
        responder.send(response)
