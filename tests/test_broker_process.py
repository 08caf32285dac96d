"""Real ``hamq`` processes on loopback: the README's commands, restarts, kill -9."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.brokers import small_store_toml
from tests.support.processes import (
    hamq_command,
    hamq_process,
    hamq_server,
    read_ready_line,
    ready_addresses,
    stop,
)

pytestmark = pytest.mark.slow


async def test_produce_and_consume_from_the_command_line_across_restarts(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    config = str(small_store_toml(tmp_path))
    broker = ("broker", "-c", config, "--port", "0", "--namesrv-port", "0", "--store-dir", store)
    async with hamq_server(*broker) as (proc, line):
        _, ns = ready_addresses(line)
        sent = await hamq_command("produce", "--topic", "demo", "--count", "1000", "-n", ns)
        assert sent.returncode == 0, sent.stderr
        assert b"sent 1000 message(s) to demo" in sent.stdout
        got = await hamq_command(
            "consume", "--topic", "demo", "--group", "g", "-n", ns, "--count", "1000", "-q"
        )
        assert got.returncode == 0, got.stderr
        assert b"consumed 1000 message(s) from demo as g" in got.stderr
        assert await stop(proc) == 0  # SIGTERM: a clean stop that writes the offsets
    assert (tmp_path / "store" / "config" / "consumerOffset.json").exists()

    async with hamq_server(*broker) as (proc, line):
        _, ns = ready_addresses(line)
        # the group's offsets survived: nothing is delivered twice
        again = await hamq_command(
            "consume", "--topic", "demo", "--group", "g", "-n", ns, "--idle-exit", "2", "-q"
        )
        assert b"consumed 0 message(s)" in again.stderr, again.stderr
        sent = await hamq_command("produce", "--topic", "demo", "--count", "10", "-n", ns)
        assert sent.returncode == 0
        os_exit = await stop(proc, signal.SIGKILL)  # no clean stop at all
        assert os_exit == -signal.SIGKILL

    async with hamq_server(*broker) as (proc, line):
        _, ns = ready_addresses(line)
        # every message survived the kill: a new group reads all 1010
        everything = await hamq_command(
            "consume", "--topic", "demo", "--group", "g2", "-n", ns, "--count", "1010", "-q"
        )
        assert b"consumed 1010 message(s)" in everything.stderr, everything.stderr
        status = await hamq_command("topic", "status", "demo", "-n", ns)
        assert status.returncode == 0 and b"demo@broker-a:0" in status.stdout


async def test_a_standalone_nameserver_and_a_broker_that_registers_with_it(tmp_path: Path) -> None:
    async with hamq_server("nameserver", "--port", "0") as (_, ns_line):
        ns = ns_line.rsplit(" ", 1)[1]
        async with hamq_server(
            "broker",
            *("-c", str(small_store_toml(tmp_path)), "--port", "0", "-n", ns),
            *("--store-dir", str(tmp_path / "store"), "--name", "b1"),
        ) as (_, line):
            broker_addr, _ = ready_addresses(line)
            made = await hamq_command("topic", "create", "Made", "--queues", "2", "-n", ns)
            assert made.returncode == 0, made.stderr
            assert f"topic Made: 2 queue(s) on {broker_addr}".encode() in made.stdout
            listed = await hamq_command("topic", "list", "-n", ns)
            assert b"Made" in listed.stdout.split()
            route = await hamq_command("topic", "route", "Made", "-n", ns)
            assert b"b1" in route.stdout and broker_addr.encode() in route.stdout
            cluster = await hamq_command("admin", "cluster", "-n", ns)
            assert b"DefaultCluster" in cluster.stdout


async def test_a_master_says_it_is_master_in_its_log_not_slave(tmp_path: Path) -> None:
    """At its default log level; the store starts taking no sends (the broker makes it
    master once it serves), and its line says so rather than naming a role."""
    config = str(small_store_toml(tmp_path))
    log = tmp_path / "broker.log"
    async with hamq_process(
        *("broker", "-c", config, "--port", "0", "--namesrv-port", "0"),
        *("--store-dir", str(tmp_path / "store")),
        stderr=log,
    ) as proc:
        await read_ready_line(proc, "hamq broker")
        assert await stop(proc) == 0
    text = log.read_text()
    assert "message store running in " in text, text  # (the line had its chance)
    assert "SLAVE" not in text, text
    assert "STARTING -> MASTER (configured master" in text, text


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["broker", "--port", "70000"], "listen_port"),
        (["broker", "-c", "/nonexistent/broker.toml"], "cannot read /nonexistent/broker.toml"),
        (["broker", "--flush", "SOMETIMES"], "'SOMETIMES' is not a valid FlushDiskType"),
        (["broker", "-n", "nohost"], "bad address 'nohost'"),
        (["produce", "--topic", "bad topic"], "may only contain"),
        (["consume", "--topic", "T", "--group", "g", "--from", "middle"], "--from 'middle'"),
        (["produce", "--topic", "T", "--count", "0"], "Invalid value for '--count'"),
    ],
)
def test_bad_command_lines_are_named(args: list[str], error: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert error in result.output


def test_an_unreachable_nameserver_is_named() -> None:
    result = runner.invoke(app, ["topic", "list", "-n", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert "no nameserver answered: 127.0.0.1:1" in result.output
