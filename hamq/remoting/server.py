"""RemotingServer: accepts TCP connections and serves each with the processor table.

Lifecycle: ``await nursery.start(server.run)`` binds (port 0 picks a free port),
then reports the bound port through ``task_status.started(port)``. ``shutdown(grace_s)``
is the graceful end: stop accepting, let every connection answer what it has in
flight and flush, and cut whatever is left when the grace period ends; ``run`` then
returns. Cancelling ``run`` is the hard end.

One connection's trouble (a bad frame, a reset, even a bug in its handling) closes
that connection alone; the server and its other connections carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from hamq.remoting.address import format_address
from hamq.remoting.config import RemotingConfig
from hamq.remoting.connection import Connection
from hamq.remoting.dispatch import Dispatcher

log = logging.getLogger(__name__)

#: How long ``shutdown()`` lets connections finish by default.
DEFAULT_SHUTDOWN_GRACE_S = 5.0


@attrs.frozen
class ServerStatistics:
    address: str
    connections: int
    connections_accepted: int
    requests_received: int
    in_flight: int


class RemotingServer:
    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: RemotingConfig | None = None,
    ) -> None:
        if not 0 <= port < 65536:
            raise ValueError(f"port {port} is not in 0..65535")
        self.dispatcher = dispatcher
        self.host = host
        self.port = port
        self._config = config or RemotingConfig()
        self._connections: set[Connection] = set()
        self._accepted = 0
        self._closed_requests = 0
        self._connect_listeners: list[Callable[[Connection], None]] = []
        self._close_listeners: list[Callable[[Connection], None]] = []
        self._shutdown = trio.Event()
        self._grace_s = DEFAULT_SHUTDOWN_GRACE_S

    @property
    def address(self) -> str:
        """``host:port`` as bound (the real port once ``run`` has started)."""
        return format_address(self.host, self.port)

    @property
    def connections(self) -> frozenset[Connection]:
        return frozenset(self._connections)

    def on_connect(self, listener: Callable[[Connection], None]) -> None:
        """Call ``listener(conn)`` for every new connection, before it reads anything."""
        self._connect_listeners.append(listener)

    def on_close(self, listener: Callable[[Connection], None]) -> None:
        """Call ``listener(conn)`` whenever a connection has closed."""
        self._close_listeners.append(listener)

    def statistics(self) -> ServerStatistics:
        stats = [conn.statistics() for conn in self._connections]
        return ServerStatistics(
            address=self.address,
            connections=len(stats),
            connections_accepted=self._accepted,
            requests_received=self._closed_requests + sum(s.requests_received for s in stats),
            in_flight=sum(s.in_flight for s in stats),
        )

    def shutdown(self, grace_s: float = DEFAULT_SHUTDOWN_GRACE_S) -> None:
        """Begin the graceful end; ``run`` returns within about ``grace_s`` seconds."""
        self._grace_s = grace_s
        self._shutdown.set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise OSError(exc.errno, f"cannot listen on {self.address}: {reason}") from None
        try:
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                accepting = trio.CancelScope()
                nursery.start_soon(self._accept, listeners, accepting, nursery)
                log.info("remoting server listening on %s", self.address)
                task_status.started(self.port)
                await self._shutdown.wait()
                log.info(
                    "remoting server %s shutting down, %d connection(s), grace %gs",
                    self.address,
                    len(self._connections),
                    self._grace_s,
                )
                accepting.cancel()
                for conn in list(self._connections):
                    conn.drain()
                nursery.cancel_scope.deadline = trio.current_time() + self._grace_s
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await trio.aclose_forcefully(listener)

    async def _accept(
        self,
        listeners: list[trio.SocketListener],
        scope: trio.CancelScope,
        nursery: trio.Nursery,
    ) -> None:
        with scope:
            await trio.serve_listeners(self._serve, listeners, handler_nursery=nursery)

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = format_address(host, port)
        except OSError:
            peer = "unknown peer"
        conn = Connection(stream, peer=peer, dispatcher=self.dispatcher, config=self._config)
        self._accepted += 1
        self._connections.add(conn)
        for close_listener in self._close_listeners:
            conn.add_close_listener(close_listener)
        for listener in self._connect_listeners:
            try:
                listener(conn)
            except Exception:
                log.exception("connect listener for %s failed", peer)
        if self._shutdown.is_set():
            conn.drain()
        try:
            await conn.run()
        except Exception:
            log.exception("connection from %s failed", peer)
        finally:
            self._connections.discard(conn)
            self._closed_requests += conn.statistics().requests_received
