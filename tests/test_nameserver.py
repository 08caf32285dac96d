"""The nameserver: route table rules, its remoting API, housekeeping in virtual time."""

from __future__ import annotations

import json
import zlib

import pytest
import trio
import trio.testing

from hamq.protocol import RemotingCommand, RequestCode, ResponseCode, SerializeType
from hamq.protocol.bodies import (
    ClusterInfo,
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    GetRouteInfoRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
)
from hamq.remoting import RemotingClient
from nameserver import NameServer, NameServerConfig, RouteTable
from tests.support.timing import virtual_clock, wait_for


def topics(*names: str, queues: int = 4) -> dict[str, TopicConfig]:
    return {n: TopicConfig(n, read_queue_nums=queues, write_queue_nums=queues) for n in names}


def register(table: RouteTable, name: str, broker_id: int, addr: str, now: int = 0, **kw: object):  # type: ignore[no-untyped-def]
    return table.register_broker(
        cluster=kw.pop("cluster", "DefaultCluster"),  # type: ignore[arg-type]
        broker_name=name,
        broker_id=broker_id,
        addr=addr,
        ha_server_addr=addr.replace("10911", "10912"),
        topics=kw.pop("topics", topics("T")),  # type: ignore[arg-type]
        data_version=kw.pop("data_version", DataVersion(0, 1, 1)),  # type: ignore[arg-type]
        now_ms=now,
        **kw,  # type: ignore[arg-type]
    )


def test_route_joins_queue_data_and_broker_addresses() -> None:
    table = RouteTable()
    register(table, "broker-a", 0, "127.0.0.1:10911", topics=topics("T", "U"))
    register(table, "broker-b", 0, "127.0.0.2:10911", topics=topics("T", queues=8))
    result = register(table, "broker-a", 1, "127.0.0.3:10911")
    # a slave learns its master's remoting and HA addresses
    assert result.master_addr == "127.0.0.1:10911"
    assert result.ha_server_addr == "127.0.0.1:10912"
    route = table.route("T")
    assert route is not None
    assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 4),
        ("broker-b", 8),
    ]
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.3:10911"}
    assert table.route("nope") is None
    assert table.topic_names() == ["T", "U"]
    info = table.cluster_info()
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a", "broker-b"]}


def test_route_json_is_what_the_cpp_client_reads() -> None:
    table = RouteTable()
    register(table, "broker-a", 0, "127.0.0.1:10911")
    route = json.loads(encode_body(table.route("T")))
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}  # quoted keys
    assert route["queueDatas"][0] == {
        "brokerName": "broker-a",
        "readQueueNums": 4,
        "writeQueueNums": 4,
        "perm": 6,
        "topicSysFlag": 0,
    }


def test_silent_brokers_expire_and_take_their_topics_with_them() -> None:
    table = RouteTable()
    register(table, "broker-a", 0, "127.0.0.1:10911", now=0)
    register(table, "broker-b", 0, "127.0.0.2:10911", now=0, topics=topics("T", "Only-B"))
    table.heartbeat("127.0.0.2:10911", now_ms=100_000)
    assert table.scan_inactive(now_ms=120_000) == []  # exactly 120 s is not past it
    assert table.scan_inactive(now_ms=120_001) == ["127.0.0.1:10911"]
    route = table.route("T")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert table.scan_inactive(now_ms=220_001) == ["127.0.0.2:10911"]
    assert table.route("T") is None and table.route("Only-B") is None
    assert table.clusters == {}


def test_a_closed_connection_drops_its_brokers_at_once() -> None:
    table = RouteTable()
    connection = object()
    register(table, "broker-a", 0, "127.0.0.1:10911", connection=connection)
    register(table, "broker-b", 0, "127.0.0.2:10911", connection=object())
    assert table.connection_closed(connection) == ["127.0.0.1:10911"]
    assert "broker-a" not in table.brokers and "broker-b" in table.brokers


def test_a_promoted_slave_replaces_its_old_id() -> None:
    table = RouteTable()
    register(table, "broker-a", 0, "127.0.0.1:10911")
    register(table, "broker-a", 1, "127.0.0.3:10911")
    table.unregister_broker(broker_name="broker-a", addr="127.0.0.1:10911", broker_id=0)
    register(table, "broker-a", 0, "127.0.0.3:10911")  # the slave is master now
    assert table.brokers["broker-a"].broker_addrs == {0: "127.0.0.3:10911"}


def register_request(
    addr: str, topic_names: tuple[str, ...], broker_id: int = 0, **fields: object
) -> RemotingCommand:
    body = encode_body(
        RegisterBrokerBody(TopicConfigSerializeWrapper(topics(*topic_names), DataVersion(0, 1, 1)))
    )
    header = RegisterBrokerRequestHeader(
        broker_name="broker-a",
        broker_addr=addr,
        cluster_name="DefaultCluster",
        ha_server_addr=addr.replace("10911", "10912"),
        broker_id=broker_id,
        body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
        **fields,  # type: ignore[arg-type]
    )
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body=body)


async def test_nameserver_api_over_the_wire(nursery: trio.Nursery) -> None:
    server = NameServer(NameServerConfig(port=0))
    port = await nursery.start(server.run)
    addr = f"127.0.0.1:{port}"
    async with RemotingClient() as client:
        response = await client.invoke(addr, register_request("127.0.0.1:10911", ("T",)), 5)
        assert response.code == ResponseCode.SUCCESS
        slave = await client.invoke(addr, register_request("127.0.0.9:10911", ("T",), 1), 5)
        assert slave.header(RegisterBrokerResponseHeader).master_addr == "127.0.0.1:10911"
        route_request = RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            GetRouteInfoRequestHeader(topic="T"),
            serialize_type=SerializeType.JSON,
        )
        route = await client.invoke(addr, route_request, 5)
        assert route.code == ResponseCode.SUCCESS
        assert decode_body(TopicRouteData, route.body).broker_datas[0].broker_addrs == {
            0: "127.0.0.1:10911",
            1: "127.0.0.9:10911",
        }
        missing = await client.invoke(
            addr,
            RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic="nope")
            ),
            5,
        )
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST
        assert missing.remark == "No topic route info in name server for the topic: nope"
        info = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 5
        )
        assert decode_body(ClusterInfo, info.body).cluster_addr_table == {
            "DefaultCluster": ["broker-a"]
        }
        listed = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5
        )
        assert decode_body(TopicList, listed.body).topic_list == ["T"]
        bad_crc = register_request("127.0.0.1:10911", ("T",))
        bad_crc.body += b" "
        refused = await client.invoke(addr, bad_crc, 5)
        assert (refused.code, refused.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
        # the brokers' connection closes: they are dropped at once
        client.close_connection(addr)
        await wait_for(lambda: not server.table.live, 5, what="the server drops them")
    assert server.table.route("T") is None


async def test_query_data_version_says_whether_a_broker_must_register(
    nursery: trio.Nursery,
) -> None:
    """QUERY_DATA_VERSION (RocketMQ's check before a registration): changed for a broker
    this nameserver does not know (it restarted) or knows with another topic-table
    version; unchanged, and counted as heard from, for the version it has."""
    server = NameServer(NameServerConfig(port=0))
    port = await nursery.start(server.run)
    addr = f"127.0.0.1:{port}"

    def query(version: DataVersion) -> RemotingCommand:
        header = QueryDataVersionRequestHeader(
            broker_name="broker-a",
            broker_addr="127.0.0.1:10911",
            cluster_name="DefaultCluster",
            broker_id=0,
        )
        return RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION, header, body=encode_body(version)
        )

    async with RemotingClient() as client:
        unknown = await client.invoke(addr, query(DataVersion(0, 1, 1)), 5)
        assert unknown.code == ResponseCode.SUCCESS
        assert unknown.header(QueryDataVersionResponseHeader).changed is True
        assert unknown.body == b""
        await client.invoke(addr, register_request("127.0.0.1:10911", ("T",)), 5)
        heard = server.table.live["127.0.0.1:10911"].last_update_ms
        same = await client.invoke(addr, query(DataVersion(0, 1, 1)), 5)
        assert same.header(QueryDataVersionResponseHeader).changed is False
        assert decode_body(DataVersion, same.body) == DataVersion(0, 1, 1)
        assert server.table.live["127.0.0.1:10911"].last_update_ms >= heard
        newer = await client.invoke(addr, query(DataVersion(0, 2, 2)), 5)
        assert newer.header(QueryDataVersionResponseHeader).changed is True


async def test_a_silent_broker_is_dropped_after_120_seconds(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    clock = virtual_clock(base_ms=0)
    server = NameServer(NameServerConfig(port=0), clock=clock)
    await nursery.start(server.run)
    register(server.table, "broker-a", 0, "127.0.0.1:10911", now=clock())
    await trio.sleep(119)
    assert server.table.route("T") is not None
    await trio.sleep(12)  # past 120 s and one more 10 s scan
    assert server.table.route("T") is None
    assert server.statistics().brokers_expired == 1


@pytest.mark.parametrize("body", [b"not json", b'{"topicConfigSerializeWrapper": 5}'])
async def test_a_bad_registration_body_is_named(nursery: trio.Nursery, body: bytes) -> None:
    server = NameServer(NameServerConfig(port=0))
    port = await nursery.start(server.run)
    request = register_request("127.0.0.1:10911", ("T",))
    request.body = body
    request.ext_fields.pop("bodyCrc32")
    async with RemotingClient() as client:
        response = await client.invoke(f"127.0.0.1:{port}", request, 5)
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "RegisterBrokerBody" in (response.remark or "")


def test_a_retry_topic_has_a_route_before_its_group_first_heartbeats() -> None:
    table = RouteTable()
    template = {"TBW102": TopicConfig("TBW102", 8, 8, perm=7)}  # inheritable: auto-creates
    register(table, "broker-a", 0, "127.0.0.1:10911", topics=template)
    register(
        table,
        "broker-b",
        0,
        "127.0.0.2:10911",
        topics={"TBW102": TopicConfig("TBW102", 8, 8, perm=6)},
    )
    route = table.retry_route("%RETRY%my-group")
    assert route is not None
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 1, 1)  # only where the broker will create it
    ]
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
    assert table.retry_route("plain-topic") is None
