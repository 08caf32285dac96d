"""Raft groups in this process: ``RaftState`` nodes (pysyncobj) on loopback ports found
free at run time, started in worker threads and always stopped at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from hamq.controller.raft import RaftState
from tests.support.processes import free_ports


@asynccontextmanager
async def raft_group(
    directory: Path, secrets: Sequence[str] = ("s", "s", "s")
) -> AsyncIterator[tuple[list[str], list[RaftState]]]:
    """One node per secret (node ``i`` stores under ``directory/n<i>``), all peers of
    each other: yields (their Raft addresses, the nodes). The addresses are in order, so
    the last node dials every other (the larger address dials: raft_transport.py). A
    node a test stopped early is stopped again harmlessly."""
    peers = sorted(f"127.0.0.1:{p}" for p in free_ports(len(secrets)))
    nodes = [
        RaftState(p, peers, directory / f"n{i}", secret=s)
        for i, (p, s) in enumerate(zip(peers, secrets, strict=True))
    ]
    try:
        for node in nodes:
            await trio.to_thread.run_sync(node.start)
        yield peers, nodes
    finally:
        for node in nodes:
            await trio.to_thread.run_sync(node.stop)
