"""One TCP stream speaking remoting frames, in both directions.

A ``Connection`` serves the requests its peer sends (through a ``Dispatcher``) and
sends requests of its own (``invoke`` / ``invoke_oneway``) matched to responses by
opaque. Server and client use the same class: brokers send requests to clients over
the clients' own connections (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE).

Tasks and invariants (all inside ``run``'s nursery):
- the reader decodes frames and handles each inline, in the order received: a
  response wakes its waiter, a request goes to the dispatcher. Processors that answer
  at once never cost a task, and the answers to one received chunk leave in one write
  that the reader makes itself when the socket is idle (no task switch per batch).
  The requests of one chunk (at most YIELD_EVERY_COMMANDS at a time) are a group: a
  processor may finish work it gathered for the whole group once it ends
  (``at_group_end``), before any other task runs.
- the reader never blocks on output: it writes what the socket takes at once
  (one non-blocking write on its file descriptor) and leaves the rest to the writer
  task. Two peers that both stopped reading until their output drained would wait
  for each other forever; instead, past ``max_send_buffer_bytes`` of unsent output
  the peer counts as not reading and the connection closes.
- everyone else appends whole frames to the output buffer, then writes what the
  socket takes at once the same way (no waiting for the writer task's turn) and the
  writer task sends the rest; a write never awaits, so a caller that is cancelled
  never leaves half a frame on the wire. Of our requests, only the first of a loop
  turn is written so; the turn's later ones leave together when the writer's turn
  comes (64 tasks woken by one chunk of answers: two writes, not 64). At most one
  send is in progress at a time (``_send_busy``); whoever finishes a send hands
  frames queued meanwhile to the writer. A send is only ever cancelled when the
  whole connection is torn down.
- our own requests wait while the output is above its high-water mark: backpressure
  for the side that produces. Otherwise a request's wait has no cancel scope: the
  expiry task of hamq/remoting/pending.py ends the waits whose deadline passed.
- requests answered later (async processors, ``defer``) are "in flight"; past
  ``max_in_flight_per_connection`` a new one is answered SYSTEM_BUSY at once.
- a watchdog task closes the connection once nothing has been received for
  ``idle_timeout_s``, or once a frame begun ``frame_timeout_s`` ago is still
  incomplete (a peer trickling bytes is never idle; no timer per receive). Its
  passes are counted (``watchdog_passes``): what a test waits on to know the
  connection was judged after a pause.
- the stream is an AnyIO byte stream, so the same class runs under Trio (the broker,
  and Trio clients) and asyncio (asyncio clients); the server hands it Trio's socket
  streams through hamq.remoting.trio_stream. The reader writes straight to the
  descriptor only under Trio on plain TCP: an asyncio transport buffers writes of its
  own, and TLS encrypts, so there every send goes through the writer task, and drain()
  cancels the receive instead of shutting the socket's read side.
- warnings a peer can provoke at will (malformed frames, slowloris cuts) go through
  a RateLimitedLog (the server's, shared by its connections).
- when the connection ends (EOF, error, bad frame, idle timeout, close()), every
  request of ours still waiting fails at once with RemotingConnectionClosed.
- ``drain()`` is the graceful end: stop reading, answer what is in flight, flush,
  close. ``close()`` is the hard end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc
import attrs

from hamq.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    RequestError,
    ResponseCode,
    encode_frame,
)
from hamq.ratelimit import RateLimitedLog
from hamq.remoting.config import RemotingConfig
from hamq.remoting.errors import (
    RemotingConnectionClosed,
    RemotingFrameTooLarge,
    RemotingTimeoutError,
    describe_failure,
)
from hamq.remoting.loop import EventLike, current_loop
from hamq.remoting.pending import Pending, RequestDeadlines
from hamq.remoting.responder import Responder
from hamq.remoting.trio_stream import direct_socket

if TYPE_CHECKING:
    from hamq.remoting.dispatch import Dispatcher

log = logging.getLogger(__name__)

#: a read that brought many commands lets other tasks run after every this many: a
#: master's HA writer then ships the first sends of a burst to the slave while the rest
#: are still being appended, instead of the whole burst moving in lockstep (append all,
#: replicate all, answer all). SYNC_MASTER sends with 64 in flight: about 1.6x the
#: msgs/s (benchmarks/replication.py --quick, 3 interleaved runs: median 8,297 vs 5,120)
YIELD_EVERY_COMMANDS = 16

_OPAQUE_MASK = 0x7FFFFFFF


@attrs.frozen
class ConnectionStatistics:
    peer: str
    requests_received: int
    responses_sent: int
    requests_sent: int
    responses_received: int
    #: received requests not answered yet (async or deferred processors)
    in_flight: int
    #: our requests waiting for their responses
    pending: int
    bytes_received: int
    bytes_sent: int
    send_buffer_bytes: int
    #: times the watchdog looked at the connection (it counts before it judges)
    watchdog_passes: int = 0
    #: groups the received requests were dispatched in (``Connection.at_group_end``)
    request_groups: int = 0
    #: writes made to the stream (frames sent / writes: how many each carried)
    writes: int = 0


class Connection:
    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        *,
        peer: str,
        dispatcher: Dispatcher,
        config: RemotingConfig,
        warnings: RateLimitedLog | None = None,
    ) -> None:
        self.peer = peer
        #: free for the layers above (client ids, group names) to tag a connection
        self.attributes: dict[str, Any] = {}
        self._stream = stream
        # the reader's receive: a stream may offer its own, one call layer less per chunk
        # (hamq.remoting.trio_stream: Trio's receive_some, b"" at EOF, and its errors)
        self._receive_some: Callable[[int], Awaitable[bytes | bytearray]] = getattr(
            stream, "raw_receive", stream.receive
        )
        self._receive_errors: tuple[type[Exception], ...] = (
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            OSError,
            *getattr(stream, "raw_errors", ()),
        )
        #: the running loop's Event, timeout scope and clock (hamq.remoting.loop says why)
        self._loop = current_loop()
        self._event = self._loop.event
        # the socket, and its descriptor (non-blocking under Trio) for the reader's writes
        self._socket = direct_socket(stream, self._loop.name)
        self._fd = self._socket.fileno() if self._socket is not None else -1
        self._dispatcher = dispatcher
        self._config = config
        self._decoder = FrameDecoder(config.max_frame_length)
        self._warnings = warnings or RateLimitedLog(log)
        #: when the first byte of the frame still incomplete arrived (None: none is)
        self._frame_started: float | None = None
        # output: frames waiting to be sent, and the bytes of the send under way
        self._out = bytearray()
        self._sending = 0
        self._send_busy = False
        self._in_read_batch = False
        #: a request of this loop turn was written from its caller: the turn's later ones
        #: wait for the writer (its turn comes once this one's tasks have run)
        self._requests_this_turn = False
        #: what processors finish once the group of requests being dispatched is done
        self._group_end: list[Callable[[], None]] = []
        self._writer_wakeup: EventLike | None = None
        self._write_progress: EventLike | None = None
        # our requests, by opaque, and the deadlines of their waits (the expiry task's)
        self._pending: dict[int, Pending] = {}
        self._next_opaque = 0
        self._deadlines = RequestDeadlines()
        # received requests answered later
        self._in_flight = 0
        self._idle: EventLike | None = None
        # lifecycle
        self._nursery: anyio.abc.TaskGroup | None = None
        # for streams without a direct socket (TLS, asyncio, test doubles): a scope
        # around each receive, and nothing else, so drain() cancels a receive, never a send
        self._receive_scope: anyio.CancelScope | None = None
        self._draining = False
        self._closed = False
        self._close_reason = ""
        self._close_listeners: list[Callable[[Connection], None]] = []
        # counters
        self._requests_received = 0
        self._responses_sent = 0
        self._requests_sent = 0
        self._responses_received = 0
        self._bytes_received = 0
        self._bytes_sent = 0
        self._watchdog_passes = 0
        self._request_groups = 0
        self._writes = 0

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str:
        return self._close_reason

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def add_close_listener(self, listener: Callable[[Connection], None]) -> None:
        """Call ``listener(conn)`` once, when the connection has closed."""
        self._close_listeners.append(listener)

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(
            peer=self.peer,
            requests_received=self._requests_received,
            responses_sent=self._responses_sent,
            requests_sent=self._requests_sent,
            responses_received=self._responses_received,
            in_flight=self._in_flight,
            pending=len(self._pending),
            bytes_received=self._bytes_received,
            bytes_sent=self._bytes_sent,
            send_buffer_bytes=len(self._out) + self._sending,
            watchdog_passes=self._watchdog_passes,
            request_groups=self._request_groups,
            writes=self._writes,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "draining" if self._draining else "open"
        return f"<Connection {self.peer} {state}>"

    # ------------------------------------------------------------------ lifecycle
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the connection until it ends; never raises for network trouble."""
        try:
            if self._close_reason:  # closed before it started
                task_status.started()
                return
            async with anyio.create_task_group() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                nursery.start_soon(self._deadlines.expire, self._loop)
                idle_s, frame_s = self._config.idle_timeout_s, self._config.frame_timeout_s
                if idle_s is not None or frame_s is not None:
                    nursery.start_soon(self._watchdog, idle_s, frame_s)
                task_status.started()
                reason = await self._read_loop()
                if self._draining and not self._close_reason:
                    await self._finish_in_flight()
                self._abort(reason)
        finally:
            self._abort("connection ended")
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(self._stream)
            log.debug("connection %s closed: %s", self.peer, self._close_reason)
            for listener in self._close_listeners:
                try:
                    listener(self)
                except Exception:
                    log.exception("close listener of %s failed", self.peer)

    def drain(self) -> None:
        """Graceful end: read nothing more, answer what is in flight, flush, close.

        Our own requests still waiting fail at once: their answers can no longer be read.
        """
        if self._closed or self._draining:
            return
        self._draining = True
        self._fail_pending("connection draining")
        if self._socket is not None:
            # a receive in progress sees EOF; sends are not affected
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RD)
        elif self._receive_scope is not None:
            self._receive_scope.cancel()

    def close(self, reason: str = "closed locally") -> None:
        """Hard end: close now; requests in flight go unanswered."""
        self._abort(reason)

    def _abort(self, reason: str) -> None:
        """Close at once: from here on the connection is closed for everyone, even while
        its tasks are still being cancelled."""
        if not self._close_reason:
            self._close_reason = reason
        self._closed = True
        self._fail_pending(self._close_reason)
        self._wake_progress()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _finish_in_flight(self) -> None:
        while self._in_flight > 0:
            self._idle = self._event()
            await self._idle.wait()
        await self._wait_flushed(0)

    # ------------------------------------------------------------------ reading
    async def _watchdog(self, idle_s: float | None, frame_s: float | None) -> None:
        """Close the connection once nothing has been received for ``idle_s`` seconds,
        or a frame has been arriving for ``frame_s`` seconds without being complete.
        Checks four times per the shorter period: a deadline is kept within a quarter."""
        seen = self._bytes_received
        clock = self._loop.current_time
        quiet_since = clock()
        period = min(t for t in (idle_s, frame_s) if t is not None) / 4
        while True:
            await anyio.sleep(period)
            self._watchdog_passes += 1
            now = clock()
            started = self._frame_started
            if frame_s is not None and started is not None and now - started >= frame_s:
                reason = (
                    f"a frame begun {now - started:.3g}s ago is still incomplete "
                    f"({self._decoder.buffered} bytes of it received; frame_timeout_s "
                    f"{frame_s:g})"
                )
                self._warnings.warning(
                    "frame_timeout", "closing connection with %s: %s", self.peer, reason
                )
                self._abort(reason)
                return
            if self._bytes_received != seen:
                seen = self._bytes_received
                quiet_since = now
            elif idle_s is not None and now - quiet_since >= idle_s:
                self._abort(f"nothing received for {idle_s:g}s")
                return

    async def _read_loop(self) -> str:
        decoder = self._decoder
        size = self._config.receive_size_bytes
        max_unsent = self._config.max_send_buffer_bytes
        dispatch = self._dispatcher.dispatch
        while not self._draining:
            try:
                data = await self._receive(size)
            except anyio.EndOfStream:
                data = b""
            except self._receive_errors as exc:
                return f"receive failed: {describe_failure(exc)}"
            if data is None:
                break  # drain() cancelled the receive before anything arrived
            if not data:
                if self._draining:
                    break  # drain() shut the socket's read side
                return "closed by peer"
            self._bytes_received += len(data)
            decoder.feed(data)
            try:
                commands = decoder.commands()
            except ProtocolError as exc:
                return self._protocol_error(exc)
            if not decoder.buffered:
                self._frame_started = None
            elif commands or self._frame_started is None:  # a new frame began in this chunk
                self._frame_started = self._loop.current_time()
            self._in_read_batch = True
            grouped = 0  # requests of the group being dispatched
            try:
                for i, cmd in enumerate(commands, 1):
                    if cmd.flag & FLAG_RESPONSE:
                        self._complete(cmd)
                    else:
                        self._requests_received += 1
                        grouped += 1
                        dispatch(cmd, self)
                    if i % YIELD_EVERY_COMMANDS == 0:  # (see YIELD_EVERY_COMMANDS)
                        if grouped:
                            self._end_group()
                            grouped = 0
                        await self._loop.checkpoint()
            finally:
                if grouped:
                    self._end_group()
                self._in_read_batch = False
            if self._out and not self._send_busy:  # else that sender hands them over
                try:
                    self._write_now()
                except OSError as exc:
                    return f"send failed: {exc}"
                if self._out:
                    self._kick_writer()
            if len(self._out) + self._sending > max_unsent:
                return (
                    f"peer is not reading: {len(self._out) + self._sending} bytes unsent, "
                    f"over max_send_buffer_bytes {max_unsent}"
                )
            if decoder.failed:
                try:
                    decoder.commands()
                except ProtocolError as exc:
                    return self._protocol_error(exc)
        return "drained"

    async def _receive(self, size: int) -> bytes | bytearray | None:
        """The next bytes received: None when drain() cancelled the receive; at the
        peer's EOF b"" or EndOfStream (a stream's raw receive, or AnyIO's)."""
        if self._socket is not None:  # drain() wakes this receive by shutting the read side
            return await self._receive_some(size)
        # TLS, asyncio, test doubles: a scope around the receive alone
        data = None
        with anyio.CancelScope() as self._receive_scope:
            data = await self._receive_some(size)
        self._receive_scope = None
        return data

    def _protocol_error(self, exc: ProtocolError) -> str:
        self._warnings.warning("protocol", "closing connection with %s: %s", self.peer, exc)
        return f"protocol error: {exc}"

    def at_group_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the group being dispatched (the complete frames of
        one read, at most YIELD_EVERY_COMMANDS) was handled, before any other task runs;
        at once outside a group. Processors finish work gathered per group there
        (hamq/broker/processors/send.py); its answers leave with the group's."""
        if self._in_read_batch:
            self._group_end.append(callback)
        else:
            callback()

    def _end_group(self) -> None:
        self._request_groups += 1
        callbacks = self._group_end
        while callbacks:
            callback = callbacks.pop(0)
            try:
                callback()
            except Exception:
                log.exception("%s: finishing a group of requests failed", self.peer)

    def _complete(self, response: RemotingCommand) -> None:
        self._responses_received += 1
        pending = self._pending.pop(response.opaque, None)
        if pending is None:
            log.debug("%s: dropping %s, nobody waits for it", self.peer, response.describe())
            return
        pending.response = response
        pending.done.set()

    # ------------------------------------------------------------------ answering
    def respond(
        self, request: RemotingCommand, response: RemotingCommand, *, flush: bool = True
    ) -> None:
        """Send ``response`` to a received ``request`` (nothing for oneway requests).

        The response gets the request's opaque and serialize type and the response bit.
        ``flush=False``: it leaves with the next write (the caller's ``flush()``).
        """
        if request.flag & FLAG_ONEWAY or self._closed:
            return
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = request.serialize_type
        try:
            frame = encode_frame(response)
            if len(frame) - 4 > self._config.max_frame_length:
                raise ValueError(
                    f"a response frame of {len(frame) - 4} bytes is over the maximum frame "
                    f"length {self._config.max_frame_length}"
                )
        except Exception as exc:
            log.error("%s: cannot send the response to %s: %s", self.peer, request.describe(), exc)
            frame = encode_frame(
                request.response_to(
                    ResponseCode.SYSTEM_ERROR,
                    f"the response to {request.describe()} could not be encoded "
                    f"({type(exc).__name__})",
                )
            )
        self._out += frame
        self._responses_sent += 1
        if flush and not self._in_read_batch:  # (else the reader writes its batch's answers)
            self._write_soon()

    def flush(self) -> None:
        """Send the answers given with ``flush=False`` (in the reader's batch: its write)."""
        if not self._in_read_batch and not self._closed:
            self._write_soon()

    def defer(self, request: RemotingCommand) -> Responder:
        """Take a place in flight for ``request``, to be answered later by the Responder.

        Raises RequestError(SYSTEM_BUSY) when the connection's in-flight limit is reached.
        """
        limit = self._config.max_in_flight_per_connection
        if self._in_flight >= limit:
            raise RequestError(
                ResponseCode.SYSTEM_BUSY,
                f"[OVERLOAD] {self._in_flight} requests already in flight on this "
                f"connection (limit {limit}); try again later",
            )
        self._in_flight += 1
        return Responder(self, request)

    def _release(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None:
        """Run ``fn(*args)`` as a task that lives no longer than this connection."""
        if self._closed:
            raise RemotingConnectionClosed(self.peer, f"connection closed ({self._close_reason})")
        if self._nursery is None:
            raise RuntimeError(f"{self!r} is not running")
        self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------------ requesting
    async def invoke(self, request: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``request`` and wait for its response; assigns ``request.opaque``.

        RemotingTimeoutError after ``timeout_s``; RemotingConnectionClosed at once if the
        connection ends first.
        """
        request.flag &= ~FLAG_ONEWAY
        frame = self._request_frame(request)
        opaque = request.opaque
        pending = Pending(self._event)
        self._pending[opaque] = pending
        try:
            high_water = self._config.write_buffer_high_water_bytes
            if (
                self._deadlines.expiring
                and len(self._out) + self._sending + len(frame) <= high_water
            ):
                # the usual case: no cancel scope, the expiry task times the wait out
                self._queue_request(frame)
                self._deadlines.add(pending, self._loop.current_time() + timeout_s)
                await pending.done.wait()
            else:  # (it may wait for room in the output: a scope around it all)
                with self._loop.move_on_after(timeout_s):
                    await self._send_request(frame)
                    await pending.done.wait()
            if pending.response is not None:
                return pending.response
            if pending.error is not None:
                raise pending.error
            raise RemotingTimeoutError(
                self.peer, f"no response to {request.describe()} within {timeout_s:g}s"
            )
        finally:
            pending.settled = True
            pending.response = None  # (the waits kept until their turn hold no bodies)
            self._pending.pop(opaque, None)
            self._deadlines.drop_settled()

    async def invoke_oneway(self, request: RemotingCommand, timeout_s: float) -> None:
        """Send ``request`` with the oneway bit; waits only for room in the send buffer."""
        request.flag |= FLAG_ONEWAY
        frame = self._request_frame(request)
        with self._loop.move_on_after(timeout_s) as scope:
            await self._send_request(frame)
        if scope.cancelled_caught:
            raise RemotingTimeoutError(
                self.peer, f"{request.describe()} not sent within {timeout_s:g}s (peer not reading)"
            )
        if self._closed and (self._out or self._sending):
            raise RemotingConnectionClosed(
                self.peer, f"connection closed before {request.describe()} was sent"
            )

    async def _send_request(self, frame: bytes) -> None:
        """Queue a request frame; wait while the buffer is over high water. Callers may be
        cancelled at any point here: a frame's bytes only ever leave whole."""
        self._queue_request(frame)
        await self._wait_flushed(self._config.write_buffer_high_water_bytes)

    def _queue_request(self, frame: bytes) -> None:
        """Queue a request frame (the turn's first is written now, later ones together)."""
        if self._closed:
            raise RemotingConnectionClosed(self.peer, f"connection closed ({self._close_reason})")
        self._out += frame
        if not self._in_read_batch:
            if self._requests_this_turn:
                self._kick_writer()  # (after this loop turn, with the turn's other requests)
            else:
                self._write_soon()
                self._requests_this_turn = True
                self._kick_writer()  # (its turn comes after this one's: it ends the turn)

    def _request_frame(self, request: RemotingCommand) -> bytes:
        if self._closed:
            raise RemotingConnectionClosed(self.peer, f"connection closed ({self._close_reason})")
        if self._draining:
            raise RemotingConnectionClosed(self.peer, "connection draining: no new requests")
        request.opaque = self._next_opaque
        self._next_opaque = (self._next_opaque + 1) & _OPAQUE_MASK
        request.flag &= ~FLAG_RESPONSE
        frame = encode_frame(request)
        if len(frame) - 4 > self._config.max_frame_length:
            raise RemotingFrameTooLarge(
                self.peer,
                f"{request.describe()} is a frame of {len(frame) - 4} bytes, over the "
                f"maximum frame length {self._config.max_frame_length}; nothing was sent",
            )
        self._requests_sent += 1
        return frame

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.error = RemotingConnectionClosed(
                self.peer, f"connection closed before the response arrived ({reason})"
            )
            waiter.done.set()

    # ------------------------------------------------------------------ writing
    def _kick_writer(self) -> None:
        wakeup = self._writer_wakeup
        if wakeup is not None:
            self._writer_wakeup = None
            wakeup.set()

    def _write_soon(self) -> None:
        """Frames were queued outside the reader's batch: what the socket takes goes now,
        from the caller (no wait for the writer task's turn, which under load comes
        after several rounds of other tasks' work), the writer sends the rest. A write
        that fails leaves the bytes to the writer, which meets the error and closes."""
        if self._out and not self._send_busy:
            try:
                self._write_now()
            except OSError:
                pass
        if self._out:
            self._kick_writer()

    def _write_now(self) -> None:
        """Write what the socket takes without blocking; the rest stays buffered."""
        if self._fd < 0:
            return  # not a socket: the writer task sends
        data = self._out
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            return
        self._writes += 1
        self._bytes_sent += written
        if written == len(data):
            self._out = bytearray()
        else:
            del data[:written]
        self._wake_progress()

    async def _send_out(self) -> None:
        """Send everything buffered; the caller made sure no other send is under way."""
        data, self._out = self._out, bytearray()
        self._send_busy = True
        self._sending = len(data)
        try:
            # a bytearray handed over whole (never touched again): every backend takes it
            await self._stream.send(cast(bytes, data))
            self._writes += 1
            self._bytes_sent += len(data)
        finally:
            self._send_busy = False
            self._sending = 0
            self._wake_progress()
        if self._out:
            self._kick_writer()  # frames queued during this send

    async def _wait_flushed(self, limit: int) -> None:
        """Wait until at most ``limit`` bytes are left to send (or the connection ends)."""
        while len(self._out) + self._sending > limit and not self._closed:
            if self._write_progress is None:
                self._write_progress = self._event()
            await self._write_progress.wait()

    def _wake_progress(self) -> None:
        progress = self._write_progress
        if progress is not None:
            self._write_progress = None
            progress.set()

    async def _write_loop(self) -> None:
        try:
            while True:
                if not self._out or self._send_busy:
                    self._writer_wakeup = self._event()
                    await self._writer_wakeup.wait()
                    self._requests_this_turn = False
                    continue
                await self._send_out()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._abort(f"send failed: {describe_failure(exc)}")
