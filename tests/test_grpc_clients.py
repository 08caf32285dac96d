"""RocketMQ's official Python 5.x client, unchanged, against a ``hamq broker`` process's
gRPC endpoint: Producer (normal with tag, keys and properties; FIFO; delay; transactions
with commit, rollback and check-back), SimpleConsumer (receive, ack, a message not acked
coming back, change of invisible duration), PushConsumer (a failure retried), and a
topic served by two broker groups (sent to and received from both).

The client runs in its own virtualenv (tests/support/rocketmq5.py, made from the index
on first use), one driver process per client; loopback, free ports.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamq.client import AdminClient, NoRouteError
from tests.support.processes import broker_process, free_ports, hamq_command
from tests.support.rocketmq5 import ensure_venv, run_driver
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow

#: check-backs start 1 s after a half message was stored, every second
FAST_CHECKS = "transaction_timeout_s = 1.0\ntransaction_check_interval_s = 1.0\n"


@pytest.fixture(scope="module")
def python() -> Path:
    return ensure_venv()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A broker process serving gRPC for this module: its endpoint and nameserver."""
    (port,) = free_ports(1)
    store = tmp_path_factory.mktemp("grpc-clients")
    with broker_process(store, f"grpc_port = {port}\n{FAST_CHECKS}") as (_addr, namesrv):
        yield {"endpoints": f"127.0.0.1:{port}", "namesrv": namesrv}


async def client(
    python: Path, tmp_path: Path, broker: dict[str, str], command: str, *args: str
) -> Any:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return await run_driver(
        python, command, "--endpoints", broker["endpoints"], *args, home=home, timeout_s=120
    )


async def test_send_and_receive_with_tags_keys_and_properties(
    python: Path, tmp_path: Path, broker: dict[str, str]
) -> None:
    sent = await client(
        python, tmp_path, broker, "produce", "--topic", "Plain", "--count", "10",
        "--tag", "TagA", "--keys", "K{i}", "--prop", "color=red{i}", "--body", "hello {i}",
    )  # fmt: skip
    assert len(sent.all("sent")) == 10, sent.records
    got = await client(
        python, tmp_path, broker, "simple", "--topic", "Plain", "--group", "G1", "--count", "10"
    )
    messages = {m["body"]: m for m in got.all("received")}
    assert sorted(messages) == sorted(f"hello {i}" for i in range(10))
    for i in range(10):
        message = messages[f"hello {i}"]
        assert (message["tag"], message["keys"], message["topic"]) == ("TagA", [f"K{i}"], "Plain")
        assert message["properties"] == {"color": f"red{i}"}
        assert message["delivery_attempt"] == 1
    assert {r["message_id"] for r in sent.records if "sent" in r} == {
        m["message_id"] for m in messages.values()
    }
    # (each acked: none comes back. Proof that none waits to: the group has nothing in
    # flight, which a message popped and not acked would be until it came back)
    async with AdminClient(broker["namesrv"]) as admin:
        progress = await admin.consumer_progress("G1")
    assert progress.queues and all(q.in_flight == 0 for q in progress.queues)


async def test_a_message_not_acked_comes_back_and_a_nack_brings_it_back_later(
    python: Path, tmp_path: Path, broker: dict[str, str]
) -> None:
    await client(python, tmp_path, broker, "produce", "--topic", "Retry", "--count", "3")
    first = await client(
        python, tmp_path, broker, "simple", "--topic", "Retry", "--group", "G2",
        "--count", "3", "--no-ack", "--invisible-s", "2",
    )  # fmt: skip
    assert [m["delivery_attempt"] for m in first.all("received")] == [1, 1, 1]
    # not acked: back after the invisible time, attempt 2; nacked there: back again later
    second = await client(
        python, tmp_path, broker, "simple", "--topic", "Retry", "--group", "G2",
        "--count", "3", "--nack-first", "--nack-s", "2",
    )  # fmt: skip
    deliveries = collections.defaultdict(list)
    for message in second.all("received"):
        deliveries[message["message_id"]].append(message)
    assert len(deliveries) == 3
    for runs in deliveries.values():
        assert [m["delivery_attempt"] for m in runs] == [2, 3]
        assert runs[1]["at_ms"] - runs[0]["at_ms"] >= 1500  # (the nack's 2 s, less a poll)
    assert len(second.all("acked")) == 3


async def test_fifo_messages_come_in_order_per_message_group(
    python: Path, tmp_path: Path, broker: dict[str, str]
) -> None:
    made = await hamq_command(
        "admin", "update-group", "--group", "Fifo", "--orderly", "-n", broker["namesrv"]
    )
    assert made.returncode == 0, made.stderr
    await client(
        python, tmp_path, broker, "produce", "--topic", "Ordered", "--type", "fifo",
        "--group", "order-{i}", "--groups", "3", "--count", "30", "--body", "{i}",
    )  # fmt: skip
    got = await client(
        python, tmp_path, broker, "simple", "--topic", "Ordered", "--group", "Fifo",
        "--count", "30",
    )  # fmt: skip
    per_group = collections.defaultdict(list)
    for message in got.all("received"):
        per_group[message["message_group"]].append(int(message["body"]))
    assert sorted(per_group) == ["order-0", "order-1", "order-2"]
    for group, bodies in per_group.items():
        assert bodies == sorted(bodies) and len(bodies) == 10, (group, bodies)


async def test_a_delay_message_arrives_at_its_time(
    python: Path, tmp_path: Path, broker: dict[str, str]
) -> None:
    sent = await client(
        python, tmp_path, broker, "produce", "--topic", "Later", "--type", "delay",
        "--deliver-after-s", "3", "--count", "2",
    )  # fmt: skip
    got = await client(
        python, tmp_path, broker, "simple", "--topic", "Later", "--group", "G3", "--count", "2"
    )
    messages = got.all("received")
    assert len(messages) == 2
    for message in messages:
        assert message["delivery_timestamp"] >= sent.all("at_ms")[0] + 1000
        assert message["at_ms"] >= message["delivery_timestamp"]


async def test_transactions_commit_roll_back_and_answer_check_backs(
    python: Path, tmp_path: Path, broker: dict[str, str]
) -> None:
    args = ("--topic", "Tx", "--type", "transaction")
    committed = await client(
        python, tmp_path, broker, "produce", *args, "--end", "commit", "--count", "2",
        "--body", "commit {i}",
    )  # fmt: skip
    await client(
        python, tmp_path, broker, "produce", *args, "--end", "rollback", "--count", "2",
        "--body", "rollback {i}",
    )  # fmt: skip
    # left open: the broker asks the producer (on its Telemetry stream), which commits
    checked = await client(
        python, tmp_path, broker, "produce", *args, "--end", "none", "--check", "commit",
        "--count", "1", "--body", "checked", "--linger-s", "6",
    )  # fmt: skip
    assert checked.all("checked") == checked.all("message_id")[:1], checked.records
    got = await client(
        python, tmp_path, broker, "simple", "--topic", "Tx", "--group", "G4", "--count", "3"
    )
    bodies = sorted(m["body"] for m in got.all("received"))
    assert bodies == ["checked", "commit 0", "commit 1"]
    assert len(committed.all("sent")) == 2
    # (the rolled back never come: had they been left open, the checking producer, which
    # lingered through several check passes, would have been asked about them and
    # committed them, and the consumer would have got them; it was asked about its own)


async def test_a_push_consumer_gets_a_failed_message_again(
    python: Path, tmp_path: Path, broker: dict[str, str]
) -> None:
    await client(python, tmp_path, broker, "produce", "--topic", "Pushed", "--count", "3")
    got = await client(
        python, tmp_path, broker, "push", "--topic", "Pushed", "--group", "G5",
        "--count", "3", "--fail-first", "--timeout-s", "90",
    )  # fmt: skip
    attempts = collections.defaultdict(list)
    for message in got.all("received"):
        attempts[message["body"]].append(message["delivery_attempt"])
    assert got.records[-1] == {"done": 3}
    assert sorted(attempts) == ["body 0", "body 1", "body 2"]
    assert all(runs[:2] == [1, 2] for runs in attempts.values()), attempts


async def test_a_producer_and_a_consumer_use_every_broker_group_of_a_topic(
    python: Path, tmp_path: Path
) -> None:
    """Two broker groups serving the topic: the client, given one endpoint, learns the
    other from QueryRoute, sends to the queues of both, and receives from both."""
    port_a, port_b = free_ports(2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with broker_process(tmp_path / "a", f"grpc_port = {port_a}\nbroker_name = 'broker-a'\n") as (
        _address_a,
        namesrv,
    ):
        config_b = (
            f"grpc_port = {port_b}\nbroker_name = 'broker-b'\nnamesrv_addrs = ['{namesrv}']\n"
        )
        with broker_process(tmp_path / "b", config_b):
            async with AdminClient(namesrv) as admin:

                async def both_registered() -> bool:
                    return len((await admin.cluster_info()).broker_addr_table) == 2

                async def routed_to_both() -> bool:
                    try:
                        route = await admin.topic_route("Spread")
                    except NoRouteError:
                        return False
                    return len({data.broker_name for data in route.queue_datas}) == 2

                await wait_for(both_registered, 30, what="both brokers registered")
                await admin.create_topic("Spread", 4)
                await wait_for(routed_to_both, 30, what="a route of Spread naming both groups")
                where = {"endpoints": f"127.0.0.1:{port_a}", "namesrv": namesrv}
                sent = await client(
                    python, tmp_path, where, "produce", "--topic", "Spread", "--count", "40",
                    "--body", "spread {i}",
                )  # fmt: skip
                assert len(sent.all("sent")) == 40, sent.records
                stored: collections.Counter[str] = collections.Counter()
                for status in await admin.queue_status("Spread"):
                    stored[status.queue.broker_name] += status.max_offset - status.min_offset
                assert stored.keys() == {"broker-a", "broker-b"}, stored
                assert sum(stored.values()) == 40
                got = await client(
                    python, tmp_path, where, "simple", "--topic", "Spread", "--group", "GS",
                    "--count", "40",
                )  # fmt: skip
                bodies = [m["body"] for m in got.all("received")]
                assert sorted(bodies) == sorted(f"spread {i}" for i in range(40)), got.records
