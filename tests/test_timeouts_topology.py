"""Timeouts and topology that used to defeat the guarantees.

- A producer's try must outlast the broker's own wait, so that FLUSH_SLAVE_TIMEOUT (or
  FLUSH_DISK_TIMEOUT) reaches the caller instead of a client time out and a retry that
  stores the message twice; both sides warn when configured otherwise.
- ``make run``'s profile: each broker embeds a nameserver and registers with both, so
  that with the master killed clients using the CLI's default list find the slave.

The tests with a client in this process and real processes around it run on every
AnyIO backend: the support modules start and kill their processes with
AnyIO's API. The others stay plain (Trio) tests: no client runs in them.
"""

from __future__ import annotations

import logging
import os
import signal
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest

from cli.common import DEFAULT_NAMESRV
from cli.profiles import CLUSTER_FILE, load_profile, profile_names
from hamq.broker import build_config
from hamq.client import AdminClient, Message, Producer, SendStatus
from hamq.ha import HAConfig
from hamq.protocol.send_timing import (
    BROKER_SYNC_FLUSH_WAIT_S,
    BROKER_SYNC_SLAVE_WAIT_S,
    send_wait_too_short,
)
from hamq.store import StoreConfig
from tests.support.brokers import running_broker, topic_messages
from tests.support.cluster import READY_S, cluster_up
from tests.support.ha import broker_group, first_slave_in_sync
from tests.support.processes import copy_profile, hamq_command
from tests.support.timing import wait_for

# ---------------------------------------------------------------- timeouts


def test_the_documented_broker_waits_are_the_brokers_defaults(tmp_path: Path) -> None:
    """The client knows the broker's waits only as documented constants: they must be
    the broker's real defaults, and the producer's default try must outlast them."""
    assert StoreConfig(store_dir=tmp_path).sync_flush_timeout_s == BROKER_SYNC_FLUSH_WAIT_S
    assert HAConfig().sync_timeout_s == BROKER_SYNC_SLAVE_WAIT_S
    producer = Producer("PG", "127.0.0.1:9876")
    assert not send_wait_too_short(producer.first_try_s), producer.first_try_s


def _from(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"send_timeout_s": 3.0}, "3s (send_timeout_s)"),
        ({"send_attempt_timeout_s": 4.0}, "4s (send_attempt_timeout_s)"),
        ({"send_timeout_s": 5.5, "send_attempt_timeout_s": 20.0}, "5.5s (send_timeout_s)"),
    ],
)
def test_a_producer_whose_tries_end_before_the_brokers_answer_warns_once(
    caplog: pytest.LogCaptureFixture, options: dict[str, Any], named: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="hamq.client.producer"):
        Producer("PG", "127.0.0.1:9876")
        assert not _from(caplog, "hamq.client.producer")  # the defaults keep the rule
        Producer("PG", "127.0.0.1:9876", **options)
    [record] = _from(caplog, "hamq.client.producer")
    text = record.getMessage()
    assert f"a try waits at most {named}" in text, text
    assert "FLUSH_SLAVE_TIMEOUT" in text and "at least 6s" in text, text


async def test_a_broker_whose_waits_outlast_the_producers_tries_warns_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hamq.broker.node"):
        async with running_broker(tmp_path / "default", store={"role": "SYNC_MASTER"}):
            pass
        assert not _from(caplog, "hamq.broker.node")  # the defaults keep the rule
        async with running_broker(
            tmp_path / "slow",
            store={"role": "SYNC_MASTER", "flush_disk_type": "SYNC_FLUSH"},
            ha={"sync_timeout_s": 9.5},
        ):
            pass
    [record] = _from(caplog, "hamq.broker.node")
    text = record.getMessage()
    assert "waits up to 9.5s before it answers a send" in text, text
    assert "[ha] sync_timeout_s = 9.5" in text and "sync_flush_timeout_s = 5" in text, text


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_stopped_slave_reaches_a_default_producer_as_flush_slave_timeout(
    tmp_path: Path,
) -> None:
    """A SYNC_MASTER at its default 3 s wait whose slave is stopped (SIGSTOP: connected,
    silent) answers FLUSH_SLAVE_TIMEOUT; a producer at its defaults gets that answer,
    not a time out of its own (which its caller would retry: a duplicate)."""
    async with (
        broker_group(tmp_path, "SYNC_MASTER") as (ns, _master, (slave, _)),
        Producer("PG", ns) as producer,
    ):
        first = await producer.send(Message("Stalled", b"before"))
        assert first.status is SendStatus.SEND_OK
        os.kill(slave.pid, signal.SIGSTOP)
        try:
            started = anyio.current_time()
            stalled = await producer.send(Message("Stalled", b"while the slave is stopped"))
            waited = anyio.current_time() - started
        finally:
            os.kill(slave.pid, signal.SIGCONT)
        assert stalled.status is SendStatus.FLUSH_SLAVE_TIMEOUT, stalled
        assert waited >= BROKER_SYNC_SLAVE_WAIT_S  # the broker's wait, not the client's


# ---------------------------------------------------------------- topology


def _embedded(path: Path) -> str | None:
    config = build_config(tomllib.loads(path.read_text()))
    if config.namesrv_addrs and not config.embed_namesrv:
        return None
    return f"127.0.0.1:{config.embedded_namesrv_port}"


@pytest.mark.parametrize("name", profile_names())
def test_no_shipped_profile_loses_every_nameserver_with_one_broker(name: str) -> None:
    """Whichever broker of a profile dies, every other broker registers with a
    nameserver that lives on (a standalone one, or one another broker embeds)."""
    profile = load_profile(name)
    files = [p for p in sorted(profile.directory.glob("*.toml")) if p.name != CLUSTER_FILE]
    for dead in files:
        gone = _embedded(dead)
        for other in files:
            if other == dead:
                continue
            config = build_config(tomllib.loads(other.read_text()))
            own = _embedded(other)
            alive = {a for a in (*config.namesrv_addrs, own) if a and a != gone}
            assert alive, f"{name}: with {dead.name} down, {other.name} has no nameserver"


def test_the_cli_default_names_make_runs_nameservers() -> None:
    """``hamq produce/consume/admin`` without ``-n`` ask every nameserver of ``make
    run``'s profile, so that one broker's death does not leave them without any."""
    profile = load_profile("1m-1s-sync")
    embedded = {_embedded(p) for p in profile.directory.glob("*.toml")}
    assert embedded == set(DEFAULT_NAMESRV.split(";")), embedded


@pytest.mark.anyio
@pytest.mark.slow
async def test_with_make_runs_master_killed_a_default_client_consumes_from_the_slave(
    tmp_path: Path,
) -> None:
    """conf/1m-1s-sync (its ports moved to free ones): kill -9 the master; a client
    given the CLI's default nameserver list (moved alike) still finds broker-a's route,
    now the slave alone, and reads every message sent before."""
    profile = tmp_path / "1m-1s-sync"
    moved = copy_profile("1m-1s-sync", profile, tmp_path / "data")
    default = ";".join(
        f"127.0.0.1:{moved[int(addr.rsplit(':', 1)[1])]}" for addr in DEFAULT_NAMESRV.split(";")
    )
    master_addr = f"127.0.0.1:{moved[10911]}"
    slave_ns = f"127.0.0.1:{moved[9877]}"
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: 1m-1s-sync", READY_S)
        shown = await up.read_until(r"^clients: --namesrv (.*)$", 5)
        assert shown.group(1).strip("'") == default, shown.group(0)
        # SEND_OK once the slave is in sync
        await wait_for(lambda: first_slave_in_sync(master_addr), 30, every_s=0.1)
        bodies = [f"before the kill {i}".encode() for i in range(20)]
        async with Producer("PG", default) as producer:
            for body in bodies:
                result = await producer.send(Message("Topology", body))
                assert result.status is SendStatus.SEND_OK, result
        async with AdminClient(slave_ns) as admin:  # the master registered it there too
            route = await admin.topic_route("Topology")
        assert {b.broker_name for b in route.broker_datas} == {"broker-a"}, route

        os.kill(up.table_pids()["broker-a"], signal.SIGKILL)
        await up.stderr_until(r"broker-a \(master, pid \d+\) exited unexpectedly", 20)
        found = await topic_messages(default, "Topology")
        assert sorted(m.body for m in found) == sorted(bodies)
        assert {m.store_host for m in found} == {master_addr}  # (read from the slave's copy)
        async with AdminClient(default) as admin:
            route = await admin.topic_route("Topology")
        [broker] = route.broker_datas
        assert broker.broker_addrs == {1: f"127.0.0.1:{moved[10921]}"}, broker


@pytest.mark.slow
async def test_with_make_runs_master_killed_produce_names_it_and_a_new_group_reads_quietly(
    tmp_path: Path,
) -> None:
    """conf/1m-1s-sync, the master killed: ``hamq produce`` to a topic that exists says
    its broker group has no master (not that no broker serves the topic), and a group
    new to the slave consumes what is there without a warning about its %RETRY% topic
    (the slave has it from the group's heartbeat)."""
    profile = tmp_path / "1m-1s-sync"
    moved = copy_profile("1m-1s-sync", profile, tmp_path / "data")
    namesrv = f"127.0.0.1:{moved[9876]};127.0.0.1:{moved[9877]}"
    master_addr, slave_addr = (f"127.0.0.1:{moved[p]}" for p in (10911, 10921))
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: 1m-1s-sync", READY_S)
        await wait_for(lambda: first_slave_in_sync(master_addr), 30, every_s=0.1)
        sent = await hamq_command("produce", "-n", namesrv, "--topic", "Quiet", "--count", "10")
        assert sent.returncode == 0 and b"10 acknowledged (SEND_OK)" in sent.stdout, sent

        os.kill(up.table_pids()["broker-a"], signal.SIGKILL)
        await up.stderr_until(r"broker-a \(master, pid \d+\) exited unexpectedly", 20)
        refused = await hamq_command(
            *("produce", "-n", namesrv, "--topic", "Quiet", "--count", "1"),
            *("--send-timeout", "3", "--attempt-timeout", "3"),
        )
        said = refused.stderr.decode()
        assert refused.returncode == 1, said
        why = (
            f"no broker group serving it has a master now: broker-a (only broker 1 at {slave_addr})"
        )
        assert f"warning: topic Quiet exists, but {why}" in said, said
        assert f"the last: route: topic Quiet exists, but {why}" in said, said
        assert "auto-creates" not in said, said

        # --idle-exit 4: it runs on after the last message, while the old answer
        # (TOPIC_NOT_EXIST for %RETRY%Fresh, every 3 s) would have been logged
        read = await hamq_command(
            *("consume", "-n", namesrv, "--topic", "Quiet", "--group", "Fresh"),
            *("--from", "first", "--idle-exit", "4", "-q"),
        )
        said = read.stderr.decode()
        assert read.returncode == 0 and "consumed 10 message(s) from Quiet as Fresh" in said, said
        assert "%RETRY%" not in said and "TOPIC_NOT_EXIST" not in said, said
        topics = tmp_path / "data" / "broker-a-1" / "config" / "topics.json"
        # (the heartbeat reached the slave, which wrote its topics: at once, bounded here)
        await wait_for(lambda: "%RETRY%Fresh" in topics.read_text(), 10)
