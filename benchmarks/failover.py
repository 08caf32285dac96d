"""Automatic failover: from kill -9 of the master to the first SEND_OK on the new one.

A real cluster on 127.0.0.1 (tests/support/autoswitch.py: 3 nameservers embedding the
controllers, Raft between them; one group of 3 controller-mode brokers with
allAckInSyncStateSet; free ports; stores in a temporary directory removed at the end;
every process killed by PID). Four producers in this process send without pause (send
timeout 10 s; the producer's own retries ride out the failover). Each round:

  1. wait until the group has a master and all 3 brokers in its SyncStateSet;
  2. kill -9 the master; t0;
  3. t1 = the first SEND_OK whose offset message id names another broker's store
     (the message is on the new master and acknowledged by its SyncStateSet);
  4. start the killed broker again (it rejoins as a slave) and go on.
Reported: t1 - t0 per kill, p50 and max; also the time to the election (the
controller's answer naming the new master, polled every 20 ms) for scale.

Goal: p50 < 3 s.

    python benchmarks/failover.py             # 10 kills
    python benchmarks/failover.py --kills 3
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support.autoswitch

from hamq.client import Message, Producer, SendStatus
from hamq.client.errors import ClientError
from tests.support.autoswitch import AutoswitchCluster, Server, autoswitch_cluster

PRODUCERS = 4


class Watch:
    def __init__(self) -> None:
        self.killed: Server | None = None
        self.first_ok: float | None = None
        self.sent = 0


async def produce(cluster: AutoswitchCluster, k: int, watch: Watch) -> None:
    async with Producer(f"bench-{k}", namesrv=cluster.namesrv, send_timeout_s=10.0) as producer:
        i = 0
        while True:
            i += 1
            try:
                result = await producer.send(Message("failover-bench", f"{k}-{i}".encode()))
            except ClientError:
                continue
            if result.status is not SendStatus.SEND_OK:
                continue
            watch.sent += 1
            if (
                watch.killed is not None
                and watch.first_ok is None
                and cluster.broker_stored(result.offset_msg_id) is not watch.killed
            ):
                watch.first_ok = trio.current_time()


async def one_kill(cluster: AutoswitchCluster, watch: Watch) -> tuple[float, float]:
    state = await cluster.wait_in_sync(3, timeout_s=60)
    master = cluster.broker_at(state["masterAddress"])
    assert master is not None
    sent = watch.sent
    await cluster.wait_until("sends", lambda: _more(watch, sent + 50), timeout_s=30)
    watch.first_ok = None
    watch.killed = master
    t0 = trio.current_time()
    await master.kill(signal.SIGKILL)
    elected = None
    with trio.fail_after(60):
        while watch.first_ok is None:
            if elected is None:
                try:
                    now = await cluster.group_state()
                except RuntimeError:
                    now = {}
                if now.get("masterAddress") not in (None, master.address):
                    elected = trio.current_time()
            await trio.sleep(0.02)
    assert watch.first_ok is not None
    if elected is None:
        elected = watch.first_ok
    await master.start()
    return watch.first_ok - t0, elected - t0


async def _more(watch: Watch, n: int) -> bool:
    return watch.sent >= n


async def main(kills: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="hamq-failover-"))
    try:
        async with autoswitch_cluster(
            root, broker_config={"all_ack_in_sync_state_set": True}
        ) as cluster:
            watch = Watch()
            async with trio.open_nursery() as nursery:
                for k in range(PRODUCERS):
                    nursery.start_soon(produce, cluster, k, watch)
                to_ok, to_elected = [], []
                for n in range(kills):
                    ok_s, elected_s = await one_kill(cluster, watch)
                    to_ok.append(ok_s)
                    to_elected.append(elected_s)
                    print(
                        f"kill {n + 1}: first SEND_OK on the new master after {ok_s:.3f}s "
                        f"(new master named by the controllers after {elected_s:.3f}s)",
                        flush=True,
                    )
                nursery.cancel_scope.cancel()
        print(
            f"\nkill -9 of the master -> first SEND_OK on the new master, {kills} kills:\n"
            f"  p50 {median(to_ok):.3f}s   max {max(to_ok):.3f}s   min {min(to_ok):.3f}s\n"
            f"  (election seen: p50 {median(to_elected):.3f}s, max {max(to_elected):.3f}s)\n"
            f"  goal p50 < 3 s: {'met' if median(to_ok) < 3 else 'NOT met'}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    args = parser.parse_args()
    trio.run(main, args.kills)
