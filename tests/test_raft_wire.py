"""The controllers' Raft connections, sans-IO (hamq/controller/raft_wire.py):
frames, the handshake, what a stranger's bytes can and cannot do. Bytes in, bytes and
events out; no sockets."""

from __future__ import annotations

import os
import pickle
import struct
import zlib
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from pysyncobj.encryptor import getEncryptor

from hamq.controller.raft_wire import (
    KEEPALIVE,
    MAX_FRAME_BYTES,
    PREAUTH_MAX_FRAME_BYTES,
    Authenticated,
    FrameDecoder,
    IllegalMove,
    RaftSession,
    RaftWireError,
    Received,
    State,
    frame,
    loads,
)

LOW, HIGH = "10.0.0.1:9877", "10.0.0.2:9877"  # HIGH dials LOW (the larger address dials)
KEY = getEncryptor("secret")  # (pysyncobj's key derivation: one per test run is enough)


class _Payload:
    """Unpickling it makes a directory: proof that a peer's bytes ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def pair(fernet: Fernet | None = KEY) -> tuple[RaftSession, RaftSession]:
    dialer = RaftSession(dialer=True, self_address=HIGH, partners=frozenset({LOW}), fernet=fernet)
    listener = RaftSession(
        dialer=False, self_address=LOW, partners=frozenset({HIGH}), fernet=fernet
    )
    return dialer, listener


def connect(dialer: RaftSession, listener: RaftSession) -> None:
    """Run the handshake to the end; both sides authenticated."""
    first, events = dialer.start()
    seen = list(events)
    to_listener, to_dialer = first, b""
    while to_listener or to_dialer:
        if to_listener:
            to_dialer, events = listener.receive(to_listener)
            assert all(isinstance(e, Authenticated) for e in events)
            seen += events
            to_listener = b""
        if to_dialer:
            to_listener, events = dialer.receive(to_dialer)
            seen += events
            to_dialer = b""
    assert set(seen) == {Authenticated(LOW), Authenticated(HIGH)}
    assert dialer.state is listener.state is State.OPEN


@pytest.mark.parametrize("fernet", [KEY, None], ids=["secret", "insecure"])
def test_a_handshake_then_messages_both_ways(fernet: Fernet | None) -> None:
    dialer, listener = pair(fernet)
    connect(dialer, listener)
    message = {"type": "append_entries", "entries": [(b"\x00call", 7, 2)], "set": {1, 2}}
    assert listener.receive(dialer.send(message)) == (b"", [Received(message)])
    back = {"type": "next_node_idx", "next_node_idx": 8, "success": True}
    assert dialer.receive(listener.send(back)) == (b"", [Received(back)])
    # keepalives are the transport's: no event
    assert listener.receive(dialer.send(KEEPALIVE)) == (b"", [])


def test_a_peer_with_another_secret_is_refused_at_its_first_frame(tmp_path: Path) -> None:
    dialer, _ = pair(getEncryptor("another secret"))
    _, listener = pair()
    first, _ = dialer.start()
    with pytest.raises(RaftWireError, match="does not decrypt"):
        listener.receive(first)
    assert listener.state is State.CLOSED
    with pytest.raises(RaftWireError):
        listener.receive(b"")


def test_nothing_a_stranger_sends_is_unpickled(tmp_path: Path) -> None:
    """pysyncobj's frame of a pickle, sent without the secret (and with the secret but
    naming a class): refused, never run."""
    marker = tmp_path / "ran"
    body = zlib.compress(pickle.dumps(_Payload(marker)))
    _, listener = pair()
    with pytest.raises(RaftWireError):
        listener.receive(struct.pack("<i", len(body)) + body)
    _, insecure = pair(None)
    with pytest.raises(RaftWireError, match=r"may not name posix\.mkdir"):
        insecure.receive(struct.pack("<i", len(body)) + body)
    dialer, listener = pair()
    connect(dialer, listener)
    with pytest.raises(RaftWireError, match="may not name"):
        listener.receive(dialer.send({"type": "x", "payload": _Payload(marker)}))
    assert not marker.exists()


def test_a_replayed_handshake_gets_nowhere() -> None:
    """A recording of one connection replayed on a new one: the listener's fresh key is
    not in the recorded third frame."""
    dialer, listener = pair()
    first, _ = dialer.start()
    answer, _ = listener.receive(first)
    third, _ = dialer.receive(answer)
    _, again = pair()
    again.receive(first)  # (the first frame decrypts: it was made with the key)
    with pytest.raises(RaftWireError, match="another connection's key"):
        again.receive(third)
    assert again.peer is None


def test_the_listener_takes_only_a_partner_that_dials_by_the_rule() -> None:
    stranger = RaftSession(
        dialer=True, self_address="10.0.0.9:1", partners=frozenset({LOW}), fernet=KEY
    )
    _, listener = pair()
    answer, _ = listener.receive(stranger.start()[0])
    with pytest.raises(RaftWireError, match="not a partner"):
        listener.receive(stranger.receive(answer)[0])
    # a partner with the smaller address must not dial (it would make a second link)
    wrong = RaftSession(dialer=True, self_address=LOW, partners=frozenset({HIGH}), fernet=KEY)
    upper = RaftSession(dialer=False, self_address=HIGH, partners=frozenset({LOW}), fernet=KEY)
    answer, _ = upper.receive(wrong.start()[0])
    with pytest.raises(RaftWireError, match="the node with the larger address dials"):
        upper.receive(wrong.receive(answer)[0])


def test_frames_before_authentication_are_small() -> None:
    _, listener = pair()
    with pytest.raises(RaftWireError, match=f"at most {PREAUTH_MAX_FRAME_BYTES}"):
        listener.receive(struct.pack("<i", 2**31 - 1))  # (refused on its 4 bytes alone)
    _, listener = pair()
    with pytest.raises(RaftWireError, match="-5 bytes"):
        listener.receive(struct.pack("<i", -5))
    dialer, listener = pair()
    connect(dialer, listener)
    big = {"type": "append_entries", "data": os.urandom(1024 * 1024)}
    assert listener.receive(dialer.send(big)) == (b"", [Received(big)])


def test_a_message_that_inflates_too_far_is_refused() -> None:
    """A zlib bomb in a frame small enough to pass: refused at the limit."""
    bomb = zlib.compress(pickle.dumps(b"\0" * (1024 * 1024)), 9)
    assert len(bomb) < PREAUTH_MAX_FRAME_BYTES
    _, listener = pair(None)
    with pytest.raises(RaftWireError, match="inflating to more than"):
        listener.receive(frame(bomb))


def test_the_decoder_keeps_at_most_a_frame_and_takes_whole_ones() -> None:
    decoder = FrameDecoder(100)
    stream = frame(b"a" * 10) + frame(b"") + frame(b"b" * 100)
    bodies = []
    for i in range(len(stream)):  # a byte at a time
        decoder.feed(stream[i : i + 1])
        while (body := decoder.next_frame()) is not None:
            bodies.append(body)
        assert decoder.buffered <= 4 + 100
    assert bodies == [b"a" * 10, b"", b"b" * 100]
    decoder.feed(struct.pack("<i", 101))
    with pytest.raises(RaftWireError, match="101 bytes"):
        decoder.next_frame()
    with pytest.raises(RaftWireError):  # poisoned
        decoder.feed(frame(b""))


def test_frames_after_authentication_are_bounded_too() -> None:
    dialer, listener = pair()
    connect(dialer, listener)
    with pytest.raises(RaftWireError, match=f"at most {MAX_FRAME_BYTES}"):
        listener.receive(struct.pack("<i", MAX_FRAME_BYTES + 1))


def test_a_frame_older_than_the_last_is_refused() -> None:
    now = [100.0]
    dialer = RaftSession(
        dialer=True, self_address=HIGH, partners=frozenset({LOW}), fernet=KEY, clock=lambda: now[0]
    )
    _, listener = pair()
    connect(dialer, listener)
    later = dialer.send({"type": "a"})
    now[0] = 50.0
    earlier = dialer.send({"type": "b"})
    listener.receive(later)
    with pytest.raises(RaftWireError, match="older than the one before"):
        listener.receive(earlier)


def test_pysyncobj_protocol_2_pickles_are_read() -> None:
    """What pysyncobj's own transport sends (an older controller): bytes and sets are
    spelled with globals in pickle protocol 2; those, and only those, are allowed."""
    message = {"type": "append_entries", "entries": [(b"cmd", 1, 1)], "s": {1}, "e": b""}
    assert loads(pickle.dumps(message, 2)) == message
    with pytest.raises(RaftWireError, match="may not name"):
        loads(pickle.dumps(RaftWireError("x"), 2))
    with pytest.raises(RaftWireError, match="encoding 'rot13'"):
        loads(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00rot13\x86R.")


def test_calls_out_of_order_are_illegal_moves() -> None:
    dialer, listener = pair()
    with pytest.raises(IllegalMove):
        dialer.send({"type": "x"})
    with pytest.raises(IllegalMove):
        listener.start()
    with pytest.raises(IllegalMove):
        dialer.receive(b"")
