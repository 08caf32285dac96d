"""A stranger on a controller's Raft port: what it costs the controller.

3 controllers (``hamq nameserver --controller``, tests/support/autoswitch.py) on loopback
with a shared secret; an attacker in this process (plain blocking sockets in threads,
no secret) works on controller 0's Raft port for ``--seconds`` per attack:

  big-frame  one connection announces a frame of 2 GiB - 1 and streams bytes into it
             as fast as it can (reconnecting whenever it is closed);
  junk       one connection streams random bytes (reconnecting when closed);
  idle       ``--idle`` connections opened and left silent;
  connect    connections opened and closed as fast as one thread can.

Reported per attack: the controller's CPU (% of one core, from /proc), its resident
memory at the end, how many times the attacker was disconnected, or connected (idle: how
many of its connections the controller had closed by the end) and the controller's CPU
time per time, and the slowest change the controllers committed while it lasted (one
asked of controller 0 every 0.5 s; inf: one failed).

    python benchmarks/raft_port_flood.py
    python benchmarks/raft_port_flood.py --seconds 5 --idle 2000 idle connect
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import trio
from support import cpu_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import ApplyBrokerIdRequestHeader
from hamq.remoting import RemotingClient
from tests.support.autoswitch import AutoswitchCluster, autoswitch_cluster

CHUNK = b"\x00" * 65536


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def stream(target: tuple[str, int], stop: threading.Event, first: bytes, junk: bool) -> int:
    """Stream into ``target`` until ``stop``; the number of times it was disconnected."""
    closed = 0
    while not stop.is_set():
        try:
            with socket.create_connection(target, timeout=2) as sock:
                sock.sendall(first)
                while not stop.is_set():
                    sock.sendall(os.urandom(65536) if junk else CHUNK)
        except OSError:
            closed += 1
    return closed


def idle(target: tuple[str, int], stop: threading.Event, count: int) -> int:
    """Open ``count`` connections, wait for ``stop``; how many were closed by then."""
    socks = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(target, timeout=2))
        except OSError:
            break
    stop.wait()
    closed = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            closed += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        sock.close()
    return closed


def connect_flood(target: tuple[str, int], stop: threading.Event) -> int:
    """Connect and close until ``stop``; how many connections were made."""
    made = 0
    while not stop.is_set():
        try:
            socket.create_connection(target, timeout=2).close()
            made += 1
        except OSError:
            time.sleep(0.01)
    return made


async def slowest_commit(cluster: AutoswitchCluster, stop: trio.Event) -> float:
    """Ask controller 0 for a change every 0.5 s until ``stop``: the slowest (s)."""
    header = ApplyBrokerIdRequestHeader("probe", "probe", 1, "probe")
    slowest = 0.0
    async with RemotingClient() as client:
        while not stop.is_set():
            start = trio.current_time()
            request = RemotingCommand.request(RequestCode.CONTROLLER_APPLY_BROKER_ID, header)
            try:
                response = await client.invoke(cluster.nameservers[0].address, request, 10)
                ok = response.code == ResponseCode.SUCCESS
            except Exception:
                ok = False
            slowest = max(slowest, trio.current_time() - start if ok else float("inf"))
            with trio.move_on_after(0.5):
                await stop.wait()
    return slowest


async def attack(
    cluster: AutoswitchCluster, name: str, work: Callable[[threading.Event], int], seconds: float
) -> None:
    pid = cluster.nameservers[0].proc.pid  # type: ignore[union-attr]
    stop = threading.Event()
    done = trio.Event()
    result: list[int] = []
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    thread = threading.Thread(target=lambda: result.append(work(stop)), daemon=True)
    async with trio.open_nursery() as nursery:
        slowest: list[float] = []

        async def probe() -> None:
            slowest.append(await slowest_commit(cluster, done))

        nursery.start_soon(probe)
        thread.start()
        await trio.sleep(seconds)
        cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) * 100
        rss = rss_mib(pid)
        stop.set()
        done.set()
    await trio.to_thread.run_sync(thread.join)
    count = result[0] if result else 0
    per = f" ({cpu * seconds * 1e4 / count:.0f} us each)" if count and name != "idle" else ""
    print(
        f"{name:10} controller CPU {cpu:5.1f} %, RSS {rss:6.1f} MiB, attacker {count}{per}, "
        f"slowest commit {slowest[0]:.2f} s",
        flush=True,
    )


async def main(seconds: float, idle_count: int, only: list[str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="hamq-flood-"))
    try:
        async with autoswitch_cluster(root, brokers=0) as cluster:
            args = cluster.nameservers[0].args
            host, port = args[args.index("--raft-address") + 1].rsplit(":", 1)
            target = (host, int(port))
            await trio.sleep(3)  # a leader
            pid = cluster.nameservers[0].proc.pid  # type: ignore[union-attr]
            cpu0 = cpu_seconds(pid)
            await trio.sleep(seconds)
            print(
                f"{'quiet':10} controller CPU {(cpu_seconds(pid) - cpu0) / seconds * 100:5.1f} "
                f"%, RSS {rss_mib(pid):6.1f} MiB",
                flush=True,
            )
            big = struct.pack("i", 2**31 - 1)
            attacks: list[tuple[str, Callable[[threading.Event], int]]] = [
                ("big-frame", lambda stop: stream(target, stop, big, junk=False)),
                ("junk", lambda stop: stream(target, stop, b"", junk=True)),
                ("idle", lambda stop: idle(target, stop, idle_count)),
                ("connect", lambda stop: connect_flood(target, stop)),
            ]
            for name, work in attacks:
                if not only or name in only:
                    await attack(cluster, name, work, seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=int, default=1000, help="idle connections")
    parser.add_argument(
        "attacks", nargs="*", help="big-frame, junk, idle, connect (default: all, in turn)"
    )
    args = parser.parse_args()
    trio.run(main, args.seconds, args.idle, args.attacks)
