"""Trio's streams seen as AnyIO byte streams, for the Trio side of hamq.

``Connection`` is written on AnyIO so that clients run under asyncio as well as Trio;
the broker, the nameserver and the controller accept connections with Trio's own
listeners (hamq.remoting.server) and hand each stream to a Connection through
``TrioByteStream``. Semantics follow AnyIO: the peer's EOF raises ``anyio.EndOfStream``
(Trio returns b""), Trio's BrokenResourceError and ClosedResourceError become AnyIO's,
and a plain socket stream offers its socket (``SocketAttribute.raw_socket``) so that
the connection's reader may write to it directly. A TLS stream offers none: its bytes
must go through the TLS layer. The connection's reader takes ``raw_receive`` when a
stream offers it: Trio's receive, unwrapped; for a plain socket, a receive of its own
in fewer steps (``_receive_socket``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import anyio
import anyio.abc
import trio
from anyio.streams.tls import TLSAttribute


class TrioByteStream(anyio.abc.ByteStream):
    """One Trio stream (socket, TLS or an in-memory test stream) as an AnyIO ByteStream."""

    #: what Trio's streams raise (``raw_receive`` lets them through)
    raw_errors = (trio.BrokenResourceError, trio.ClosedResourceError)

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        #: Trio's own receive (b"" at EOF, raw_errors), for a Connection's reader: one
        #: call layer less per received chunk than ``receive`` (a broker's hot path)
        self.raw_receive: Callable[[int], Awaitable[bytes | bytearray]] = stream.receive_some
        #: a plain socket's descriptor, and whether its last read drained it
        self._fd = -1
        self._drained = True
        if isinstance(stream, trio.SocketStream):
            self._fd = stream.socket.fileno()
            self.raw_receive = self._receive_socket

    async def _receive_socket(self, max_bytes: int) -> bytes:
        """Trio's ``receive_some`` on a plain socket, in fewer steps per chunk (a
        broker's hot path; the same bytes, b"" at EOF, an OSError as Trio's would be):
        Trio tries a read first and yields after one that succeeds. Here, after a read
        that took less than it could (the socket was drained: a peer waiting for its
        answers) the receive waits until the socket is readable instead of trying a
        read that would fail, and the wait is its yield; after a read that filled its
        buffer it yields once, as Trio's does, then reads. A request answered one at a
        time costs one read and one wait, not two reads, a wait and a yield."""
        fd = self._fd
        if self._drained:
            await trio.lowlevel.wait_readable(fd)
        else:
            await trio.lowlevel.checkpoint()
        while True:
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            self._drained = len(data) < max_bytes
            return data

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self.stream.receive_some(max_bytes)
        except trio.BrokenResourceError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc
        except trio.ClosedResourceError as exc:
            raise anyio.ClosedResourceError(str(exc)) from exc
        if not data:
            raise anyio.EndOfStream
        return bytes(data)

    async def send(self, item: bytes) -> None:
        try:
            await self.stream.send_all(item)
        except trio.BrokenResourceError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc
        except trio.ClosedResourceError as exc:
            raise anyio.ClosedResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        if isinstance(self.stream, trio.abc.HalfCloseableStream):
            await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        if not isinstance(self.stream, trio.SocketStream):
            return {}
        # Trio's socket offers what a Connection uses of one (fileno, shutdown)
        sock = cast(socket.socket, self.stream.socket)
        return {anyio.abc.SocketAttribute.raw_socket: lambda: sock}


def direct_socket(stream: anyio.abc.ByteStream, loop: str) -> socket.socket | None:
    """The socket a connection's reader may write to directly: a plain TCP stream under
    Trio (whose sockets are non-blocking and unbuffered), else None."""
    if loop != "trio":
        return None
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None or stream.extra(TLSAttribute.ssl_object, None) is not None:
        return None
    return sock
