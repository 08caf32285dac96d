"""Every controller restarted at once: a master within its lease stays master.

A restarted controller has heard no broker yet. It must not take the group's master for
dead before it has listened for the master's lease; the controllers before this fix
elected anew (or dropped the master) at the first pass of a new Raft leader, from
whichever brokers had heartbeat by then.

To make "the master's next heartbeat comes after the leader's first pass" certain
rather than likely, the brokers announce a 10 s lease and the master is stopped
(SIGSTOP) while the controllers restart, and continued once the new leader has made its
first pass: it was silent for a few seconds, well within its lease.

Real processes: tests/support/autoswitch.py (3 nameservers embedding the controllers,
Raft between them; a master and a slave in controller mode) on loopback.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.autoswitch import AutoswitchCluster, autoswitch_cluster

pytestmark = [pytest.mark.slow]

LEASE_S = 10


def who(state: dict[str, Any]) -> tuple[Any, Any, Any]:
    return state.get("masterBrokerId"), state.get("masterAddress"), state.get("masterEpoch")


def logged_since_restart(cluster: AutoswitchCluster, text: str) -> bool:
    return any(text in s.log().rsplit("---- start 2", 1)[-1] for s in cluster.nameservers)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
async def test_restarting_every_controller_keeps_a_master_within_its_lease(
    tmp_path: Path, sig: int
) -> None:
    config = {"controller_lease_s": LEASE_S}
    async with autoswitch_cluster(tmp_path, brokers=2, broker_config=config) as cluster:
        before = who(await cluster.wait_in_sync(2))
        master_id, master_address, epoch = before
        master = cluster.broker_at(master_address)
        assert master is not None
        master.send_signal(signal.SIGSTOP)
        try:
            for server in cluster.nameservers:
                await server.kill(sig)
            async with anyio.create_task_group() as group:
                for server in cluster.nameservers:
                    group.start_soon(server.start)

            async def changed_or_logged(text: str) -> dict[str, Any] | None:
                state = await cluster.group_state()
                if not state:
                    return None  # a controller that has not applied its log yet knows no group
                if who(state) != before or logged_since_restart(cluster, text):
                    return state
                return None

            # the new leader's first pass: it waits for the master (or, before the fix,
            # elects without it)
            waiting = f"broker group broker-a: master {master_id} not heard yet"
            state = await cluster.wait_until(
                "the new leader's first pass", lambda: changed_or_logged(waiting)
            )
            assert who(state) == before, f"the master changed from {before} to {who(state)}"
        finally:
            master.send_signal(signal.SIGCONT)
        kept = f"broker group broker-a: master {master_id} (epoch {epoch}) is alive"
        state = await cluster.wait_until(
            "the leader hearing the master", lambda: changed_or_logged(kept)
        )
        assert who(state) == before, f"the master changed from {before} to {who(state)}"
