"""``hamq cluster up``: a profile's nameserver, master and slave as real processes.

The profiles are written into tmp_path with ports found free at run time (sockets bound
to 127.0.0.1:0 and closed just before the start) and small store files. ``cluster up``
runs as a child process; its children are found from the table it prints (and, should
a test fail early, from /proc), and every one is killed by PID in ``finally``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import tomllib
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from hamq.client import Message, Producer, PullConsumer, SendStatus
from tests.support.cluster import (
    READY_S,
    STOP_S,
    Ports,
    cluster_up,
    wait_gone,
    write_profile,
)
from tests.support.processes import free_ports, hamq_command, write_toml
from tests.support.tls import server_files


@pytest.mark.slow
async def test_a_sync_group_comes_up_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "sync-group", tmp_path / "data", ports)
    ns = f"127.0.0.1:{ports.namesrv}"
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: sync-group, 3 process\(es\)", READY_S)
        pids = up.table_pids()
        assert set(pids) == {f"nameserver-{ports.namesrv}", "master", "slave"}, up.text
        for row in (
            rf"│ nameserver-{ports.namesrv} +│ nameserver +│ - +│ - +│ {ns} ",
            rf"│ master +│ master +│ SYNC_MASTER +│ 0 +│ 127\.0\.0\.1:{ports.master} ",
            rf"│ slave +│ slave +│ SLAVE +│ 1 +│ 127\.0\.0\.1:{ports.slave} ",
        ):
            assert re.search(row, up.text), (row, up.text)
        assert f"clients: --namesrv {ns}" in up.text

        async with Producer("PG", ns, send_timeout_s=3) as producer:
            with trio.fail_after(15):  # SEND_OK once the slave is connected and in sync
                while True:
                    sent = await producer.send(Message("Demo", b"first"))
                    if sent.status is SendStatus.SEND_OK:
                        break
                    await trio.sleep(0.1)
            results = [await producer.send(Message("Demo", f"m{i}".encode())) for i in range(5)]
        assert [r.status for r in results] == [SendStatus.SEND_OK] * 5

        bodies = []
        async with PullConsumer("CG", ns) as consumer:
            with trio.fail_after(10):
                for queue in await consumer.queues("Demo"):
                    result = await consumer.pull(queue, 0, max_nums=32)
                    bodies += [m.body for m in result.messages]
        assert {f"m{i}".encode() for i in range(5)} <= set(bodies)

        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(STOP_S):
            code = await up.proc.wait()
        text = await up.read_to_end(5)
        assert code == 0, text + (tmp_path / "cluster-up.stderr").read_text()
        assert not await wait_gone(list(pids.values())), text
        # slaves first, then masters, then nameservers; each stopped by SIGTERM
        order = [
            re.search(rf"^  {name} \(.*\): ended .* after SIGTERM", text, re.M)
            for name in (
                "slave",
                "master",
                f"nameserver-{ports.namesrv}",
            )
        ]
        assert all(order), text
        starts = [m.start() for m in order if m]
        assert starts == sorted(starts), text
        logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
        assert logs == [
            "sync-group-master.log",
            f"sync-group-nameserver-{ports.namesrv}.log",
            "sync-group-slave.log",
        ]
        assert "hamq broker ready:" in (tmp_path / "logs" / "sync-group-slave.log").read_text()


@pytest.mark.slow
async def test_a_child_that_cannot_start_stops_the_others(tmp_path: Path) -> None:
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "doomed", tmp_path / "data", ports)
    with socket.socket() as taken:  # the slave's port is in use: the slave exits at once
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", ports.slave))
        taken.listen()
        async with cluster_up(profile, tmp_path / "logs") as up:
            with trio.fail_after(READY_S + STOP_S):
                code = await up.proc.wait()
            text = await up.read_to_end(5)
    errors = (tmp_path / "cluster-up.stderr").read_text()
    assert code == 1, text + errors
    assert re.search(r"error: slave \(slave, pid \d+\) ended before it was ready", errors), errors
    assert "doomed-slave.log" in errors, errors
    started = [int(pid) for pid in re.findall(r"ready at \S+ in [\d.]+ s \(pid (\d+)\)", text)]
    assert len(started) == 2, text  # the nameserver and the master
    assert re.search(r"^  master \(.*\): ended .* after SIGTERM \(exit code 0\)", text, re.M)
    assert not await wait_gone(started), text


@pytest.mark.slow
async def test_a_profile_with_bad_toml_exits_2_naming_the_file(tmp_path: Path) -> None:
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "broken", tmp_path / "data", ports)
    (profile / "slave.toml").write_text('broker_name = "broker-t\n')
    done = await hamq_command("cluster", "up", "--profile", str(profile), timeout_s=30)
    assert done.returncode == 2, done
    error = done.stderr.decode()
    assert error.startswith(f"error: {profile / 'slave.toml'} is not valid TOML"), error
    assert error.count("\n") == 1, error
    assert not (tmp_path / "data").exists()  # nothing started


runner = CliRunner()


def test_an_unknown_profile_is_refused_listing_the_known_ones() -> None:
    result = runner.invoke(app, ["cluster", "up", "--profile", "no-such-profile"])
    assert result.exit_code == 2
    assert "profile 'no-such-profile' not found" in result.output
    assert "1m-1s-sync" in result.output


def test_a_profile_without_brokers_is_refused(tmp_path: Path) -> None:
    write_toml(tmp_path / "cluster.toml", {"nameserver_ports": [9876]})
    result = runner.invoke(app, ["cluster", "up", "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert f"profile {tmp_path} has no broker" in result.output


def test_a_bad_broker_setting_is_refused_naming_its_file(tmp_path: Path) -> None:
    write_toml(tmp_path / "b.toml", {"broker_id": 1, "store": {"role": "SYNC_MASTER"}})
    result = runner.invoke(app, ["cluster", "up", "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'b.toml'}: broker_id 1 does not fit role SYNC_MASTER" in result.output


def test_two_brokers_on_one_port_are_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_toml(
            tmp_path / f"{name}.toml",
            {
                "broker_name": name,
                "listen_port": 20911,
                "namesrv_addrs": ["127.0.0.1:9876"],
                "store": {"store_dir": str(tmp_path / name)},
            },
        )
    result = runner.invoke(app, ["cluster", "up", "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'b.toml'}: port 20911 is also {tmp_path / 'a.toml'}'s" in result.output


def test_the_shipped_profiles_load() -> None:
    from cli.profiles import Kind, load_profile

    kinds = {
        name: [c.kind for c in load_profile(name).children]
        for name in ("1m-1s-sync", "2m-2s-sync", "2m-2s-async")
    }
    assert kinds["1m-1s-sync"] == [Kind.MASTER, Kind.SLAVE]
    assert (
        kinds["2m-2s-sync"]
        == kinds["2m-2s-async"]
        == [Kind.NAMESERVER] * 2 + [Kind.MASTER] * 2 + [Kind.SLAVE] * 2
    )


MIB = 1024 * 1024
#: consume queues a demo store gets files for: a few topics of 4 queues each, their
#: %RETRY% topics and the delay levels of SCHEDULE_TOPIC_XXXX
DEMO_QUEUES_PER_STORE = 32


@pytest.mark.parametrize("name", ["1m-1s-sync", "2m-2s-sync", "2m-2s-async", "autoswitch"])
def test_a_demo_profile_reserves_well_under_a_gigabyte(name: str) -> None:
    """Every store file is reserved whole (posix_fallocate): the first CommitLog segment,
    the first index file and one file per consume queue that gets a message."""
    from cli.profiles import load_profile
    from hamq.broker import build_config
    from hamq.store.consume_queue import ENTRY_SIZE
    from hamq.store.index import HEADER_SIZE

    profile = load_profile(name)
    reserved = 0
    for path in sorted(profile.directory.glob("*.toml")):
        if path.name == "cluster.toml":
            continue
        store = build_config(tomllib.loads(path.read_text())).store
        index = HEADER_SIZE + 4 * store.index_hash_slots + 20 * store.index_max_entries
        queues = DEMO_QUEUES_PER_STORE * ENTRY_SIZE * store.consume_queue_entries_per_file
        reserved += store.commitlog_segment_bytes + index + queues
    assert reserved < 512 * MIB, f"{name}: {reserved / MIB:.0f} MiB"


README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_runs_the_shipped_profiles() -> None:
    """Each ``hamq cluster up --profile X`` of the README names a profile of conf/, and
    the synopsis lists them all."""
    from cli.profiles import profile_names

    known = set(profile_names())
    text = README.read_text()
    synopsis = re.search(r"^hamq cluster up (\[.*\] )?--profile (.*)$", text, re.M)
    assert synopsis, "no `hamq cluster up` in the README's synopsis"
    listed = [name.strip() for name in synopsis.group(2).split("|")]
    assert set(listed) == known | {"DIR"}, listed
    for used in re.findall(r"cluster up --profile ([\w.-]+)", text):
        assert used in known, used


def test_the_readme_autoswitch_example_is_the_profile() -> None:
    """The broker TOML of "Automatic failover" has conf/autoswitch's addresses."""
    text = README.read_text()
    section = text.split("## Automatic failover", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block, "no TOML example under Automatic failover"
    example = tomllib.loads(block.group(1))
    profile = tomllib.loads(
        (
            Path(__file__).resolve().parent.parent / "conf" / "autoswitch" / "broker-a-n0.toml"
        ).read_text()
    )
    for key in ("broker_name", "listen_port", "namesrv_addrs", "controller_addrs"):
        assert example[key] == profile[key], key


@pytest.mark.slow
async def test_a_tls_profile_comes_up_registered_and_tells_clients_the_ca(tmp_path: Path) -> None:
    """conf/1m-1s-sync with TLS on every port: ``up`` asks the brokers' embedded
    nameservers over TLS (with the brokers' own TLS settings) whether they know both
    brokers, so it says ready without a warning, and names the CA clients need."""
    from tests.support.processes import copy_profile

    pki = server_files(tmp_path)
    ca_file, cert, key = pki.ca, pki.cert, pki.key
    profile = tmp_path / "tls"
    moved = copy_profile("1m-1s-sync", profile, tmp_path / "data")
    tls = f"\n[remoting.tls]\ncert_file = '{cert}'\nkey_file = '{key}'\nca_file = '{ca_file}'\n"
    for path in profile.glob("*.toml"):
        path.write_text(path.read_text() + tls)
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: tls, 2 process\(es\)", READY_S)
        assert f"TLS: hamq --tls-ca {ca_file} ..." in up.text, up.text
        assert "warning" not in up.stderr.read_text()
        namesrv = f"127.0.0.1:{moved[9876]};127.0.0.1:{moved[9877]}"
        sent = await hamq_command(
            "--tls-ca", str(ca_file), "produce", "-n", namesrv, "-t", "T", "x"
        )
        assert sent.returncode == 0, sent.stderr
        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(STOP_S):
            assert await up.proc.wait() == 0, await up.read_to_end(5)
