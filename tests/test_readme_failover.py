"""The README's failover walkthrough, run as written, on the shipped autoswitch profile
(its ports moved to free ones, its data under tmp_path):

    hamq cluster up --profile autoswitch
    hamq produce --topic demo --count N        (in a second terminal)
    kill -9 <the master's pid>                 (while it runs)

``produce`` ends with every message acknowledged, and ``up`` starts the killed broker
again: it is back in the SyncStateSet as a slave of the new master. (The README says
100000 messages; the test sends fewer to stay short: COUNT.) The walkthrough's
``hamq admin elect-master ... --broker-id 2`` then succeeds, run twice: the second time
broker 2 is the master already, which it may also be the first time.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import trio

from tests.support.autoswitch import sync_state_when
from tests.support.brokers import stored
from tests.support.cluster import READY_S, STOP_S, cluster_up
from tests.support.processes import (
    HAMQ,
    ROOT,
    copy_profile,
    hamq_command,
    kill_and_reap,
    open_child,
)
from tests.support.timing import wait_for

GROUP = "broker-a"
COUNT = 5000
#: how many must be acknowledged before the kill, so it lands mid-run
BEFORE_KILL = 1000
BROKERS = {10911: "broker-a-n0", 10921: "broker-a-n1", 10931: "broker-a-n2"}


def readme_elect_master_line() -> list[str]:
    """The walkthrough's ``hamq admin elect-master ...`` line, its words after ``hamq``."""
    section = (ROOT / "README.md").read_text().split("\n## Automatic failover", 1)[1]
    match = re.search(r"^hamq (admin elect-master .*)$", section, re.M)
    assert match, "no elect-master line in the README's failover walkthrough"
    return match.group(1).split("#", 1)[0].split()


@pytest.mark.slow
async def test_the_readme_failover_walkthrough(tmp_path: Path) -> None:
    moved = copy_profile("autoswitch", tmp_path / "autoswitch", tmp_path / "data")
    namesrv = f"127.0.0.1:{moved[9876]}"  # produce's default: the first nameserver
    names = {f"127.0.0.1:{moved[port]}": name for port, name in BROKERS.items()}

    async def enough_stored() -> bool:  # acknowledged enough to kill the master mid-run
        return await stored(namesrv, "demo") >= BEFORE_KILL

    async with cluster_up(tmp_path / "autoswitch", tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: autoswitch, 6 process\(es\)", READY_S)
        pids = up.table_pids()
        before = await sync_state_when(
            namesrv, GROUP, lambda g: len(g.get("inSyncReplicas") or []) == 3
        )

        errors = tmp_path / "produce.err"
        with errors.open("wb") as stderr:
            producing = await open_child(
                [*HAMQ, "produce", "-n", namesrv, "--topic", "demo", "--count", str(COUNT)],
                stderr=stderr,
            )
        try:
            await wait_for(enough_stored, 60, every_s=0.1)
            master = names[before["masterAddress"]]
            os.kill(pids[master], signal.SIGKILL)
            assert producing.returncode is None, "produce ended before the kill"

            with trio.fail_after(180):
                assert producing.stdout is not None
                out = b""
                async for chunk in producing.stdout:
                    out += chunk
                code = await producing.wait()
            err = errors.read_text()
        finally:
            await kill_and_reap(producing)
        summary = out.decode()
        assert code == 0, summary + err
        acknowledged = re.search(r"(\d+) acknowledged \(SEND_OK\)", summary)
        assert acknowledged is not None and int(acknowledged.group(1)) == COUNT, summary

        # the killed broker is started again and rejoins the new master's SyncStateSet
        await up.read_until(rf"^  {master}: broker ready again at ", 60)
        after = await sync_state_when(
            namesrv,
            GROUP,
            lambda g: (
                g["masterEpoch"] > before["masterEpoch"] and len(g.get("inSyncReplicas") or []) == 3
            ),
        )
        assert names[after["masterAddress"]] != master
        assert before["masterBrokerId"] in {r["brokerId"] for r in after["inSyncReplicas"]}
        assert await stored(namesrv, "demo") >= COUNT  # all there (a retry may add one)

        # the walkthrough's elect-master line (broker 2), as written but for the port
        elect = [w.replace(":9876", f":{moved[9876]}") for w in readme_elect_master_line()]
        assert elect[elect.index("--broker-id") + 1] == "2", elect
        for _ in range(2):  # the second time at the latest, broker 2 is the master already
            done = await hamq_command(*elect)
            assert done.returncode == 0, done.stdout + done.stderr
        assert b"broker-a: broker 2 (" in done.stdout, done.stdout
        assert b"is master already; nothing changed" in done.stdout, done.stdout

        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(STOP_S):
            assert await up.proc.wait() == 0, await up.read_to_end(5)
