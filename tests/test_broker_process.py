"""Real ``hamq`` processes on loopback: the README's commands, restarts, kill -9."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from hamq.client import MessageExt, SimpleConsumer
from tests.support.brokers import SMALL_STORE, small_store_toml
from tests.support.metrics import scrape, value
from tests.support.processes import (
    free_ports,
    hamq_command,
    hamq_process,
    hamq_server,
    read_ready_line,
    ready_addresses,
    stop,
    write_toml,
)
from tests.support.timing import wait_for
from tests.support.tls import make_pki

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


class FakeNameserver:
    """A port where registrations fail: each request is read whole and its connection
    closed unanswered, and counted (``tries``): proof that the broker tried again."""

    def __init__(self) -> None:
        self.tries = 0
        self.port = 0
        self.scope = trio.CancelScope()

    async def _refuse(self, stream: trio.SocketStream) -> None:
        async with stream:
            received = b""
            with trio.move_on_after(10):
                while len(received) < 4 or len(received) < 4 + int.from_bytes(received[:4]):
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    received += chunk
            self.tries += 1

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            await trio.serve_listeners(self._refuse, listeners, task_status=task_status)


def broker_toml(tmp_path: Path, namesrv: str | None, **extra: object) -> Path:
    """A broker registering with ``namesrv`` (retried every second; None: its embedded
    one, on a free port), small store files."""
    values: dict[str, object] = {
        "listen_port": 0,
        **({"namesrv_addrs": namesrv.split(";")} if namesrv else {"embedded_namesrv_port": 0}),
        "register_interval_s": 1.0,
        **extra,
        "store": {"store_dir": str(tmp_path / "store"), **SMALL_STORE},
    }
    return write_toml(tmp_path / "broker.toml", values)


def said(log: Path, text: str) -> int:
    return log.read_text().count(text)


async def test_a_broker_is_ready_once_a_nameserver_accepts_it_and_says_once_why_not(
    tmp_path: Path,
) -> None:
    """Its only nameserver fails every registration: it serves, is not ready, says why
    once however often it tries; the nameserver comes up on that port: ready."""
    fake = FakeNameserver()
    out, log = tmp_path / "broker.out", tmp_path / "broker.log"
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        namesrv = f"127.0.0.1:{fake.port}"
        async with hamq_process(
            "broker", "-c", str(broker_toml(tmp_path, namesrv)), stdout=out, stderr=log
        ):
            await wait_for(lambda: fake.tries >= 4, 30, what="4 registrations tried")
            assert out.read_text() == "", out.read_text()  # not ready after 4 tries
            failed = f"registering with nameserver {namesrv} failed"
            assert said(log, failed) == 1, log.read_text()
            assert said(log, "clients find this broker once one accepts") == 1

            fake.scope.cancel()  # the port comes free: a real nameserver there
            async with hamq_server("nameserver", "--port", str(fake.port)):
                line = await wait_for(lambda: out.read_text(), 30, what="the ready line")
                assert line.startswith("hamq broker ready: broker broker-a at "), line
                assert f"nameserver {namesrv}, " in line, line
                await wait_for(lambda: said(log, f"registered with nameserver {namesrv} again"))
            # still said once for the fake's refusals (a try between the fake's end and the
            # nameserver's start may find the port closed: a new reason, said once more)
            assert said(log, f"{failed}: {namesrv}: connection closed") == 1, log.read_text()


async def test_a_broker_with_one_of_its_nameservers_down_is_ready_and_says_so_once(
    tmp_path: Path,
) -> None:
    fake = FakeNameserver()
    log = tmp_path / "broker.log"
    async with trio.open_nursery() as nursery, hamq_server("nameserver", "--port", "0") as ns:
        await nursery.start(fake.serve)
        down, up = f"127.0.0.1:{fake.port}", ns[1].rsplit(" ", 1)[1]
        config = broker_toml(tmp_path, f"{up};{down}")
        async with hamq_process("broker", "-c", str(config), stderr=log) as proc:
            line = await read_ready_line(proc, "the broker")
            assert f"nameserver {up};{down}, " in line, line
            await wait_for(lambda: fake.tries >= 3, 30, what="3 registrations tried")
            assert said(log, f"registering with nameserver {down} failed") == 1, log.read_text()
            assert "clients find this broker once one accepts" not in log.read_text()
        nursery.cancel_scope.cancel()


async def test_a_tls_broker_that_cannot_verify_its_own_nameserver_is_not_ready(
    tmp_path: Path,
) -> None:
    """The case once reported: --tls-cert without --tls-ca, its embedded nameserver's
    certificate signed by a CA the system does not know: "certificate verify failed",
    said once while the handshakes fail (counted by the nameserver's metrics); with
    --tls-ca it is ready."""
    pki = make_pki(tmp_path)
    (metrics_port,) = free_ports(1)
    out, log = tmp_path / "broker.out", tmp_path / "broker.log"
    config = broker_toml(tmp_path, None)
    tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    broker = ("broker", "-c", str(config), "--metrics-port", str(metrics_port), *tls)
    async with hamq_process(*broker, stdout=out, stderr=log):

        async def refused_thrice() -> bool:
            try:
                metrics = await scrape(metrics_port)
            except OSError:  # (not listening yet)
                return False
            failures = "hamq_nameserver_tls_handshake_failures"
            return value(metrics, failures, "_total") >= 3

        await wait_for(refused_thrice, 30, every_s=0.2, what="3 handshakes failed")
        assert out.read_text() == "", out.read_text()
        assert said(log, "certificate verify failed") == 1, log.read_text()
    async with hamq_process(*broker, "--tls-ca", str(pki.ca), stderr=log) as proc:
        assert (await read_ready_line(proc, "the broker")).startswith("hamq broker ready: ")


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


async def test_pop_from_the_command_line_and_across_a_kill(tmp_path: Path) -> None:
    """``hamq consume --pop`` acks what it prints; messages popped and not acked when
    the broker is killed (-9) come back once after a restart, acked ones never."""
    store = str(tmp_path / "store")
    config = str(small_store_toml(tmp_path))
    broker = ("broker", "-c", config, "--port", "0", "--namesrv-port", "0", "--store-dir", store)
    pop = ("consume", "--pop", "--topic", "popped", "--group", "g")
    async with hamq_server(*broker) as (proc, line):
        _, ns = ready_addresses(line)
        sent = await hamq_command("produce", "-t", "popped", "-c", "20", "-n", ns, "p{i}")
        assert sent.returncode == 0, sent.stderr
        got = await hamq_command(*pop, "--count", "5", "-n", ns)
        assert got.returncode == 0, got.stderr
        printed = [line.rsplit(" ", 1)[1] for line in got.stdout.decode().splitlines()]
        assert len(printed) == 5
        async with SimpleConsumer("g", ns) as consumer:
            consumer.subscribe("popped")
            held: list[MessageExt] = []
            with trio.fail_after(20):
                while len(held) < 15:
                    held += await consumer.receive(32, invisible_s=3, await_s=1)
            for message in held[:5]:
                await consumer.ack(message)
        assert await stop(proc, signal.SIGKILL) == -signal.SIGKILL
    acked = set(printed) | {m.body.decode() for m in held[:5]}
    unacked = {m.body.decode() for m in held[5:]}
    assert len(acked) == 10 and len(unacked) == 10

    async with hamq_server(*broker) as (proc, line):
        _, ns = ready_addresses(line)
        back = await hamq_command(*pop, "--count", "10", "--idle-exit", "30", "-n", ns)
        assert back.returncode == 0, back.stderr
        again = {line.rsplit(" ", 1)[1] for line in back.stdout.decode().splitlines()}
        assert again == unacked
        rest = await hamq_command(*pop, "--idle-exit", "4", "-n", ns)
        assert b"consumed 0 message(s)" in rest.stderr, rest.stdout
