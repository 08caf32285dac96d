"""TrioByteStream's receive for a plain socket (hamq/remoting/trio_stream.py): the bytes
Trio's own would give, in fewer steps, and never without letting other tasks run."""

from __future__ import annotations

import socket

import trio

from hamq.remoting.trio_stream import TrioByteStream


def _pair() -> tuple[TrioByteStream, socket.socket]:
    ours, theirs = socket.socketpair()
    return TrioByteStream(trio.SocketStream(trio.socket.from_stdlib_socket(ours))), theirs


async def test_a_socket_receive_gives_what_arrived_in_order_and_b_empty_at_eof() -> None:
    stream, peer = _pair()
    with peer:
        assert stream.raw_receive.__name__ == "_receive_socket"
        peer.sendall(b"0123456789")
        assert await stream.raw_receive(4) == b"0123"  # (its buffer filled: it yields, reads on)
        assert await stream.raw_receive(4) == b"4567"
        assert await stream.raw_receive(4) == b"89"  # (less than asked: drained)
        got: list[bytes] = []

        async def receive() -> None:
            got.append(await stream.raw_receive(4))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # a drained socket: the receive waits for the next bytes
            peer.sendall(b"ab")
        assert got == [b"ab"]
        peer.shutdown(socket.SHUT_WR)
        assert await stream.raw_receive(4) == b""
    await stream.aclose()


async def test_a_socket_receive_lets_other_tasks_run_between_reads() -> None:
    """A reader with a backlog to read (every read fills its buffer) still yields after
    each read, as Trio's receive does: a task that counts meanwhile runs between them."""
    stream, peer = _pair()
    with peer:
        peer.sendall(b"x" * 64)
        turns: list[int] = []
        ran = 0

        async def count() -> None:
            nonlocal ran
            while True:
                ran += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(count)
            for _ in range(8):
                before = ran
                assert await stream.raw_receive(8) == b"x" * 8
                turns.append(ran - before)
            nursery.cancel_scope.cancel()
        # each read is followed by a yield: the counter, runnable all along, ran once per
        # scheduling batch (Trio orders a batch at random: a turn may show 0 or 2)
        assert sum(turns) >= len(turns) - 1, turns
    await stream.aclose()


async def test_a_closed_socket_ends_a_waiting_receive() -> None:
    stream, peer = _pair()
    with peer:
        outcome: list[BaseException] = []

        async def receive() -> None:
            try:
                await stream.raw_receive(4)
            except (trio.ClosedResourceError, OSError) as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
        assert len(outcome) == 1
