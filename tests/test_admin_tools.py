"""``hamq admin`` and ``hamq topic`` as operators use them: consumer
progress, groups and their members, offsets reset by time (a running push consumer
goes back), messages by key and id, broker status and live configuration, topic
status per queue, and the ``--json`` form of every command.

The wire formats are tested with bytes (fastjson's inline object keys, the C++
clients' reset body); the broker's side of the requests in this process
(tests/support/brokers.py); every command as a real ``hamq`` process at 127.0.0.1
against a SYNC_MASTER and its SLAVE (the shape of ``make run``) on ports free at run
time, started once for the module. Every wait is bounded; every process is killed by
PID at the end.

The tests with a client in this process (AdminClient, Producer, PushConsumer,
PullConsumer) run on every AnyIO backend: their brokers in a Trio thread
(tests/support/backends.py) or as processes. The tests of the commands alone stay
plain (Trio) tests: the client runs in the ``hamq`` process there, not in the test's
loop, and three runs of each would add their processes' time for nothing.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
import trio

from cli.admin import parse_timestamp
from hamq.broker import build_config
from hamq.broker.client_calls import reset_body
from hamq.broker.clients import ClientChannel
from hamq.broker.live_config import config_key, flatten, parse_properties, typed_settings
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.client import AdminClient, Message, Producer, PullConsumer, PushConsumer
from hamq.client.admin_views import BrokerStatus, camel_case_keys, epochs_from_ha_status, kv_value
from hamq.client.message import MessageExt
from hamq.protocol import LanguageCode, RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import (
    BodyError,
    ConsumerOffsetSerializeWrapper,
    ConsumeStats,
    GetConsumerStatusBody,
    MessageQueue,
    OffsetWrapper,
    ResetOffsetBody,
    ResetOffsetBodyForC,
    TopicOffset,
    TopicRouteData,
    TopicStatsTable,
    decode_body,
    decode_reset_offsets,
    encode_body,
)
from hamq.protocol.headers import GetConsumerStatusRequestHeader, ResetOffsetRequestHeader
from tests.support.autoswitch import sync_state_when
from tests.support.backends import broker_thread
from tests.support.brokers import SMALL_STORE, invoke
from tests.support.ha import broker_addr, first_slave_in_sync
from tests.support.processes import HAMQ, free_ports, hamq_command, hamq_server, write_toml
from tests.support.timing import wait_for

# ---------------------------------------------------------------- wire formats

#: what Java's fastjson writes for a ConsumeStats (not JSON: the keys are objects)
JAVA_CONSUME_STATS = (
    '{"consumeTps":1.5,"offsetTable":{{"brokerName":"broker-a","queueId":3,"topic":"T"}:'
    '{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":1700000000000,"pullOffset":4}}}'
)


def test_queue_keyed_maps_are_written_as_fastjson_writes_them() -> None:
    queue = MessageQueue("T", "broker-a", 3)
    stats = ConsumeStats({queue: OffsetWrapper(9, 4, 4, 1700000000000)}, 1.5)
    encoded = encode_body(stats).decode()
    assert '"offsetTable":{{"brokerName":"broker-a","queueId":3,"topic":"T"}:{' in encoded
    assert decode_body(ConsumeStats, encoded) == stats
    assert decode_body(ConsumeStats, JAVA_CONSUME_STATS) == stats


@pytest.mark.parametrize(
    "text",
    [
        # the key as a JSON string holding the object
        '{"offsetTable":{"{\\"brokerName\\":\\"b\\",\\"queueId\\":1,\\"topic\\":\\"T\\"}":'
        '{"minOffset":2,"maxOffset":9,"lastUpdateTimestamp":10}}}',
        # fastjson's inline key, with white space and fields in another order
        '{ "offsetTable" : { { "topic":"T", "queueId":1, "brokerName":"b" } :'
        ' {"minOffset":2,"maxOffset":9,"lastUpdateTimestamp":10} } }',
    ],
)
def test_queue_keys_decode_inline_or_quoted(text: str) -> None:
    table = decode_body(TopicStatsTable, text).offset_table
    assert table == {MessageQueue("T", "b", 1): TopicOffset(2, 9, 10)}


def test_numeric_keys_still_decode_unquoted() -> None:
    route = decode_body(
        TopicRouteData, '{"brokerDatas":[{"cluster":"c","brokerName":"b","brokerAddrs":{0:"a:1"}}]}'
    )
    assert route.broker_datas[0].broker_addrs == {0: "a:1"}


@pytest.mark.parametrize(
    "text", ['{"offsetTable":{{"brokerName":"b"}', '{"offsetTable":{{"x":1}:2}}', "{,}"]
)
def test_broken_bodies_are_refused_by_name(text: str) -> None:
    with pytest.raises(BodyError, match="ConsumeStats"):
        decode_body(ConsumeStats, text)


def test_reset_bodies_in_either_form() -> None:
    queue = MessageQueue("T", "b", 2)
    assert decode_reset_offsets(encode_body(ResetOffsetBody({queue: 7}))) == {queue: 7}
    listed = b'{"offsetTable":[{"topic":"T","brokerName":"b","queueId":2,"offset":7}]}'
    assert decode_reset_offsets(listed) == {queue: 7}


@pytest.mark.parametrize(
    ("language", "body_type"), [(LanguageCode.CPP, ResetOffsetBodyForC), (LanguageCode.JAVA, None)]
)
def test_a_cpp_client_is_told_of_a_reset_in_its_own_form(
    language: LanguageCode, body_type: type | None
) -> None:
    channel = ClientChannel("c", None, language, 63, 0)  # type: ignore[arg-type]
    body = reset_body(channel, {MessageQueue("T", "b", 0): 5})
    if body_type is not None:
        listed = decode_body(ResetOffsetBodyForC, body).offset_table
        assert [(q.topic, q.queue_id, q.offset) for q in listed] == [("T", 0, 5)]
    assert decode_reset_offsets(body) == {MessageQueue("T", "b", 0): 5}


def test_a_slave_takes_a_reset_offset_back_and_nothing_else_back(tmp_path: Path) -> None:
    master = ConsumerOffsetManager(tmp_path / "master.json")
    slave = ConsumerOffsetManager(tmp_path / "slave.json")

    def sync() -> None:  # as the slave's metadata sync does, through the wire format
        body = encode_body(master.snapshot())
        slave.merge_newer(decode_body(ConsumerOffsetSerializeWrapper, body))

    master.commit("g", "T", 0, 10)
    sync()
    slave.commit("g", "T", 0, 12)  # consumed from the slave while the master was away
    sync()
    assert slave.query("g", "T", 0) == 12  # never back ...
    master.reset("g", "T", 0, 3, now_ms=1000)
    sync()
    assert slave.query("g", "T", 0) == 3  # ... but for a reset
    slave.commit("g", "T", 0, 5)
    sync()
    assert slave.query("g", "T", 0) == 5  # once
    master.reset("g", "T", 0, 2, now_ms=1000)  # again, within the same ms
    sync()
    assert slave.query("g", "T", 0) == 2
    again = ConsumerOffsetManager(tmp_path / "restarted.json")
    again.restore(decode_body(ConsumerOffsetSerializeWrapper, encode_body(slave.snapshot())))
    assert again.resets == slave.resets == {"T@g": {0: 1001}}


# ---------------------------------------------------------------- command-line input


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", 123),
        ("0", 0),
        ("-1", -1),
        ("1700000000123", 1700000000123),
        ("2023-11-14T22:13:20.123Z", 1700000000123),
        ("2023-11-14T23:13:20.123+01:00", 1700000000123),
        ("2023-11-14 22:13:20Z", 1700000000000),
    ],
)
def test_timestamps_are_ms_iso_or_now(text: str, expected: int) -> None:
    assert parse_timestamp(text, now_ms=123) == expected


def test_a_local_iso_time_is_exact_to_the_ms() -> None:
    stamp = 1795456065602  # (its float seconds round down: the ms must not)
    local = datetime.fromtimestamp(stamp / 1000).isoformat(timespec="milliseconds")
    assert parse_timestamp(local, now_ms=0) == stamp


@pytest.mark.parametrize("text", ["-2", "yesterday", "", "2023-13-01"])
def test_what_is_no_timestamp_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp(text, now_ms=0)


def test_properties_and_names() -> None:
    text = "# a comment\n a = 1\nb: two words\n\n!also\nc\n"
    assert parse_properties(text) == {"a": "1", "b": "two words", "c": ""}
    assert config_key("slaveReadEnable") == "slave_read_enable"
    assert config_key("long_polling_max_s") == "long_polling_max_s"
    assert config_key("store.flushDiskType") == "store.flush_disk_type"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("180715", 180715),
        ("-3", -3),
        ("0.25", 0.25),
        ("1e3", 1000.0),
        ("True", True),
        ("true", True),
        ("False", False),
        ("None", None),
        ("null", None),
        ("", ""),
        ("007", "007"),  # not a JSON number: a name, kept as it is
        ("1e999", "1e999"),  # no JSON number holds it
        ("NaN", "NaN"),
        ("127.0.0.1:10911", "127.0.0.1:10911"),
        ("SYNC_MASTER", "SYNC_MASTER"),
        ("[ 0 days, 0 hours ]", "[ 0 days, 0 hours ]"),
    ],
)
def test_runtime_info_values_are_typed_by_their_text(text: str, value: Any) -> None:
    typed = kv_value(text)
    assert typed == value and type(typed) is type(value)


def test_runtime_info_names_in_camel_case() -> None:
    status = BrokerStatus("a:1", {"commitlog_max_offset": "7", "brokerAddr": "a:1", "x_y": "1"})
    assert status.values == {"brokerAddr": "a:1", "commitlogMaxOffset": 7, "xY": 1}
    # a name another key already has keeps its own: nothing is lost
    both = BrokerStatus("a:1", {"max_offset": "1", "maxOffset": "2"}).values
    assert both == {"maxOffset": 2, "max_offset": 1}
    nested = {"master": {"max_offset": 3, "slaves": [{"in_sync": True}]}, "brokerId": 0}
    assert camel_case_keys(nested) == {
        "master": {"maxOffset": 3, "slaves": [{"inSync": True}]},
        "brokerId": 0,
    }


def test_settings_read_back_in_their_types(tmp_path: Path) -> None:
    """typed_settings is flatten's inverse: each setting comes back as the configuration
    holds it (a tuple as a list, an enum as its value), whatever its text looks like."""
    config = build_config(
        {
            "broker_name": "123",
            "namesrv_addrs": ["a:1", "b:2"],
            "metrics_port": 0,
            "store": {"store_dir": str(tmp_path), "role": "SYNC_MASTER"},
        }
    )
    typed = typed_settings(flatten(config))
    assert typed["broker_name"] == "123" and typed["broker_id"] == 0
    assert typed["namesrv_addrs"] == ["a:1", "b:2"] and typed["controller_addrs"] == []
    assert typed["metrics_port"] == 0 and typed["ha_listen_port"] is None
    assert typed["store.role"] == "SYNC_MASTER" and typed["store.store_dir"] == str(tmp_path)
    assert typed["register_interval_s"] == 30.0 and typed["embed_namesrv"] is False
    assert typed["remoting.tls"] is None
    for key, value in typed.items():
        held: Any = config
        for part in key.split("."):
            held = getattr(held, part)
        if isinstance(held, Enum):
            held = held.value
        if isinstance(held, tuple):
            held = list(held)
        if isinstance(held, Path):
            held = str(held)
        assert value == held, key
    # another broker's setting (RocketMQ's, or a newer hamq's) keeps its text
    assert typed_settings({"brokerClusterName": "1"}) == {"brokerClusterName": "1"}


def test_epochs_from_the_ha_status() -> None:
    status = {"broker": "b", "epochs": [[1, 0], [3, 50]], "master": {"max_offset": 80}}
    table = epochs_from_ha_status(status)
    assert table.to_json()["epochs"] == [
        {"epoch": 1, "startOffset": 0, "endOffset": 50},
        {"epoch": 3, "startOffset": 50, "endOffset": 80},
    ]


# ---------------------------------------------------------------- the broker's side


async def send_all(ns: str, topic: str, bodies: list[str]) -> None:
    async with Producer("admin-tools", ns) as producer:
        for body in bodies:
            await producer.send(Message(topic, body, keys=[body]))


@pytest.mark.anyio
async def test_a_running_push_consumer_goes_back_after_a_reset(tmp_path: Path) -> None:
    """Messages stored before the reset time are not delivered again; every one
    stored at or after it is, to the consumer that is running."""
    async with broker_thread(tmp_path) as broker, AdminClient(broker.namesrv) as admin:
        ns = broker.namesrv
        await admin.create_topic("Rewind", 3)
        await send_all(ns, "Rewind", [f"a{i}" for i in range(6)])
        await anyio.sleep(0.005)
        cut_ms = int(time.time() * 1000) + 1
        await anyio.sleep(0.01)
        later = [f"b{i}" for i in range(6)]
        await send_all(ns, "Rewind", later)
        got: list[str] = []
        consumer = PushConsumer("rewinders", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Rewind")

        def handle(messages: list[MessageExt]) -> None:  # (in a worker thread)
            got.extend(m.body.decode() for m in messages)

        async with consumer.consuming(handle):
            await wait_for(lambda: len(got) >= 12, 20, what="all 12 consumed")
            result = await admin.reset_offset("rewinders", "Rewind", cut_ms)
            assert result.notified == 1
            assert sum(result.offsets.values()) == 6  # each queue: after its a-messages
            await wait_for(lambda: len(got) >= 18, 20, what="the b-messages again")
            assert Counter(got) - Counter(f"a{i}" for i in range(6)) - Counter(later) == Counter(
                later
            )
            # (the handler runs in a worker thread: the offsets move once it has returned)
            held = await wait_for(
                lambda: (
                    (offsets := consumer.consume_offsets("Rewind"))
                    and sum(offsets.values()) == 12
                    and offsets
                ),
                10,
                what=lambda: f"offsets back at 12: {consumer.consume_offsets('Rewind')}",
            )
            # and the broker asks it for them (INVOKE_BROKER_TO_GET_CONSUMER_STATUS)
            header = GetConsumerStatusRequestHeader("Rewind", "rewinders")
            asked = RemotingCommand.request(
                RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, header
            )
            status = await invoke(broker.address, asked)
            assert status.code == ResponseCode.SUCCESS, status.remark
            table = decode_body(GetConsumerStatusBody, status.body).consumer_table
            assert table == {consumer.client_id: held}
        # the group's committed offsets went back too, and forward again
        progress = await admin.consumer_progress("rewinders", "Rewind")
        assert progress.total_lag == 0


@pytest.mark.anyio
async def test_reset_without_force_only_moves_back_and_a_slave_refuses(tmp_path: Path) -> None:
    async with broker_thread(tmp_path / "m") as broker, AdminClient(broker.namesrv) as admin:
        ns = broker.namesrv
        await admin.create_topic("Fwd", 1)
        await send_all(ns, "Fwd", ["x", "y", "z"])
        async with PullConsumer("fwd", ns) as consumer:
            queue = (await consumer.queues("Fwd"))[0]
            await consumer.commit_offset(queue, 1)
            # to the end without force: not forward
            kept = await admin.reset_offset("fwd", "Fwd", -1, force=False)
            assert kept.offsets == {queue: 1} and kept.notified == 0
            assert await consumer.committed_offset(queue) == 1
            moved = await admin.reset_offset("fwd", "Fwd", -1)
            assert moved.offsets == {queue: 3}
            assert await consumer.committed_offset(queue) == 3
            back = await admin.reset_offset("fwd", "Fwd", 0, force=False)
            assert back.offsets == {queue: 0}
        header = ResetOffsetRequestHeader("Fwd", "fwd", 0, is_force=True, queue_id=0, offset=2)
        reset = RemotingCommand.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header)
        one = await invoke(broker.address, reset)
        assert one.code == ResponseCode.SUCCESS, one.remark
        assert decode_body(ResetOffsetBody, one.body).offset_table == {queue: 2}
    async with broker_thread(tmp_path / "s", broker_id=1, store={"role": "SLAVE"}) as slave:
        refused = await invoke(slave.address, reset)
    assert (refused.code, refused.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "Can not reset offset in slave broker",
    )


@pytest.mark.anyio
async def test_live_settings_change_and_the_others_are_refused_by_name(tmp_path: Path) -> None:
    async with broker_thread(tmp_path) as broker, AdminClient(broker.namesrv) as admin:
        before = await admin.broker_config(broker.address)
        assert before.values["listen_port"] == "0" and "listen_port" not in before.live_keys
        await admin.update_broker_config(
            broker.address, {"long_polling_max_s": "5", "rebalanceLockMaxLiveS": "7.5"}
        )
        live = await broker.call(
            lambda n: (n.ctx.config.long_polling_max_s, n.ctx.locks.max_live_ms)
        )
        assert live == (5.0, 7500)  # (and the lock manager was told)
        after = await admin.broker_config(broker.address)
        assert after.values["long_polling_max_s"] == "5.0"
        assert json.loads(after.version)["counter"] == json.loads(before.version)["counter"] + 1
        for changes, problem in (
            ({"listen_port": "1"}, "listen_port cannot change while the broker runs"),
            ({"long_polling_max_s": '"5"'}, "must be a number, not the string '5'"),
            ({"slave_read_enable": "1"}, "must be true or false, not the integer 1"),
            ({"long_polling_max_s": "0"}, "must be > 0.0"),
            ({"no_such_key": "1"}, "no_such_key: no such setting"),
        ):
            with pytest.raises(ValueError, match=re.escape(problem)):
                await admin.update_broker_config(
                    broker.address, {"register_timeout_s": "9", **changes}
                )
        register_s = await broker.call(lambda n: n.ctx.config.register_timeout_s)
        assert register_s != 9.0  # all or nothing


# ---------------------------------------------------------------- the commands


@attrs.frozen
class Pair:
    """A SYNC_MASTER and its SLAVE (broker-a) and their nameserver, with data: topic
    ADMIN_TOPIC holds KEYED messages plus one long one; group PROGRESS_GROUP committed
    COMMITTED of them."""

    namesrv: str
    master: str
    slave: str


ADMIN_TOPIC = "AdminT"
KEYED = 20
LONG_BODY = "L" * 600
PROGRESS_GROUP = "admin-progress"
COMMITTED = {0: 2, 1: 3}


@contextlib.contextmanager
def server(*args: str) -> Iterator[str]:
    """``hamq <args>`` (a server) until the block ends; its ready line."""
    proc = subprocess.Popen([*HAMQ, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # (it exits, ending the line, if it cannot start)
        assert " ready: " in line, f"hamq {' '.join(args)}: no ready line: {line!r}"
        yield line.strip()
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def _prepare(pair: Pair) -> None:
    # the slave is in sync: a SYNC_MASTER's sends wait for it
    await wait_for(lambda: first_slave_in_sync(pair.master), 60, every_s=0.05)
    with anyio.fail_after(60):
        async with AdminClient(pair.namesrv) as admin:
            await admin.create_topic(ADMIN_TOPIC, 4)
        async with Producer("admin-tools", pair.namesrv) as producer:
            for i in range(KEYED):
                await producer.send(Message(ADMIN_TOPIC, f"m{i}", keys=[f"k{i}"], tags="t"))
            await producer.send(Message(ADMIN_TOPIC, LONG_BODY, keys=["long"]))
        async with PullConsumer(PROGRESS_GROUP, pair.namesrv) as consumer:
            for queue in await consumer.queues(ADMIN_TOPIC):
                if queue.queue_id in COMMITTED:
                    await consumer.commit_offset(queue, COMMITTED[queue.queue_id])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("admin-tools")
    with server("nameserver", "--port", "0") as ns_line:
        ns = ns_line.rsplit(" ", 1)[1]
        configs = [
            write_toml(
                tmp / f"{name}.toml",
                {
                    "broker_name": "broker-a",
                    "broker_id": broker_id,
                    "listen_port": 0,
                    "namesrv_addrs": [ns],
                    "store": {"store_dir": str(tmp / name), "role": role, **SMALL_STORE},
                },
            )
            for name, broker_id, role in (("master", 0, "SYNC_MASTER"), ("slave", 1, "SLAVE"))
        ]
        with (
            server("broker", "-c", str(configs[0])) as m,
            server("broker", "-c", str(configs[1])) as s,
        ):
            found = Pair(ns, broker_addr(m), broker_addr(s))
            trio.run(_prepare, found)
            yield found


async def hamq_json(pair: Pair, *args: str) -> Any:
    """``hamq <args> --json -n <nameserver>``: its JSON (the command must succeed)."""
    done = await hamq_command(*args, "--json", "-n", pair.namesrv)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b"", done.stderr.decode()
    return json.loads(done.stdout)


async def hamq_fails(pair: Pair, *args: str) -> tuple[int, str]:
    done = await hamq_command(*args, "-n", pair.namesrv)
    err = done.stderr.decode()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return done.returncode, err.strip()


@pytest.mark.slow
async def test_topic_list_json(pair: Pair) -> None:
    answer = await hamq_json(pair, "topic", "list")
    assert ADMIN_TOPIC in answer["topics"] and answer["topics"] == sorted(answer["topics"])


@pytest.mark.slow
async def test_topic_route_json(pair: Pair) -> None:
    answer = await hamq_json(pair, "topic", "route", ADMIN_TOPIC)
    assert answer["topic"] == ADMIN_TOPIC
    (queues,) = answer["queueDatas"]
    assert (queues["brokerName"], queues["readQueueNums"], queues["perm"]) == ("broker-a", 4, 6)
    (broker,) = answer["brokerDatas"]
    assert broker["brokerAddrs"] == {"0": pair.master, "1": pair.slave}


@pytest.mark.slow
async def test_topic_status_json_comes_from_topic_stats(pair: Pair) -> None:
    answer = await hamq_json(pair, "topic", "status", ADMIN_TOPIC)
    queues = answer["queues"]
    assert [q["queueId"] for q in queues] == [0, 1, 2, 3]
    assert answer["totalMessages"] == KEYED + 1 == sum(q["maxOffset"] for q in queues)
    assert all(q["minOffset"] == 0 and q["messages"] == q["maxOffset"] for q in queues)
    assert all(q["lastUpdateTimestamp"] > 1_600_000_000_000 for q in queues)
    text = await hamq_command("topic", "status", ADMIN_TOPIC, "-n", pair.namesrv)
    assert f"{ADMIN_TOPIC}@broker-a:0".encode() in text.stdout
    assert f"{KEYED + 1} message(s) in 4 queue(s)".encode() in text.stdout


@pytest.mark.slow
async def test_topic_create_and_delete_json(pair: Pair) -> None:
    made = await hamq_json(pair, "topic", "create", "AdminMade", "--queues", "2")
    assert made == {"topic": "AdminMade", "queues": 2, "perm": "RW", "brokers": [pair.master]}
    gone = await hamq_json(pair, "topic", "delete", "AdminMade")
    assert gone == {"topic": "AdminMade", "brokers": [pair.master]}


@pytest.mark.slow
async def test_admin_cluster_json(pair: Pair) -> None:
    answer = await hamq_json(pair, "admin", "cluster")
    assert answer["clusters"] == {"DefaultCluster": ["broker-a"]}
    assert answer["brokers"] == [
        {
            "cluster": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": 0,
            "address": pair.master,
        },
        {
            "cluster": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": 1,
            "address": pair.slave,
        },
    ]


@pytest.mark.slow
async def test_ha_status_json(pair: Pair) -> None:
    answer = await hamq_json(pair, "admin", "ha-status")
    by_address = {b["address"]: b for b in answer["brokers"]}
    assert by_address[pair.master]["role"] == "SYNC_MASTER"
    assert by_address[pair.master]["master"]["slaves"][0]["inSync"] is True
    assert isinstance(by_address[pair.master]["master"]["maxOffset"], int)
    assert by_address[pair.slave]["role"] == "SLAVE"
    assert by_address[pair.slave]["slave"]["masterAddress"]


#: text that JSON would hold as a number, a boolean or null (Java's or Python's spelling)
_TYPED_TEXT = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null|True|False|None")


@pytest.mark.slow
async def test_broker_status_json_every_broker_or_one(pair: Pair) -> None:
    """Issue 30: every value was a string ("180715", "True", "None") under snake_case
    and camelCase names alike. Now numbers, booleans and null are typed, and every name
    is camelCase."""
    answer = await hamq_json(pair, "admin", "broker-status")
    tables = {b["address"]: b["table"] for b in answer["brokers"]}
    assert set(tables) == {pair.master, pair.slave}
    master = tables[pair.master]
    assert master["role"] == "SYNC_MASTER"
    assert tables[pair.slave]["brokerAddr"] == pair.slave
    assert master["messagesIn"] >= KEYED + 1  # what _prepare sent
    assert master["running"] is True and master["dispatchFailure"] is None
    assert master["commitlogMaxOffset"] == master["flushedOffset"] > 0
    for table in tables.values():
        assert list(table) == sorted(table)
        assert [k for k in table if not CAMEL_CASE.fullmatch(k)] == []
        as_text = {k: v for k, v in table.items() if isinstance(v, str)}
        assert [k for k, v in as_text.items() if _TYPED_TEXT.fullmatch(v)] == [], as_text
    one = await hamq_json(pair, "admin", "broker-status", "--broker", pair.slave)
    assert [b["address"] for b in one["brokers"]] == [pair.slave]


@pytest.mark.slow
async def test_broker_config_and_update_json(pair: Pair) -> None:
    """Each setting in its type (the configuration file's): numbers, booleans, lists,
    null for one not set; names as the configuration file spells them."""
    answer = await hamq_json(pair, "admin", "broker-config", "--broker", pair.master)
    assert answer["address"] == pair.master
    config = answer["config"]
    assert config["broker_name"] == "broker-a"
    assert config["store.role"] == "SYNC_MASTER"
    assert (config["broker_id"], config["listen_port"]) == (0, 0)
    assert config["slave_read_enable"] is False and config["store.check_crc_on_read"] is True
    assert config["long_polling_max_s"] == 30.0 and config["ha_listen_port"] is None
    assert config["namesrv_addrs"] == [pair.namesrv] and config["controller_addrs"] == []
    assert "long_polling_max_s" in answer["liveKeys"] and "listen_port" not in answer["liveKeys"]
    assert set(answer["version"]) >= {"counter", "timestamp"}
    changed = await hamq_json(
        pair, "admin", "update-broker-config", "--broker", pair.master, "long_polling_max_s=20"
    )
    assert changed == {"address": pair.master, "updated": {"long_polling_max_s": 20.0}}
    again = await hamq_json(pair, "admin", "broker-config", "--broker", pair.master)
    assert again["config"]["long_polling_max_s"] == 20.0
    assert again["version"]["counter"] == answer["version"]["counter"] + 1


#: a field's name in the JSON outputs (README, "--json")
CAMEL_CASE = re.compile(r"[a-z][a-zA-Z0-9]*")
#: the objects whose keys are names (of settings, clusters, broker ids, properties,
#: broker groups), not fields: their keys are the names as they are
NAME_KEYED = frozenset(
    {"config", "updated", "clusters", "brokerAddrs", "properties", "replicasInfoTable"}
)


def field_names(value: Any) -> Iterator[str]:
    """Every key of ``value``'s objects that names a field (NAME_KEYED's keys skipped,
    their values' looked into)."""
    if isinstance(value, list):
        for item in value:
            yield from field_names(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            inner = item.values() if key in NAME_KEYED and isinstance(item, dict) else [item]
            for each in inner:
                yield from field_names(each)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["admin", "ha-status"],
        ["admin", "broker-status"],
        ["admin", "broker-config", "--broker", "MASTER"],
        ["admin", "cluster"],
        ["admin", "groups"],
        ["admin", "consumer-progress", "--group", PROGRESS_GROUP],
        ["admin", "query-message", "--topic", ADMIN_TOPIC, "--key", "k3"],
        ["topic", "route", ADMIN_TOPIC],
        ["topic", "status", ADMIN_TOPIC],
    ],
    ids=lambda command: " ".join(command[:2]),
)
async def test_json_outputs_name_every_field_in_camel_case(pair: Pair, command: list[str]) -> None:
    """Issue 30: ha-status mixed brokerId with max_offset and master_address, and
    broker-status commitlog_max_offset with brokerAddr: one key style, camelCase."""
    answer = await hamq_json(pair, *[pair.master if a == "MASTER" else a for a in command])
    names = set(field_names(answer))
    assert names and sorted(n for n in names if not CAMEL_CASE.fullmatch(n)) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ("listen_port=1", "listen_port cannot change while the broker runs"),
        ("long_polling_max_s=abc", "long_polling_max_s=abc: must be a number, not the string"),
        ("store.role=SLAVE", "store.role cannot change while the broker runs"),
        ("nonsense", "'nonsense' is not KEY=VALUE"),
        ("long_polling_max_s=" + "[" * 5000, "must be a number, not the string"),
    ],
    ids=["listen_port", "not-a-number", "role", "not-key-value", "nested-5000-deep"],
)
async def test_update_broker_config_refuses_by_name(pair: Pair, setting: str, problem: str) -> None:
    code, line = await hamq_fails(
        pair, "admin", "update-broker-config", "--broker", pair.master, setting
    )
    assert code == 2 and problem in line, line


@pytest.mark.slow
async def test_consumer_progress_json_per_queue(pair: Pair) -> None:
    answer = await hamq_json(pair, "admin", "consumer-progress", "--group", PROGRESS_GROUP)
    queues = {q["queueId"]: q for q in answer["queues"] if q["topic"] == ADMIN_TOPIC}
    assert answer["group"] == PROGRESS_GROUP
    assert {i: q["consumerOffset"] for i, q in queues.items()} == {0: 2, 1: 3, 2: 0, 3: 0}
    for q in queues.values():
        assert q["lag"] == q["brokerOffset"] - q["consumerOffset"]
        assert q["brokerName"] == "broker-a"
        # the store time of the last message consumed; none consumed: 0
        assert (q["lastTimestamp"] > 1_600_000_000_000) == (q["consumerOffset"] > 0)
    assert answer["totalLag"] == KEYED + 1 - sum(COMMITTED.values())
    only = await hamq_json(
        pair, "admin", "consumer-progress", "--group", PROGRESS_GROUP, "--topic", ADMIN_TOPIC
    )
    assert only["totalLag"] == answer["totalLag"]
    none = await hamq_json(pair, "admin", "consumer-progress", "--group", "nobody-here")
    assert none == {"group": "nobody-here", "queues": [], "totalLag": 0, "consumeTps": 0.0}


@pytest.fixture
def run_tag(request: pytest.FixtureRequest) -> str:
    """Which backend's run of a test this is ("trio", "asyncio", "uvloop"): its topics
    and groups are named by it, since the runs share the module's brokers (a group
    that consumed in an earlier run would start from its committed offsets)."""
    return str(request.node.callspec.id)


@pytest.mark.anyio
@pytest.mark.slow
async def test_groups_consumer_connection_and_progress_json_with_a_member(
    pair: Pair, run_tag: str
) -> None:
    group = f"admin-online-{run_tag}"
    consumer = PushConsumer(group, pair.namesrv, consume_from="FIRST_OFFSET")
    consumer.subscribe(ADMIN_TOPIC, "t")
    got: list[str] = []  # (the handler is sync: it runs in a worker thread)
    async with consumer.consuming(lambda ms: got.extend(m.body.decode() for m in ms)):
        await wait_for(lambda: len(got) >= KEYED, 20, what="the tagged messages")
        answer = await hamq_json(pair, "admin", "consumer-connection", "--group", group)
        assert answer["group"] == group
        assert (answer["consumeType"], answer["messageModel"]) == (
            "CONSUME_PASSIVELY",
            "CLUSTERING",
        )
        assert answer["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
        (member,) = answer["members"]
        assert member["clientId"] == consumer.client_id
        assert member["language"] == "PYTHON" and member["version"] > 0
        assert member["clientAddr"].startswith("127.0.0.1:")
        assert sorted(member["brokers"]) == sorted([pair.master, pair.slave])
        assert {"topic": ADMIN_TOPIC, "expression": "t"} in [
            {k: s[k] for k in ("topic", "expression")} for s in answer["subscriptions"]
        ]
        groups = {g["group"]: g for g in (await hamq_json(pair, "admin", "groups"))["groups"]}
        assert groups[group]["members"] == 1
        assert ADMIN_TOPIC in groups[group]["topics"]
        assert groups[PROGRESS_GROUP]["members"] == 0  # known by its offsets
        every = await hamq_json(pair, "admin", "consumer-progress")
        totals = {g["group"]: g for g in every["groups"]}
        assert totals[PROGRESS_GROUP]["totalLag"] == KEYED + 1 - sum(COMMITTED.values())
        assert set(totals[PROGRESS_GROUP]) == {
            "group",
            "members",
            "consumeType",
            "messageModel",
            "topics",
            "totalLag",
            "consumeTps",
        }
    code, line = await hamq_fails(pair, "admin", "consumer-connection", "--group", "nobody-here")
    assert code == 1 and line == "error: group nobody-here has no consumer online"


@pytest.mark.anyio
@pytest.mark.slow
async def test_reset_offset_json_sends_a_running_consumer_back(pair: Pair, run_tag: str) -> None:
    topic, group = f"AdminRewind-{run_tag}", f"admin-rewind-{run_tag}"
    async with AdminClient(pair.namesrv) as admin:
        await admin.create_topic(topic, 2)
    await send_all(pair.namesrv, topic, [f"a{i}" for i in range(4)])
    await anyio.sleep(0.005)
    cut_ms = int(time.time() * 1000) + 1
    await anyio.sleep(0.01)
    later = [f"b{i}" for i in range(4)]
    await send_all(pair.namesrv, topic, later)
    consumer = PushConsumer(group, pair.namesrv, consume_from="FIRST_OFFSET")
    consumer.subscribe(topic)
    got: list[str] = []  # (the handler is sync: it runs in a worker thread)
    async with consumer.consuming(lambda ms: got.extend(m.body.decode() for m in ms)):
        await wait_for(lambda: len(got) >= 8, 20, what="all 8")
        local = datetime.fromtimestamp(cut_ms / 1000).isoformat(timespec="milliseconds")
        answer = await hamq_json(
            pair,
            "admin",
            "reset-offset",
            "--group",
            group,
            "--topic",
            topic,
            "--timestamp",
            local,
        )
        assert (answer["group"], answer["topic"], answer["timestamp"]) == (group, topic, cut_ms)
        assert answer["notifiedClients"] == 1  # the master told it (the slave resets nothing)
        assert [q["queueId"] for q in answer["queues"]] == [0, 1]
        assert sum(q["offset"] for q in answer["queues"]) == 4
        await wait_for(lambda: len(got) >= 12, 20, what="the b-messages again")
        assert Counter(got) == Counter([f"a{i}" for i in range(4)] + later * 2)
    # a timestamp that is none is bad input
    code, line = await hamq_fails(
        pair, "admin", "reset-offset", "-g", "g", "-t", topic, "--timestamp", "soon"
    )
    assert code == 2 and "--timestamp 'soon'" in line


@pytest.mark.slow
async def test_query_message_json_by_key_and_by_either_id(pair: Pair) -> None:
    answer = await hamq_json(pair, "admin", "query-message", "--topic", ADMIN_TOPIC, "--key", "k7")
    (message,) = answer["messages"]
    assert (message["topic"], message["body"], message["keys"], message["tags"]) == (
        ADMIN_TOPIC,
        "m7",
        ["k7"],
        "t",
    )
    assert message["brokerName"] == "broker-a" and message["storeHost"] == pair.master
    assert message["storeTimestamp"] >= message["bornTimestamp"] > 0
    assert message["properties"]["UNIQ_KEY"] == message["msgId"]
    assert set(message) >= {"queueId", "queueOffset", "commitLogOffset", "offsetMsgId", "bornHost"}
    for msg_id in (message["msgId"], message["offsetMsgId"]):
        found = await hamq_json(pair, "admin", "query-message", "--id", msg_id)
        assert [m["queueOffset"] for m in found["messages"]] == [message["queueOffset"]]
        assert found["messages"][0]["body"] == "m7"
    long = await hamq_json(pair, "admin", "query-message", "-t", ADMIN_TOPIC, "-k", "long")
    assert long["messages"][0]["bodyTruncated"] is True
    assert long["messages"][0]["body"] == LONG_BODY[:512] and long["messages"][0]["bodySize"] == 600
    full = await hamq_json(
        pair, "admin", "query-message", "-t", ADMIN_TOPIC, "-k", "long", "--body-full"
    )
    assert full["messages"][0]["body"] == LONG_BODY
    text = await hamq_command(
        "admin", "query-message", "--id", message["msgId"], "-n", pair.namesrv
    )
    assert text.returncode == 0 and b"m7" in text.stdout and b"store time" in text.stdout
    code, line = await hamq_fails(pair, "admin", "query-message", "--id", "00FF")
    assert code == 1 and "no message with id 00FF" in line
    code, line = await hamq_fails(pair, "admin", "query-message", "-t", ADMIN_TOPIC, "-k", "none")
    assert code == 1 and line == f"error: no message of {ADMIN_TOPIC} has the key none"


@pytest.mark.slow
async def test_broker_epoch_json(pair: Pair) -> None:
    done = await hamq_command("admin", "broker-epoch", "--broker", pair.master, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["address"], answer["brokerName"], answer["role"]) == (
        pair.master,
        "broker-a",
        "SYNC_MASTER",
    )
    assert answer["epochs"][0]["startOffset"] == 0
    assert answer["epochs"][-1]["endOffset"] == answer["maxOffset"] > 0


@pytest.mark.slow
async def test_controller_commands_json(tmp_path: Path) -> None:
    """sync-state-set, elect-master and broker-epoch with --json, against a nameserver
    that embeds a controller and two brokers in controller mode."""
    port, raft_port = free_ports(2)
    controller = f"127.0.0.1:{port}"
    args = ["nameserver", "--port", str(port), "--controller"]
    args += ["--raft-address", f"127.0.0.1:{raft_port}", "--controller-dir", str(tmp_path / "c")]
    async with hamq_server(*args):
        configs = [
            write_toml(
                tmp_path / f"b{i}.toml",
                {
                    "broker_name": "broker-j",
                    "listen_port": 0,
                    "namesrv_addrs": [controller],
                    "enable_controller_mode": True,
                    "controller_addrs": [controller],
                    "store": {"store_dir": str(tmp_path / f"b{i}"), **SMALL_STORE},
                },
            )
            for i in (1, 2)
        ]
        async with (
            hamq_server("broker", "-c", str(configs[0])),
            hamq_server("broker", "-c", str(configs[1])),
        ):
            group = await sync_state_when(
                controller, "broker-j", lambda g: len(g.get("inSyncReplicas") or []) >= 2, 60
            )
            master, epoch = group["masterBrokerId"], group["masterEpoch"]
            (other,) = {r["brokerId"] for r in group["inSyncReplicas"]} - {master}
            done = await hamq_command(
                "admin", "elect-master", "--controller", controller, "--broker", "broker-j",
                "--broker-id", str(other), "--json",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            answer = json.loads(done.stdout)
            assert (answer["brokerName"], answer["masterBrokerId"]) == ("broker-j", other)
            assert answer["masterEpoch"] == epoch + 1 and answer["controller"] == controller
            assert other in answer["syncStateSet"]
            assert set(answer) == {
                "controller", "brokerName", "masterBrokerId", "masterAddress", "masterEpoch",
                "syncStateSet", "syncStateSetEpoch", "elected",
            }  # fmt: skip
            assert answer["elected"] is True
            # the master it is already: a success that says so, nothing changed
            again = await hamq_command(
                "admin", "elect-master", "--controller", controller, "--broker", "broker-j",
                "--broker-id", str(other), "--json",
            )  # fmt: skip
            assert again.returncode == 0, again.stderr
            kept = json.loads(again.stdout)
            same = ("brokerName", "masterBrokerId", "masterAddress", "masterEpoch")
            assert [kept[k] for k in same] == [answer[k] for k in same], kept
            assert kept["elected"] is False and set(kept) == set(answer), kept
            done = await hamq_command(
                "admin", "broker-epoch", "--broker", answer["masterAddress"], "--json"
            )
            assert done.returncode == 0, done.stderr
            epochs = json.loads(done.stdout)
            assert epochs["brokerName"] == "broker-j"
            assert [e["epoch"] for e in epochs["epochs"]][-1] == epoch + 1
