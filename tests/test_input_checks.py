"""What broke when tried by hand (issue 13), each case with the check that now holds:

- a push consumer's retry after a failover goes to its broker group's current master
  (by broker name), else through a producer to ``%RETRY%group``;
- a store directory another process holds is named, with the holder's PID (exit 2);
- bad input is refused by name: deleting a topic that does not exist, shrinking a
  topic's queues that hold messages (unless ``--force``), config values of the wrong
  type, malformed tag expressions (client and broker);
- a broker that fails to start writes no epoch entry.

CLI behaviour runs the real ``hamq`` command; the rest runs brokers in this process.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from hamq.broker import BrokerNode, ConfigError, build_config, load_config
from hamq.client import (
    AdminClient,
    ConsumeResult,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from hamq.ha import EpochFile
from hamq.ha.epoch import FILE_NAME as EPOCH_FILE_NAME
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from hamq.protocol.headers import PULL_FLAG_SUBSCRIPTION, PullMessageRequestHeader
from hamq.protocol.message import PROPERTY_RETRY_TOPIC, parse_tags
from hamq.remoting import RemotingClient
from tests.support.brokers import (
    SMALL_STORE,
    broker_config,
    running_broker,
    running_nameserver,
    small_store_toml,
)
from tests.support.processes import hamq_command, hamq_server, ready_addresses, write_toml
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow

#: delay levels of a second each: a sent-back message comes back quickly
FAST_RETRY = {"message_delay_level": "1s 1s 1s 1s 1s 1s", **SMALL_STORE}


@asynccontextmanager
async def broker_process(tmp_path: Path, store: str = "store") -> AsyncIterator[tuple[Any, str]]:
    """A ``hamq broker`` with an embedded nameserver: (process, nameserver address)."""
    args = ["-c", str(small_store_toml(tmp_path)), "--port", "0", "--namesrv-port", "0"]
    async with hamq_server("broker", *args, "--store-dir", str(tmp_path / store)) as (
        proc,
        line,
    ):
        yield proc, ready_addresses(line)[1]


# ---------------------------------------------------------------- the CLI


async def test_a_store_directory_in_use_is_named_with_its_holder(tmp_path: Path) -> None:
    store = tmp_path / "data" / "broker-a-0"
    async with broker_process(tmp_path, "data/broker-a-0") as (holder, _):
        second = await hamq_command(
            "broker",
            *("-c", str(small_store_toml(tmp_path)), "--port", "0", "--namesrv-port", "0"),
            *("--store-dir", str(store)),
        )
    assert second.returncode == 2, second.stderr
    assert second.stderr.decode().splitlines() == [
        f"error: {store} is in use by process {holder.pid}"
    ]


async def test_deleting_a_topic_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    async with broker_process(tmp_path) as (_, ns):
        missing = await hamq_command("topic", "delete", "NoSuchTopic", "-n", ns)
        assert missing.returncode == 2, missing.stdout
        assert b"deleted" not in missing.stdout
        assert b"topic NoSuchTopic does not exist" in missing.stderr, missing.stderr
        made = await hamq_command("topic", "create", "Real", "--queues", "2", "-n", ns)
        assert made.returncode == 0, made.stderr
        deleted = await hamq_command("topic", "delete", "Real", "-n", ns)
        assert deleted.returncode == 0, deleted.stderr
        assert b"topic Real deleted" in deleted.stdout


async def test_shrinking_queues_that_hold_messages_needs_force(tmp_path: Path) -> None:
    async with broker_process(tmp_path) as (_, ns):
        for topic in ("Full", "Empty"):
            made = await hamq_command("topic", "create", topic, "--queues", "4", "-n", ns)
            assert made.returncode == 0, made.stderr
        sent = await hamq_command("produce", "--topic", "Full", "--count", "20", "-n", ns)
        assert sent.returncode == 0, sent.stderr

        refused = await hamq_command("topic", "create", "Full", "--queues", "2", "-n", ns)
        assert refused.returncode == 2, refused.stdout
        text = refused.stderr.decode()
        assert "Full@broker-a:2 holds 5 message(s)" in text, text
        assert "Full@broker-a:3 holds 5 message(s)" in text, text
        assert "Full@broker-a:1" not in text and "--force" in text
        status = await hamq_command("topic", "status", "Full", "-n", ns)
        assert b"Full@broker-a:3" in status.stdout  # nothing changed

        # queues without messages may go; --force hides the others
        shrunk = await hamq_command("topic", "create", "Empty", "--queues", "2", "-n", ns)
        assert shrunk.returncode == 0, shrunk.stderr
        forced = await hamq_command("topic", "create", "Full", "--queues", "2", "--force", "-n", ns)
        assert forced.returncode == 0, forced.stderr
        status = await hamq_command("topic", "status", "Full", "-n", ns)
        assert b"Full@broker-a:1" in status.stdout and b"Full@broker-a:2" not in status.stdout
        grown = await hamq_command("topic", "create", "Full", "--queues", "4", "-n", ns)
        assert grown.returncode == 0, grown.stderr


async def test_a_config_value_of_the_wrong_type_is_refused_by_the_command(tmp_path: Path) -> None:
    config = write_toml(
        tmp_path / "broker.toml", {"listen_port": "11011", "store": {"store_dir": "x"}}
    )
    result = await hamq_command("broker", "-c", str(config))
    assert result.returncode == 2
    text = result.stderr.decode()
    assert text.startswith("error: ") and "listen_port" in text and "'11011'" in text, text
    assert len(text.splitlines()) == 1


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"listen_port": "11011"}, "broker.listen_port"),
        ({"broker_id": True}, "broker.broker_id"),
        ({"listen_port": 11011.0}, "broker.listen_port"),
        ({"register_interval_s": "30"}, "broker.register_interval_s"),
        ({"auto_create_topic_enable": "false"}, "broker.auto_create_topic_enable"),
        ({"slave_read_enable": 1}, "broker.slave_read_enable"),
        ({"broker_name": 7}, "broker.broker_name"),
        ({"namesrv_addrs": "127.0.0.1:9876"}, "broker.namesrv_addrs"),
        ({"namesrv_addrs": [9876]}, "broker.namesrv_addrs"),
        (
            {"store": {"flush_interval_commitlog_s": "0.5"}},
            "broker.store.flush_interval_commitlog_s",
        ),
        ({"store": {"role": 0}}, "broker.store.role"),
        ({"store": {"store_dir": 5}}, "broker.store.store_dir"),
        ({"ha": {"sync_timeout_s": "3"}}, "broker.ha.sync_timeout_s"),
        ({"ha": {"sync_from_last_file": "yes"}}, "broker.ha.sync_from_last_file"),
        ({"remoting": {"idle_timeout_s": "never"}}, "broker.remoting.idle_timeout_s"),
    ],
)
def test_config_values_of_the_wrong_type_are_refused_by_key(
    values: dict[str, Any], key: str
) -> None:
    store = {"store_dir": "./data/store", **values.pop("store", {})}
    with pytest.raises(ConfigError, match=re.escape(f"@ {key}")):
        build_config({**values, "store": store})


def test_every_wrong_type_is_named_at_once(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('listen_port = "11011"\nbroker_id = "0"\n[store]\nstore_dir = "x"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "listen_port" in str(refused.value) and "broker_id" in str(refused.value)


def test_numbers_where_floats_go_and_right_types_still_load(tmp_path: Path) -> None:
    config = build_config(
        {
            "listen_port": 11011,
            "register_interval_s": 30,  # an int where a float goes
            "namesrv_addrs": ["127.0.0.1:9876"],
            "auto_create_topic_enable": False,
            "store": {"store_dir": str(tmp_path), "role": "SYNC_MASTER", "file_reserved_time_h": 1},
            "ha": {"sync_timeout_s": 2, "protocol": "autoswitch"},
            "remoting": {"idle_timeout_s": 60.5},
        }
    )
    assert config.listen_port == 11011 and config.register_interval_s == 30.0
    assert isinstance(config.register_interval_s, float)
    assert config.namesrv_addrs == ("127.0.0.1:9876",)
    assert config.store.store_dir == tmp_path and config.ha.sync_timeout_s == 2.0


# ---------------------------------------------------------------- tag expressions


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        ("*", None),
        ("", None),
        (" * ", None),
        ("a", {"a"}),
        ("a || b", {"a", "b"}),
        ("  a||b ||c ", {"a", "b", "c"}),
    ],
)
def test_valid_tag_expressions(expression: str, tags: set[str] | None) -> None:
    assert parse_tags(expression) == (None if tags is None else frozenset(tags))


BAD_EXPRESSIONS = ["a ||", "|| a", "a || || b", "||", "a ||  ", "a || *"]


@pytest.mark.parametrize("expression", BAD_EXPRESSIONS)
def test_malformed_tag_expressions_are_refused(expression: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(expression))):
        parse_tags(expression)
    consumer = PushConsumer("G", "127.0.0.1:9876")
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(expression))):
        consumer.subscribe("T", expression)
    assert consumer.subscriptions == {}


async def test_the_broker_refuses_malformed_subscriptions(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as node, RemotingClient() as client:
        for expression in BAD_EXPRESSIONS:
            pull = PullMessageRequestHeader(
                consumer_group="G",
                topic="TBW102",
                queue_id=0,
                queue_offset=0,
                max_msg_nums=1,
                sys_flag=PULL_FLAG_SUBSCRIPTION,
                commit_offset=0,
                suspend_timeout_millis=0,
                sub_version=0,
                subscription=expression,
                expression_type="TAG",
            )
            answer = await client.invoke(
                node.address, RemotingCommand.request(RequestCode.PULL_MESSAGE, pull), 5
            )
            assert answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, answer
            assert repr(expression) in (answer.remark or "")

            heartbeat = HeartbeatData(
                "c1",
                consumer_data_set=[
                    ConsumerData("G", subscription_data_set=[SubscriptionData("T", expression)])
                ],
            )
            request = RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(heartbeat))
            answer = await client.invoke(node.address, request, 5)
            assert answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, answer
            assert repr(expression) in (answer.remark or "")
        assert not node.ctx.consumers.client_ids("G")  # nothing was registered
        good = HeartbeatData(
            "c1",
            consumer_data_set=[
                ConsumerData("G", subscription_data_set=[SubscriptionData("T", "a || b")])
            ],
        )
        request = RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(good))
        assert (await client.invoke(node.address, request, 5)).code == ResponseCode.SUCCESS


# ---------------------------------------------------------------- epochs


def epochs_of(store_dir: Path) -> list[tuple[int, int]]:
    epochs = EpochFile(store_dir / EPOCH_FILE_NAME)
    epochs.load()
    return [(e.epoch, e.start_offset) for e in epochs.entries]


async def test_a_broker_that_cannot_start_writes_no_epoch(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for _ in range(3):
            node = BrokerNode(broker_config(store, listen_port=port, ha_listen_port=0))
            with pytest.raises(BaseException) as failed:
                async with trio.open_nursery() as nursery:
                    await nursery.start(node.run)
            assert isinstance(failed.value, OSError) or (
                isinstance(failed.value, BaseExceptionGroup) and failed.group_contains(OSError)
            ), failed.value
    assert epochs_of(store) == []
    async with running_broker(store):  # one that starts: one epoch
        pass
    async with running_broker(store):
        pass
    assert [epoch for epoch, _ in epochs_of(store)] == [1, 2]


async def test_a_broker_stopped_before_it_registered_writes_no_epoch(tmp_path: Path) -> None:
    """Its nameserver takes the connection and never answers: the broker is stopped
    while it waits to register."""
    registering = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        registering.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        node = BrokerNode(
            broker_config(
                tmp_path / "store",
                namesrv_addrs=[f"127.0.0.1:{port}"],
                register_timeout_s=60.0,
            )
        )
        scope, stopped = trio.CancelScope(), trio.Event()

        async def serve() -> None:
            try:
                with scope:
                    await node.run()
            finally:
                stopped.set()

        nursery.start_soon(serve)
        with trio.fail_after(20):
            await registering.wait()
            scope.cancel()
            await stopped.wait()
        nursery.cancel_scope.cancel()
    assert epochs_of(tmp_path / "store") == []


# ---------------------------------------------------------------- retries after a failover


@attrs.define
class Running:
    node: BrokerNode
    scope: trio.CancelScope
    stopped: trio.Event

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(20):
            await self.stopped.wait()


async def start_broker(nursery: trio.Nursery, store_dir: Path, **overrides: Any) -> Running:
    node = BrokerNode(broker_config(store_dir, **overrides))
    running = Running(node, trio.CancelScope(), trio.Event())

    async def serve(*, task_status: trio.TaskStatus[int]) -> None:
        try:
            with running.scope:
                await node.run(task_status=task_status)
        finally:
            running.stopped.set()

    await nursery.start(serve)
    return running


def retry_once_handler(
    deliveries: list[MessageExt], first_seen: trio.Event, go_on: trio.Event
) -> Callable[[list[MessageExt]], Awaitable[ConsumeResult]]:
    """RECONSUME_LATER for the first delivery (once ``go_on`` is set), then SUCCESS."""

    async def handle(messages: list[MessageExt]) -> ConsumeResult:
        deliveries.extend(messages)
        if len(deliveries) == 1:
            first_seen.set()
            await go_on.wait()
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    return handle


def assert_retried(deliveries: list[MessageExt], topic: str) -> None:
    first, again = deliveries[0], deliveries[1]
    assert again.body == first.body and again.msg_id == first.msg_id
    assert again.topic == topic  # (shown with its original topic)
    assert again.properties.get(PROPERTY_RETRY_TOPIC) == topic
    assert first.reconsume_times == 0 and again.reconsume_times == 1  # from %RETRY%G


async def test_a_retry_goes_to_the_new_master_when_the_store_host_is_a_slave(
    tmp_path: Path,
) -> None:
    """Master A and slave B of broker-a; a message is stored on A; then B's store
    serves as master and A's as slave at A's old address: the message's store host
    refuses the send-back (SERVICE_NOT_AVAILABLE), the group's master takes it."""
    deliveries: list[MessageExt] = []
    first_seen, swapped = trio.Event(), trio.Event()
    async with running_nameserver() as (_, ns), trio.open_nursery() as nursery:
        common: dict[str, Any] = {"namesrv_addrs": [ns], "metadata_sync_interval_s": 0.5}
        a = await start_broker(nursery, tmp_path / "a", store=FAST_RETRY, **common)
        b = await start_broker(
            nursery, tmp_path / "b", broker_id=1, store={"role": "SLAVE", **FAST_RETRY}, **common
        )
        assert a.node.ha_service is not None
        await wait_for(a.node.ha_service.transfer.available)
        async with Producer("PG", ns) as producer:
            await producer.send(Message("Swapped", b"retry me"))
        consumer = PushConsumer("G", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Swapped")
        async with consumer.consuming(retry_once_handler(deliveries, first_seen, swapped)):
            with trio.fail_after(20):
                await first_seen.wait()
            old_address = a.node.address
            port = a.node.ctx.port
            await wait_for(
                lambda: b.node.store.commitlog_max_offset == a.node.store.commitlog_max_offset
            )
            # the slave has copied the topics and the group (the metadata sync)
            await wait_for(
                lambda: (
                    {"Swapped", "%RETRY%G"} <= set(b.node.ctx.topics.table)
                    and "G" in b.node.ctx.subscriptions.table
                )
            )
            await a.stop()
            await b.stop()
            await start_broker(nursery, tmp_path / "b", store=FAST_RETRY, **common)
            demoted = await start_broker(
                nursery,
                tmp_path / "a",
                broker_id=1,
                listen_port=port,
                store={"role": "SLAVE", **FAST_RETRY},
                **common,
            )
            assert demoted.node.address == old_address == deliveries[0].store_host
            swapped.set()
            await wait_for(lambda: len(deliveries) >= 2, 30)
        nursery.cancel_scope.cancel()
    assert_retried(deliveries, "Swapped")
    # CONSUMER_SEND_MSG_BACK's copy (the new master took it), not a new message
    assert deliveries[1].born_timestamp == deliveries[0].born_timestamp


async def test_a_retry_goes_through_a_producer_when_no_broker_takes_the_send_back(
    tmp_path: Path,
) -> None:
    """broker-a stored the message and is gone when the handler gives up: the retry is
    sent to %RETRY%G as a new message (RocketMQ's fallback), here to broker-b."""
    deliveries: list[MessageExt] = []
    first_seen, gone = trio.Event(), trio.Event()
    async with running_nameserver() as (_, ns), trio.open_nursery() as nursery:
        a = await start_broker(nursery, tmp_path / "a", namesrv_addrs=[ns], store=FAST_RETRY)
        await start_broker(
            nursery, tmp_path / "b", namesrv_addrs=[ns], broker_name="broker-b", store=FAST_RETRY
        )
        async with AdminClient(ns) as admin:
            await admin.create_topic("Fallback", 1)
        async with Producer("PG", ns) as producer:
            await producer.send(
                Message("Fallback", b"retry me"), queue=MessageQueue("Fallback", "broker-a", 0)
            )
        consumer = PushConsumer("G", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Fallback")
        async with consumer.consuming(retry_once_handler(deliveries, first_seen, gone)):
            with trio.fail_after(20):
                await first_seen.wait()
            await a.stop()
            gone.set()
            await wait_for(lambda: len(deliveries) >= 2, 30)
        assert consumer.sent_back == 1
        nursery.cancel_scope.cancel()
    assert_retried(deliveries, "Fallback")
    assert deliveries[1].born_timestamp > deliveries[0].born_timestamp  # a new message
