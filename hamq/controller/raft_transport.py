"""The controllers' Raft transport: pysyncobj's ``Transport``, on hamq's own sockets.

pysyncobj's TCPTransport let a stranger cost a controller a core and its memory (its
read buffer grew by ``bytes +=`` without a bound, before any check), never closed an
idle or half-open connection, unbound its port when accept failed (out of file
descriptors), and never timed out a connection attempt: after a partition healed, an
attempt made during it waited for the kernel's next SYN retry (1, 3, 7, 15, 31, 63 s
apart), so the controllers took ~25 s to form a quorum again. This one keeps
pysyncobj's wire format and authentication (raft_wire.py, sans-IO) and owns the rest.

Everything runs on pysyncobj's tick thread: its poller calls the socket callbacks, its
tick (every ~50 ms) calls ``_on_tick``, and SyncObj calls ``send`` from the same thread.
So nothing here needs a lock; ``statistics()`` is a snapshot of counters for any thread.

Rules (``RaftTransportConfig`` has the numbers):
- the node with the larger address dials (pysyncobj's rule, kept for older nodes); a
  dial that has not connected within ``connect_timeout_s`` is abandoned and made
  again at once; one refused waits ``retry_s``;
- a connection not authenticated within ``auth_timeout_s`` is closed; at most
  ``max_pending`` wait for it (a new one beyond closes the oldest); their frames are
  at most 4 KiB, and nothing they send is unpickled before it decrypts with the key;
- an open connection that has read nothing for ``dead_after_s`` is dead (closed, and
  dialed again); each side sends a keepalive when it has sent nothing for
  ``keepalive_s``; one that does not take ``max_send_buffer_bytes`` of messages is
  closed; a second authenticated connection of a partner replaces the first;
- a tick that comes late (this thread stalled longer than ``keepalive_s``) judges no
  connection: what the peers sent meanwhile is read first;
- the listening socket is never given up: accept errors are counted and skipped, and
  when descriptors run out the oldest waiting stranger is closed and accepting pauses
  for ``accept_pause_s``;
- reads take at most ``read_budget_bytes`` per poll event (8 KiB before
  authentication), so one busy peer does not starve the others or the tick.
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport, TransportNotReadyError

from hamq.controller.raft_wire import (
    KEEPALIVE,
    PREAUTH_MAX_FRAME_BYTES,
    Authenticated,
    RaftSession,
    RaftWireError,
)

log = logging.getLogger(__name__)

_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
_READ_WRITE = _READ | POLL_EVENT_TYPE.WRITE
#: accept errors that mean this process (or the system) is out of descriptors/memory
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: how many connections one readable event of the listening socket accepts
_ACCEPTS_PER_EVENT = 64
#: bytes read per poll event from a connection not authenticated yet: two whole frames
_PREAUTH_READ_BYTES = 2 * (4 + PREAUTH_MAX_FRAME_BYTES)
#: warnings about strangers: at most one per this many seconds (the rest are counted)
_WARN_EVERY_S = 10.0


@attrs.frozen
class RaftTransportConfig:
    #: a dial not connected by then is abandoned (and made again)
    connect_timeout_s: float = 1.0
    #: after a dial was refused (or failed at once), wait this long
    retry_s: float = 0.5
    #: a connection must authenticate within this
    auth_timeout_s: float = 2.0
    #: an open connection that read nothing for this long is dead
    dead_after_s: float = 2.0
    #: send a keepalive when nothing was sent for this long
    keepalive_s: float = 0.5
    #: connections waiting to authenticate, at most
    max_pending: int = 32
    #: unsent bytes a peer may leave with us before it is closed
    max_send_buffer_bytes: int = 64 * 1024 * 1024
    #: bytes read per poll event and connection, at most
    read_budget_bytes: int = 1024 * 1024
    #: how long accepting pauses when descriptors run out
    accept_pause_s: float = 0.2
    #: the listening socket's backlog
    backlog: int = 128

    def __attrs_post_init__(self) -> None:
        if self.keepalive_s >= self.dead_after_s:
            raise ValueError(
                f"keepalive_s ({self.keepalive_s}) must be shorter than dead_after_s "
                f"({self.dead_after_s}), or idle links would be taken for dead"
            )


@attrs.frozen
class RaftTransportStatistics:
    accepted: int
    dialed: int
    #: connections that failed to authenticate (bad frames, wrong secret, strangers)
    refused: int
    #: connections closed for not authenticating in time
    auth_timeouts: int
    #: waiting strangers closed to make room for a new one or for descriptors
    evicted: int
    #: dials abandoned for not connecting in time
    connect_timeouts: int
    #: open connections closed for reading nothing for dead_after_s
    dead: int
    #: accept calls that failed (descriptors, memory, aborted connections)
    accept_errors: int
    #: connections waiting to authenticate now
    pending: int
    #: partners connected now
    connected: int


class _Link:
    """One TCP connection and its session."""

    def __init__(self, sock: socket.socket, session: RaftSession, remote: str, now: float) -> None:
        self.sock = sock
        self.fileno = sock.fileno()
        self.session = session
        self.remote = remote
        self.node: TCPNode | None = None
        #: a dial whose connect has not completed yet
        self.connecting = False
        self.opened_at = now
        self.last_read = now
        self.last_sent = now
        self.out = bytearray()
        self.closed = False


class RaftTransport(Transport):  # type: ignore[misc]
    """pysyncobj's Transport (module docstring). Made by SyncObj:
    ``transportClass=functools.partial(RaftTransport, config=..., created=...)``.

    Args:
        sync: the SyncObj (its poller, conf.bindAddress and encryptor are used).
        self_node: this node.
        other_nodes: the partners.
        config: the limits and timeouts.
        created: called with the transport once made (its owner's handle on it).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        sync: Any,
        self_node: TCPNode | None,
        other_nodes: Any,
        *,
        config: RaftTransportConfig | None = None,
        created: Callable[[RaftTransport], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sync, self_node, other_nodes)
        if self_node is None:
            raise ValueError("hamq's Raft transport has no read-only nodes")
        self._poller = sync._poller
        self._fernet = sync.encryptor
        self._conf = sync.conf
        self._self = self_node
        self._config = config or RaftTransportConfig()
        self._clock = clock
        self._nodes: dict[str, TCPNode] = {}
        #: authenticated connections, one per partner
        self._links: dict[TCPNode, _Link] = {}
        #: dials not authenticated yet, one per partner
        self._dials: dict[TCPNode, _Link] = {}
        self._next_dial: dict[TCPNode, float] = {}
        #: incoming connections not authenticated yet, oldest first
        self._pending: dict[int, _Link] = {}
        self._server: socket.socket | None = None
        self._listening = False
        self._accept_paused_until = 0.0
        self._ready = False
        self._bind_attempts = 0
        self._last_bind = float("-inf")
        self._bind_over = threading.Event()
        self._destroyed = False
        self._counts = dict.fromkeys(
            (
                "accepted",
                "dialed",
                "refused",
                "auth_timeouts",
                "evicted",
                "connect_timeouts",
                "dead",
                "accept_errors",
            ),
            0,
        )
        self._last_warning = float("-inf")
        self._unwarned = 0
        #: partners whose failed handshake was logged (until one succeeds)
        self._handshake_warned: set[TCPNode] = set()
        self._last_tick = clock()
        for node in other_nodes:
            self.addNode(node)
        sync.addOnTickCallback(self._on_tick)
        if created is not None:
            created(self)

    # ------------------------------------------------------------------ pysyncobj API
    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:
        self._maybe_bind()

    def waitReady(self) -> None:
        self._bind_over.wait()
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node: TCPNode) -> None:
        self._nodes[node.address] = node
        self._next_dial[node] = 0.0

    def dropNode(self, node: TCPNode) -> None:
        self._nodes.pop(node.address, None)
        self._next_dial.pop(node, None)
        for table in (self._links, self._dials):
            link = table.get(node)
            if link is not None:
                self._close(link, "the node was dropped", notify=False)

    def send(self, node: TCPNode, message: Any) -> bool:
        link = self._links.get(node)
        if link is None or link.closed:
            return False
        self._write(link, link.session.send(message))
        return not link.closed

    def destroy(self) -> None:
        self._destroyed = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        for link in [*self._links.values(), *self._dials.values(), *self._pending.values()]:
            self._close(link, "the transport stops", notify=False)
        if self._server is not None:
            if self._listening:
                self._poller.unsubscribe(self._server.fileno())
            self._server.close()
            self._server = None
        self._listening = False

    # ------------------------------------------------------------------ statistics
    def statistics(self) -> RaftTransportStatistics:
        return RaftTransportStatistics(
            **dict(self._counts), pending=len(self._pending), connected=len(self._links)
        )

    def _count(self, what: str) -> None:
        self._counts[what] += 1

    def _warn_stranger(self, link: _Link, why: str) -> None:
        """A stranger's failure, logged at most every _WARN_EVERY_S (a flood is counted)."""
        now = self._clock()
        if now - self._last_warning < _WARN_EVERY_S:
            self._unwarned += 1
            return
        more = f" ({self._unwarned} more since the last warning)" if self._unwarned else ""
        log.warning("Raft port %s: closed %s: %s%s", self._self.address, link.remote, why, more)
        self._last_warning = now
        self._unwarned = 0

    # ------------------------------------------------------------------ binding
    def _maybe_bind(self) -> None:
        if self._ready or self._destroyed:
            return
        now = self._clock()
        if now < self._last_bind + self._conf.bindRetryTime:
            return
        self._last_bind = now
        host, port = self._conf.bindAddress.rsplit(":", 1)
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host.strip("[]"), int(port), type=socket.SOCK_STREAM
            )[0]
            server = socket.socket(family, kind, proto)
            try:
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                server.setblocking(False)
                server.bind(address)
                server.listen(self._config.backlog)
            except BaseException:
                server.close()
                raise
        except OSError as exc:
            self._bind_attempts += 1
            log.info("Raft port %s: cannot bind yet: %s", self._conf.bindAddress, exc)
            retries = self._conf.maxBindRetries
            if retries and self._bind_attempts >= retries:
                self._bind_over.set()
                raise TransportNotReadyError from None
            return
        self._server = server
        self._listen()
        self._ready = True
        self._bind_over.set()

    def _listen(self) -> None:
        assert self._server is not None
        self._poller.subscribe(self._server.fileno(), self._on_listener, _READ)
        self._listening = True

    # ------------------------------------------------------------------ accepting
    def _on_listener(self, descr: int, events: int) -> None:
        server = self._server
        if server is None or not self._listening or descr != server.fileno():
            return
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                sock, address = server.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                self._count("accept_errors")
                if exc.errno in _EXHAUSTED:
                    self._out_of_descriptors(exc)
                    return
                continue  # (ECONNABORTED and the like: that connection only)
            self._accepted(sock, address)

    def _out_of_descriptors(self, exc: OSError) -> None:
        """Free a descriptor (the oldest waiting stranger) and pause accepting."""
        log.warning(
            "Raft port %s: cannot accept (%s); pausing %gs",
            self._self.address,
            exc.strerror,
            self._config.accept_pause_s,
        )
        if self._pending:
            self._count("evicted")
            self._close(next(iter(self._pending.values())), "out of descriptors", notify=False)
        assert self._server is not None
        self._poller.unsubscribe(self._server.fileno())
        self._listening = False
        self._accept_paused_until = self._clock() + self._config.accept_pause_s

    def _accepted(self, sock: socket.socket, address: Any) -> None:
        self._count("accepted")
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = RaftSession(
            dialer=False,
            self_address=self._self.address,
            partners=frozenset(self._nodes),
            fernet=self._fernet,
        )
        link = _Link(sock, session, f"{address[0]}:{address[1]}", self._clock())
        if len(self._pending) >= self._config.max_pending:
            self._count("evicted")
            oldest = next(iter(self._pending.values()))
            self._warn_stranger(oldest, f"{self._config.max_pending} connections wait already")
            self._close(oldest, "evicted", notify=False)
        self._pending[link.fileno] = link
        self._poller.subscribe(link.fileno, functools.partial(self._on_event, link), _READ)

    # ------------------------------------------------------------------ dialing
    def _dial(self, node: TCPNode, now: float) -> None:
        self._next_dial[node] = now + self._config.retry_s
        ip = node.ip  # (pysyncobj's resolver: cached)
        if ip is None:
            return
        try:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("Raft: cannot dial %s: %s", node.address, exc)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.connect((ip, node.port))
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            sock.close()
            return
        self._count("dialed")
        session = RaftSession(
            dialer=True,
            self_address=self._self.address,
            partners=frozenset({node.address}),
            fernet=self._fernet,
        )
        link = _Link(sock, session, node.address, now)
        link.connecting = True
        self._dials[node] = link
        self._poller.subscribe(link.fileno, functools.partial(self._on_event, link), _READ_WRITE)

    def _connected(self, link: _Link) -> None:
        link.connecting = False
        link.opened_at = link.last_read = self._clock()  # (the handshake's time starts)
        first, events = link.session.start()
        self._write(link, first)
        self._handle(link, events)

    # ------------------------------------------------------------------ I/O
    def _on_event(self, link: _Link, descr: int, events: int) -> None:
        if link.closed or descr != link.fileno:
            return  # (a stale event of a closed descriptor, maybe reused)
        if link.connecting:
            problem = link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if problem:
                self._close(link, f"cannot connect: {errno.errorcode.get(problem, problem)}")
                return
            if not events & POLL_EVENT_TYPE.WRITE:
                return
            self._connected(link)
            if link.closed:
                return
        if events & (POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR):
            self._read(link)
            if link.closed:
                return
        if events & POLL_EVENT_TYPE.WRITE:
            self._flush(link)

    def _read(self, link: _Link) -> None:
        # a stranger's bytes are read in small pieces: its first frame header ends it
        budget = self._config.read_budget_bytes if link.node else _PREAUTH_READ_BYTES
        while budget > 0 and not link.closed:
            try:
                data = link.sock.recv(min(65536, budget))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._close(link, f"read failed: {exc.strerror}")
                return
            if not data:
                self._close(link, "closed by the peer")
                return
            budget -= len(data)
            link.last_read = self._clock()
            try:
                reply, events = link.session.receive(data)
            except RaftWireError as exc:
                if link.node is None:
                    self._count("refused")
                    self._warn_stranger(link, str(exc))
                self._close(link, str(exc))
                return
            if reply:
                self._write(link, reply)
            self._handle(link, events)

    def _handle(self, link: _Link, events: list[Any]) -> None:
        for event in events:
            if link.closed:
                return
            if isinstance(event, Authenticated):
                self._authenticated(link, event.peer)
            elif link.node is not None:
                self._onMessageReceived(link.node, event.message)

    def _authenticated(self, link: _Link, peer: str) -> None:
        node = self._nodes.get(peer)
        if node is None:  # (a partner dropped meanwhile)
            self._close(link, f"{peer} is not a partner now", notify=False)
            return
        self._pending.pop(link.fileno, None)
        if self._dials.get(node) is link:
            del self._dials[node]
        old = self._links.get(node)
        if old is not None:
            self._close(old, "replaced by a new connection")
        link.node = node
        self._links[node] = link
        self._handshake_warned.discard(node)
        log.info("Raft: %s connected (%s)", peer, "dialed" if link.session.dialer else "accepted")
        self._onNodeConnected(node)

    def _write(self, link: _Link, data: bytes) -> None:
        if link.closed:
            return
        link.out += data
        link.last_sent = self._clock()
        if not link.connecting:
            self._flush(link)
        if not link.closed and len(link.out) > self._config.max_send_buffer_bytes:
            self._close(link, f"the peer leaves more than {len(link.out)} bytes unread")

    def _flush(self, link: _Link) -> None:
        was_waiting = bool(link.out)
        while link.out:
            try:
                sent = link.sock.send(link.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._close(link, f"write failed: {exc.strerror}")
                return
            del link.out[:sent]
        if link.connecting:
            return
        if link.out:
            self._poller.subscribe(
                link.fileno, functools.partial(self._on_event, link), _READ_WRITE
            )
        elif was_waiting:
            self._poller.subscribe(link.fileno, functools.partial(self._on_event, link), _READ)

    def _close(self, link: _Link, why: str, *, notify: bool = True) -> None:
        if link.closed:
            return
        link.closed = True
        # the books first: a peer that sees the close may read the statistics at once
        self._pending.pop(link.fileno, None)
        self._poller.unsubscribe(link.fileno)
        link.sock.close()
        node = link.node
        if node is not None and self._links.get(node) is link:
            del self._links[node]
            log.info("Raft: %s disconnected: %s", node.address, why)
            if notify:
                self._onNodeDisconnected(node)
        for dialed, dial in list(self._dials.items()):
            if dial is link:
                del self._dials[dialed]
                if node is None:
                    log.debug("Raft: dial to %s ended: %s", dialed.address, why)

    # ------------------------------------------------------------------ the tick
    def _on_tick(self) -> None:
        if self._destroyed:
            return
        try:
            self._maybe_bind()
        except TransportNotReadyError:
            return
        if not self._ready:
            return
        now = self._clock()
        config = self._config
        if not self._listening and now >= self._accept_paused_until:
            self._listen()
        stalled, self._last_tick = now - self._last_tick > config.keepalive_s, now
        if stalled:
            # this thread did not run for a while (a long apply, a pause of the process):
            # what peers sent meanwhile is unread, so no connection is judged this tick
            return
        for link in list(self._pending.values()):
            if now - link.opened_at > config.auth_timeout_s:
                self._count("auth_timeouts")
                self._warn_stranger(link, f"not authenticated within {config.auth_timeout_s}s")
                self._close(link, "no authentication in time", notify=False)
        for node, link in list(self._dials.items()):
            if link.connecting and now - link.opened_at > config.connect_timeout_s:
                self._count("connect_timeouts")
                self._close(link, f"not connected within {config.connect_timeout_s}s")
                self._next_dial[node] = now  # (dial again at once: the wait was the timeout)
            elif not link.connecting and now - link.opened_at > config.auth_timeout_s:
                self._count("auth_timeouts")
                if node not in self._handshake_warned:  # (once until it works)
                    self._handshake_warned.add(node)
                    log.warning(
                        "Raft: %s did not complete the handshake within %gs (another secret?)",
                        node.address,
                        config.auth_timeout_s,
                    )
                self._close(link, "no handshake in time")
        for node, link in list(self._links.items()):
            if now - link.last_read > config.dead_after_s:
                self._count("dead")
                self._close(link, f"nothing read for {config.dead_after_s}s")
            elif now - link.last_sent > config.keepalive_s:
                self.send(node, KEEPALIVE)
        for node in self._nodes.values():
            if (
                node.address < self._self.address
                and node not in self._links
                and node not in self._dials
                and now >= self._next_dial.get(node, 0.0)
            ):
                self._dial(node, now)
