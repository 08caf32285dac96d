"""The controllers' Raft port: pysyncobj's messages are pickles, so the
port binds only the address given and takes nothing from a peer without the secret.

Real pysyncobj nodes on loopback, real sockets, real time with bounded waits."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib
from pathlib import Path

import pytest
import trio

from hamq.controller import ControllerConfig
from hamq.controller.raft import RaftSecretMissing, RaftState
from hamq.controller.raft_transport import RaftTransportStatistics
from tests.support.processes import free_ports, hamq_command
from tests.support.raft import raft_group
from tests.support.timing import wait_for


class _Payload:
    """Unpickling it makes a directory: proof that a stranger's bytes ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def _pysyncobj_frame(message: object) -> bytes:
    """A message framed as pysyncobj frames it without a password."""
    data = zlib.compress(pickle.dumps(message), 3)
    return struct.pack("i", len(data)) + data


def _send_and_wait_for_close(address: tuple[str, int], frame: bytes) -> bytes:
    """Send ``frame``; everything the node answers until it closes (bounded: 5 s)."""
    answer = b""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(frame)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    return answer


def stats(node: RaftState) -> RaftTransportStatistics:
    """``node``'s Raft transport counters (it is running)."""
    counters = node.transport_statistics()
    assert counters is not None
    return counters


@pytest.fixture
def single_node(tmp_path: Path):  # type: ignore[no-untyped-def]
    (port,) = free_ports(1)
    node = RaftState(f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], tmp_path / "raft")
    node.start()
    try:
        yield node, port
    finally:
        node.stop()


def test_the_raft_port_binds_only_the_host_given(single_node) -> None:  # type: ignore[no-untyped-def]
    _, port = single_node
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # 127.0.0.2 is loopback too: a node bound to every interface would answer there
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_a_pickle_from_a_peer_without_the_secret_is_never_unpickled(
    single_node, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    _, port = single_node
    marker = tmp_path / "ran"
    for message in (_Payload(marker), ["status"]):
        answer = _send_and_wait_for_close(("127.0.0.1", port), _pysyncobj_frame(message))
        assert answer == b"", f"the node answered {message!r} from a stranger"
    assert not marker.exists(), "a stranger's pickle was unpickled"


async def test_a_group_commits_and_ignores_a_peer_with_the_wrong_secret(tmp_path: Path) -> None:
    async with raft_group(tmp_path, ["right", "right", "wrong"]) as (peers, nodes):
        with trio.fail_after(30):
            await nodes[0].call(
                "apply_broker_id", cluster="c", broker_name="b", broker_id=1, check_code="one"
            )
        # (another thread applies it: polled)
        await wait_for(lambda: "b" in nodes[1].state.groups, 30)
        assert nodes[0].leader() in peers[:2] and nodes[1].leader() == nodes[0].leader()
        leader = nodes[peers.index(nodes[0].leader())]
        # the outsider has the largest address, so it dials the leader: three more
        # connections of its refused (with the secret, any one would have carried the log)
        refused = stats(leader).refused
        await wait_for(
            lambda: stats(leader).refused >= refused + 3 or "b" in nodes[2].state.groups, 30
        )
        assert "b" not in nodes[2].state.groups
        assert not nodes[2].is_leader()


def test_a_group_without_a_secret_is_refused_unless_insecure(tmp_path: Path) -> None:
    peers = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    with pytest.raises(RaftSecretMissing, match="--raft-secret-file"):
        ControllerConfig(raft_address=peers[0], raft_peers=peers, data_dir=tmp_path)
    ControllerConfig(raft_address=peers[0], raft_peers=peers, data_dir=tmp_path, insecure_raft=True)
    with_secret = ControllerConfig(raft_address=peers[0], data_dir=tmp_path, raft_secret="hid")
    assert "hid" not in repr(with_secret)  # never in a log line


async def test_hamq_controller_names_a_missing_secret(tmp_path: Path) -> None:
    port, *raft = free_ports(4)
    peers = ";".join(f"127.0.0.1:{p}" for p in raft)
    common = ["controller", "--port", str(port), "--raft-address", f"127.0.0.1:{raft[0]}"]
    common += ["--raft-peers", peers, "--controller-dir", str(tmp_path)]
    refused = await hamq_command(*common)
    assert refused.returncode == 2
    assert b"needs a shared Raft secret" in refused.stderr
    missing = tmp_path / "no-such-secret"
    unreadable = await hamq_command(*common, "--raft-secret-file", str(missing))
    assert unreadable.returncode == 2
    assert f"--raft-secret-file {missing}: cannot read it".encode() in unreadable.stderr
