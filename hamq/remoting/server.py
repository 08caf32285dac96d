"""RemotingServer: accepts TCP connections and serves each with the processor table.

Lifecycle: ``await nursery.start(server.run)`` binds (port 0 picks a free port),
then reports the bound port through ``task_status.started(port)``. ``shutdown(grace_s)``
is the graceful end: stop accepting, let every connection answer what it has in
flight and flush, and cut whatever is left when the grace period ends; ``run`` then
returns. Cancelling ``run`` is the hard end.

One connection's trouble (a bad frame, a reset, a failed TLS handshake, even a bug in
its handling) closes that connection alone; the server and its other connections
carry on.

Accepting (``Acceptor``, shared with the HA listener): at most ``max_connections``
open at once, TLS handshakes under way included; one more is closed as soon as it is
accepted. accept() failing for lack of resources (EMFILE: out of file descriptors,
ENFILE, ENOMEM, ENOBUFS) is retried after ACCEPT_RETRY_S, and the server carries on
once descriptors are free again. Every warning a peer can repeat at will (refused
connections, failed handshakes, accept errors, malformed frames) goes through one
``RateLimitedLog`` per server.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import NoReturn

import attrs
import trio

from hamq.ratelimit import RateLimitedLog
from hamq.remoting.address import format_address
from hamq.remoting.config import RemotingConfig
from hamq.remoting.connection import Connection
from hamq.remoting.dispatch import Dispatcher
from hamq.remoting.tls import TlsHandshakeError, make_server_context, server_handshake
from hamq.remoting.trio_stream import TrioByteStream

log = logging.getLogger(__name__)

#: How long ``shutdown()`` lets connections finish by default.
DEFAULT_SHUTDOWN_GRACE_S = 5.0
#: accept() errors that mean "out of resources for now" (as trio.serve_listeners has them)
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
#: how long to wait before accepting again after one of those
ACCEPT_RETRY_S = 0.1

#: what an Acceptor runs for each connection: (stream, plain or TLS; the peer's address)
StreamHandler = Callable[[trio.abc.Stream, str], Awaitable[None]]


def peer_address(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "unknown peer"
    return format_address(host, port)


class Acceptor:
    """The accept loop of a listener: the connection cap, TLS, accept() errors.

    ``serve`` runs a handler per accepted connection in the nursery given, with the
    stream (TLS already negotiated when the config has it) and the peer's address;
    the stream is closed when the handler returns (``alpn_protocols``: what TLS offers,
    ``("h2",)`` for gRPC). The handler's own exceptions are
    its own business: they propagate (RemotingServer's handler never raises).
    TlsConfigError from the constructor when TLS is configured without a usable
    certificate.
    """

    def __init__(
        self,
        name: str,
        config: RemotingConfig,
        warnings: RateLimitedLog,
        *,
        alpn_protocols: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.max_connections = config.max_connections
        self._tls = None if config.tls is None else make_server_context(config.tls)
        if self._tls is not None and alpn_protocols:
            self._tls.set_alpn_protocols(list(alpn_protocols))
        self._handshake_s = 0.0 if config.tls is None else config.tls.handshake_timeout_s
        self._warnings = warnings
        #: connections open now (handshakes under way included)
        self.open = 0
        #: connections closed at once for being over max_connections
        self.refused = 0
        self.handshake_failures = 0

    @property
    def tls(self) -> bool:
        return self._tls is not None

    async def serve(
        self, listeners: list[trio.SocketListener], handler: StreamHandler, nursery: trio.Nursery
    ) -> NoReturn:
        """Accept on every listener until cancelled; errors other than resource
        shortages propagate (the listener is then unusable)."""
        async with trio.open_nursery() as accepting:
            for listener in listeners:
                accepting.start_soon(self._accept_loop, listener, handler, nursery)
        raise AssertionError("accept loops do not end")  # pragma: no cover

    async def _accept_loop(
        self, listener: trio.SocketListener, handler: StreamHandler, nursery: trio.Nursery
    ) -> None:
        async with listener:  # closed when accepting stops: new peers are refused
            while True:
                await self._accept_one(listener, handler, nursery)

    async def _accept_one(
        self, listener: trio.SocketListener, handler: StreamHandler, nursery: trio.Nursery
    ) -> None:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                raise
            self._warnings.warning(
                "accept",
                "%s: accept failed: %s (%s); retrying every %gs",
                self.name,
                errno.errorcode.get(exc.errno or 0, "?"),
                os.strerror(exc.errno or 0),
                ACCEPT_RETRY_S,
            )
            await trio.sleep(ACCEPT_RETRY_S)
            return
        if self.open >= self.max_connections:
            self.refused += 1
            self._warnings.warning(
                "max_connections",
                "%s: closed a connection from %s: max_connections %d are open",
                self.name,
                peer_address(stream),
                self.max_connections,
            )
            await trio.aclose_forcefully(stream)
            return
        self.open += 1
        nursery.start_soon(self._run, stream, handler)

    async def _run(self, stream: trio.SocketStream, handler: StreamHandler) -> None:
        peer = peer_address(stream)
        try:
            served: trio.abc.Stream = stream
            if self._tls is not None:
                try:
                    served = await server_handshake(
                        stream, self._tls, peer=peer, timeout_s=self._handshake_s
                    )
                except TlsHandshakeError as exc:
                    self.handshake_failures += 1
                    self._warnings.warning("tls", "%s: closed: %s", self.name, exc)
                    return
            try:
                await handler(served, peer)
            finally:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(served)
        finally:
            self.open -= 1
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


@attrs.frozen
class ServerStatistics:
    address: str
    connections: int
    connections_accepted: int
    requests_received: int
    in_flight: int
    #: connections closed at once for being over max_connections
    connections_refused: int = 0
    tls_handshake_failures: int = 0
    #: the groups the requests were dispatched in (requests / groups: the mean group)
    request_groups: int = 0


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
        self._closed_groups = 0
        self._connect_listeners: list[Callable[[Connection], None]] = []
        self._close_listeners: list[Callable[[Connection], None]] = []
        self._shutdown = trio.Event()
        self._grace_s = DEFAULT_SHUTDOWN_GRACE_S
        self.warnings = RateLimitedLog(log)
        self._acceptor = Acceptor("remoting server", self._config, self.warnings)

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
            connections_refused=self._acceptor.refused,
            tls_handshake_failures=self._acceptor.handshake_failures,
            request_groups=self._closed_groups + sum(s.request_groups for s in stats),
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
            self._acceptor.name = f"remoting server {self.address}"
            async with trio.open_nursery() as nursery:
                accepting = trio.CancelScope()
                nursery.start_soon(self._accept, listeners, accepting, nursery)
                log.info(
                    "remoting server listening on %s%s",
                    self.address,
                    " (TLS)" if self._acceptor.tls else "",
                )
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
            await self._acceptor.serve(listeners, self._serve, nursery)

    async def _serve(self, stream: trio.abc.Stream, peer: str) -> None:
        conn = Connection(
            TrioByteStream(stream),
            peer=peer,
            dispatcher=self.dispatcher,
            config=self._config,
            warnings=self.warnings,
        )
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
            closed = conn.statistics()
            self._closed_requests += closed.requests_received
            self._closed_groups += closed.request_groups
