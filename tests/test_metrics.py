"""The metrics endpoint: scraped over real HTTP on loopback and parsed with
prometheus-client's own parser; requests a stranger could send are bounded."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from prometheus_client import Counter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from hamq.client import AdminClient, Message, Producer, PullConsumer, SendStatus
from hamq.controller import Controller, ControllerConfig, ControllerServer
from hamq.metrics import MetricsServer, Snapshot, new_registry
from hamq.metrics.server import MAX_CONNECTIONS, BadRequest, parse_request
from hamq.ratelimit import RateLimitedLog
from nameserver import NameServer, NameServerConfig
from tests.support.brokers import namesrv, running_broker, running_nameserver
from tests.support.cluster import READY_S, cluster_up
from tests.support.metrics import documented, families, http, scrape, shows, value
from tests.support.processes import copy_profile, free_ports, hamq_command
from tests.support.timing import wait_for


@asynccontextmanager
async def serving(server: MetricsServer) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield port
        nursery.cancel_scope.cancel()


async def test_a_scrape_shows_what_was_registered_at_scrape_time() -> None:
    registry = new_registry()
    sent = Counter("hamq_test_sent", "Messages sent", ["topic"], registry=registry)
    depth = [3]

    def snapshot() -> list[Metric]:
        gauge = GaugeMetricFamily("hamq_test_depth", "Depth now", labels=["queue"])
        gauge.add_metric(["0"], depth[0])
        return [gauge]

    registry.register(Snapshot(snapshot))
    server = MetricsServer(registry, "127.0.0.1", 0)
    async with serving(server) as port:
        sent.labels("T").inc(5)
        first = families(await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert first["hamq_test_sent"].samples[0].value == 5
        assert first["hamq_test_sent"].samples[0].labels == {"topic": "T"}
        assert first["hamq_test_depth"].samples[0].value == 3
        assert "process_open_fds" in first  # the process's own figures
        sent.labels("T").inc()
        depth[0] = 7
        second = families(await http(port, b"GET /metrics HTTP/1.0\r\n\r\n"))
        assert second["hamq_test_sent"].samples[0].value == 6
        assert second["hamq_test_depth"].samples[0].value == 7
    assert server.scrapes == 2


async def test_openmetrics_when_asked_and_head_without_a_body() -> None:
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    async with serving(server) as port:
        open_metrics = await http(
            port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n"
        )
        assert b"Content-Type: application/openmetrics-text" in open_metrics
        assert open_metrics.rstrip().endswith(b"# EOF")
        head = await http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /nothing HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"hello\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 10_000 + b"\r\n\r\n", b"431"),
    ],
)
async def test_what_is_not_a_scrape_gets_a_status_and_a_closed_connection(
    request_bytes: bytes, status: bytes
) -> None:
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    async with serving(server) as port:
        answer = await http(port, request_bytes)
    assert answer.split(b" ")[1] == status
    assert server.scrapes == 0


async def test_a_scrape_that_fails_is_a_500_and_the_server_goes_on() -> None:
    registry = new_registry()
    broken = [False]

    def snapshot() -> list[Metric]:
        if broken[0]:
            raise RuntimeError("a collector failed")
        return []

    registry.register(Snapshot(snapshot))
    broken[0] = True
    server = MetricsServer(registry, "127.0.0.1", 0)
    async with serving(server) as port:
        bad_accept = (
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=x\r\n\r\n"
        )
        assert (await http(port, b"GET /metrics HTTP/1.1\r\n\r\n")).split(b" ")[1] == b"500"
        broken[0] = False
        assert (await http(port, bad_accept)).split(b" ")[1] == b"200"  # (the text format)
        assert (await http(port, b"GET /metrics HTTP/1.1\r\n\r\n")).split(b" ")[1] == b"200"


async def test_connections_over_the_limit_are_closed_at_once_and_others_still_served() -> None:
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    async with serving(server) as port:
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        try:
            with trio.fail_after(10):
                while server.refused == 0:  # the server sees each idle one in turn
                    extra = await trio.open_tcp_stream("127.0.0.1", port)
                    async with extra:
                        assert await extra.receive_some(10) == b""  # closed at once
        finally:
            for stream in idle:
                await stream.aclose()
        with trio.fail_after(10):
            while True:  # the idle ones' places come free
                answer = await http(port, b"GET /metrics HTTP/1.1\r\n\r\n")
                if answer:
                    break
        assert answer.startswith(b"HTTP/1.1 200 OK")


async def test_connections_over_the_limit_are_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """30 connections over the limit in one 10 s window (the clock held still): 5 lines,
    not 30; the rest are counted."""
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    server.warnings = RateLimitedLog(logging.getLogger("hamq.metrics.server"), clock=lambda: 0.0)
    caplog.set_level(logging.WARNING, "hamq.metrics.server")
    async with serving(server) as port:
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        try:
            with trio.fail_after(20):
                while server.refused < 30:  # each one over the limit had its line's chance
                    extra = await trio.open_tcp_stream("127.0.0.1", port)
                    async with extra:
                        assert await extra.receive_some(10) == b""
        finally:
            for stream in idle:
                await stream.aclose()
    said = [r for r in caplog.records if "over 16 connections" in r.getMessage()]
    assert len(said) == 5, [r.getMessage() for r in said]
    assert server.warnings.suppressed["refused"] == server.refused - 5


async def test_the_server_binds_only_the_host_it_is_given() -> None:
    server = MetricsServer(new_registry(), "127.0.0.2", 0)
    async with serving(server) as port:
        answer = await http(port, b"GET / HTTP/1.1\r\n\r\n", host="127.0.0.2")
        assert answer.startswith(b"HTTP/1.1 200 OK")
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)


def test_request_heads_are_parsed_strictly() -> None:
    assert parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nAccept: text/plain") == (
        "GET",
        "/metrics",
        {"accept": "text/plain"},
    )
    for bad in (b"", b"GET /metrics", b"GET / HTTP/1.1\r\n: empty name"):
        with pytest.raises(BadRequest):
            parse_request(bad)


# ---------------------------------------------------------------- what servers show


async def test_a_broker_shows_messages_in_and_out_sends_pulls_lag_and_its_store(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, metrics_port=0) as node:
        assert node.metrics_port is not None
        ns = namesrv(node)
        async with AdminClient(ns) as admin:
            await admin.create_topic("M", 2)
        async with Producer("PG", ns) as producer:
            for i in range(10):
                result = await producer.send(Message("M", b"x" * 100, keys=[f"k{i}"]))
                assert result.status is SendStatus.SEND_OK
            await producer.send(Message("Later", b"x", deliver_after=600))  # (a timer waits)
        await node.store.wait_dispatched()
        before = await scrape(node.metrics_port)
        assert value(before, "hamq_broker_messages_in", "_total", topic="M") == 10
        assert value(before, "hamq_broker_bytes_in", "_total", topic="M") > 10 * 100
        assert value(before, "hamq_broker_send_latency_seconds", "_count", status="SEND_OK") == 11
        assert value(before, "hamq_broker_master") == 1
        requests = value(before, "hamq_broker_requests_received", "_total")
        assert requests >= 10  # the sends, and the clients' other requests
        assert 1 <= value(before, "hamq_broker_request_groups", "_total") <= requests
        assert value(before, "hamq_broker_info", role="ASYNC_MASTER", broker_name="broker-a") == 1
        assert value(before, "hamq_broker_commitlog_offset", which="max") > 0
        assert value(before, "hamq_broker_timer_messages", state="waiting") == 1
        disk = "hamq_broker_store_disk_bytes"
        # measured in a worker thread, from the start on
        reserved = shows(node.metrics_port, disk, lambda v: v > 0, kind="reserved")
        await wait_for(reserved, 10, every_s=0.05)
        assert value(before, "hamq_nameserver_brokers") == 1  # the embedded nameserver
        async with PullConsumer("G", ns) as puller:
            pulled = 0
            for queue in await puller.queues("M"):
                result = await puller.pull(queue, 0, max_nums=32)
                pulled += len(result.messages)
                if result.messages:
                    await puller.commit_offset(queue, 1)  # one consumed, the rest behind
            committed_queues = sum(1 for q in await puller.queues("M"))
        after = await scrape(node.metrics_port)
        assert pulled == 10
        assert value(after, "hamq_broker_messages_out", "_total", topic="M") == 10
        assert value(after, "hamq_broker_pull_requests", "_total", outcome="SUCCESS") >= 1
        lag = value(after, "hamq_broker_consumer_lag_messages", group="G", topic="M")
        assert 10 - committed_queues <= lag <= 9
        assert documented(after) == []
        async with AdminClient(ns) as admin:
            await admin.delete_topic("M")
        gone = await scrape(node.metrics_port)
        assert "M" not in {s.labels.get("topic") for s in gone["hamq_broker_messages_in"].samples}


@pytest.mark.parametrize("protocol", ["classic", "autoswitch"])
async def test_replication_lag_is_one_series_per_slave_by_broker_id_across_reconnects(
    tmp_path: Path, protocol: str
) -> None:
    """The slave's HA connection comes from a new port each time; its series does not
    (the classic protocol does not say the broker id: the nameservers' registration of
    the slave's host does)."""
    async with running_nameserver() as (_, ns):
        common = {"namesrv_addrs": [ns], "ha": {"protocol": protocol}}
        async with (
            running_broker(tmp_path / "m", metrics_port=0, **common) as master,
            running_broker(tmp_path / "s", broker_id=1, store={"role": "SLAVE"}, **common) as slave,
        ):
            service, client = master.ha_service, slave.ha_client
            assert service is not None and client is not None and master.metrics_port
            port = master.metrics_port

            def identified() -> str | None:  # the slave's connection, once it has an id
                known = [c.peer for c in service.connections if c.broker_id >= 0]
                return known[0] if known else None

            first = await wait_for(identified, 20, what="the slave's connection")
            lag = "hamq_broker_replication_lag_bytes"
            assert [s.labels for s in (await scrape(port))[lag].samples] == [{"broker_id": "1"}]
            for _ in range(2):
                client.kick()  # a new session: a new connection, from a new port
                await wait_for(
                    lambda old=first: identified() not in (None, old), 20, what="reconnected"
                )
                first = identified()
                shown = (await scrape(port))[lag].samples
                assert [s.labels for s in shown] == [{"broker_id": "1"}], shown
            assert client.statistics().sessions >= 3  # (it did reconnect)


async def test_a_nameserver_with_a_controller_shows_the_group_it_elected(tmp_path: Path) -> None:
    (raft_port,) = free_ports(1)
    controller = Controller(
        ControllerConfig(raft_address=f"127.0.0.1:{raft_port}", data_dir=tmp_path / "raft")
    )
    server = NameServer(NameServerConfig(port=0, metrics_port=0), controller=controller)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        ns = f"127.0.0.1:{port}"
        assert server.metrics_port is not None
        async with running_broker(
            tmp_path / "broker",
            namesrv_addrs=[ns],
            enable_controller_mode=True,
            controller_addrs=[ns],
            metrics_port=0,
        ) as node:
            await wait_for(lambda: node.roles.is_master, 30, what="the controller elects it")
            shown = await scrape(server.metrics_port)
            labels = {"cluster": "DefaultCluster", "broker_name": "broker-a"}
            assert value(shown, "hamq_controller_leader") == 1
            assert node.replicas is not None  # (a master registers as id 0; this is its own)
            assert value(shown, "hamq_controller_master_id", **labels) == node.replicas.broker_id
            assert value(shown, "hamq_controller_master_epoch", **labels) >= 1
            assert value(shown, "hamq_controller_sync_state_set_size", **labels) == 1
            assert value(shown, "hamq_nameserver_brokers") == 1
            assert node.metrics_port is not None
            broker = await scrape(node.metrics_port)
            assert value(broker, "hamq_broker_master") == 1
            assert value(broker, "hamq_broker_sync_state_set_size") == 1
            assert value(broker, "hamq_broker_epoch") >= 1
            assert documented(shown) == documented(broker) == []
        nursery.cancel_scope.cancel()


async def test_a_standalone_controller_serves_its_metrics(tmp_path: Path) -> None:
    (raft_port,) = free_ports(1)
    config = ControllerConfig(raft_address=f"127.0.0.1:{raft_port}", data_dir=tmp_path)
    server = ControllerServer(config, port=0, metrics_port=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        assert server.metrics_port is not None
        # a single Raft node elects itself
        leader = shows(server.metrics_port, "hamq_controller_leader", lambda v: v == 1)
        await wait_for(leader, 30, every_s=0.05)
        shown = await scrape(server.metrics_port)
        assert value(shown, "hamq_controller_live_brokers") == 0
        assert value(shown, "hamq_controller_raft_peers_connected") == 0  # (a single one)
        closed = "hamq_controller_raft_unauthenticated_closed"
        assert value(shown, closed, "_total", reason="refused") == 0
        assert "hamq_nameserver_brokers" not in shown
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_the_make_run_profile_shows_messages_moving_under_hamq_produce(
    tmp_path: Path,
) -> None:
    """``make run``'s profile (conf/1m-1s-sync, its ports moved to free ones) serves
    metrics; ``hamq produce`` and ``hamq consume`` move messages in and out."""
    profile = tmp_path / "1m-1s-sync"
    moved = copy_profile("1m-1s-sync", profile, tmp_path / "data")
    ns_port, master_metrics, slave_metrics = moved[9876], moved[10919], moved[10929]
    ns = f"127.0.0.1:{ns_port}"
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: 1m-1s-sync", READY_S)
        before = await scrape(master_metrics)
        assert value(before, "hamq_broker_info", role="SYNC_MASTER") == 1
        assert value(await scrape(slave_metrics), "hamq_broker_info", role="SLAVE") == 1
        # SEND_OK once the slave is in sync
        in_sync = shows(master_metrics, "hamq_broker_in_sync_replicas", lambda v: v >= 2)
        await wait_for(in_sync, 30, every_s=0.1)
        produced = await hamq_command(
            "produce", "-n", ns, "--topic", "demo", "--count", "200", timeout_s=60
        )
        assert produced.returncode == 0, produced.stderr
        after_produce = await scrape(master_metrics)
        assert value(after_produce, "hamq_broker_messages_in", "_total", topic="demo") == 200
        latency = "hamq_broker_send_latency_seconds"
        assert value(after_produce, latency, "_count", status="SEND_OK") >= 1
        consumed = await hamq_command(
            "consume", "-n", ns, "--topic", "demo", "--group", "g", "--count", "200",
            timeout_s=60,
        )  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr
        after_consume = await scrape(master_metrics)
        assert value(after_consume, "hamq_broker_messages_out", "_total", topic="demo") >= 200
        slave_shown = await scrape(slave_metrics)
        assert value(slave_shown, "hamq_broker_commitlog_offset", which="max") > 0
        [replica] = after_consume["hamq_broker_replication_lag_bytes"].samples  # the slave
        assert replica.value >= 0
