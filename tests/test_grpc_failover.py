"""The official RocketMQ 5 Python client across a failover: 3 nameservers embedding the
controllers, 3 controller-mode brokers serving gRPC (allAckInSyncStateSet), the
client's access point all three gRPC endpoints.

A producer sends for a while and a SimpleConsumer receives and acks; the master is
killed (-9) while they run. After the election QueryRoute names the new master's
endpoint and both go on: sends succeed again, and every message whose send was answered
OK is received (none lost).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio

from tests.support.autoswitch import autoswitch_cluster
from tests.support.brokers import create_topic
from tests.support.rocketmq5 import driving, ensure_venv

pytestmark = [pytest.mark.slow]

TOPIC = "failover-grpc"
#: how long the producer sends: the kill, the election and a route refresh of the
#: client (every 30 s) fit in it
SEND_S = 50


async def test_the_official_client_sends_and_receives_across_a_master_kill(
    tmp_path: Path,
) -> None:
    python = await trio.to_thread.run_sync(ensure_venv)
    config = {"all_ack_in_sync_state_set": True, "metadata_sync_interval_s": 0.5}
    async with autoswitch_cluster(tmp_path, broker_config=config, grpc=True) as cluster:
        state = await cluster.wait_in_sync(3)
        old_master = cluster.broker_at(state["masterAddress"])
        assert old_master is not None
        await create_topic(cluster.namesrv, TOPIC, 4)
        endpoints = ";".join(f"127.0.0.1:{b.grpc_port}" for b in cluster.brokers)
        home = tmp_path / "home"
        home.mkdir()
        common = ("--endpoints", endpoints, "--topic", TOPIC)
        async with (
            driving(
                python, "produce", *common, "--count", "1000000", "--for-s", str(SEND_S),
                "--pause-s", "0.05", "--keep-going", "--request-timeout-s", "2",
                home=home, stderr=tmp_path / "produce.err",
            ) as producer,
            driving(
                python, "simple", *common, "--group", "failover", "--count", "1000000",
                "--timeout-s", str(SEND_S + 40), "--invisible-s", "10", "--wait-s", "1",
                home=home, stderr=tmp_path / "simple.err",
            ) as consumer,
        ):  # fmt: skip
            with trio.fail_after(60):
                await producer.until("sent", 40)
            await old_master.kill(signal.SIGKILL)
            killed_ms = time.time() * 1000
            with trio.fail_after(SEND_S + 60):
                await producer.finish()
            sent = {r["message_id"] for r in producer.records if "sent" in r}
            after = [r for r in producer.records if "sent" in r and r["at_ms"] > killed_ms]
            assert after, f"no send succeeded after the kill: {producer.records[-5:]}"

            def missing() -> set[str]:
                return sent - {m["message_id"] for m in consumer.all("received")}

            with trio.fail_after(90):
                while missing():
                    if await consumer.next() is None:
                        break
            assert not missing(), f"{len(missing())} of {len(sent)} never received"
