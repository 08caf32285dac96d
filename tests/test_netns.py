"""The network namespaces of the partition tests (tests/support/netns.py): a host's
namespace entered and left leaves nothing of it behind in this process — not even in
Trio's worker threads, from which Trio spawns child processes.

Skipped, saying why, where namespaces cannot be made (not root, no iproute2 or
iptables that can be installed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import trio

from tests.support import netns


@pytest.fixture
def network() -> Iterator[netns.Network]:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"needs network namespaces: {why}")
    network = netns.Network.create()
    try:
        yield network
    finally:
        network.close()


async def child_namespace() -> str:
    """The network namespace of a child process spawned now (Trio forks in a worker)."""
    done = await trio.run_process(["readlink", "/proc/self/ns/net"], capture_stdout=True)
    return done.stdout.decode().strip()


async def worker_namespaces() -> set[str]:
    """The network namespaces of Trio's worker threads: one more job at once than there
    are worker threads, each holding its thread until all run (so every idle worker
    takes one, and at least one thread is started now)."""
    count = 1 + sum(1 for t in threading.enumerate() if t.name.startswith("Trio thread"))
    running = threading.Barrier(count)
    seen: set[str] = set()

    def job() -> None:
        seen.add(os.readlink("/proc/thread-self/ns/net"))
        running.wait(10)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(trio.to_thread.run_sync, job)
    return seen


async def test_trio_workers_and_children_are_back_in_this_namespace_after_the_block(
    network: netns.Network,
) -> None:
    host = network.add("h1")
    home = os.readlink("/proc/thread-self/ns/net")
    with netns.entered(host):
        inside = await worker_namespaces()
    assert inside - {home}, "no worker thread was started in the host's namespace"
    assert os.readlink("/proc/thread-self/ns/net") == home
    assert await worker_namespaces() == {home}
    assert await child_namespace() == home


def test_network_numbers_are_never_shared_while_held(network: netns.Network) -> None:
    with pytest.raises(netns.NetnsError, match=f"network {network.number} is held"):
        netns.Network.create(network.number)
