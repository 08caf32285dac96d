"""The network namespaces of the partition tests (tests/support/netns.py): a host's
namespace entered and left leaves nothing of it behind in this process — not even in
Trio's worker threads, from which Trio spawns child processes.

Skipped, saying why, where namespaces cannot be made (not root, no iproute2 or
iptables that can be installed).
"""

from __future__ import annotations

import os
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


async def test_a_child_spawned_after_the_block_is_in_this_namespace(
    network: netns.Network,
) -> None:
    host = network.add("h1")
    home = os.readlink("/proc/thread-self/ns/net")
    with netns.entered(host):
        inside = await child_namespace()  # (a Trio worker thread started in there)
        await trio.to_thread.run_sync(os.getpid)
    assert inside != home
    assert os.readlink("/proc/thread-self/ns/net") == home
    assert await child_namespace() == home
    assert await trio.to_thread.run_sync(os.readlink, "/proc/thread-self/ns/net") == home


def test_network_numbers_are_never_shared_while_held(network: netns.Network) -> None:
    with pytest.raises(netns.NetnsError, match=f"network {network.number} is held"):
        netns.Network.create(network.number)
