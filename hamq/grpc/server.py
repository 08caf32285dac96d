"""GrpcServer: gRPC over HTTP/2 (h2, sans-IO) on Trio.

Lifecycle as RemotingServer's: ``await nursery.start(server.run)`` binds and reports the
port; ``shutdown(grace_s)`` sends every connection a GOAWAY, lets the calls under way
finish and cuts what is left when the grace ends; cancelling ``run`` is the hard end.

One connection per peer, three kinds of task:
- the reader feeds what arrives to the HTTP/2 state machine and acts on its events: a
  new stream starts a task for its call, data is cut into gRPC messages (a 5-byte
  prefix: compressed flag, length) and queued for the call, a reset cancels the call;
- one task per call runs its method (``Method``: unary, server streaming or bidi);
  a method answered by callback (``MethodKind.UNARY_CALLBACK``) has none: the reader
  hands it its request once the request is complete, and it answers when it can from
  whichever task learns the answer (``Call.answer``), so the calls a client makes most
  cost no task each (a request not complete by the end of the read that began it gets
  a task that waits for the rest);
- the writer sends what the state machine has to send. The reader writes too, as a
  remoting connection's does: once a read's events are handled (and the work they
  gathered, ``Call.at_read_end``), what they answered goes out in one non-blocking
  write on a plain socket while the writer is not sending; what the socket does not
  take, and everything decided in other tasks, the writer sends. A request answered at
  once costs one read and one write, no task woken. Nothing else touches the socket, so
  a call never waits for the peer to read: only for HTTP/2 flow control, and
  ``Call.try_send`` does not even wait for that.

Answers: a call ends with trailers (``grpc-status``, ``grpc-message``); one that fails
before sending a message gets them alone ("Trailers-Only"). A method raising GrpcError
ends with its status; one whose request is not its message type, INVALID_ARGUMENT;
any other exception, INTERNAL (logged). An unknown path is UNIMPLEMENTED.

Limits, each ending the stream or the connection that broke it, nothing else:
``max_connections`` and TLS as every listener has them (hamq.remoting.server.Acceptor,
ALPN ``h2``); at most ``max_concurrent_streams`` streams per connection (advertised;
one more is an HTTP/2 protocol error, the connection ends with a GOAWAY); header lists
past ``max_header_list_bytes`` likewise; a message past ``max_message_bytes`` ends its
stream with RESOURCE_EXHAUSTED; a unary or server-streaming request not complete
``request_timeout_s`` after it began is answered DEADLINE_EXCEEDED; more than
``max_queued_messages`` received and not yet read by a bidi call reset its stream; a
connection with no stream open for ``idle_timeout_s`` is closed; output the peer
leaves unread past ``max_send_buffer_bytes`` closes the connection. Bytes that are not
HTTP/2 (HTTP/1.1, TLS to a plaintext port, junk) end the connection at once.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import re
import urllib.parse
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
import trio
from attrs import validators as v
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from hamq.grpc.hpack_codec import Decoder, Encoder
from hamq.grpc.status import GrpcError, Status
from hamq.ratelimit import RateLimitedLog
from hamq.remoting import RemotingConfig
from hamq.remoting.address import format_address
from hamq.remoting.server import DEFAULT_SHUTDOWN_GRACE_S, Acceptor
from hamq.remoting.trio_stream import TrioByteStream

log = logging.getLogger(__name__)

_PREFIX = 5
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIMEOUT = re.compile(r"^(\d{1,8})([HMSmun])$")
#: what grpc-message keeps as it is (the rest is percent-encoded, as gRPC says)
_SAFE = " !#$&'()*+,/:;=?@[]"


def parse_timeout(value: str) -> float:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; ValueError if malformed."""
    match = _TIMEOUT.match(value)
    if match is None:
        raise ValueError(f"grpc-timeout {value!r} is not 1-8 digits and a unit of HMSmun")
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


@attrs.frozen
class GrpcConfig:
    #: listener-wide: max_connections, TLS, idle_timeout_s (a connection with no stream
    #: open this long is closed), frame_timeout_s (a request must be complete this long
    #: after its stream began, bidi streams aside), max_send_buffer_bytes
    remoting: RemotingConfig = attrs.field(factory=RemotingConfig)
    #: a gRPC message (either way) longer than this ends its stream
    max_message_bytes: int = attrs.field(default=16 * 1024 * 1024, validator=v.ge(1024))
    #: streams one connection may have open at once (advertised in SETTINGS)
    max_concurrent_streams: int = attrs.field(default=128, validator=v.ge(1))
    #: the size of a header list (HPACK-decoded, RFC 7541's count) a peer may send
    max_header_list_bytes: int = attrs.field(default=16 * 1024, validator=v.ge(1024))
    #: messages a bidi call may leave unread before its stream is reset
    max_queued_messages: int = attrs.field(default=64, validator=v.ge(1))
    #: the receive window of each stream, and of each connection
    window_bytes: int = attrs.field(default=1024 * 1024, validator=[v.ge(65535), v.le(2**31 - 1)])


class MethodKind(enum.Enum):
    UNARY = "unary"
    UNARY_CALLBACK = "unary, answered by callback"
    SERVER_STREAMING = "server streaming"
    BIDI = "bidi streaming"


#: unary: ``await handler(request, call)`` returns the response;
#: unary answered by callback: ``handler(request, call)`` (not a coroutine: it runs in
#: the connection's reader and must not block) answers then or later, from any task,
#: with ``call.answer(response)`` or ``call.fail(status, message)``; the call's deadline
#: is the client's to keep (a client past it resets the stream: the answer is dropped);
#: server streaming: ``await handler(request, call)`` sends with ``call.send``;
#: bidi: ``await handler(None, call)`` reads with ``call.receive``.
Handler = Callable[[Any, "Call"], Any]


@attrs.frozen
class Method:
    kind: MethodKind
    request_type: type[ProtoMessage]
    handler: Handler


@attrs.frozen
class GrpcStatistics:
    address: str
    connections: int
    connections_accepted: int
    calls: int
    calls_open: int
    #: connections ended by an HTTP/2 protocol error of the peer's
    protocol_errors: int
    connections_refused: int
    tls_handshake_failures: int


class _Ended(Exception):
    """The stream was reset, or the connection went: nothing more can be sent."""


class Call:
    """One gRPC call (an HTTP/2 stream) as its method sees it."""

    def __init__(self, conn: _Connection, stream_id: int, path: str, metadata: dict[str, str]):
        self._conn = conn
        self.stream_id = stream_id
        self.path = path
        #: the request's headers, names lower case (pseudo-headers left out)
        self.metadata = metadata
        self._method: Method | None = None
        self._buffer = bytearray()
        self._messages: deque[bytes] = deque()
        self._arrived = trio.Event()
        self._remote_ended = False
        self._reset = False
        self._headers_sent = False
        self._finished = False
        self._scope: trio.CancelScope | None = None
        #: (UNARY_CALLBACK) a task waits for the rest of its request
        self._awaited = False
        #: when the call's deadline (grpc-timeout) passes, in Trio's clock (inf: none)
        self.deadline = math.inf

    @property
    def remaining_s(self) -> float:
        """Seconds left before the call's deadline (inf: none)."""
        return self.deadline - trio.current_time()

    @property
    def peer(self) -> str:
        return self._conn.peer

    @property
    def connection_attributes(self) -> dict[str, Any]:
        """Free for the layers above to tag the connection (a client id, say)."""
        return self._conn.attributes

    @property
    def active(self) -> bool:
        """Neither reset nor finished, and its connection open."""
        return not (self._reset or self._finished or self._conn.closed)

    # ------------------------------------------------------------------ receiving
    def _data(self, data: bytes, max_bytes: int) -> GrpcError | None:
        self._buffer += data
        while len(self._buffer) >= _PREFIX:
            length = int.from_bytes(self._buffer[1:5], "big")
            if length > max_bytes:
                return GrpcError(
                    Status.RESOURCE_EXHAUSTED,
                    f"a message of {length} bytes is past the limit of {max_bytes}",
                )
            if len(self._buffer) < _PREFIX + length:
                break
            flag = self._buffer[0]
            payload = bytes(self._buffer[_PREFIX : _PREFIX + length])
            del self._buffer[: _PREFIX + length]
            if flag:
                try:
                    payload = self._decompress(payload, max_bytes)
                except GrpcError as exc:
                    return exc
            self._messages.append(payload)
        self._arrived.set()
        return None

    def _decompress(self, payload: bytes, max_bytes: int) -> bytes:
        encoding = self.metadata.get("grpc-encoding", "identity")
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
        if wbits is None:
            raise GrpcError(Status.UNIMPLEMENTED, f"grpc-encoding {encoding!r} is not supported")
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(payload, max_bytes + 1)
        except zlib.error as exc:
            raise GrpcError(
                Status.INTERNAL, f"a {encoding} message does not inflate: {exc}"
            ) from None
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED, f"a message inflates past the limit of {max_bytes}"
            )
        return out

    def _end_of_input(self) -> None:
        self._remote_ended = True
        self._arrived.set()

    async def receive(self) -> Any | None:
        """The next message the peer sent (of the method's request type), or None when
        it ended its side. Malformed protobuf: GrpcError INVALID_ARGUMENT."""
        while not self._messages:
            if self._remote_ended or self._reset:
                return None
            self._arrived = trio.Event()
            await self._arrived.wait()
        return self._parse(self._messages.popleft())

    def _parse(self, payload: bytes) -> Any:
        assert self._method is not None
        try:
            return self._method.request_type.FromString(payload)
        except DecodeError as exc:
            raise GrpcError(
                Status.INVALID_ARGUMENT,
                f"the request is not a {self._method.request_type.DESCRIPTOR.full_name}: {exc}",
            ) from None

    @property
    def queued(self) -> int:
        return len(self._messages)

    # ------------------------------------------------------------------ sending
    async def send(self, message: ProtoMessage) -> None:
        """Send one message, waiting for HTTP/2 flow control (never for the socket);
        _Ended (a subclass of Exception) when the stream or connection is gone."""
        await self._send_framed(self._frame(message))

    async def _send_framed(self, data: bytearray) -> None:
        while data:
            if not self.active:
                raise _Ended
            taken = self._conn.send_data(self, data)
            del data[:taken]
            if data:
                await self._conn.window_opened()

    def try_send(self, message: ProtoMessage) -> bool:
        """Send one message if HTTP/2 flow control lets all of it go now; False (and
        nothing sent) if it does not, or the stream is gone. Never waits."""
        if not self.active:
            return False
        data = self._frame(message)
        if self._conn.flow_window(self) < len(data):
            return False
        try:
            self._conn.send_data(self, data)
        except _Ended:
            return False
        return True

    def answer(self, message: ProtoMessage) -> None:
        """A UNARY_CALLBACK call's answer: sent, and the call ended OK (dropped if the
        call is gone). Never waits: what flow control holds back goes in a task."""
        if not self.active:
            return
        try:
            data = self._frame(message)
        except GrpcError as exc:
            self.fail(exc.status, exc.message)
            return
        if self._conn.flow_window(self) < len(data):
            self._conn.answer_later(self, data)
            return
        try:
            self._conn.send_data(self, data)
        except _Ended:
            return
        self._conn._finish(self, Status.OK, "")

    def at_read_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the events of the read being handled (the one that
        completed this call's request, for a UNARY_CALLBACK method) are all handled,
        before what they answer is written; at once outside a read. Work gathered per
        read is finished there (hamq/broker/grpc/channel.py dispatches a group)."""
        self._conn.at_read_end(callback)

    def fail(self, status: Status, message: str) -> None:
        """End a UNARY_CALLBACK call with ``status`` and no answer (if it is not gone)."""
        self._conn._finish(self, status, message)

    def _frame(self, message: ProtoMessage) -> bytearray:
        payload = message.SerializeToString()
        if len(payload) > self._conn.config.max_message_bytes:
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED,
                f"an answer of {len(payload)} bytes is past the limit of "
                f"{self._conn.config.max_message_bytes}",
            )
        out = bytearray(b"\0")
        out += len(payload).to_bytes(4, "big")
        out += payload
        return out


class _Connection:
    def __init__(self, server: GrpcServer, stream: trio.abc.Stream, peer: str) -> None:
        self.server = server
        self.config = server.config
        self.peer = peer
        self.attributes: dict[str, Any] = {}
        self._stream = stream
        # (Trio's receive in fewer steps on a plain socket; its descriptor for the
        # reader's own writes: hamq/remoting/trio_stream.py says why)
        self._receive = TrioByteStream(stream).raw_receive
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        # h2's header checks (RFC 9113 8.2, per header, per request) cost a third of a
        # call's time here; what a call uses is checked in _check and _request, what it
        # sends is this module's own
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,  # (bytes: each request's few are decoded in _request)
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config)
        # (HPACK as a gRPC server needs it: hamq/grpc/hpack_codec.py says why)
        self.h2.decoder = Decoder()
        self.h2.encoder = Encoder()
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.config.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.config.max_header_list_bytes,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.config.window_bytes,
            },
        )
        self.h2.decoder.max_header_list_size = self.config.max_header_list_bytes
        self.calls: dict[int, Call] = {}
        #: UNARY_CALLBACK calls whose request is not complete yet
        self._unstarted: dict[int, Call] = {}
        self.closed = False
        self._going_away = False
        #: a GOAWAY to send (shutdown): the streams open go on, new ones are refused
        self._goaway = b""
        #: bytes taken from the state machine and not written yet, and whether the
        #: writer is sending (the reader then writes nothing: it would cut in)
        self._out = bytearray()
        self._send_busy = False
        #: the reader is handling a read's events: what they answer is written at the
        #: end, and ``at_read_end`` callbacks run then
        self._reading = False
        self._read_end: list[Callable[[], None]] = []
        self._out_wakeup = trio.Event()
        self._window_wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._last_stream_activity = trio.current_time()

    # ------------------------------------------------------------------ lifecycle
    async def serve(self) -> None:
        self.h2.initiate_connection()
        grow = self.config.window_bytes - 65535
        if grow > 0:
            self.h2.increment_flow_control_window(grow)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                nursery.start_soon(self._idle_watch)
                await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            for call in self.calls.values():
                call._reset = True
                call._arrived.set()
            self._window_wakeup.set()

    async def _read_loop(self) -> None:
        size = self.config.remoting.receive_size_bytes
        while True:
            try:
                data = await self._receive(size)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if not data:
                return
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self.server.protocol_errors += 1
                self.server.warnings.warning(
                    "protocol", "gRPC: closed %s: not HTTP/2 as expected: %s", self.peer, exc
                )
                await self._flush_last()
                return
            self._reading = True
            try:
                for event in events:
                    self._event(event)
                for call in self._unstarted.values():
                    if not call._awaited:  # (a request longer than a read: a task waits)
                        call._awaited = True
                        assert self._nursery is not None
                        self._nursery.start_soon(self._await_request, call)
                self._run_read_end()
            finally:
                self._reading = False
            self._write_now()

    def at_read_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the events of the read being handled are handled,
        before what they answer is written; at once outside a read."""
        if self._reading:
            self._read_end.append(callback)
        else:
            callback()

    def _run_read_end(self) -> None:
        callbacks = self._read_end
        while callbacks:
            callback = callbacks.pop(0)
            try:
                callback()
            except Exception:
                log.exception("gRPC: a read's end callback for %s failed", self.peer)

    def _write_now(self) -> None:
        """Write what there is to send without waiting (the reader's, after a read: no
        wait for the writer's turn); what the socket does not take, the writer sends."""
        if self._send_busy or self._fd < 0:
            self._out_wakeup.set()
            return
        self._out += self.h2.data_to_send()
        if self._out:
            try:
                written = os.write(self._fd, self._out)
            except BlockingIOError:
                written = 0
            except OSError:
                self.abort()
                return
            del self._out[:written]
        if self._out or self._goaway:
            self._out_wakeup.set()

    async def _flush_last(self) -> None:
        """Send what is pending (a GOAWAY, say) within a moment, then give up."""
        with trio.move_on_after(1.0):
            data = bytes(self._out) + self.h2.data_to_send()
            self._out = bytearray()
            if data:
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def _write_loop(self) -> None:
        limit = self.config.remoting.max_send_buffer_bytes
        while True:
            self._out += self.h2.data_to_send() + self._goaway
            self._goaway = b""
            if not self._out and self._going_away and not self.calls:
                self.abort()  # (the GOAWAY is out, the last call answered)
                return
            if not self._out:
                self._out_wakeup = trio.Event()
                await self._out_wakeup.wait()
                continue
            data, self._out = self._out, bytearray()
            if len(data) > limit:
                self.server.warnings.warning(
                    "slow", "gRPC: closed %s: it leaves %d bytes unread", self.peer, len(data)
                )
                self.abort()
                return
            self._send_busy = True
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.abort()
                return
            finally:
                self._send_busy = False

    async def _idle_watch(self) -> None:
        timeout = self.config.remoting.idle_timeout_s
        if timeout is None:
            return
        while True:
            await trio.sleep_until(self._last_stream_activity + timeout)
            if self.calls:
                self._last_stream_activity = trio.current_time()
            elif trio.current_time() >= self._last_stream_activity + timeout:
                log.info("gRPC: closed %s: no stream for %g s", self.peer, timeout)
                self.h2.close_connection()
                await self._flush_last()
                self.abort()
                return

    def abort(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def goaway(self) -> None:
        """Tell the peer to open no new stream (the calls under way go on)."""
        if not self.closed and not self._going_away:
            self._going_away = True
            # (written by hand: h2's close_connection would end the calls under way too)
            frame = hyperframe.frame.GoAwayFrame(0)
            frame.last_stream_id = self.h2.highest_inbound_stream_id
            frame.error_code = h2.errors.ErrorCodes.NO_ERROR
            self._goaway = frame.serialize()
            self._kick()

    def _kick(self) -> None:
        if not self._reading:  # (the reader writes what a read's events answer)
            self._out_wakeup.set()

    # ------------------------------------------------------------------ events
    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._received(event)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call._end_of_input()
                if call.stream_id in self._unstarted:
                    self._start_callback(call)
        elif isinstance(event, h2.events.StreamReset):
            self._stream_gone(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window_wakeup.set()
            self._window_wakeup = trio.Event()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.abort()

    def _request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        headers = {
            k.decode("latin-1"): value.decode("utf-8", "replace")
            for k, value in event.headers or ()
        }
        path = headers.get(":path", "")
        metadata = {k: value for k, value in headers.items() if not k.startswith(":")}
        call = Call(self, stream_id, path, metadata)
        if self._going_away:
            self._reset_stream(call, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        self.calls[stream_id] = call
        self._last_stream_activity = trio.current_time()
        self.server.calls += 1
        problem = self._check(headers)
        if problem is not None:
            self._finish(call, *problem)
            return
        call._method = self.server.methods.get(path)
        if call._method is None:
            self._finish(call, Status.UNIMPLEMENTED, f"unknown method {path}")
            return
        deadline = math.inf
        if "grpc-timeout" in metadata:
            try:
                deadline = trio.current_time() + parse_timeout(metadata["grpc-timeout"])
            except ValueError as exc:
                self._finish(call, Status.INVALID_ARGUMENT, str(exc))
                return
        if call._method.kind is MethodKind.UNARY_CALLBACK:
            call.deadline = deadline
            self._unstarted[stream_id] = call
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._run_call, call, deadline)

    @staticmethod
    def _check(headers: dict[str, str]) -> tuple[Status, str] | None:
        if headers.get(":method") != "POST":
            return Status.UNIMPLEMENTED, f"method {headers.get(':method')!r}: gRPC is POST"
        content_type = headers.get("content-type", "")
        if content_type != "application/grpc" and not content_type.startswith(
            ("application/grpc+proto", "application/grpc;")
        ):
            return Status.UNKNOWN, f"content-type {content_type!r} is not application/grpc"
        return None

    def _received(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id
        self.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
        call = self.calls.get(stream_id)
        if call is None or call._reset or call._finished:
            return
        problem = call._data(event.data or b"", self.config.max_message_bytes)
        if problem is not None:
            self._finish(call, problem.status, problem.message)
        elif call.queued > self.config.max_queued_messages:
            self.server.warnings.warning(
                "queued",
                "gRPC: reset a stream of %s: %d messages unread",
                self.peer,
                call.queued,
            )
            self._reset_stream(call, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _stream_gone(self, stream_id: int) -> None:
        self._unstarted.pop(stream_id, None)
        call = self.calls.pop(stream_id, None)
        if call is None:
            return
        call._reset = True
        call._arrived.set()
        if call._scope is not None:
            call._scope.cancel()
        self._window_wakeup.set()
        self._window_wakeup = trio.Event()
        self._kick()

    def _reset_stream(self, call: Call, code: h2.errors.ErrorCodes) -> None:
        try:
            self.h2.reset_stream(call.stream_id, code)
        except h2.exceptions.ProtocolError:
            pass
        self._stream_gone(call.stream_id)
        self._kick()

    # ------------------------------------------------------------------ calls
    async def _run_call(self, call: Call, deadline: float) -> None:
        method = call._method
        assert method is not None
        status, message = Status.OK, ""
        call.deadline = deadline
        with trio.CancelScope(deadline=deadline) as scope:
            call._scope = scope
            try:
                if method.kind is MethodKind.BIDI:
                    await method.handler(None, call)
                else:
                    request = await self._only_request(call)
                    answer = await method.handler(request, call)
                    if method.kind is MethodKind.UNARY:
                        await call.send(answer)
            except GrpcError as exc:
                status, message = exc.status, exc.message
            except _Ended:
                return
            except Exception as exc:
                log.error("gRPC: %s failed", call.path, exc_info=exc)
                status, message = Status.INTERNAL, f"{type(exc).__name__}: {exc}"
        if call._reset or self.closed:
            return
        if scope.cancelled_caught:
            status, message = Status.DEADLINE_EXCEEDED, "the call's deadline (grpc-timeout) passed"
        self._finish(call, status, message)

    def _start_callback(self, call: Call) -> None:
        """A UNARY_CALLBACK call's request is complete: its handler has it."""
        del self._unstarted[call.stream_id]
        if call._finished or call._reset:
            return
        method = call._method
        assert method is not None
        try:
            if len(call._messages) != 1:
                raise GrpcError(
                    Status.INVALID_ARGUMENT,
                    "the call ended without a request"
                    if not call._messages
                    else "a unary request holds one message",
                )
            method.handler(call._parse(call._messages.popleft()), call)
        except GrpcError as exc:
            self._finish(call, exc.status, exc.message)
        except Exception as exc:
            log.error("gRPC: %s failed", call.path, exc_info=exc)
            self._finish(call, Status.INTERNAL, f"{type(exc).__name__}: {exc}")

    async def _await_request(self, call: Call) -> None:
        """The rest of a UNARY_CALLBACK call's request, within ``frame_timeout_s`` (and
        its deadline); the reader starts the call when it is complete."""
        timeout = self.config.remoting.frame_timeout_s or math.inf
        why = f"the request was not complete {timeout} s after it began"
        if call.deadline < trio.current_time() + timeout:
            why = "the call's deadline (grpc-timeout) passed"
        with trio.move_on_at(min(call.deadline, trio.current_time() + timeout)):
            while call.stream_id in self._unstarted:
                call._arrived = trio.Event()
                await call._arrived.wait()
            return
        if self._unstarted.pop(call.stream_id, None) is not None:
            self._finish(call, Status.DEADLINE_EXCEEDED, why)

    def answer_later(self, call: Call, data: bytearray) -> None:
        """Send a UNARY_CALLBACK call's answer as flow control lets it, then end it."""
        assert self._nursery is not None
        self._nursery.start_soon(self._answer_later, call, data)

    async def _answer_later(self, call: Call, data: bytearray) -> None:
        try:
            await call._send_framed(data)
        except _Ended:
            return
        self._finish(call, Status.OK, "")

    async def _only_request(self, call: Call) -> Any:
        with trio.move_on_after(self.config.remoting.frame_timeout_s or math.inf):
            request = await call.receive()
            if request is None:
                raise GrpcError(Status.INVALID_ARGUMENT, "the call ended without a request")
            while not call._remote_ended and not call._messages:
                call._arrived = trio.Event()
                await call._arrived.wait()
            if call._messages:
                raise GrpcError(Status.INVALID_ARGUMENT, "a unary request holds one message")
            return request
        raise GrpcError(
            Status.DEADLINE_EXCEEDED,
            f"the request was not complete {self.config.remoting.frame_timeout_s} s after it began",
        )

    def _finish(self, call: Call, status: Status, message: str) -> None:
        if call._finished or call._reset or self.closed:
            return
        trailers = [("grpc-status", str(int(status)))]
        if message:
            trailers.append(("grpc-message", urllib.parse.quote(message, safe=_SAFE)))
        try:
            if not call._headers_sent:
                self.h2.send_headers(
                    call.stream_id,
                    [(":status", "200"), ("content-type", "application/grpc"), *trailers],
                    end_stream=True,
                )
            else:
                self.h2.send_headers(call.stream_id, trailers, end_stream=True)
        except h2.exceptions.ProtocolError:  # (the stream or the connection is gone)
            pass
        call._finished = True
        self.calls.pop(call.stream_id, None)
        self._unstarted.pop(call.stream_id, None)
        self._last_stream_activity = trio.current_time()
        self._kick()

    def flow_window(self, call: Call) -> int:
        """What HTTP/2 flow control lets the call send now."""
        try:
            return self.h2.local_flow_control_window(call.stream_id)
        except h2.exceptions.ProtocolError:
            return 0

    def send_data(self, call: Call, data: bytearray) -> int:
        """Hand the state machine as much of ``data`` as flow control allows now;
        _Ended if the stream or the connection is gone."""
        try:
            return self._send_data(call, data)
        except h2.exceptions.ProtocolError:
            raise _Ended from None

    def _send_data(self, call: Call, data: bytearray) -> int:
        if not call._headers_sent:
            self.h2.send_headers(
                call.stream_id, [(":status", "200"), ("content-type", "application/grpc")]
            )
            call._headers_sent = True
        sent = 0
        while sent < len(data):
            size = min(self.flow_window(call), self.h2.max_outbound_frame_size, len(data) - sent)
            if size <= 0:
                break
            self.h2.send_data(call.stream_id, bytes(data[sent : sent + size]))
            sent += size
        self._kick()
        return sent

    async def window_opened(self) -> None:
        await self._window_wakeup.wait()


class GrpcServer:
    def __init__(
        self,
        methods: dict[str, Method],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: GrpcConfig | None = None,
    ) -> None:
        if not 0 <= port < 65536:
            raise ValueError(f"port {port} is not in 0..65535")
        self.methods = methods
        self.host = host
        self.port = port
        self.config = config or GrpcConfig()
        self.warnings = RateLimitedLog(log)
        self._acceptor = Acceptor(
            "gRPC server", self.config.remoting, self.warnings, alpn_protocols=("h2",)
        )
        self._connections: set[_Connection] = set()
        #: called with a connection's ``attributes`` once it has closed
        self.on_close: list[Callable[[dict[str, Any]], None]] = []
        self._accepted = 0
        self.calls = 0
        self.protocol_errors = 0
        self._shutdown = trio.Event()
        self._all_closed = trio.Event()
        self._grace_s = DEFAULT_SHUTDOWN_GRACE_S

    @property
    def tls(self) -> bool:
        return self._acceptor.tls

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            serving = trio.CancelScope()

            async def accept() -> None:
                with serving:
                    await self._acceptor.serve(listeners, self._serve, nursery)

            nursery.start_soon(accept)
            task_status.started(self.port)
            await self._shutdown.wait()
            serving.cancel()
            for conn in list(self._connections):
                conn.goaway()  # each closes once its last call is answered
            with trio.move_on_after(self._grace_s):
                if self._connections:
                    await self._all_closed.wait()
            nursery.cancel_scope.cancel()

    def shutdown(self, grace_s: float = DEFAULT_SHUTDOWN_GRACE_S) -> None:
        self._grace_s = grace_s
        self._shutdown.set()

    async def _serve(self, stream: trio.abc.Stream, peer: str) -> None:
        conn = _Connection(self, stream, peer)
        self._connections.add(conn)
        self._accepted += 1
        try:
            await conn.serve()
        except Exception:  # (a bug: it ends this connection alone)
            log.exception("gRPC: the connection of %s failed", peer)
        finally:
            self._connections.discard(conn)
            for listener in self.on_close:
                try:
                    listener(conn.attributes)
                except Exception:
                    log.exception("gRPC: a close listener of %s failed", peer)
            if not self._connections and self._shutdown.is_set():
                self._all_closed.set()

    def connection_attributes(self) -> list[dict[str, Any]]:
        """The ``attributes`` of each open connection (what the layers above tagged)."""
        return [conn.attributes for conn in self._connections]

    def statistics(self) -> GrpcStatistics:
        return GrpcStatistics(
            address=format_address(self.host, self.port),
            connections=len(self._connections),
            connections_accepted=self._accepted,
            calls=self.calls,
            calls_open=sum(len(conn.calls) for conn in self._connections),
            protocol_errors=self.protocol_errors,
            connections_refused=self._acceptor.refused,
            tls_handshake_failures=self._acceptor.handshake_failures,
        )
