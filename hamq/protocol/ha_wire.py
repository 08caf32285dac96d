r"""The master/slave HA channel's wire formats, sans-IO (docs/PROTOCOL.md#ha-wire).

Two protocols share the same TCP port (listen port + 1), chosen by configuration:

Classic (RocketMQ 4.x, 5.x ``DefaultHAService``), big-endian:
    slave -> master   report     int64 slaveMaxPhyOffset                      (8 bytes)
    master -> slave   transfer   int64 phyOffset | int32 bodySize | body      (12 + n)

Auto-switch (RocketMQ 5.x ``AutoSwitchHAClient`` / ``AutoSwitchHAConnection``):
    slave -> master   HANDSHAKE  int32 state=1 | int16 isSyncFromLastFile |
                                 int16 isAsyncLearner | int64 brokerId       (16 bytes)
                      TRANSFER   int32 state=2 | int64 slaveMaxPhyOffset     (12 bytes)
    master -> slave   HANDSHAKE  int32 state=1 | int32 bodySize | int64 maxPhyOffset |
                                 int32 lastEpoch | body: (int32 epoch, int64 start)*n
                      TRANSFER   int32 state=2 | int32 bodySize | int64 offset |
                                 int32 epoch | int64 epochStartOffset |
                                 int64 confirmOffset | body                  (36 + n)

A transfer with bodySize 0 is a heartbeat. Decoders are incremental: ``feed(bytes)``,
then take events until None (need more data). Anything that cannot be a valid message
(an unknown state, a negative or oversized body, a handshake body that is not whole
entries) raises ``HAProtocolError`` naming it, and poisons the decoder.

Membership proof (hamq's own; only when the master has ``[ha] secret``), before
anything above, in either protocol. The secret never crosses the wire: each side
proves it knows it with an HMAC-SHA256 over both sides' fresh nonces, so a proof
cannot be replayed, nor reflected (the two proofs are keyed by role)::

    master -> slave   CHALLENGE  magic "\xfeHA\x01" | masterNonce[32]            (36 bytes)
    slave -> master   RESPONSE   magic | slaveNonce[32] | slaveMac[32]          (68 bytes)
    master -> slave   RESULT     magic | int8 accepted (1) or refused (0) |
                                 masterMac[32] (zeros when refused)         (37 bytes)

    slaveMac  = HMAC-SHA256(secret, "hamq-ha slave\0"  + brokerName + "\0" +
                            masterNonce + slaveNonce)
    masterMac = HMAC-SHA256(secret, "hamq-ha master\0" + brokerName + "\0" +
                            masterNonce + slaveNonce)

The broker name (the group's) is in both MACs: a slave of another group that shares
the secret is refused too. The magic's first byte (0xfe) makes it an impossible first
message of both protocols (a negative offset, an unknown state), so a peer without the
secret fails at once with an error that says so (``MasterMessageDecoder`` names it).
Then the protocol's own messages follow on the same connection.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import hmac
import struct

import attrs

#: the most bytes one transfer may carry (RocketMQ sends 32 KiB; a margin for others)
MAX_TRANSFER_BODY = 64 * 1024 * 1024
#: the most epoch entries a handshake may list
MAX_EPOCH_ENTRIES = 1 << 20


class HAProtocolError(Exception):
    """Bytes on the HA channel that are not a valid message of its protocol."""


class HAProtocol(enum.Enum):
    CLASSIC = "classic"
    AUTOSWITCH = "autoswitch"


class HAState(enum.IntEnum):
    """RocketMQ's HAConnectionState; the auto-switch headers carry these ordinals."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3  # (RocketMQ's ordinal, kept; hamq never enters it: hamq/ha/states.py)
    SHUTDOWN = 4


@attrs.frozen
class EpochEntry:
    """Data from ``start_offset`` on was written under ``epoch`` (until the next entry)."""

    epoch: int
    start_offset: int


@attrs.frozen
class SlaveReport:
    """The slave's max CommitLog offset: where it wants data from, and its ack."""

    max_offset: int


@attrs.frozen
class SlaveHandshake:
    sync_from_last_file: bool
    async_learner: bool
    broker_id: int


@attrs.frozen
class MasterHandshake:
    max_offset: int
    last_epoch: int
    epochs: tuple[EpochEntry, ...]


@attrs.frozen(hash=False)
class Transfer:
    """CommitLog bytes from ``offset`` (empty: a heartbeat). The epoch fields are the
    auto-switch protocol's (0 in classic). ``body`` is a read-only view into what was
    received (no copy); it stays valid, the decoder never reuses its buffers."""

    offset: int
    body: bytes | memoryview
    epoch: int = 0
    epoch_start_offset: int = 0
    confirm_offset: int = 0


@attrs.frozen
class AuthChallenge:
    """The master's fresh nonce; the slave must answer with its proof."""

    nonce: bytes


@attrs.frozen
class AuthResponse:
    """The slave's fresh nonce and its proof of the secret."""

    nonce: bytes
    mac: bytes


@attrs.frozen
class AuthResult:
    """The master's verdict; when accepted, its own proof of the secret."""

    accepted: bool
    mac: bytes


AUTH_MAGIC = b"\xfeHA\x01"
AUTH_NONCE_BYTES = 32
AUTH_MAC_BYTES = 32
AUTH_CHALLENGE_BYTES = len(AUTH_MAGIC) + AUTH_NONCE_BYTES
AUTH_RESPONSE_BYTES = len(AUTH_MAGIC) + AUTH_NONCE_BYTES + AUTH_MAC_BYTES
AUTH_RESULT_BYTES = len(AUTH_MAGIC) + 1 + AUTH_MAC_BYTES
_AUTH_LABELS = {"slave": b"hamq-ha slave\0", "master": b"hamq-ha master\0"}

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_Q = struct.Struct(">q")
_CLASSIC_TRANSFER = struct.Struct(">qi")  # 12
_SLAVE_HANDSHAKE = struct.Struct(">ihhq")  # 16
_SLAVE_TRANSFER = struct.Struct(">iq")  # 12
_MASTER_HANDSHAKE = struct.Struct(">iiqi")  # 20
_EPOCH_ENTRY = struct.Struct(">iq")  # 12
_MASTER_TRANSFER = struct.Struct(">iiqiqq")  # 36


# ---------------------------------------------------------------- encoding


def encode_report(protocol: HAProtocol, max_offset: int) -> bytes:
    if protocol is HAProtocol.CLASSIC:
        return _Q.pack(max_offset)
    return _SLAVE_TRANSFER.pack(HAState.TRANSFER, max_offset)


def encode_slave_handshake(handshake: SlaveHandshake) -> bytes:
    return _SLAVE_HANDSHAKE.pack(
        HAState.HANDSHAKE,
        int(handshake.sync_from_last_file),
        int(handshake.async_learner),
        handshake.broker_id,
    )


def encode_master_handshake(handshake: MasterHandshake) -> bytes:
    body = b"".join(_EPOCH_ENTRY.pack(e.epoch, e.start_offset) for e in handshake.epochs)
    return (
        _MASTER_HANDSHAKE.pack(
            HAState.HANDSHAKE, len(body), handshake.max_offset, handshake.last_epoch
        )
        + body
    )


def encode_transfer_header(
    protocol: HAProtocol,
    offset: int,
    size: int,
    *,
    epoch: int = 0,
    epoch_start_offset: int = 0,
    confirm_offset: int = 0,
) -> bytes:
    """The header sent before ``size`` CommitLog bytes (sent as they are, after it)."""
    if protocol is HAProtocol.CLASSIC:
        return _CLASSIC_TRANSFER.pack(offset, size)
    return _MASTER_TRANSFER.pack(
        HAState.TRANSFER, size, offset, epoch, epoch_start_offset, confirm_offset
    )


def auth_mac(
    secret: bytes, role: str, broker_name: str, master_nonce: bytes, slave_nonce: bytes
) -> bytes:
    """The proof ``role`` ("slave" or "master") gives of knowing ``secret``."""
    message = b"".join((_AUTH_LABELS[role], broker_name.encode(), b"\0", master_nonce, slave_nonce))
    return hmac.new(secret, message, hashlib.sha256).digest()


def encode_auth_challenge(challenge: AuthChallenge) -> bytes:
    if len(challenge.nonce) != AUTH_NONCE_BYTES:
        raise ValueError(f"a challenge nonce is {AUTH_NONCE_BYTES} bytes")
    return AUTH_MAGIC + challenge.nonce


def encode_auth_response(response: AuthResponse) -> bytes:
    if len(response.nonce) != AUTH_NONCE_BYTES or len(response.mac) != AUTH_MAC_BYTES:
        raise ValueError(f"a response is a {AUTH_NONCE_BYTES}-byte nonce and a MAC")
    return AUTH_MAGIC + response.nonce + response.mac


def encode_auth_result(result: AuthResult) -> bytes:
    mac = result.mac if result.accepted else bytes(AUTH_MAC_BYTES)
    if len(mac) != AUTH_MAC_BYTES:
        raise ValueError(f"a result's MAC is {AUTH_MAC_BYTES} bytes")
    return AUTH_MAGIC + bytes([int(result.accepted)]) + mac


def _auth_body(data: bytes, size: int, what: str) -> bytes:
    if len(data) != size:
        raise HAProtocolError(f"an HA secret {what} is {size} bytes, not {len(data)}")
    if data[: len(AUTH_MAGIC)] != AUTH_MAGIC:
        raise HAProtocolError(
            f"not an HA secret {what} (it starts {data[:8].hex()}): the peer does not "
            "speak the secret exchange (no [ha] secret there?)"
        )
    return data[len(AUTH_MAGIC) :]


def decode_auth_challenge(data: bytes) -> AuthChallenge:
    return AuthChallenge(_auth_body(data, AUTH_CHALLENGE_BYTES, "challenge"))


def decode_auth_response(data: bytes) -> AuthResponse:
    body = _auth_body(data, AUTH_RESPONSE_BYTES, "response")
    return AuthResponse(body[:AUTH_NONCE_BYTES], body[AUTH_NONCE_BYTES:])


def decode_auth_result(data: bytes) -> AuthResult:
    body = _auth_body(data, AUTH_RESULT_BYTES, "result")
    if body[0] not in (0, 1):
        raise HAProtocolError(f"an HA secret result of {body[0]}, not 0 or 1")
    return AuthResult(body[0] == 1, body[1:])


# ---------------------------------------------------------------- decoding


class _Decoder:
    """Holds received chunks without joining them: a message is parsed from the chunk it
    starts in, and only a message that straddles two chunks is copied (just its own
    bytes). Chunks are never changed, so the views handed out stay valid."""

    __slots__ = ("_buffer", "_error", "_more", "_pos", "protocol")

    def __init__(self, protocol: HAProtocol) -> None:
        self.protocol = protocol
        self._buffer: bytes | memoryview = b""  # the chunk being parsed
        self._pos = 0
        self._more: collections.deque[memoryview] = collections.deque()  # chunks after it
        self._error: HAProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data if isinstance(data, bytes) else bytes(data))
        if view:
            self._more.append(view)

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._pos + sum(len(c) for c in self._more)

    def _have(self, n: int) -> bool:
        """Make the next ``n`` bytes contiguous at ``self._pos``; False if not all here."""
        avail = len(self._buffer) - self._pos
        if avail >= n:
            return True
        if avail == 0 and self._more:  # the next chunk, as it is
            self._buffer, self._pos = self._more.popleft(), 0
            return self._have(n)
        if avail + sum(len(c) for c in self._more) < n:
            return False
        parts = [memoryview(self._buffer)[self._pos :]]
        need = n - avail
        while need:
            chunk = self._more[0]
            if len(chunk) <= need:
                parts.append(self._more.popleft())
                need -= len(chunk)
            else:
                parts.append(chunk[:need])
                self._more[0] = chunk[need:]
                need = 0
        self._buffer, self._pos = b"".join(parts), 0
        return True

    def _fail(self, message: str) -> HAProtocolError:
        self._error = HAProtocolError(message)
        return self._error

    def _state(self) -> int | None:
        if not self._have(4):
            return None
        state: int = _I32.unpack_from(self._buffer, self._pos)[0]
        return state


class SlaveMessageDecoder(_Decoder):
    """What a master reads from a slave: reports (and, auto-switch, a handshake)."""

    __slots__ = ()

    def next_event(self) -> SlaveReport | SlaveHandshake | None:
        if self._error is not None:
            raise self._error
        if self.protocol is HAProtocol.CLASSIC:
            if not self._have(8):
                return None
            offset = _Q.unpack_from(self._buffer, self._pos)[0]
            self._pos += 8
            return self._report(offset)
        state = self._state()
        if state is None:
            return None
        if state == HAState.HANDSHAKE:
            if not self._have(_SLAVE_HANDSHAKE.size):
                return None
            _state, from_last_file, learner, broker_id = _SLAVE_HANDSHAKE.unpack_from(
                self._buffer, self._pos
            )
            self._pos += _SLAVE_HANDSHAKE.size
            return SlaveHandshake(bool(from_last_file), bool(learner), broker_id)
        if state == HAState.TRANSFER:
            if not self._have(_SLAVE_TRANSFER.size):
                return None
            offset = _SLAVE_TRANSFER.unpack_from(self._buffer, self._pos)[1]
            self._pos += _SLAVE_TRANSFER.size
            return self._report(offset)
        raise self._fail(f"a slave message with state {state}, not HANDSHAKE(1) or TRANSFER(2)")

    def _report(self, offset: int) -> SlaveReport:
        if offset < 0:
            raise self._fail(f"a slave reported offset {offset}")
        return SlaveReport(offset)


class MasterMessageDecoder(_Decoder):
    """What a slave reads from a master: transfers (and, auto-switch, a handshake)."""

    __slots__ = ("max_body",)

    def __init__(self, protocol: HAProtocol, max_body: int = MAX_TRANSFER_BODY) -> None:
        super().__init__(protocol)
        self.max_body = max_body

    def next_event(self) -> Transfer | MasterHandshake | None:
        if self._error is not None:
            raise self._error
        if self._have(len(AUTH_MAGIC)) and (
            self._buffer[self._pos : self._pos + len(AUTH_MAGIC)] == AUTH_MAGIC
        ):
            raise self._fail(
                "the master sent an HA secret challenge: it requires [ha] secret, which "
                "this slave does not have"
            )
        if self.protocol is HAProtocol.CLASSIC:
            header = _CLASSIC_TRANSFER
            if not self._have(header.size):
                return None
            offset, size = header.unpack_from(self._buffer, self._pos)
            body = self._body(header.size, offset, size)
            return None if body is None else Transfer(offset, body)
        state = self._state()
        if state is None:
            return None
        if state == HAState.HANDSHAKE:
            if not self._have(_MASTER_HANDSHAKE.size):
                return None
            _state, size, max_offset, last_epoch = _MASTER_HANDSHAKE.unpack_from(
                self._buffer, self._pos
            )
            if size % _EPOCH_ENTRY.size or not 0 <= size <= MAX_EPOCH_ENTRIES * _EPOCH_ENTRY.size:
                raise self._fail(f"a handshake body of {size} bytes is not whole epoch entries")
            if not self._have(_MASTER_HANDSHAKE.size + size):
                return None
            start = self._pos + _MASTER_HANDSHAKE.size
            epochs = tuple(
                EpochEntry(*_EPOCH_ENTRY.unpack_from(self._buffer, at))
                for at in range(start, start + size, _EPOCH_ENTRY.size)
            )
            self._pos = start + size
            return MasterHandshake(max_offset, last_epoch, epochs)
        if state == HAState.TRANSFER:
            if not self._have(_MASTER_TRANSFER.size):
                return None
            _state, size, offset, epoch, epoch_start, confirm = _MASTER_TRANSFER.unpack_from(
                self._buffer, self._pos
            )
            body = self._body(_MASTER_TRANSFER.size, offset, size)
            if body is None:
                return None
            return Transfer(offset, body, epoch, epoch_start, confirm)
        raise self._fail(f"a master message with state {state}, not HANDSHAKE(1) or TRANSFER(2)")

    def _body(self, header_size: int, offset: int, size: int) -> memoryview | None:
        if not 0 <= size <= self.max_body:
            raise self._fail(f"a transfer of {size} bytes (limit {self.max_body})")
        if offset < 0:
            raise self._fail(f"a transfer at offset {offset}")
        if not self._have(header_size + size):
            return None
        start = self._pos + header_size
        self._pos = start + size
        return memoryview(self._buffer)[start : start + size].toreadonly()
