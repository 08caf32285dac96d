r"""The controllers' Raft connections, sans-IO: frames, the handshake, the messages.

The wire format is pysyncobj's (0.3), so a controller of this version and one still on
pysyncobj's own transport talk to each other (a rolling upgrade)::

    frame    int32 length (little-endian) | body[length]
    body     Fernet(key, zlib(pickle(message)))        with a secret
             zlib(pickle(message))                      without one (--insecure-raft)

The Fernet key is pysyncobj's (PBKDF2 of the shared secret); a token's timestamp is the
sender's monotonic clock in seconds, and on one connection it never goes back.

Handshake, with a secret (the node with the larger address dials; ``A``, ``B`` are 32
fresh random bytes of the dialer and of the listener)::

    dialer   -> listener   A
    listener -> dialer     (A, B)
    dialer   -> listener   (B, dialer's Raft address)
    then every message     (the receiver's key, message)      -- A to the dialer, B to
                                                                 the listener

A frame that does not decrypt with the key (a stranger, another group's secret) ends the
connection. A peer is *authenticated* when its message carries the key this side made
for this connection: the listener's ``B``, the dialer's ``A`` (a replayed first frame
gets nowhere). Without a secret the dialer sends its address and both sides are open at
once. The listener takes only a partner's address (no read-only nodes, no pysyncobj
utility commands).

Bounds, so that bytes from a stranger cost little: before authentication a frame may be
at most ``PREAUTH_MAX_FRAME_BYTES`` (4 KiB; the handshake's are under 400 bytes) and
inflate to at most ``PREAUTH_MAX_MESSAGE_BYTES``; after, ``MAX_FRAME_BYTES`` (16 MiB) and
``MAX_MESSAGE_BYTES`` (64 MiB; pysyncobj sends batches of about 64 KiB). The decoder
keeps at most one frame's bytes and consumes only whole frames. Unpickling takes no
classes except what pysyncobj's messages are made of (bytes and sets in pickle protocol
2), so even a peer that has the secret cannot make the transport run code; what the
peer may do beyond that is pysyncobj's (its log entries are pickles of calls).

``KEEPALIVE`` (``{"type": "hamq_keepalive"}``) is sent on an idle connection; the
receiving session drops it (pysyncobj ignores message types it does not know, so an
older node takes it too). Every failure raises ``RaftWireError`` and poisons the session.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

import attrs
from cryptography.fernet import Fernet, InvalidToken

#: the largest frame before the peer is authenticated
PREAUTH_MAX_FRAME_BYTES = 4 * 1024
#: the largest message (inflated) before the peer is authenticated
PREAUTH_MAX_MESSAGE_BYTES = 16 * 1024
#: the largest frame of an authenticated peer
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: the largest message (inflated) of an authenticated peer
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RAND_KEY_BYTES = 32
KEEPALIVE_TYPE = "hamq_keepalive"
KEEPALIVE: dict[str, str] = {"type": KEEPALIVE_TYPE}
#: pickle protocol of what is sent (any is read)
PICKLE_PROTOCOL = 5
_LENGTH = struct.Struct("<i")


class RaftWireError(Exception):
    """Bytes on a Raft connection that break the protocol; the text says how."""


class State(enum.Enum):
    #: dialer, before ``start``
    DIAL = "dial"
    #: dialer, its key sent, waiting for the listener's answer
    AWAIT_ANSWER = "await answer"
    #: listener, waiting for the dialer's key (with a secret) or its address (without)
    AWAIT_HELLO = "await hello"
    #: listener, its key sent, waiting for the dialer's address under it
    AWAIT_PROOF = "await proof"
    OPEN = "open"
    CLOSED = "closed"


_MOVES: dict[State, frozenset[State]] = {
    State.DIAL: frozenset({State.AWAIT_ANSWER, State.OPEN, State.CLOSED}),
    State.AWAIT_ANSWER: frozenset({State.OPEN, State.CLOSED}),
    State.AWAIT_HELLO: frozenset({State.AWAIT_PROOF, State.OPEN, State.CLOSED}),
    State.AWAIT_PROOF: frozenset({State.OPEN, State.CLOSED}),
    State.OPEN: frozenset({State.CLOSED}),
    State.CLOSED: frozenset(),
}


class IllegalMove(RaftWireError):
    """A call the session's state does not allow (a bug of the caller)."""


@attrs.frozen
class Authenticated:
    """The peer proved it holds the secret (or, without one, said who it is)."""

    peer: str


@attrs.frozen
class Received:
    """A message of an authenticated peer, for pysyncobj."""

    message: Any


Event = Authenticated | Received


class FrameDecoder:
    """Whole frames out of a byte stream: ``feed`` bytes, then take ``next_frame`` until
    None. Each frame's length is checked against ``max_frame`` as it is reached (a
    caller may change it between frames), so the buffer holds at most what one
    ``feed`` brought plus one frame."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._start = 0
        self._poisoned: RaftWireError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._start

    def feed(self, data: bytes) -> None:
        if self._poisoned is not None:
            raise self._poisoned
        if self._start:
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """The next whole frame's body, None if it has not all come yet. RaftWireError
        for a length that is negative or over ``max_frame``; the decoder is poisoned
        then."""
        if self._poisoned is not None:
            raise self._poisoned
        buffer, start = self._buffer, self._start
        if len(buffer) - start < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(buffer, start)
        if length < 0 or length > self.max_frame:
            self._poisoned = RaftWireError(
                f"a frame of {length} bytes (at most {self.max_frame} here)"
            )
            buffer.clear()
            self._start = 0
            raise self._poisoned
        end = start + _LENGTH.size + length
        if len(buffer) < end:
            return None
        self._start = end
        return bytes(buffer[start + _LENGTH.size : end])


def frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as pickle protocol 2 uses it for bytes, and nothing else."""
    if encoding != "latin1":
        raise pickle.UnpicklingError(f"bytes in encoding {encoding!r}")
    return text.encode("latin1")


#: the only globals a message may name: how protocol 2 spells bytes and sets
_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("_codecs", "encode"): _latin1,
    **{
        (module, name): kind
        for module in ("builtins", "__builtin__")
        for name, kind in (("bytes", bytes), ("set", set), ("frozenset", frozenset))
    },
}


class _MessageUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"a Raft message may not name {module}.{name}")
        return found


def loads(data: bytes) -> Any:
    """A message unpickled without running any code (RaftWireError if it names a class)."""
    try:
        return _MessageUnpickler(io.BytesIO(data)).load()
    except RecursionError:
        raise RaftWireError("a message nested too deep") from None
    except Exception as exc:  # (unpickling a bad stream raises many types)
        raise RaftWireError(f"not a message: {exc}") from None


def inflate(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit)
    except zlib.error as exc:
        raise RaftWireError(f"not zlib data: {exc}") from None
    if inflater.unconsumed_tail:
        raise RaftWireError(f"a message inflating to more than {limit} bytes")
    if not inflater.eof:
        raise RaftWireError("a truncated zlib stream")
    return out


class RaftSession:
    """One Raft connection's protocol (module docstring).

    Args:
        dialer: this side connected (it speaks first).
        self_address: this node's Raft address (the dialer sends it).
        partners: the dialer: the one address it dialed; the listener: the addresses
            it accepts.
        fernet: the key (pysyncobj's), None without a secret.
        clock: monotonic seconds, for Fernet timestamps.
    """

    def __init__(
        self,
        *,
        dialer: bool,
        self_address: str,
        partners: frozenset[str],
        fernet: Fernet | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dialer = dialer
        self.self_address = self_address
        self.partners = partners
        self.fernet = fernet
        self.clock = clock
        if dialer and len(partners) != 1:
            raise ValueError("a dialer dials one partner")
        self.state = State.DIAL if dialer else State.AWAIT_HELLO
        #: the peer's Raft address (a listener's: once the dialer said it)
        self.peer: str | None = next(iter(partners)) if dialer else None
        self._decoder = FrameDecoder(PREAUTH_MAX_FRAME_BYTES)
        self._message_limit = PREAUTH_MAX_MESSAGE_BYTES
        #: the key the peer must put in its messages (made here)
        self._recv_key: bytes | None = None
        #: the key this side puts in its messages (made by the peer)
        self._send_key: bytes | None = None
        self._last_timestamp = 0

    def _move(self, to: State) -> None:
        if to not in _MOVES[self.state]:
            raise IllegalMove(f"a Raft session cannot go from {self.state.value} to {to.value}")
        self.state = to
        if to is State.OPEN:
            self._decoder.max_frame = MAX_FRAME_BYTES
            self._message_limit = MAX_MESSAGE_BYTES

    def _fail(self, why: str) -> RaftWireError:
        self.state = State.CLOSED
        return RaftWireError(why)

    # ------------------------------------------------------------------ sending
    def _seal(self, message: Any) -> bytes:
        if self._send_key is not None:
            message = (self._send_key, message)
        body = zlib.compress(pickle.dumps(message, PICKLE_PROTOCOL), 3)
        if self.fernet is not None:
            body = self.fernet.encrypt_at_time(body, int(self.clock()))
        return frame(body)

    def start(self) -> tuple[bytes, list[Event]]:
        """The dialer's first bytes, once connected; with them ``Authenticated`` when
        there is no secret (nothing to prove)."""
        if self.state is not State.DIAL:
            raise IllegalMove(f"only a dialer starts (this session is {self.state.value})")
        if self.fernet is None:
            self._move(State.OPEN)
            return self._seal(self.self_address), [Authenticated(str(self.peer))]
        self._recv_key = os.urandom(RAND_KEY_BYTES)
        self._move(State.AWAIT_ANSWER)
        return self._seal(self._recv_key), []

    def send(self, message: Any) -> bytes:
        """The bytes of ``message`` (only on an open session)."""
        if self.state is not State.OPEN:
            raise IllegalMove(f"cannot send on a Raft session that is {self.state.value}")
        return self._seal(message)

    # ------------------------------------------------------------------ receiving
    def receive(self, data: bytes) -> tuple[bytes, list[Event]]:
        """Take bytes from the peer: (bytes to send back, events). RaftWireError if they
        break the protocol (the session is closed then)."""
        if self.state is State.CLOSED:
            raise RaftWireError("the session is closed")
        if self.state is State.DIAL:
            raise IllegalMove("bytes before the dialer started")
        reply = b""
        events: list[Event] = []
        try:
            self._decoder.feed(data)
            while (body := self._decoder.next_frame()) is not None:
                more, event = self._body(body)
                reply += more
                if event is not None:
                    events.append(event)
        except RaftWireError as exc:
            self.state = State.CLOSED
            raise RaftWireError(str(exc)) from None
        return reply, events

    def _open(self, body: bytes) -> Any:
        if self.fernet is not None:
            try:
                timestamp = self.fernet.extract_timestamp(body)
                plain = self.fernet.decrypt(body)
            except InvalidToken:
                raise self._fail(
                    "a frame that does not decrypt with the Raft secret"
                    + ("" if self.state is State.OPEN else " (a peer without the secret?)")
                ) from None
            if timestamp < self._last_timestamp:
                raise self._fail("a frame older than the one before it")
            self._last_timestamp = timestamp
            body = plain
        try:
            message = loads(inflate(body, self._message_limit))
        except RaftWireError as exc:
            raise self._fail(str(exc)) from None
        if self._recv_key is None:
            return message
        if not (isinstance(message, tuple) and len(message) == 2):
            raise self._fail("a message without the connection's key")
        key, message = message
        if key != self._recv_key:
            raise self._fail("a message with another connection's key")
        return message

    def _body(self, body: bytes) -> tuple[bytes, Event | None]:
        message = self._open(body)
        state = self.state
        if state is State.OPEN:
            if isinstance(message, dict) and message.get("type") == KEEPALIVE_TYPE:
                return b"", None
            if not isinstance(message, dict) or "type" not in message:
                raise self._fail(f"a Raft message that is not one: {type(message).__name__}")
            return b"", Received(message)
        if state is State.AWAIT_ANSWER:  # (dialer) message: the listener's key
            if not (isinstance(message, bytes) and len(message) == RAND_KEY_BYTES):
                raise self._fail("the listener's answer is not a key")
            self._send_key = message
            self._move(State.OPEN)
            return self._seal(self.self_address), Authenticated(str(self.peer))
        if state is State.AWAIT_HELLO:
            if self.fernet is None:
                return b"", self._authenticated(message)
            if not (isinstance(message, bytes) and len(message) == RAND_KEY_BYTES):
                raise self._fail("the dialer's first message is not a key")
            self._send_key = message
            self._recv_key = os.urandom(RAND_KEY_BYTES)
            self._move(State.AWAIT_PROOF)
            return self._seal(self._recv_key), None
        if state is State.AWAIT_PROOF:
            return b"", self._authenticated(message)
        raise IllegalMove(f"a frame in state {state.value}")  # pragma: no cover

    def _authenticated(self, address: object) -> Authenticated:
        if not isinstance(address, str):
            raise self._fail(f"the dialer names itself with a {type(address).__name__}")
        if address not in self.partners:
            raise self._fail(f"the dialer names itself {address[:80]!r}, not a partner")
        if address <= self.self_address:
            raise self._fail(
                f"{address} dialed {self.self_address}: the node with the larger address dials"
            )
        self.peer = address
        self._move(State.OPEN)
        return Authenticated(address)
