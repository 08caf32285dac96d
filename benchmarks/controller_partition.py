"""Controllers across a partition: how long after the heal until they commit again, and
until they elect a new broker master.

Every controller (``hamq nameserver --controller``) and broker on a host of its own (a
network namespace on one bridge, tests/support/raft_hosts.py; needs root, iproute2 and
iptables). Each round:

  quorum:   the 3 controllers cut from each other (iptables DROP: connection attempts
            hang, as across a real partition) for ``--cut`` seconds, then healed; t0 =
            the heal; t1 = the first change a controller commits (a change is asked of
            every controller every 0.1 s).
  election: the same cut with a group of 2 brokers (master and slave in sync); the
            master is killed (-9) 5 s into the cut; t1 = the first answer of a controller
            naming the slave as master.

Reported: t1 - t0 per round, p50 and max. Goal: both <= 3 s.

    sudo .venv/bin/python benchmarks/controller_partition.py            # 3 rounds of each
    sudo .venv/bin/python benchmarks/controller_partition.py --rounds 1 --cut 20
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import trio
from support import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.support.netns import unavailable
from tests.support.raft_hosts import ControllerHosts, controller_hosts
from tests.support.timing import wait_for

#: how often each controller is asked to commit (or asked who the master is)
POLL_S = 0.1


def cut_controllers(hosts: ControllerHosts) -> None:
    for a, b in (("c0", "c1"), ("c0", "c2"), ("c1", "c2")):
        hosts.net.cut(a, b)


async def first_commit(hosts: ControllerHosts, since: float, limit_s: float) -> float:
    """Seconds from ``since`` to the first change committed by any controller."""
    done = trio.Event()
    first: list[float] = []

    async def attempt(address: str) -> None:
        if await hosts.commit(address, timeout_s=limit_s) and not first:
            first.append(trio.current_time() - since)
            done.set()

    with trio.move_on_after(limit_s):
        async with trio.open_nursery() as nursery:
            while not done.is_set():
                for address in hosts.controller_addrs:
                    nursery.start_soon(attempt, address)
                with trio.move_on_after(POLL_S):
                    await done.wait()
            nursery.cancel_scope.cancel()
    return first[0] if first else float("inf")


async def quorum_round(root: Path, cut_s: float) -> float:
    async with controller_hosts(root) as hosts:
        first = hosts.controller_addrs[0]
        await wait_for(lambda: hosts.commit(first), 60, every_s=0.2, what="a quorum")
        cut_controllers(hosts)
        await trio.sleep(cut_s)
        hosts.net.heal()
        return await first_commit(hosts, trio.current_time(), 120)


async def election_round(root: Path, cut_s: float) -> float:
    async with controller_hosts(root, brokers=2) as hosts:
        address = hosts.controller_addrs[0]

        async def in_sync() -> bool:
            state = await hosts.group_state(address)
            return bool(state.get("masterAddress")) and len(state["inSyncReplicas"]) == 2

        await wait_for(in_sync, 60, every_s=0.2, what="master and slave in sync")
        master_address = (await hosts.group_state(address))["masterAddress"]
        master = next(b for b in hosts.brokers if b.address == master_address)
        cut_controllers(hosts)
        await trio.sleep(5)
        await master.kill(signal.SIGKILL)
        await trio.sleep(cut_s - 5)
        hosts.net.heal()
        healed = trio.current_time()

        async def new_master() -> bool:
            for addr in hosts.controller_addrs:
                try:
                    with trio.fail_after(1):
                        state = await hosts.group_state(addr)
                except Exception:
                    continue
                if state.get("masterAddress") not in (None, master_address):
                    return True
            return False

        await wait_for(new_master, 120, every_s=POLL_S, what="a new master")
        return trio.current_time() - healed


async def main(rounds: int, cut_s: float, keep: bool) -> None:
    results: dict[str, list[float]] = {"quorum": [], "election": []}
    for i in range(rounds):
        for name, scenario in (("quorum", quorum_round), ("election", election_round)):
            root = Path(tempfile.mkdtemp(prefix=f"hamq-{name}-"))
            try:
                seconds = await scenario(root, cut_s)
            finally:
                if keep:
                    print(f"logs in {root}", flush=True)
                else:
                    shutil.rmtree(root, ignore_errors=True)
            results[name].append(seconds)
            print(f"round {i + 1}: {name} {seconds:.2f} s after the heal", flush=True)
    for name, values in results.items():
        print(f"{name}: p50 {median(values):.2f} s, max {max(values):.2f} s ({len(values)} rounds)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cut", type=float, default=40.0, help="seconds the cut lasts")
    parser.add_argument("--keep", action="store_true", help="keep each round's logs")
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"cannot run: {why}")
    trio.run(main, args.rounds, args.cut, args.keep)
