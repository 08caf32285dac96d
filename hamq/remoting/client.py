"""RemotingClient: one connection per address, opened on demand, many requests in flight.

Use it as an async context manager; its connections live in its own nursery and
close when the block ends::

    async with RemotingClient() as client:
        response = await client.invoke("127.0.0.1:9876", request, timeout_s=3.0)

Requests on one connection are matched to responses by opaque, so any number can be
in flight at once. ``invoke``'s timeout covers connecting as well as waiting. When a
connection drops, every request waiting on it fails at once with
RemotingConnectionClosed and the next call to that address connects again. Requests
the server sends to the client (NOTIFY_CONSUMER_IDS_CHANGED ...) go to the client's
own dispatcher.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
from collections.abc import Callable, Iterator
from types import TracebackType

import anyio
import anyio.abc

from hamq.protocol import RemotingCommand
from hamq.remoting.address import parse_address
from hamq.remoting.config import RemotingConfig
from hamq.remoting.connection import Connection
from hamq.remoting.dispatch import Dispatcher
from hamq.remoting.errors import RemotingConnectError, RemotingTimeoutError
from hamq.remoting.loop import ANY_LOOP, current_loop
from hamq.remoting.tls import ClientTls, TlsHandshakeError

log = logging.getLogger(__name__)

#: called on every request before it is sent, ``hook(address, request)``: it may add
#: ext fields (hamq.acl's signer adds AccessKey and Signature, as RocketMQ's RPCHook)
RpcHook = Callable[[str, RemotingCommand], None]


class RemotingClient:
    def __init__(
        self,
        *,
        dispatcher: Dispatcher | None = None,
        config: RemotingConfig | None = None,
        rpc_hook: RpcHook | None = None,
    ) -> None:
        self.dispatcher = dispatcher or Dispatcher()
        self._rpc_hook = rpc_hook
        self._config = config or RemotingConfig()
        #: TLS (config.tls): the context is built once, TlsConfigError here if it cannot be
        self._tls = ClientTls.of(self._config.tls)
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, _Attempt] = {}
        self._nursery: anyio.abc.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._task_scopes: set[anyio.CancelScope] = set()
        self._closing = False
        #: the running loop's clock, taken when the client opens (hamq.remoting.loop)
        self._loop = ANY_LOOP

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> RemotingClient:
        self._closing = False
        self._loop = current_loop()
        stack = contextlib.AsyncExitStack()
        self._nursery = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._nursery is not None and self._stack is not None
        self._closing = True
        for conn in list(self._connections.values()):
            conn.close("client closed")
        for scope in list(self._task_scopes):
            scope.cancel()
        self._nursery.cancel_scope.cancel()
        stack, self._stack, self._nursery = self._stack, None, None
        # The block's own exception is not handed to the nursery, so it propagates
        # as itself rather than wrapped in an ExceptionGroup.
        await stack.aclose()
        return None

    @property
    def connections(self) -> dict[str, Connection]:
        """The open connections by address."""
        return {addr: conn for addr, conn in self._connections.items() if not conn.closed}

    # ------------------------------------------------------------------ calls
    async def invoke(
        self, addr: str, request: RemotingCommand, timeout_s: float
    ) -> RemotingCommand:
        """Send ``request`` to ``addr`` and return the response; assigns ``request.opaque``.

        RemotingConnectError if no connection can be opened, RemotingTimeoutError
        when ``timeout_s`` (connecting included) passes, RemotingConnectionClosed when
        the connection drops first.
        """
        if self._rpc_hook is not None:
            self._rpc_hook(addr, request)
        conn = self._connections.get(addr)
        if conn is not None and not conn.closed:  # (the usual case: no time to take off)
            return await conn.invoke(request, timeout_s)
        deadline = self._loop.current_time() + timeout_s
        conn = await self.connection(addr, timeout_s=timeout_s)
        remaining = deadline - self._loop.current_time()
        if remaining <= 0:
            raise RemotingTimeoutError(addr, f"connecting used the whole {timeout_s:g}s timeout")
        return await conn.invoke(request, remaining)

    async def invoke_oneway(self, addr: str, request: RemotingCommand, timeout_s: float) -> None:
        """Send ``request`` with the oneway bit set; no response is awaited."""
        if self._rpc_hook is not None:
            self._rpc_hook(addr, request)
        conn = await self.connection(addr, timeout_s=timeout_s)
        await conn.invoke_oneway(request, timeout_s)

    # ------------------------------------------------------------------ connections
    async def connection(self, addr: str, *, timeout_s: float | None = None) -> Connection:
        """The open connection to ``addr``, connecting if there is none.

        Concurrent callers share one connect attempt; each waits at most ``timeout_s``
        (RemotingTimeoutError), and all see the same outcome.
        """
        conn = self._connections.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._nursery is None:
            raise RuntimeError("RemotingClient is not open; use 'async with RemotingClient()'")
        attempt = self._connecting.get(addr)
        if attempt is None:
            attempt = self._connecting[addr] = _Attempt()
            self._nursery.start_soon(self._connect, addr, attempt)
        with anyio.move_on_after(math.inf if timeout_s is None else timeout_s) as waited:
            await attempt.done.wait()
        if waited.cancelled_caught:
            raise RemotingTimeoutError(addr, f"not connected within {timeout_s:g}s")
        if attempt.connection is None:
            raise RemotingConnectError(addr, attempt.error)
        return attempt.connection

    def close_connection(self, addr: str, reason: str = "closed by client") -> None:
        """Close the connection to ``addr`` if there is one (its waiters fail at once)."""
        conn = self._connections.pop(addr, None)
        if conn is not None:
            conn.close(reason)

    async def _connect(self, addr: str, attempt: _Attempt) -> None:
        try:
            with self._shielded():
                attempt.connection = await self._open(addr)
            if attempt.connection is None:  # cancelled: the client closed meanwhile
                attempt.error = "the client closed"
            else:
                self._connections[addr] = attempt.connection
        except RemotingConnectError as exc:
            attempt.error = str(exc).removeprefix(f"{addr}: ")
        finally:
            del self._connecting[addr]
            attempt.done.set()

    async def _open(self, addr: str) -> Connection:
        try:
            host, port = parse_address(addr)
        except ValueError as exc:
            raise RemotingConnectError(addr, str(exc)) from None
        limit_s = self._config.connect_timeout_s
        try:
            with anyio.fail_after(limit_s):
                stream = await anyio.connect_tcp(host, port)
        except TimeoutError:  # an OSError: first
            raise RemotingConnectError(addr, f"connect timed out after {limit_s:g}s") from None
        except OSError as exc:
            raise RemotingConnectError(addr, f"cannot connect: {_reason(exc)}") from None
        served: anyio.abc.ByteStream = stream
        if self._tls is not None:
            try:
                served = await self._tls.wrap_anyio(stream, host=host, peer=addr)
            except TlsHandshakeError as exc:
                raise RemotingConnectError(addr, str(exc).removeprefix(f"{addr}: ")) from None
        if self._closing or self._nursery is None:
            await served.aclose()
            raise RemotingConnectError(addr, "the client closed")
        conn = Connection(served, peer=addr, dispatcher=self.dispatcher, config=self._config)
        conn.add_close_listener(self._forget)
        await self._nursery.start(self._run_connection, conn)
        log.debug("connected to %s", addr)
        return conn

    @contextlib.contextmanager
    def _shielded(self) -> Iterator[None]:
        """Shield a connection's task from its owner's cancellation: only the client's
        closing ends it (see the module's comment)."""
        with anyio.CancelScope(shield=True) as scope:
            if self._closing:  # started just as the client closed: end at once
                scope.cancel()
            self._task_scopes.add(scope)
            try:
                yield
            finally:
                self._task_scopes.discard(scope)

    async def _run_connection(
        self,
        conn: Connection,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with self._shielded():
            await conn.run(task_status=task_status)

    def _forget(self, conn: Connection) -> None:
        if self._connections.get(conn.peer) is conn:
            del self._connections[conn.peer]


def _reason(exc: OSError) -> str:
    """Why a connect failed, in the system's words: 'connection refused' rather than
    'all connection attempts failed' (the reasons are its cause: one error, or a group
    of them when the name has several addresses)."""
    errors = [exc]
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        errors = [e for e in cause.exceptions if isinstance(e, OSError)] or errors
    elif isinstance(cause, OSError):
        errors = [cause]
    reasons = []
    for error in errors:
        if isinstance(error, socket.gaierror) or not error.errno or error.errno < 0:
            reason = (error.strerror or str(error)).lower()
        else:
            reason = os.strerror(error.errno).lower()
        if reason not in reasons:
            reasons.append(reason)
    return "; ".join(reasons)


class _Attempt:
    """One connect attempt that several callers may wait for."""

    __slots__ = ("connection", "done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.connection: Connection | None = None
        self.error = "connect failed"
