"""The controllers' Raft port under strangers, and its dials:
hamq/controller/raft_transport.py on real sockets.

pysyncobj's own transport kept a stranger's bytes without a bound (a core at 100 %, the
memory growing), never closed junk or idle connections, unbound its port when accept
ran out of descriptors, and never gave up a dial stuck connecting. Each test here
failed on it; the timing after a partition is tests/test_controller_partition.py's.

Raft nodes in this process (tests/support/raft.py) or a ``hamq controller`` process;
loopback, ports free at run time, every wait bounded.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from pysyncobj import SyncObj, SyncObjConf

from hamq.controller.raft import RaftState, _Replica
from hamq.controller.raft_transport import RaftTransportConfig
from tests.support.processes import ROOT, free_ports, kill_and_reap, open_child, read_ready_line
from tests.support.raft import raft_group
from tests.support.timing import wait_for

pytestmark = [pytest.mark.slow]

#: how long a stranger may go on before the test calls the node broken
STRANGER_S = 10


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[RaftState, tuple[str, int]]]:
    """A single Raft node (it makes its own secret); yields it and its Raft address."""
    (port,) = free_ports(1)
    raft = RaftState(f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], tmp_path / "raft")
    raft.start()
    try:
        yield raft, ("127.0.0.1", port)
    finally:
        raft.stop()


def closed_by_peer(sock: socket.socket, timeout_s: float = STRANGER_S) -> bool:
    """Whether the peer closes ``sock`` within ``timeout_s`` (reading whatever comes)."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


def test_a_stranger_announcing_a_huge_frame_is_cut_off(node) -> None:  # type: ignore[no-untyped-def]
    raft, address = node
    sent = 0
    chunk = b"\0" * 65536
    deadline = time.monotonic() + STRANGER_S
    with socket.create_connection(address, timeout=STRANGER_S) as sock:
        sock.sendall(struct.pack("<i", 2**31 - 1))
        with pytest.raises(OSError):  # (reset: the node closed with bytes unread)
            while time.monotonic() < deadline:
                sent += sock.send(chunk)
            pytest.fail(f"the node took {sent} bytes of a 2 GiB frame for {STRANGER_S} s")
    stats = raft.transport_statistics()
    assert stats is not None and stats.refused == 1 and stats.pending == 0


@pytest.mark.parametrize("junk", [b"", bytes(range(64)), b"GET / HTTP/1.1\r\n\r\n"])
def test_junk_and_silence_are_closed(node, junk: bytes) -> None:  # type: ignore[no-untyped-def]
    _, address = node
    with socket.create_connection(address, timeout=STRANGER_S) as sock:
        sock.sendall(junk)
        assert closed_by_peer(sock), f"{junk!r} kept its connection for {STRANGER_S} s"


async def test_a_crowd_of_strangers_is_bounded_and_the_group_still_commits(
    tmp_path: Path,
) -> None:
    async with raft_group(tmp_path) as (peers, nodes):
        host, port = peers[0].rsplit(":", 1)
        limit = nodes[0].transport_config.max_pending
        with contextlib.ExitStack() as stack:
            crowd = [
                stack.enter_context(socket.create_connection((host, int(port)), timeout=5))
                for _ in range(3 * limit)
            ]
            with trio.fail_after(30):
                await nodes[0].call(
                    "apply_broker_id", cluster="c", broker_name="b", broker_id=1, check_code="x"
                )
            # every one of them is closed: the excess at once, the rest at the deadline
            for sock in crowd:
                assert await trio.to_thread.run_sync(closed_by_peer, sock)
        stats = nodes[0].transport_statistics()
        assert stats is not None and stats.evicted >= 2 * limit and stats.connected == 2


async def test_running_out_of_descriptors_keeps_the_raft_port(tmp_path: Path) -> None:
    """A controller allowed 40 descriptors, 80 strangers at its Raft port: accepting
    pauses and resumes; the port is never given up."""
    port, raft_port = free_ports(2)
    log = tmp_path / "controller.log"
    command = [sys.executable, "-m", "cli.main", "--log-level", "info", "controller"]
    command += ["--port", str(port), "--raft-address", f"127.0.0.1:{raft_port}"]
    command += ["--controller-dir", str(tmp_path / "controller")]
    argv = ["sh", "-c", 'ulimit -n 40 && exec "$@"', "sh", *command]
    with log.open("wb") as err:
        proc = await open_child(argv, stderr=err, cwd=ROOT)
    try:
        await read_ready_line(proc, "the controller")
        address = ("127.0.0.1", raft_port)
        with contextlib.ExitStack() as stack:
            for _ in range(80):
                stack.enter_context(socket.create_connection(address, timeout=5))

            def ran_out() -> bool:
                return "cannot accept (Too many open files)" in log.read_text()

            def refused() -> bool:
                with contextlib.suppress(ConnectionRefusedError):
                    socket.create_connection(address, timeout=5).close()
                    return False
                return True

            await wait_for(lambda: ran_out() or refused(), 30, every_s=0.2)
        with socket.create_connection(address, timeout=5) as sock:  # (refused if unbound)
            assert await trio.to_thread.run_sync(closed_by_peer, sock)
        assert proc.returncode is None
    finally:
        await kill_and_reap(proc)


async def test_a_dial_that_hangs_is_given_up_and_made_again(tmp_path: Path) -> None:
    """The partner's port takes no connection (its accept queue is full: SYNs are
    dropped, as across a partition): each dial is abandoned after connect_timeout_s."""
    ports = sorted(free_ports(2), key=str)
    partner, own = (f"127.0.0.1:{p}" for p in ports)  # (the larger address dials)
    with socket.socket() as blackhole, socket.socket() as filler:
        blackhole.bind(("127.0.0.1", ports[0]))
        blackhole.listen(0)
        filler.connect(("127.0.0.1", ports[0]))  # (the one place in the queue)
        config = RaftTransportConfig(connect_timeout_s=0.5)
        raft = RaftState(own, [own, partner], tmp_path / "raft", secret="s", transport=config)
        await trio.to_thread.run_sync(raft.start)
        try:

            def given_up_twice() -> bool:
                stats = raft.transport_statistics()
                return stats is not None and stats.connect_timeouts >= 2 and stats.dialed >= 3

            await wait_for(given_up_twice, 30, every_s=0.1)
        finally:
            await trio.to_thread.run_sync(raft.stop)


async def test_a_controller_on_pysyncobjs_own_transport_is_a_partner(tmp_path: Path) -> None:
    """A rolling upgrade: the middle node (it dials one partner and is dialed by the
    other) runs pysyncobj's TCPTransport; changes commit from either kind and reach
    all."""
    peers = sorted(f"127.0.0.1:{p}" for p in free_ports(3))
    low, middle, high = peers
    nodes = [RaftState(p, peers, tmp_path / p.replace(":", "_"), secret="s") for p in (low, high)]
    replica = _Replica()
    conf = SyncObjConf(password="s", bindAddress=middle, useFork=False, raftMinTimeout=0.4)
    conf.raftMaxTimeout, conf.connectionRetryTime = 1.0, 0.5
    for node in nodes:
        await trio.to_thread.run_sync(node.start)
    old = SyncObj(middle, [low, high], conf=conf, consumers=[replica])
    try:
        with trio.fail_after(30):
            await nodes[0].call(
                "apply_broker_id", cluster="c", broker_name="b", broker_id=1, check_code="x"
            )
        await wait_for(lambda: "b" in replica.state.groups, 30)

        def by_the_old_node() -> object:
            return replica.apply(
                "apply_broker_id",
                {"cluster": "c", "broker_name": "b", "broker_id": 2, "check_code": "y"},
                sync=True,
                timeout=10,
            )

        assert await trio.to_thread.run_sync(by_the_old_node) == (True, 2)
        for node in nodes:
            await wait_for(lambda node=node: 2 in node.state.groups["b"].members, 30)
    finally:
        await trio.to_thread.run_sync(old.destroy_synchronous)
        for node in nodes:
            await trio.to_thread.run_sync(node.stop)


def test_a_config_whose_keepalive_outlasts_the_dead_time_is_refused() -> None:
    with pytest.raises(ValueError, match="keepalive_s"):
        RaftTransportConfig(keepalive_s=3.0, dead_after_s=2.0)
