"""The broker over the wire: sends, pulls, long polling, offsets, registration, refusals.

Brokers run in this process on loopback (tests/support/brokers.py); requests are raw
RemotingCommands as RocketMQ clients send them.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from hamq.broker import ConfigError, build_config, load_config
from hamq.broker.clients import ClientChannel, ConsumerManager
from hamq.broker.registration import NAMESRV_CHECK_S, REGISTER_RETRY_MAX_S, Registrar
from hamq.broker.topics import TopicConfigManager
from hamq.protocol import LanguageCode, RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import (
    PERM_READ,
    ConsumerData,
    ConsumerListBody,
    HeartbeatData,
    SubscriptionData,
    TopicConfigSerializeWrapper,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryDataVersionResponseHeader,
    QueryMessageRequestHeader,
    RegisterBrokerResponseHeader,
    SendMessageResponseHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from hamq.protocol.message import (
    BatchEntry,
    decode_properties,
    encode_batch,
    encode_properties,
    parse_offset_msg_id,
)
from hamq.protocol.record import decode_message, decode_messages, read_record
from hamq.remoting import Connection, Dispatcher, RemotingClient
from hamq.remoting.errors import RemotingConnectError
from tests.support.brokers import (
    create_topic_request,
    pull_request,
    running_broker,
    running_nameserver,
    send_request,
)
from tests.support.timing import wait_for

TIMEOUT_S = 5.0


async def test_send_pull_query_and_view_over_the_wire(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        addr = node.address
        sent = []
        for i in range(3):
            response = await client.invoke(
                addr, send_request("T", f"m{i}".encode(), queue_id=1, KEYS=f"k{i}", TAGS="a"), 5
            )
            assert response.code == ResponseCode.SUCCESS, response.remark
            sent.append(response.header(SendMessageResponseHeader))
        assert [s.queue_offset for s in sent] == [0, 1, 2]
        assert all(s.queue_id == 1 for s in sent)
        await node.store.wait_dispatched()

        pulled = await client.invoke(addr, pull_request("T", 1, 0), 5)
        assert pulled.code == ResponseCode.SUCCESS and pulled.remark == "FOUND"
        answer = pulled.header(PullMessageResponseHeader)
        assert (answer.next_begin_offset, answer.min_offset, answer.max_offset) == (3, 0, 3)
        messages = decode_messages(pulled.body)
        assert [m.body for m in messages] == [b"m0", b"m1", b"m2"]
        assert messages[0].store_host == addr  # send-back goes there
        assert messages[0].properties["CLUSTER"] == "DefaultCluster"
        assert messages[0].properties["UNIQ_KEY"]  # the broker added one

        caught_up = await client.invoke(addr, pull_request("T", 1, 3), 5)
        assert (caught_up.code, caught_up.remark) == (
            ResponseCode.PULL_NOT_FOUND,
            "OFFSET_OVERFLOW_ONE",
        )
        moved = await client.invoke(addr, pull_request("T", 1, 99), 5)
        assert moved.code == ResponseCode.PULL_OFFSET_MOVED
        filtered = await client.invoke(addr, pull_request("T", 1, 0, subscription="b"), 5)
        assert filtered.code == ResponseCode.PULL_RETRY_IMMEDIATELY

        query = RemotingCommand.request(
            RequestCode.QUERY_MESSAGE,
            QueryMessageRequestHeader(
                topic="T", key="k1", max_num=32, begin_timestamp=0, end_timestamp=2**62
            ),
        )
        found = await client.invoke(addr, query, 5)
        assert found.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(found.body)] == [b"m1"]

        listed = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 5
        )
        table = decode_body(TopicConfigSerializeWrapper, listed.body).topic_config_table
        assert {"T", "TBW102", "SCHEDULE_TOPIC_XXXX"} <= set(table)

        _host, offset = parse_offset_msg_id(sent[2].msg_id)
        viewed = await client.invoke(
            addr,
            RemotingCommand.request(
                RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset)
            ),
            5,
        )
        assert decode_message(viewed.body).body == b"m2"


@pytest.mark.parametrize(
    ("topic", "queue_id", "body", "properties", "code", "remark"),
    [
        ("bad topic!", 0, b"x", {}, ResponseCode.SYSTEM_ERROR, "may only contain letters"),
        (
            "TBW102",
            0,
            b"x",
            {},
            ResponseCode.SYSTEM_ERROR,
            "Sending message to topic[TBW102] is forbidden",
        ),
        ("T", 99, b"x", {}, ResponseCode.SYSTEM_ERROR, "request queueId[99] is illegal"),
        ("T", 0, b"x" * 70_000, {}, ResponseCode.MESSAGE_ILLEGAL, "over max_message_bytes 65536"),
        ("T", 0, b"x", {"DELAY": "soon"}, ResponseCode.MESSAGE_ILLEGAL, "DELAY property 'soon'"),
        (
            "RO",
            0,
            b"x",
            {},
            ResponseCode.NO_PERMISSION,
            "the topic[RO] sending message is forbidden",
        ),
        ("Nope", 0, b"x", {}, ResponseCode.TOPIC_NOT_EXIST, "topic[Nope] not exist"),
    ],
)
async def test_bad_sends_get_named_refusals(
    tmp_path: Path,
    topic: str,
    queue_id: int,
    body: bytes,
    properties: dict[str, str],
    code: int,
    remark: str,
) -> None:
    async with (
        running_broker(
            tmp_path, auto_create_topic_enable=False, store={"max_message_bytes": 65536}
        ) as node,
        RemotingClient() as client,
    ):
        for name, perm in (("T", 6), ("RO", PERM_READ)):
            created = await client.invoke(node.address, create_topic_request(name, 4, perm), 5)
            assert created.code == ResponseCode.SUCCESS
        response = await client.invoke(
            node.address, send_request(topic, body, queue_id=queue_id, **properties), 5
        )
        assert response.code == code
        assert remark in (response.remark or "")
        assert node.store.commitlog_max_offset == 0  # nothing was stored


async def test_topics_auto_create_from_tbw102_and_reach_the_nameserver(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path, default_topic_queue_nums=8) as node,
        RemotingClient() as client,
    ):
        response = await client.invoke(node.address, send_request("NewTopic", queue_id=2), 5)
        assert response.code == ResponseCode.SUCCESS
        config = node.ctx.topics.get("NewTopic")
        assert config is not None and config.write_queue_nums == 4  # min(4 asked, 8)
        # registered again at once: the embedded nameserver routes it
        assert node.nameserver is not None
        table = node.nameserver.table
        await wait_for(lambda: table.route("NewTopic") is not None)


async def test_a_long_polling_pull_is_answered_when_a_message_arrives(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        await client.invoke(node.address, create_topic_request("T"), 5)
        answer: list[RemotingCommand] = []

        async def pull() -> None:
            answer.append(
                await client.invoke(node.address, pull_request("T", 2, suspend_ms=30_000), 40)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull)
            await wait_for(lambda: node.statistics().held_pulls == 1)
            await client.invoke(node.address, send_request("T", b"wake up", queue_id=2), 5)
            # answered long before the 30 s hold ends, with the message
            with trio.fail_after(10):
                await wait_for(lambda: bool(answer))
        assert answer[0].code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(answer[0].body)] == [b"wake up"]
        # a hold that sees nothing is answered PULL_NOT_FOUND when it ends
        empty = await client.invoke(node.address, pull_request("T", 3, suspend_ms=200), 5)
        assert empty.code == ResponseCode.PULL_NOT_FOUND


async def test_offsets_commit_query_and_survive_a_restart(tmp_path: Path) -> None:
    query = RemotingCommand.request(
        RequestCode.QUERY_CONSUMER_OFFSET,
        QueryConsumerOffsetRequestHeader("G", "T", 1, set_zero_if_not_found=False),
    )
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        for i in range(5):
            await client.invoke(node.address, send_request("T", f"m{i}".encode(), queue_id=1), 5)
        never = await client.invoke(node.address, query, 5)
        assert never.code == ResponseCode.QUERY_NOT_FOUND
        commit = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader("G", "T", 1, 3)
        )
        assert (await client.invoke(node.address, commit, 5)).code == ResponseCode.SUCCESS
        # a pull with the commit flag commits as well
        await client.invoke(
            node.address, pull_request("T", 1, 4, group="G2", commit_offset=4, sys_flag=0x5), 5
        )
    saved = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["T@G"] == {"1": 3}
    topics = decode_body(
        TopicConfigSerializeWrapper, (tmp_path / "config" / "topics.json").read_bytes()
    )
    assert "T" in topics.topic_config_table

    async with running_broker(tmp_path) as node, RemotingClient() as client:
        restored = await client.invoke(node.address, query, 5)
        assert restored.code == ResponseCode.SUCCESS and restored.ext_fields["offset"] == "3"
        pulled = await client.invoke(node.address, pull_request("T", 1, 3), 5)
        assert [m.body for m in decode_messages(pulled.body)] == [b"m3", b"m4"]
        assert node.ctx.offsets.query("G2", "T", 1) == 4


async def test_registers_with_every_nameserver_and_again_on_a_topic_change(tmp_path: Path) -> None:
    async with (
        running_nameserver() as (first, first_addr),
        running_nameserver() as (second, second_addr),
    ):
        async with running_broker(tmp_path, namesrv_addrs=[first_addr, second_addr]) as node:
            assert node.nameserver is None  # none embedded
            for server in (first, second):
                assert server.table.route("TBW102") is not None
            async with RemotingClient() as client:
                await client.invoke(node.address, create_topic_request("Fresh"), 5)
            # re-registered at once, not after 30 s
            with trio.fail_after(5):
                await wait_for(
                    lambda: all(s.table.route("Fresh") is not None for s in (first, second))
                )
        # a clean stop unregisters from both
        for server in (first, second):
            assert server.table.route("TBW102") is None


class _Notifications:
    def __init__(self) -> None:
        self.groups: list[str] = []
        self.dispatcher = Dispatcher()
        self.dispatcher.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self.notified)

    def notified(self, request: RemotingCommand, conn: Connection) -> None:
        self.groups.append(request.ext_fields["consumerGroup"])


def heartbeat(client_id: str, group: str) -> RemotingCommand:
    data = HeartbeatData(
        client_id,
        consumer_data_set=[ConsumerData(group, subscription_data_set=[SubscriptionData("T")])],
    )
    return RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(data))


async def test_group_members_are_listed_and_told_when_the_group_changes(tmp_path: Path) -> None:
    first, second = _Notifications(), _Notifications()
    listing = RemotingCommand.request(
        RequestCode.GET_CONSUMER_LIST_BY_GROUP, GetConsumerListByGroupRequestHeader("G")
    )
    async with (
        running_broker(tmp_path) as node,
        RemotingClient(dispatcher=first.dispatcher) as one,
        RemotingClient(dispatcher=second.dispatcher) as two,
    ):
        assert (await one.invoke(node.address, heartbeat("c1", "G"), 5)).code == 0
        assert (await two.invoke(node.address, heartbeat("c2", "G"), 5)).code == 0
        await wait_for(lambda: first.groups.count("G") >= 2)  # itself, then c2 joining
        members = await one.invoke(node.address, listing, 5)
        assert decode_body(ConsumerListBody, members.body).consumer_id_list == ["c1", "c2"]
        assert node.ctx.topics.get("%RETRY%G") is not None  # made at the first heartbeat

        seen = len(first.groups)
        bye = RemotingCommand.request(
            RequestCode.UNREGISTER_CLIENT, UnregisterClientRequestHeader("c2", "", "G")
        )
        assert (await two.invoke(node.address, bye, 5)).code == 0
        await wait_for(lambda: len(first.groups) > seen)
        members = await one.invoke(node.address, listing, 5)
        assert decode_body(ConsumerListBody, members.body).consumer_id_list == ["c1"]

        one.close_connection(node.address)  # a closed connection leaves at once
        await wait_for(lambda: node.ctx.consumers.client_ids("G") == [])
        empty = await two.invoke(node.address, listing, 5)
        assert empty.code == ResponseCode.SYSTEM_ERROR
        assert "no consumer for this group" in (empty.remark or "")


def test_silent_consumers_expire_after_the_channel_timeout() -> None:
    changed: list[str] = []
    manager = ConsumerManager()
    manager.on_change.append(changed.append)

    class FakeConnection:
        closed_with: str | None = None

        def close(self, reason: str) -> None:
            self.closed_with = reason

    conn = FakeConnection()
    channel = ClientChannel("c1", conn, LanguageCode.PYTHON, 1, last_update_ms=1000)  # type: ignore[arg-type]
    manager.register(ConsumerData("G"), channel)
    manager.scan_expired(now_ms=1000 + 120_000, timeout_ms=120_000)
    assert manager.client_ids("G") == ["c1"]  # exactly 120 s: still in
    manager.scan_expired(now_ms=1000 + 120_001, timeout_ms=120_000)
    assert manager.client_ids("G") == []
    assert conn.closed_with == "client channel expired"
    assert changed == ["G"]  # joined; the last member leaving ends the group quietly


async def test_a_silent_broker_is_dropped_by_its_nameserver(tmp_path: Path) -> None:
    # real time, scaled down; that registrations keep a broker past the expiry (120 s)
    # is tested in virtual time in test_nameserver, without a wall-clock window here
    async with (
        running_nameserver(broker_timeout_ms=1000, scan_interval_s=0.05) as (server, addr),
        running_broker(tmp_path, namesrv_addrs=[addr]) as node,
    ):
        assert server.table.route("TBW102") is not None
        assert node.registrar is not None

        async def silent() -> int:
            return 0

        node.registrar.register_all = silent  # type: ignore[method-assign]
        await wait_for(lambda: server.table.route("TBW102") is None, 10)
        assert server.statistics().brokers_expired == 1


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"listen_port": 70000}, "listen_port"),
        ({"brokr_name": "x"}, "brokr_name"),
        ({"broker_name": "a b"}, "broker_name 'a b'"),
        ({"namesrv_addrs": ["nohost"]}, "nohost"),
        ({"store": {"flush_disk_type": "SOMETIMES"}}, "SOMETIMES"),
        ({"register_interval_s": -1}, "register_interval_s"),
        ({"listen_host": "localhost"}, "listen_host 'localhost' is not an IP address"),
        ({"listen_host": "0.0.0.0"}, "listen_host '0.0.0.0' is a wildcard"),
    ],
)
def test_bad_configuration_is_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        build_config(values)


def test_configuration_files_are_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "broker.toml"
    good.write_text('broker_name = "b"\nlisten_port = 1234\n[store]\nstore_dir = "s"\n')
    config = load_config(good, {"listen_port": 4321, "store.flush_disk_type": "SYNC_FLUSH"})
    assert (config.broker_name, config.listen_port) == ("b", 4321)
    assert config.store.store_dir == Path("s")
    bad = tmp_path / "bad.toml"
    bad.write_text("broker_name = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml is not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


async def test_a_held_pull_does_not_commit_its_stale_offset_again(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        await client.invoke(node.address, create_topic_request("T"), 5)
        held = pull_request("T", 0, 0, suspend_ms=300, commit_offset=5, sys_flag=0x5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.invoke, node.address, held, 5)
            await wait_for(lambda: node.statistics().held_pulls == 1)
            assert node.ctx.offsets.query("G", "T", 0) == 5  # committed on arrival
            newer = RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                UpdateConsumerOffsetRequestHeader("G", "T", 0, 8),
            )
            await client.invoke(node.address, newer, 5)
        # the hold ran out and the pull ran again: the group stays at 8
        assert node.statistics().pulls_answered_on_timeout == 1
        assert node.ctx.offsets.query("G", "T", 0) == 8


async def test_a_held_pull_wakes_only_for_a_message_it_takes(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        await client.invoke(node.address, create_topic_request("T"), 5)
        answer: list[RemotingCommand] = []

        async def pull() -> None:
            request = pull_request("T", 1, 0, suspend_ms=30_000, subscription="a")
            answer.append(await client.invoke(node.address, request, 40))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull)
            await wait_for(lambda: node.statistics().held_pulls == 1)
            await client.invoke(
                node.address, send_request("T", b"not for it", queue_id=1, TAGS="b"), 5
            )
            await node.store.wait_dispatched()  # (its listeners noted the arrival)
            holds = node.ctx.pull_holds
            assert holds is not None
            await wait_for(lambda: not holds._arrived)  # the hold service looked at it
            stats = node.statistics()
            assert (stats.held_pulls, stats.pulls_answered_on_arrival) == (1, 0)  # still waiting
            assert not answer
            await client.invoke(node.address, send_request("T", b"for it", queue_id=1, TAGS="a"), 5)
            await wait_for(lambda: bool(answer))
        assert [m.body for m in decode_messages(answer[0].body)] == [b"for it"]


async def test_sync_flush_refuses_before_storing_when_too_many_wait(tmp_path: Path) -> None:
    async with (
        running_broker(
            tmp_path,
            store={"flush_disk_type": "SYNC_FLUSH"},
            remoting={"max_in_flight_per_connection": 2},
        ) as node,
        RemotingClient() as client,
    ):
        await client.invoke(node.address, create_topic_request("T"), 5)
        codes: list[int] = []

        async def send(i: int) -> None:
            response = await client.invoke(node.address, send_request("T", b"%d" % i), 10)
            codes.append(response.code)

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(send, i)
        ok, busy = codes.count(ResponseCode.SUCCESS), codes.count(ResponseCode.SYSTEM_BUSY)
        assert ok + busy == 64 and busy > 0
        await node.store.wait_dispatched()
        # exactly the answered ones are stored: a refusal stored nothing
        assert node.store.max_offset_in_queue("T", 0) == ok


async def test_batch_entries_keep_their_properties_as_sent_with_the_brokers_added(
    tmp_path: Path,
) -> None:
    """Each entry of a batch is stored with the properties its text decodes to, plus the
    cluster and a unique key where it had none: the same whether the broker appends
    these to the entry's text or encodes the whole map again (a text without a final
    separator, a key it has already, duplicate keys, pairs without a value separator)."""
    texts = [
        "",
        "A\x01a\x02",
        "A\x01a",
        "K\x01x\x02junk\x02K\x01y\x02",
        "CLUSTER\x01other\x02B\x01b\x02",
        "UNIQ_KEY\x01\x02",
        "UNIQ_KEY\x01given\x02KEYS\x01k1 k2\x02",
    ]
    async with (
        running_broker(tmp_path) as node,
        RemotingClient() as client,
    ):
        await client.invoke(node.address, create_topic_request("T"), 5)
        entries = [BatchEntry(b"%d" % i, properties=text) for i, text in enumerate(texts)]
        request = send_request("T", encode_batch(entries), code=RequestCode.SEND_BATCH_MESSAGE)
        assert (await client.invoke(node.address, request, 5)).code == ResponseCode.SUCCESS
        await node.store.wait_dispatched()
        body = node.store.get_message("g", "T", 0, 0, 32).body
        stored = decode_messages(body)
        raw, pos = [], 0
        while pos < len(body):
            record = read_record(body, pos)
            raw.append(record.properties)
            pos += record.size
        assert [m.body for m in stored] == [b"%d" % i for i in range(len(texts))]
        for message, text in zip(stored, texts, strict=True):
            expected = decode_properties(text)
            expected["CLUSTER"] = "DefaultCluster"
            uniq_key = message.properties["UNIQ_KEY"]
            if expected.get("UNIQ_KEY"):
                assert uniq_key == expected["UNIQ_KEY"]
            else:
                assert len(uniq_key) == 32
                expected["UNIQ_KEY"] = uniq_key
            assert message.properties == expected
        # as encode_properties writes them, but for the text with duplicates kept as sent
        canonical = [
            encode_properties(m.properties) == text for m, text in zip(stored, raw, strict=True)
        ]
        assert canonical == [True, True, True, False, True, True, True]
        for key in ("k1", "k2", "given"):
            assert node.store.query_message("T", key, 10), key


async def test_a_batch_is_stored_whole_or_not_at_all(tmp_path: Path) -> None:
    entries = [BatchEntry(b"small"), BatchEntry(b"x" * 70_000), BatchEntry(b"small")]
    async with (
        running_broker(tmp_path, store={"max_message_bytes": 65536}) as node,
        RemotingClient() as client,
    ):
        await client.invoke(node.address, create_topic_request("T"), 5)
        request = send_request(
            "T", encode_batch(entries), code=RequestCode.SEND_BATCH_MESSAGE, batch=True
        )
        refused = await client.invoke(node.address, request, 5)
        assert refused.code == ResponseCode.MESSAGE_ILLEGAL
        assert "batch entry 1" in (refused.remark or "")
        assert node.store.commitlog_max_offset == 0
        good = send_request(
            "T",
            encode_batch([BatchEntry(b"a"), BatchEntry(b"b")]),
            code=RequestCode.SEND_BATCH_MESSAGE,
        )
        answer = await client.invoke(node.address, good, 5)
        assert answer.code == ResponseCode.SUCCESS
        assert len(answer.header(SendMessageResponseHeader).msg_id.split(",")) == 2
        # the C++ client's form: code 10 with batch=1
        cpp = send_request(
            "T", encode_batch([BatchEntry(b"c"), BatchEntry(b"d")]), code=RequestCode.SEND_MESSAGE
        )
        cpp.ext_fields["batch"] = "1"
        assert (await client.invoke(node.address, cpp, 5)).code == ResponseCode.SUCCESS
        await node.store.wait_dispatched()
        assert node.store.max_offset_in_queue("T", 0) == 4


async def test_numbers_and_names_out_of_range_are_refused_by_name(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        await client.invoke(node.address, create_topic_request("T"), 5)
        huge = await client.invoke(node.address, send_request("T", flag=2**40), 5)
        assert huge.code == ResponseCode.MESSAGE_ILLEGAL
        assert "flag 1099511627776 does not fit" in (huge.remark or "")
        negative = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader("G", "T", 0, -9)
        )
        refused = await client.invoke(node.address, negative, 5)
        assert refused.code == ResponseCode.INVALID_PARAMETER
        assert "commitOffset -9 is negative" in (refused.remark or "")
        odd = await client.invoke(node.address, heartbeat("c1", "a@b"), 5)
        assert odd.code == ResponseCode.INVALID_PARAMETER and "group 'a@b'" in (odd.remark or "")
        assert node.ctx.consumers.client_ids("a@b") == []
        middle = RemotingCommand.request(
            RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(5)
        )
        assert (await client.invoke(node.address, middle, 5)).code == ResponseCode.SYSTEM_ERROR


async def test_a_send_back_is_refused_when_the_offset_holds_another_message(
    tmp_path: Path,
) -> None:
    """After a failover the new master's log can hold another message at the offset a
    consumer names: the broker checks the id instead of retrying the wrong one."""
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        addr = node.address
        for body in (b"first", b"second"):
            sent = await client.invoke(addr, send_request("T", body, queue_id=0), 5)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
        await node.store.wait_dispatched()
        first, second = decode_messages(
            (await client.invoke(addr, pull_request("T", 0, 0), 5)).body
        )
        assert node.ctx.subscriptions.find("G") is not None  # (auto-created)

        def back(offset: int, origin: str) -> RemotingCommand:
            header = ConsumerSendMsgBackRequestHeader(offset, "G", 0, origin_msg_id=origin)
            return RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header)

        wrong = await client.invoke(addr, back(first.physical_offset, second.msg_id), 5)
        assert wrong.code == ResponseCode.SYSTEM_ERROR
        assert f"not {second.msg_id}" in (wrong.remark or "")
        assert node.store.max_offset_in_queue("%RETRY%G", 0) <= 0
        right = await client.invoke(addr, back(first.physical_offset, first.msg_id), 5)
        assert right.code == ResponseCode.SUCCESS, right.remark


class _Nameservers:
    """A RemotingClient stand-in for a Registrar: nameservers that answer REGISTER_BROKER
    and QUERY_DATA_VERSION (``known``: those the broker registered with since they last
    ``forget`` it, as a restart does) or, while ``down``, fail as a nameserver that is
    not there does. ``registered``: when each REGISTER_BROKER came, and to whom."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.known: set[str] = set()
        self.registered: list[tuple[float, str]] = []

    def forget(self, addr: str) -> None:
        self.known.discard(addr)

    async def invoke(
        self, addr: str, request: RemotingCommand, timeout_s: float
    ) -> RemotingCommand:
        await trio.sleep(0.001)
        if addr in self.down:
            raise RemotingConnectError(addr, "cannot connect: connection refused")
        if request.code == RequestCode.QUERY_DATA_VERSION:
            changed = addr not in self.known
            return request.response_to(header=QueryDataVersionResponseHeader(changed))
        self.registered.append((trio.current_time(), addr))
        self.known.add(addr)
        return request.response_to(header=RegisterBrokerResponseHeader())


def _registrar_context(tmp_path: Path) -> SimpleNamespace:
    """What a Registrar reads of a broker's context."""
    return SimpleNamespace(
        config=build_config({"register_interval_s": 30.0}),
        roles=SimpleNamespace(broker_id=0),
        topics=TopicConfigManager(tmp_path / "topics.json", lambda: 0),
        address="127.0.0.1:10911",
        ha_address="127.0.0.1:10912",
    )


async def test_a_nameserver_back_from_a_long_outage_has_the_broker_within_seconds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A restarted nameserver knows no broker: the one that was down is tried again
    alone, at most every REGISTER_RETRY_MAX_S (5 s), not every register_interval_s
    (30 s), and the others are not registered with again meanwhile."""
    nameservers = _Nameservers()
    nameservers.down.add("ns2:9876")
    registrar = Registrar(_registrar_context(tmp_path), nameservers, ["ns1:9876", "ns2:9876"])  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(registrar.run)
        await trio.sleep(100)  # (ns2 down a long while)
        back = trio.current_time()
        nameservers.down.clear()
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    ns2_after = [t for t, addr in nameservers.registered if addr == "ns2:9876" and t >= back]
    assert ns2_after[0] - back <= REGISTER_RETRY_MAX_S + 0.1
    ns1 = [t for t, addr in nameservers.registered if addr == "ns1:9876"]
    assert len([t for t in ns1 if t < back]) <= 1 + 100 // 30  # its rounds, no retries


async def test_a_nameserver_restarted_between_rounds_has_the_broker_within_seconds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A nameserver that restarts between two registration rounds (no registration
    failed: the broker did not notice) knows no route to the broker: asked every
    NAMESRV_CHECK_S whether it knows the broker's topic table (QUERY_DATA_VERSION), it
    says no and gets the registration at once, not at the next round 30 s later."""
    nameservers = _Nameservers()
    registrar = Registrar(_registrar_context(tmp_path), nameservers, ["ns1:9876", "ns2:9876"])  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(registrar.run)
        await trio.sleep(10)
        restarted = trio.current_time()
        nameservers.forget("ns1:9876")
        await trio.sleep(15)
        nursery.cancel_scope.cancel()
    after = [(t, addr) for t, addr in nameservers.registered if t >= restarted]
    assert [addr for _, addr in after] == ["ns1:9876"]
    assert after[0][0] - restarted <= NAMESRV_CHECK_S + 0.1
