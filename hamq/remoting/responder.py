"""The promise to answer one received request later (``Connection.defer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hamq.protocol import RemotingCommand

if TYPE_CHECKING:
    from hamq.remoting.connection import Connection


class Responder:
    """The promise to answer one received request later (``Connection.defer``).

    ``send`` answers it once; ``discard`` gives it up without an answer. Either one
    frees the request's in-flight place. Both are safe after the connection closed.
    """

    __slots__ = ("_conn", "_done", "request")

    def __init__(self, conn: Connection, request: RemotingCommand) -> None:
        self._conn = conn
        self.request = request
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def connection(self) -> Connection:
        return self._conn

    def send(self, response: RemotingCommand, *, flush: bool = True) -> bool:
        """Answer the request; False if it was already answered or the connection closed.
        ``flush=False``: the answer waits in the output for the caller's ``flush()`` of
        the connection (answers to many requests, one write)."""
        if self._done:
            return False
        self._done = True
        self._conn._release()
        if self._conn.closed:
            return False
        self._conn.respond(self.request, response, flush=flush)
        return True

    def discard(self) -> None:
        """Give the request up without answering it."""
        if not self._done:
            self._done = True
            self._conn._release()
