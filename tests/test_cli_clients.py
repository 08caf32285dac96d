"""``hamq produce`` and ``hamq consume`` as people use them (issue 13): riding out a
master that hangs, Ctrl-C, a closed stdout (``| head``), exactly ``--count`` messages,
a topic that does not exist yet, delay levels, and every error as one line.

Every command runs as a real ``hamq`` process at its default log level, against real
servers on 127.0.0.1 with ports found free at run time; every wait is bounded and every
process is killed by PID at the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

from hamq.client import AdminClient, ClientError, Message, Producer, PullConsumer
from hamq.client.message import PullStatus
from hamq.client.route_cache import TimedOutAddresses
from tests.autoswitch_support import autoswitch_cluster
from tests.ha_support import ha_status
from tests.processes import (
    broker_process,
    free_ports,
    hamq_as_run,
    hamq_process,
    hamq_server,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(broker address, nameserver address) of one broker and its embedded nameserver."""
    with broker_process(tmp_path_factory.mktemp("cli-clients-broker")) as addresses:
        yield addresses


@pytest.fixture
def namesrv(broker: tuple[str, str]) -> str:
    return broker[1]


async def until(what: str, check: Callable[[], Awaitable[object]], timeout_s: float = 30) -> None:
    """Poll ``check`` until it is truthy (bounded)."""
    with trio.move_on_after(timeout_s):
        while True:
            if await check():
                return
            await trio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def stored(namesrv: str, topic: str) -> int:
    """How many messages ``topic``'s queues hold."""
    async with AdminClient(namesrv) as admin:
        try:
            return sum(s.max_offset - s.min_offset for s in await admin.queue_status(topic))
        except ClientError:
            return 0


async def bodies(namesrv: str, topic: str) -> list[str]:
    """Every body ``topic``'s queues hold (from the master)."""
    found = []
    async with PullConsumer("cli-clients-check", namesrv) as consumer:
        for queue in await consumer.queues(topic):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, max_nums=256)
                if result.status is not PullStatus.FOUND:
                    break
                found += [m.body.decode() for m in result.messages]
                offset = result.next_begin_offset
    return found


def one_error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The command's stderr, which must be one ``error: ...`` line."""
    err = done.stderr.decode()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


def printed_bodies(stdout: bytes) -> list[str]:
    """The bodies ``hamq consume`` printed (the last field of each line)."""
    return [line.rsplit(" ", 1)[1] for line in stdout.decode().splitlines()]


# ---------------------------------------------------------------- produce through failover

FAILOVER_TOPIC = "HungMaster"
FAILOVER_COUNT = 3000


async def test_produce_rides_out_a_master_that_hangs(
    tmp_path: Path, report: Callable[[str], None]
) -> None:
    """SIGSTOP, not kill: the master's connections stay open and its sends time out; a
    new master is elected and the command goes on to send every message. (Every
    member of the SyncStateSet has what was acknowledged: the new master has it all.)"""
    out, err = tmp_path / "produce.out", tmp_path / "produce.err"
    config = {"all_ack_in_sync_state_set": True}
    async with autoswitch_cluster(tmp_path / "cluster", broker_config=config) as cluster:
        state = await cluster.wait_in_sync(3)
        master = cluster.broker_at(state["masterAddress"])
        assert master is not None

        async def master_stores() -> bool:
            status = await ha_status(master.address)
            return bool(status["master"]["max_offset"] > 0)

        args = ["produce", "-t", FAILOVER_TOPIC, "-c", str(FAILOVER_COUNT), "m{i}"]
        async with hamq_process(*args, "-n", cluster.namesrv, stdout=out, stderr=err) as proc:
            await until("sends go through", master_stores)
            master.send_signal(signal.SIGSTOP)
            assert proc.returncode is None, "sent everything before the master hung"

            async def new_master() -> bool:
                address = (await cluster.group_state()).get("masterAddress")
                return address not in (None, master.address)

            await until("a new master", new_master)
            with trio.fail_after(60):
                code = await proc.wait()
        output = out.read_text() + err.read_text()
        assert code == 0, output
        assert f"sent {FAILOVER_COUNT} message(s) to {FAILOVER_TOPIC}" in output, output
        assert f"{FAILOVER_COUNT} acknowledged (SEND_OK)" in output, output
        report(out.read_text().strip())
        found = set(await bodies(cluster.namesrv, FAILOVER_TOPIC))
        missing = {f"m{i}" for i in range(FAILOVER_COUNT)} - found
        assert not missing, f"{len(missing)} not on the new master, e.g. {sorted(missing)[:5]}"


async def test_produce_interrupted_says_what_was_sent(namesrv: str, tmp_path: Path) -> None:
    out, err = tmp_path / "produce.out", tmp_path / "produce.err"
    args = ["produce", "-t", "Interrupted", "-c", "1000000", "-n", namesrv]
    async with hamq_process(*args, stdout=out, stderr=err) as proc:
        await until("sends go through", lambda: stored(namesrv, "Interrupted"))
        os.kill(proc.pid, signal.SIGINT)
        with trio.fail_after(30):
            code = await proc.wait()
    summary = out.read_text()
    assert code == 130, summary + err.read_text()
    match = re.search(
        r"sent (\d+) of 1000000 message\(s\) to Interrupted .*; (\d+) acknowledged \(SEND_OK\)",
        summary,
    )
    assert match, summary
    assert int(match.group(1)) >= 1 and match.group(1) == match.group(2), summary
    assert err.read_text() == ""


# ---------------------------------------------------------------- a closed stdout


async def test_consume_into_a_pipe_closed_early_ends_quietly(namesrv: str, tmp_path: Path) -> None:
    """``hamq consume ... | head -3``."""
    produced = await hamq_as_run("produce", "-t", "Piped", "-c", "200", "-n", namesrv)
    assert produced.returncode == 0, produced.stderr
    err = tmp_path / "consume.err"
    args = ["consume", "-t", "Piped", "-g", "piped", "-n", namesrv]
    async with hamq_process(*args, stderr=err) as proc:
        assert proc.stdout is not None
        lines = b""
        with trio.fail_after(30):
            while lines.count(b"\n") < 3:
                chunk = await proc.stdout.receive_some()
                assert chunk, err.read_text()
                lines += chunk
        await proc.stdout.aclose()
        with trio.fail_after(30):
            code = await proc.wait()
    assert code in (0, 141)
    assert err.read_text() == ""


async def closed_pipe_run(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run ``hamq <args>`` with stdout a pipe whose reader has gone before anything is
    written (the first write fails); its exit code and stderr."""
    read, write = os.pipe()
    os.close(read)
    err = tmp_path / "command.err"
    try:
        async with hamq_process(*args, stdout=write, stderr=err) as proc:
            with trio.fail_after(30):
                code = await proc.wait()
    finally:
        os.close(write)
    return code, err.read_text()


@pytest.mark.parametrize(
    "command",
    [
        ["topic", "list"],
        ["topic", "status", "Piped2"],
        ["admin", "cluster"],
        ["produce", "-t", "Piped2", "-c", "3"],
        ["consume", "-t", "Piped2", "-g", "piped2"],
    ],
)
async def test_output_into_a_closed_pipe_ends_quietly(
    command: list[str], namesrv: str, tmp_path: Path
) -> None:
    made = await hamq_as_run("produce", "-t", "Piped2", "-n", namesrv)
    assert made.returncode == 0, made.stderr
    code, err = await closed_pipe_run(tmp_path, *command, "-n", namesrv)
    assert code in (0, 141), err
    assert err == ""


async def test_controller_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    port, raft = free_ports(2)
    args = ["controller", "--port", str(port), "--raft-address", f"127.0.0.1:{raft}"]
    args += ["--raft-peers", f"127.0.0.1:{raft}", "--controller-dir", str(tmp_path / "ctl")]
    async with hamq_server(*args):
        for command in (["sync-state-set"], ["sync-state-set", "--json"]):
            code, err = await closed_pipe_run(
                tmp_path, "admin", *command, "--controller", f"127.0.0.1:{port}"
            )
            assert code in (0, 141), err
            assert err == ""
        # and a controller given as the nameserver says what it is
        done = await hamq_as_run("topic", "list", "-n", f"127.0.0.1:{port}")
        assert done.returncode == 1
        assert one_error_line(done) == (
            f"error: 127.0.0.1:{port} is not a nameserver (it looks like a controller)"
        )
    code, err = await closed_pipe_run(tmp_path, "version")
    assert code in (0, 141), err
    assert err == ""


# ---------------------------------------------------------------- consume --count


async def test_consume_count_prints_and_commits_exactly_that_many(namesrv: str) -> None:
    produced = await hamq_as_run("produce", "-t", "Counted", "-c", "50", "-n", namesrv, "c{i}")
    assert produced.returncode == 0, produced.stderr
    seen: list[str] = []
    for count in (10, 10, 30):
        got = await hamq_as_run(
            "consume", "-t", "Counted", "-g", "counted", "-c", str(count), "-n", namesrv
        )
        assert got.returncode == 0, got.stderr
        printed = printed_bodies(got.stdout)
        assert len(printed) == count, got.stdout.decode()
        seen += printed
    assert sorted(seen) == sorted(f"c{i}" for i in range(50))  # no gap, no repeat
    rest = await hamq_as_run(
        "consume", "-t", "Counted", "-g", "counted", "--idle-exit", "1", "-n", namesrv
    )
    assert rest.returncode == 0 and rest.stdout == b"", rest.stdout


# ---------------------------------------------------------------- a topic not there yet


async def test_consume_says_once_that_the_topic_does_not_exist_yet(
    namesrv: str, tmp_path: Path
) -> None:
    err = tmp_path / "consume.err"
    args = ["consume", "-t", "NotYet", "-g", "waiting", "-n", namesrv]
    async with hamq_process(*args, stderr=err) as proc:
        assert proc.stdout is not None

        async def said() -> bool:
            return "NotYet does not exist" in err.read_text()

        await until("the consumer says the topic does not exist", said)
        produced = await hamq_as_run("produce", "-t", "NotYet", "-n", namesrv, "at last")
        assert produced.returncode == 0, produced.stderr
        line = b""
        with trio.fail_after(30):  # the consumer looks again until the topic is there
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some()
                assert chunk, err.read_text()
                line += chunk
        assert line.endswith(b" at last\n")
        os.kill(proc.pid, signal.SIGINT)
        with trio.fail_after(30):
            await proc.wait()
    assert err.read_text().count("does not exist") == 1, err.read_text()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("level", ["99", "19", "-1"])
async def test_an_out_of_range_delay_level_is_refused(level: str) -> None:
    done = await hamq_as_run("produce", "-t", "T", "--delay-level", level, "-n", "127.0.0.1:1")
    assert done.returncode == 2
    assert "--delay-level" in one_error_line(done)


async def test_a_negative_delay_level_is_refused_by_the_producer() -> None:
    producer = Producer("PG", "127.0.0.1:1")
    with pytest.raises(ValueError, match="delay_level -1 is negative"):
        await producer.send(Message("T", b"x", delay_level=-1))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["produce", "-t", "T", "--bogus"], "error: no such option: --bogus"),
        (["produce"], "error: missing option '--topic'"),
        (["consume", "-t", "T"], "error: missing option '--group'"),
        (["--log-level", "loud", "version"], "'loud' is not a log level"),
        (["topic", "nosuch"], "error: no such command 'nosuch'"),
    ],
)
async def test_usage_errors_are_one_line(args: list[str], error: str) -> None:
    done = await hamq_as_run(*args)
    assert done.returncode == 2
    assert error in one_error_line(done)
    assert done.stdout == b""


@pytest.mark.parametrize("args", [["-h"], ["produce", "-h"], ["topic", "--help"]])
async def test_help_still_works(args: list[str]) -> None:
    done = await hamq_as_run(*args)
    assert done.returncode == 0, done.stderr
    assert b"Usage: " in done.stdout


# ---------------------------------------------------------------- servers that are not there


CLIENT_COMMANDS = [
    ["produce", "-t", "T"],
    ["consume", "-t", "T", "-g", "g"],
    ["topic", "list"],
    ["admin", "cluster"],
]


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
async def test_an_unreachable_nameserver_is_named_once(command: list[str]) -> None:
    (port,) = free_ports(1)  # nothing listens there
    done = await hamq_as_run(*command, "-n", f"127.0.0.1:{port}", timeout_s=30)
    assert done.returncode == 1
    line = one_error_line(done)
    assert line.count(f"127.0.0.1:{port}") == 1 and "connection refused" in line, line


async def test_an_unreachable_broker_is_named_once() -> None:
    (port,) = free_ports(1)  # nothing listens there
    done = await hamq_as_run("admin", "ha-status", "--broker", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert one_error_line(done) == f"error: 127.0.0.1:{port}: cannot connect: connection refused"


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
async def test_a_broker_given_as_the_nameserver_is_named(
    command: list[str], broker: tuple[str, str]
) -> None:
    address = broker[0]
    done = await hamq_as_run(*command, "-n", address, timeout_s=30)
    assert done.returncode == 1
    assert one_error_line(done) == f"error: {address} is not a nameserver (it looks like a broker)"


def test_a_timed_out_address_is_avoided_for_as_long_as_its_try_waited() -> None:
    timed_out = TimedOutAddresses()
    timed_out.add("127.0.0.1:1", 100.0, 5.0)
    assert timed_out.avoided("127.0.0.1:1", 104.9)
    assert not timed_out.avoided("127.0.0.1:2", 104.9)
    assert not timed_out.avoided("127.0.0.1:1", 105.0)
    timed_out.add("127.0.0.1:1", 200.0, 5.0)
    timed_out.discard("127.0.0.1:1")  # it answered
    assert not timed_out.avoided("127.0.0.1:1", 201.0)
