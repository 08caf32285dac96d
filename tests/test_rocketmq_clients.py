"""RocketMQ's official client against a real ``hamq broker``, unchanged.

The client is the PyPI package ``rocketmq`` 0.4.4: Python bindings over RocketMQ's C++
client 1.2.x (librocketmq.so ships in the wheel). It runs in its own processes
(tests/support/rocketmq_driver.py), so its threads, its logs (under a temporary HOME) and any
crash stay out of pytest. The checks are what a RocketMQ user would check: results of
sends, what consumers receive, offsets, retries — not bytes.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import signal
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from hamq.client import ConsumeResult, Message, MessageExt, Producer, PullConsumer, PushConsumer
from hamq.protocol.message import SYSFLAG_COMPRESSED
from tests.support.ha import broker_group
from tests.support.processes import broker_process
from tests.support.timing import wait_for

if platform.system() != "Linux" or platform.machine() != "x86_64":  # the wheel's only build
    pytest.skip("rocketmq 0.4.4 ships for Linux x86_64 only", allow_module_level=True)

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).resolve().parent / "support" / "rocketmq_driver.py"
#: retries come back after 1 s instead of 10 s
FAST_RETRIES = 'message_delay_level = "' + " ".join(["1s"] * 18) + '"'


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(broker address, nameserver address) of a broker process for this module."""
    store = tmp_path_factory.mktemp("rocketmq-clients")
    with broker_process(store, store_toml=FAST_RETRIES) as addresses:
        yield addresses


@pytest.fixture
def namesrv(broker: tuple[str, str]) -> str:
    return broker[1]


def rocketmq(
    tmp_path: Path, command: str, namesrv: str, *args: str, timeout_s: float = 90
) -> list[dict[str, Any]]:
    """Run the official client (tests/support/rocketmq_driver.py); its JSON lines, checked done."""
    home = tmp_path / "rocketmq-home"  # the C++ client logs to $HOME/logs/rocketmq-cpp
    home.mkdir(exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(DRIVER), command, "--namesrv", namesrv, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "HOME": str(home)},
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stderr}"
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines and "done" in lines[-1], result.stdout + result.stderr
    return lines


def messages_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if "body" in line]


def test_send_sync_answers_ok_with_each_queues_offsets(tmp_path: Path, namesrv: str) -> None:
    lines = rocketmq(tmp_path, "send", namesrv, "--topic", "SyncTopic", "--count", "40")
    results = lines[:-1]
    assert [r["status"] for r in results] == ["OK"] * 40
    assert len({r["msg_id"] for r in results}) == 40
    pulled = messages_of(
        rocketmq(tmp_path, "pull", namesrv, "--topic", "SyncTopic", "--group", "G1")
    )
    # every message is where its send said; each queue counts up from 0
    by_id = {m["id"]: m for m in pulled}
    assert all(by_id[r["msg_id"]]["queue_offset"] == r["offset"] for r in results)
    per_queue = collections.defaultdict(list)
    for m in pulled:
        per_queue[m["queue_id"]].append(m["queue_offset"])
    assert len(per_queue) == 4  # round-robin over the auto-created topic's 4 queues
    assert all(offsets == list(range(len(offsets))) for offsets in per_queue.values())


def test_pull_consumer_reads_everything_back_and_stops_at_the_end(
    tmp_path: Path, namesrv: str
) -> None:
    rocketmq(
        tmp_path,
        "send",
        namesrv,
        "--topic",
        "PullTopic",
        "--count",
        "25",
        "--tags",
        "tagA",
        "--keys",
        "key{i} other{i}",
        "--prop",
        "myprop=value {i}",
    )
    lines = rocketmq(tmp_path, "pull", namesrv, "--topic", "PullTopic", "--show", "myprop")
    pulled = messages_of(lines)
    assert lines[-1] == {"done": 25}  # the generator ended: NO_NEW_MSG once caught up
    assert sorted(m["body"] for m in pulled) == sorted(f"body {i}" for i in range(25))
    first = next(m for m in pulled if m["body"] == "body 3")
    assert (first["tags"], first["keys"]) == ("tagA", "key3 other3")
    assert first["properties"] == {"myprop": "value 3"}
    # tag filtering from the pull's subscription string
    none = rocketmq(
        tmp_path, "pull", namesrv, "--topic", "PullTopic", "--group", "G2", "--expression", "tagB"
    )
    assert none[-1] == {"done": 0}


def test_oneway_orderly_and_batch_sends_deliver(tmp_path: Path, namesrv: str) -> None:
    rocketmq(
        tmp_path,
        "send",
        namesrv,
        "--topic",
        "Modes",
        "--count",
        "5",
        "--mode",
        "oneway",
        "--body",
        "oneway {i}",
    )
    orderly = rocketmq(
        tmp_path,
        "send",
        namesrv,
        "--topic",
        "Modes",
        "--count",
        "10",
        "--mode",
        "orderly",
        "--arg",
        "7",
        "--body",
        "ordered {i}",
    )
    assert [r["status"] for r in orderly[:-1]] == ["OK"] * 10
    batch = rocketmq(
        tmp_path,
        "send",
        namesrv,
        "--topic",
        "Modes",
        "--count",
        "3",
        "--mode",
        "batch",
        "--body",
        "batched {i}",
    )
    assert batch[0]["status"] == "OK"
    pulled = messages_of(rocketmq(tmp_path, "pull", namesrv, "--topic", "Modes"))
    bodies = [m["body"] for m in pulled]
    assert sorted(b for b in bodies if b.startswith("oneway")) == [f"oneway {i}" for i in range(5)]
    assert sorted(b for b in bodies if b.startswith("batched")) == [
        f"batched {i}" for i in range(3)
    ]
    ordered = [m for m in pulled if m["body"].startswith("ordered")]
    assert {m["queue_id"] for m in ordered} == {7 % 4}  # one queue for the key
    assert [m["body"] for m in sorted(ordered, key=lambda m: m["queue_offset"])] == [
        f"ordered {i}" for i in range(10)
    ]


async def _mark_every_queue(namesrv: str, topic: str, marker: str) -> int:
    """One message ``<marker> <queue id>`` at the end of each of ``topic``'s queues (sent
    by hamq's producer, to each queue by name); how many. A push consumer that has got
    them all has pulled every queue past what came before them, so a message delivered
    twice by those pulls has come by then: the proof that a duplicate had its chance."""
    async with PullConsumer("MARKER", namesrv) as puller:
        queues = await puller.queues(topic)
    async with Producer("MARKER", namesrv) as producer:
        for queue in queues:
            await producer.send(Message(topic, f"{marker} {queue.queue_id}"), queue=queue)
    return len(queues)


async def test_push_consumer_gets_each_message_once_and_resumes_after_a_restart(
    tmp_path: Path, namesrv: str
) -> None:
    async def run(*args: str) -> list[dict[str, Any]]:
        return await trio.to_thread.run_sync(lambda: rocketmq(tmp_path, *args))

    async def push(count: int) -> list[str]:
        """The bodies the official push consumer got until it had ``count`` messages."""
        lines = await run(
            "push", namesrv, "--topic", "PushTopic", "--group", "CID", "--count", str(count)
        )
        return [m["body"] for m in messages_of(lines)]

    await run("send", namesrv, "--topic", "PushTopic", "--count", "30")
    markers = await _mark_every_queue(namesrv, "PushTopic", "marker")
    first = await push(30 + markers)
    assert sorted(b for b in first if not b.startswith("marker")) == sorted(
        f"body {i}" for i in range(30)
    )  # once each, and every queue was pulled past them (its marker came)
    assert len(first) == 30 + markers
    # the offsets the consumer committed are on the broker (read as the group, no commit)
    async with PullConsumer("CID", namesrv) as puller:
        queues = await puller.queues("PushTopic")
        committed = {q.queue_id: await puller.committed_offset(q) for q in queues}
        ends = {q.queue_id: await puller.max_offset(q) for q in queues}
    assert committed == ends
    await run("send", namesrv, "--topic", "PushTopic", "--count", "5", "--body", "later {i}")
    await _mark_every_queue(namesrv, "PushTopic", "again")
    second = await push(5 + markers)
    assert sorted(b for b in second if not b.startswith("again")) == [
        f"later {i}" for i in range(5)
    ]  # resumed where it committed: nothing of the first run again, every queue past it
    assert len(second) == 5 + markers


def test_a_failing_callback_gets_the_message_again_through_the_retry_topic(
    tmp_path: Path, namesrv: str
) -> None:
    rocketmq(tmp_path, "send", namesrv, "--topic", "RetryTopic", "--count", "3")
    lines = rocketmq(
        tmp_path,
        "push",
        namesrv,
        "--topic",
        "RetryTopic",
        "--group",
        "CID_RETRY",
        "--count",
        "3",
        "--fail-once",
        "body 1",
        "--timeout",
        "60",
    )
    [failed] = [line["failed"] for line in lines if "failed" in line]
    delivered = messages_of(lines)
    assert sorted(m["body"] for m in delivered) == ["body 0", "body 1", "body 2"]
    again = next(m for m in delivered if m["body"] == "body 1")
    assert again["topic"] == "RetryTopic"  # shown under its own topic
    assert again["reconsume_times"] == 1 and failed["reconsume_times"] == 0


async def test_messages_cross_between_hamq_and_rocketmq_clients_intact(
    tmp_path: Path, namesrv: str
) -> None:
    big = "".join(chr(32 + i % 90) for i in range(10_000))  # compressible, 10 KB
    # hamq producer -> RocketMQ consumer
    async with Producer("PG", namesrv) as producer:
        await producer.send(
            Message("FromHamq", big, tags="big", keys=["k1", "k2"], properties={"p": "v"})
        )
        await producer.send(Message("FromHamq", "small", tags="small"))
    lines = await trio.to_thread.run_sync(
        lambda: rocketmq(tmp_path, "pull", namesrv, "--topic", "FromHamq", "--show", "p")
    )
    by_tags = {m["tags"]: m for m in messages_of(lines)}
    assert by_tags["big"]["body"] == big  # inflated by the C++ client
    assert (by_tags["big"]["keys"], by_tags["big"]["properties"]) == ("k1 k2", {"p": "v"})
    assert by_tags["small"]["body"] == "small"

    # RocketMQ producer -> hamq consumer (the C++ client compresses over 4 KiB too)
    await trio.to_thread.run_sync(
        lambda: rocketmq(
            tmp_path,
            "send",
            namesrv,
            "--topic",
            "FromRocketMQ",
            "--count",
            "1",
            "--body",
            big,
            "--tags",
            "big",
            "--keys",
            "k1",
            "--prop",
            "p=v",
        )
    )
    got: list[MessageExt] = []

    def handle(messages: list[MessageExt]) -> ConsumeResult:
        got.extend(messages)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer("HG", namesrv, consume_from="FIRST_OFFSET")
    consumer.subscribe("FromRocketMQ")
    async with consumer.consuming(handle):
        await wait_for(lambda: bool(got), 30)
    [message] = got
    assert message.body.decode() == big
    assert message.sys_flag & SYSFLAG_COMPRESSED  # stored as sent: compressed, flagged
    assert (message.tags, message.keys, message.properties["p"]) == ("big", ["k1"], "v")
    assert len(zlib.compress(big.encode(), 5)) < 10_000


def test_an_orderly_push_consumer_locks_its_queues_and_keeps_order(
    tmp_path: Path, namesrv: str
) -> None:
    for key in (1, 2):
        rocketmq(
            tmp_path,
            "send",
            namesrv,
            "--topic",
            "OrderlyTopic",
            "--count",
            "15",
            "--mode",
            "orderly",
            "--arg",
            str(key),
            "--body",
            f"key{key} step {{i}}",
        )
    lines = rocketmq(
        tmp_path, "push", namesrv, "--topic", "OrderlyTopic", "--group", "CID_ORDERLY",
        "--orderly", "--count", "30",
    )  # fmt: skip
    for key in (1, 2):
        steps = [m["body"] for m in messages_of(lines) if m["body"].startswith(f"key{key} ")]
        assert steps == [f"key{key} step {i}" for i in range(15)]


async def test_rocketmq_consumers_read_from_the_slave_while_the_master_is_down(
    tmp_path: Path,
) -> None:
    async with broker_group(tmp_path, "SYNC_MASTER") as (ns, (master, _), _slave):

        def run(*args: str) -> list[dict[str, Any]]:
            return rocketmq(tmp_path, *args)

        sent = await trio.to_thread.run_sync(
            lambda: run("send", ns, "--topic", "Replicated", "--count", "20")
        )
        assert [r["status"] for r in sent[:-1]] == ["OK"] * 20  # SYNC_MASTER: on the slave
        os.kill(master.pid, signal.SIGKILL)
        with trio.fail_after(10):
            await master.wait()
        pulled = await trio.to_thread.run_sync(
            lambda: run("pull", ns, "--topic", "Replicated", "--group", "AfterMaster")
        )
        assert sorted(m["body"] for m in messages_of(pulled)) == sorted(
            f"body {i}" for i in range(20)
        )
        pushed = await trio.to_thread.run_sync(
            lambda: run(
                "push", ns, "--topic", "Replicated", "--group", "PushAfter", "--count", "20"
            )
        )
        assert len(messages_of(pushed)) == 20


#: accounts of the ACL test: the broker's own, and the C++ client's (AclTopic, two groups)
CPP_ACL = """\
accounts:
  - accessKey: hamq-broker
    secretKey: broker-secret
    admin: true
  - accessKey: cpp-app1
    secretKey: cpp-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclTopic=PUB|SUB
    groupPerms:
      - CPP_ACL_PULL=SUB
      - CPP_ACL_PUSH=SUB
"""


def test_the_official_client_signs_with_its_session_credentials_under_acl(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    store = tmp_path_factory.mktemp("rocketmq-acl")
    (store / "plain_acl.yml").write_text(CPP_ACL)
    config = (
        f"acl_enable = true\nacl_file = '{store / 'plain_acl.yml'}'\n"
        "access_key = 'hamq-broker'\nsecret_key = 'broker-secret'\n"
    )
    keys = ("--access-key", "cpp-app1", "--secret-key", "cpp-secret")
    with broker_process(store, config_toml=config) as (_broker, ns):
        sent = rocketmq(tmp_path, "send", ns, "--topic", "AclTopic", "--count", "5", *keys)
        assert [r["status"] for r in sent[:-1]] == ["OK"] * 5
        # a wrong secret, or a topic the account may not publish to: nothing is stored
        wrong = ("--access-key", "cpp-app1", "--secret-key", "not-the-secret", "--keep-going")
        refused = rocketmq(tmp_path, "send", ns, "--topic", "AclTopic", "--count", "2", *wrong)
        other = ("--topic", "OtherTopic", "--count", "1", "--keep-going", *keys)
        refused += rocketmq(tmp_path, "send", ns, *other)
        assert [sorted(r) for r in refused] == [["error"], ["error"], ["done"], ["error"], ["done"]]
        unsigned = rocketmq(tmp_path, "send", ns, "--topic", "AclTopic", "--keep-going")
        assert "error" in unsigned[0], unsigned
        pulled = rocketmq(
            tmp_path, "pull", ns, "--topic", "AclTopic", "--group", "CPP_ACL_PULL", *keys
        )
        assert sorted(m["body"] for m in messages_of(pulled)) == [f"body {i}" for i in range(5)]
        pushed = rocketmq(
            tmp_path, "push", ns, "--topic", "AclTopic", "--group", "CPP_ACL_PUSH", "--count", "5",
            "--timeout", "30", *keys,
        )  # fmt: skip
        assert sorted(m["body"] for m in messages_of(pushed)) == [f"body {i}" for i in range(5)]
