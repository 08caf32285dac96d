"""``hamq produce`` and ``hamq consume`` as people use them: riding out a
master that hangs, Ctrl-C, a closed stdout (``| head``), exactly ``--count`` messages,
a topic that does not exist yet, delay levels, every error as one line; loading a
broker (``--concurrency``, ``--batch``), the live progress at a terminal and the summary
lines elsewhere, ``--version`` and shell completion.

Every command runs as a real ``hamq`` process at its default log level, against real
servers on 127.0.0.1 with ports found free at run time; every wait is bounded and every
process is killed by PID at the end. "At a terminal" is a pseudo-terminal (``pty``).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shlex
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from anyio.abc import Process

from hamq.client import Message, Producer
from hamq.client.route_cache import TimedOutAddresses
from tests.support.autoswitch import autoswitch_cluster
from tests.support.brokers import stored, topic_messages
from tests.support.ha import ha_status
from tests.support.processes import (
    HAMQ_AS_RUN,
    ROOT,
    broker_process,
    free_ports,
    hamq_as_run,
    hamq_process,
    hamq_server,
    kill_and_reap,
    open_child,
    user_env,
)
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(broker address, nameserver address) of one broker and its embedded nameserver."""
    # (transactions checked back within a second or two: produce --transaction unknown)
    fast_checks = "transaction_timeout_s = 1.0\ntransaction_check_interval_s = 0.5"
    with broker_process(tmp_path_factory.mktemp("cli-clients-broker"), fast_checks) as addresses:
        yield addresses


@pytest.fixture
def namesrv(broker: tuple[str, str]) -> str:
    return broker[1]


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
            await wait_for(master_stores, 30, every_s=0.05, what="sends go through")
            master.send_signal(signal.SIGSTOP)
            assert proc.returncode is None, "sent everything before the master hung"

            async def new_master() -> bool:
                address = (await cluster.group_state()).get("masterAddress")
                return address not in (None, master.address)

            await wait_for(new_master, 30, every_s=0.05, what="a new master")
            with trio.fail_after(60):
                code = await proc.wait()
        output = out.read_text() + err.read_text()
        assert code == 0, output
        assert f"sent {FAILOVER_COUNT} message(s) to {FAILOVER_TOPIC}" in output, output
        assert f"{FAILOVER_COUNT} acknowledged (SEND_OK)" in output, output
        report(out.read_text().strip())
        found = {m.body.decode() for m in await topic_messages(cluster.namesrv, FAILOVER_TOPIC)}
        missing = {f"m{i}" for i in range(FAILOVER_COUNT)} - found
        assert not missing, f"{len(missing)} not on the new master, e.g. {sorted(missing)[:5]}"


async def test_produce_interrupted_says_what_was_sent(namesrv: str, tmp_path: Path) -> None:
    out, err = tmp_path / "produce.out", tmp_path / "produce.err"
    args = ["produce", "-t", "Interrupted", "-c", "1000000", "-n", namesrv]
    async with hamq_process(*args, stdout=out, stderr=err) as proc:
        await wait_for(
            lambda: stored(namesrv, "Interrupted"), 30, every_s=0.05, what="sends go through"
        )
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
            async for chunk in proc.stdout:
                lines += chunk
                if lines.count(b"\n") >= 3:
                    break
        assert lines.count(b"\n") >= 3, err.read_text()
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


async def test_produce_deliver_after_and_at_are_consumed_at_their_time(namesrv: str) -> None:
    """Timer messages from the command line: each comes once, never before its time
    (the copy's store time against the delivery time the broker was asked for)."""
    at = time.time() + 2
    at_text = datetime.fromtimestamp(at, UTC).isoformat()
    for flags in (["--deliver-after", "1500ms"], ["--deliver-at", at_text]):
        produced = await hamq_as_run("produce", "-t", "Timed", *flags, "-n", namesrv, "t")
        assert produced.returncode == 0, produced.stderr
        assert "1 acknowledged (SEND_OK)" in produced.stdout.decode()
    got = await hamq_as_run(
        "consume", "-t", "Timed", "-g", "timed", "-c", "2", "--idle-exit", "20", "-n", namesrv
    )
    assert got.returncode == 0, got.stderr
    assert printed_bodies(got.stdout) == ["t", "t"]
    messages = await topic_messages(namesrv, "Timed")
    assert len(messages) == 2
    for message in messages:
        due = int(message.properties["TIMER_OUT_MS"])
        assert message.store_timestamp >= due
    after, at_ = sorted(messages, key=lambda m: "TIMER_DELIVER_MS" in m.properties)
    assert after.properties["TIMER_DELAY_MS"] == "1500"
    assert int(at_.properties["TIMER_DELIVER_MS"]) == pytest.approx(at * 1000, abs=1)
    assert int(at_.properties["TIMER_OUT_MS"]) == int(at_.properties["TIMER_DELIVER_MS"])


# ---------------------------------------------------------------- loading a broker

#: the summary line of hamq consume (stderr)
CONSUMED = re.compile(
    r"consumed (\d+) message\(s\) from (\S+) as (\S+) in [\d.]+s \([\d,]+ msgs/s\)"
)


async def test_produce_concurrency_and_batches_send_each_message_once(namesrv: str) -> None:
    """4 tasks sending batches of 10: every message stored once, and both summaries
    exact; into pipes, neither command draws any progress (no escape codes)."""
    produced = await hamq_as_run(
        "produce", "-t", "Loaded", "-c", "1000", "--concurrency", "4", "--batch", "10",
        "-n", namesrv, "L{i}",
    )  # fmt: skip
    out = produced.stdout.decode()
    assert produced.returncode == 0, out + produced.stderr.decode()
    assert "sent 1000 message(s) to Loaded" in out, out
    assert "1000 acknowledged (SEND_OK)" in out, out
    assert out.count("\n") == 1 and produced.stderr == b"", out + produced.stderr.decode()
    assert await stored(namesrv, "Loaded") == 1000
    got = await hamq_as_run("consume", "-t", "Loaded", "-g", "loaded", "-c", "1000", "-n", namesrv)
    assert got.returncode == 0, got.stderr
    printed = printed_bodies(got.stdout)
    assert len(printed) == 1000 and set(printed) == {f"L{i}" for i in range(1000)}
    err = got.stderr.decode()
    summary = CONSUMED.fullmatch(err.strip())
    assert summary and summary.groups() == ("1000", "Loaded", "loaded"), err
    assert b"\x1b" not in produced.stdout + got.stdout + got.stderr


async def test_produce_batches_echo_each_message(namesrv: str) -> None:
    """Few messages: one line per message, a batch's with consecutive queue offsets."""
    produced = await hamq_as_run(
        "produce", "-t", "Echoed", "-c", "7", "--batch", "3", "--concurrency", "2",
        "-n", namesrv, "e{i}",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    lines = produced.stdout.decode().splitlines()
    assert len(lines) == 8, lines
    numbered = sorted(int(line.split()[0][1:]) for line in lines[:7])
    assert numbered == list(range(7)), lines
    assert "sent 7 message(s) to Echoed" in lines[7] and "7 acknowledged" in lines[7]
    # the messages of one batch are stored one after the other in one queue
    by_number = {int(line.split()[0][1:]): line.split() for line in lines[:7]}
    for first in (0, 3):
        queues = {by_number[i][2] for i in range(first, first + 3)}
        offsets = [int(by_number[i][4]) for i in range(first, first + 3)]
        assert len(queues) == 1 and offsets == list(range(offsets[0], offsets[0] + 3)), lines


async def test_produce_in_transactions_commits_rolls_back_and_answers_check_backs(
    namesrv: str,
) -> None:
    """--transaction commit: delivered; rollback: never; unknown: the command stays until
    the broker checked each one back, answers --check-answer (commit), and they are
    delivered then."""
    outputs = {}
    for state, body in (("commit", "c{i}"), ("rollback", "r{i}"), ("unknown", "u{i}")):
        done = await hamq_as_run(
            "produce", "-t", "InTx", "-c", "3", "--transaction", state, "-n", namesrv, body
        )
        assert done.returncode == 0, done.stderr
        outputs[state] = done.stdout.decode()
    assert outputs["commit"].count(" COMMIT_MESSAGE\n") == 3, outputs["commit"]
    assert outputs["rollback"].count(" ROLLBACK_MESSAGE\n") == 3, outputs["rollback"]
    unknown = outputs["unknown"]
    assert unknown.count(" UNKNOW\n") == 3 and unknown.count("checked back: id") == 3, unknown
    assert "checked back 3 of 3 transaction(s), answered COMMIT_MESSAGE" in unknown
    got = await hamq_as_run(
        "consume", "-t", "InTx", "-g", "in-tx", "--idle-exit", "2", "-n", namesrv
    )
    assert got.returncode == 0, got.stderr
    assert sorted(printed_bodies(got.stdout)) == ["c0", "c1", "c2", "u0", "u1", "u2"]


# ---------------------------------------------------------------- progress at a terminal


class Ran:
    """How a command run at a terminal ended: its exit code, what the terminal showed
    and (when stdout was a pipe) its stdout."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.terminal = b""
        self.stdout = b""

    def shows(self, pattern: bytes) -> bool:
        return re.search(pattern, self.terminal) is not None


async def run_at_terminal(
    *args: str,
    stdout: str = "terminal",
    during: Callable[[Process, Ran], Awaitable[None]] | None = None,
    timeout_s: float = 60,
) -> Ran:
    """Run ``hamq <args>`` to the end with stderr a pseudo-terminal (120 columns) and
    stdout the same terminal, a pipe (``"pipe"``, read here) or a pipe whose reader has
    gone (``"closed"``); ``during(process, ran)`` runs meanwhile. The process is killed
    by PID at the end."""
    ran = Ran()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    env = {**user_env(), "TERM": "xterm-256color"}
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    out: int = slave
    if stdout == "pipe":
        out = subprocess.PIPE
    elif stdout == "closed":
        read, out = os.pipe()
        os.close(read)
    try:
        proc = await open_child([*HAMQ_AS_RUN, *args], stdout=out, stderr=slave, cwd=ROOT, env=env)
    finally:
        os.close(slave)
        if stdout == "closed":
            os.close(out)

    async def read_terminal() -> None:
        async with trio.lowlevel.FdStream(master) as terminal:
            while True:
                try:
                    chunk = await terminal.receive_some()
                except trio.BrokenResourceError:  # EIO: the command closed the terminal
                    return
                if not chunk:
                    return
                ran.terminal += chunk

    async def read_stdout() -> None:
        assert proc.stdout is not None
        async for chunk in proc.stdout:
            ran.stdout += chunk

    try:
        with trio.fail_after(timeout_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_terminal)
                if proc.stdout is not None:
                    nursery.start_soon(read_stdout)
                if during is not None:
                    await during(proc, ran)
                ran.code = await proc.wait()
    finally:
        await kill_and_reap(proc)
    return ran


#: rich's live display hides the cursor while it draws, and shows it again at the end
HIDE_CURSOR, SHOW_CURSOR = b"\x1b[?25l", b"\x1b[?25h"


async def test_produce_at_a_terminal_shows_its_progress(namesrv: str) -> None:
    ran = await run_at_terminal("produce", "-t", "Drawn", "-c", "2000", "-n", namesrv)
    screen = ran.terminal.decode(errors="replace")
    assert ran.code == 0, screen
    assert ran.shows(rb"produce Drawn\b.*\b2000/2000\b.*\bmsgs/s"), screen  # the last drawing
    assert HIDE_CURSOR in ran.terminal and ran.terminal.rfind(SHOW_CURSOR) > ran.terminal.rfind(
        HIDE_CURSOR
    ), screen
    assert ran.shows(rb"sent 2000 message\(s\) to Drawn .*2000 acknowledged"), screen


async def test_consume_at_a_terminal_keeps_its_progress_off_stdout(namesrv: str) -> None:
    """stdout a pipe (``hamq consume ... > file``), stderr a terminal: the messages go
    to stdout alone, the progress and the summary to the terminal."""
    produced = await hamq_as_run("produce", "-t", "Drawn2", "-c", "300", "-n", namesrv, "d{i}")
    assert produced.returncode == 0, produced.stderr
    args = ["consume", "-t", "Drawn2", "-g", "drawn", "-c", "300", "-n", namesrv]
    ran = await run_at_terminal(*args, stdout="pipe")
    screen = ran.terminal.decode(errors="replace")
    assert ran.code == 0, screen
    assert sorted(printed_bodies(ran.stdout)) == sorted(f"d{i}" for i in range(300))
    assert b"\x1b" not in ran.stdout
    assert ran.shows(rb"consume Drawn2\b.*\b300/300\b.*\bmsgs/s"), screen
    summary = CONSUMED.search(screen)  # after the display, erased
    assert summary and summary.groups() == ("300", "Drawn2", "drawn"), screen


async def test_produce_at_a_terminal_interrupted(namesrv: str) -> None:
    """Ctrl-C while the progress is drawn: the display ends, the summary says what
    was sent, exit code 130."""

    async def interrupt(proc: Process, ran: Ran) -> None:
        async def drawn() -> bool:
            return ran.shows(rb"\b[1-9]\d*/1000000\b")

        await wait_for(drawn, 30, every_s=0.05, what="the progress is drawn")
        os.kill(proc.pid, signal.SIGINT)

    args = ["produce", "-t", "Drawn3", "-c", "1000000", "-n", namesrv]
    ran = await run_at_terminal(*args, during=interrupt)
    screen = ran.terminal.decode(errors="replace")
    assert ran.code == 130, screen
    assert ran.terminal.rfind(SHOW_CURSOR) > ran.terminal.rfind(HIDE_CURSOR), screen
    assert ran.shows(rb"sent \d+ of 1000000 message\(s\) to Drawn3 "), screen
    assert b"Traceback" not in ran.terminal and b"error" not in ran.terminal, screen


async def test_consume_at_a_terminal_into_a_closed_pipe_ends_quietly(namesrv: str) -> None:
    made = await hamq_as_run("produce", "-t", "Drawn4", "-c", "5", "-n", namesrv)
    assert made.returncode == 0, made.stderr
    args = ["consume", "-t", "Drawn4", "-g", "drawn4", "-n", namesrv]
    ran = await run_at_terminal(*args, stdout="closed")
    screen = ran.terminal.decode(errors="replace")
    assert ran.code == 141, screen
    assert b"Traceback" not in ran.terminal and b"error" not in ran.terminal, screen
    assert b"consumed" not in ran.terminal, screen  # quiet, as cat is


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

        await wait_for(said, 30, every_s=0.05, what="the consumer says the topic does not exist")
        produced = await hamq_as_run("produce", "-t", "NotYet", "-n", namesrv, "at last")
        assert produced.returncode == 0, produced.stderr
        line = b""
        with trio.fail_after(30):  # the consumer looks again until the topic is there
            async for chunk in proc.stdout:
                line += chunk
                if line.endswith(b"\n"):
                    break
        assert line.endswith(b" at last\n"), line + err.read_text().encode()
        os.kill(proc.pid, signal.SIGINT)
        with trio.fail_after(30):
            await proc.wait()
    assert err.read_text().count("does not exist") == 1, err.read_text()


# ---------------------------------------------------------------- bodies from a file or stdin

#: the largest body produce sends (4 MiB: RocketMQ's maxMessageSize)
MAX_BODY = 4 * 1024 * 1024


def binary(size: int, seed: int) -> bytes:
    """``size`` bytes holding every byte value, newlines and NULs included."""
    return bytes((i * 131 + seed) % 256 for i in range(size))


async def test_produce_sends_a_body_file_larger_than_an_argument_can_hold(
    namesrv: str, tmp_path: Path
) -> None:
    """Issue 30: a body over ~128 KiB could not be given ("Argument list too long").
    --body-file sends a file's bytes as they are, binary too; --count sends it again."""
    data = binary(1024 * 1024, seed=7)
    path = tmp_path / "body.bin"
    path.write_bytes(data)
    done = await hamq_as_run(
        "produce", "-t", "BodyFile", "--body-file", str(path), "-c", "2", "--keys", "f{i}",
        "-n", namesrv,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sent 2 message(s) to BodyFile" in done.stdout.decode(), done.stdout
    found = await topic_messages(namesrv, "BodyFile")
    assert sorted(m.keys for m in found) == [["f0"], ["f1"]]
    assert [m.body == data for m in found] == [True, True]


async def test_produce_sends_stdin_one_message_a_line(namesrv: str) -> None:
    """'-': a message per line of stdin, its end (\\n or \\r\\n) dropped, its bytes as
    they are ('{i}' is not numbered in them); empty lines skipped and said so; --keys
    and --tags for each; --count takes the first lines."""
    lines = b"first\n\nsecond {i}\r\n\xff\x00third\n\nfourth"
    done = await hamq_as_run(
        "produce", "-t", "StdinLines", "-", "--keys", "s{i}", "--tags", "lined", "-n", namesrv,
        stdin=lines,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sent 4 message(s) to StdinLines" in done.stdout.decode(), done.stdout
    assert done.stderr.decode() == "skipped 2 empty line(s) of stdin: a message needs a body\n"
    found = {m.keys[0]: m for m in await topic_messages(namesrv, "StdinLines")}
    bodies = {key: m.body for key, m in found.items()}
    assert bodies == {"s0": b"first", "s1": b"second {i}", "s2": b"\xff\x00third", "s3": b"fourth"}
    assert {m.tags for m in found.values()} == {"lined"}
    first_two = await hamq_as_run(
        "produce", "-t", "StdinFirstLines", "-", "-c", "2", "-n", namesrv, stdin=b"a\nb\nc\n"
    )
    assert first_two.returncode == 0, first_two.stderr
    assert sorted(m.body for m in await topic_messages(namesrv, "StdinFirstLines")) == [b"a", b"b"]


async def test_produce_sends_all_of_stdin_as_one_message_with_whole(namesrv: str) -> None:
    data = binary(300 * 1024, seed=3)  # over what one argument can hold, newlines inside
    done = await hamq_as_run(
        "produce", "-t", "StdinWhole", "-", "--whole", "-c", "3", "--batch", "3", "-n", namesrv,
        stdin=data,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = await topic_messages(namesrv, "StdinWhole")
    assert [m.body == data for m in found] == [True, True, True]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("args", "stdin", "error"),
    [
        (["--body-file", "{tmp}/nothing-here"], None, "--body-file {tmp}/nothing-here: no such "
         "file or directory"),
        (["--body-file", "{tmp}"], None, "--body-file {tmp}: is a directory"),
        (["--body-file", "{tmp}/empty"], None, "--body-file {tmp}/empty is empty: a message "
         "needs a body"),
        (["--body-file", "{tmp}/large"], None, f"--body-file {{tmp}}/large is {MAX_BODY + 1} "
         f"bytes, over the largest message body, {MAX_BODY} bytes"),
        (["--body-file", "-"], b"x" * (MAX_BODY + 1), f"stdin is more than {MAX_BODY} bytes, "
         f"over the largest message body, {MAX_BODY} bytes"),
        (["-"], b"ok\n" + b"y" * (MAX_BODY + 1) + b"\n", f"line 2 of stdin is {MAX_BODY + 1} "
         f"bytes, over the largest message body, {MAX_BODY} bytes"),
        (["-"], b"\n\r\n", "stdin has no line to send"),
        (["-"], None, "stdin has no line to send"),
        (["-", "-c", "3"], b"a\nb\n", "--count 3: stdin has only 2 line(s) to send"),
        (["-", "--whole"], b"", "stdin is empty: a message needs a body"),
        (["text", "--body-file", "{tmp}/large"], None, "give BODY or --body-file, not both"),
        (["text", "--whole"], None, "--whole goes with BODY '-'"),
        (["--body-file", "-", "--whole"], b"x", "--whole goes with BODY '-'"),
    ],
    ids=[
        "missing-file", "directory", "empty-file", "file-too-large", "stdin-too-large",
        "line-too-long", "empty-lines-only", "no-stdin", "fewer-lines-than-count",
        "empty-whole", "body-and-file", "whole-without-stdin", "whole-with-file",
    ],
)  # fmt: skip
async def test_bad_bodies_are_refused_before_anything_is_sent(
    tmp_path: Path, args: list[str], stdin: bytes | None, error: str
) -> None:
    """One error line naming the file, the line, the size and the limit, exit code 2;
    nothing sent: the nameserver (none listens) is never asked."""
    _write(tmp_path / "empty", b"")
    _write(tmp_path / "large", b"z" * (MAX_BODY + 1))
    filled = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = await hamq_as_run("produce", "-t", "T", *filled, "-n", "127.0.0.1:1", stdin=stdin)
    *notes, line = done.stderr.decode().splitlines()
    assert done.returncode == 2, done.stderr
    assert line.startswith("error: ") and error.replace("{tmp}", str(tmp_path)) in line, line
    assert all(note.startswith("skipped ") for note in notes), notes  # (empty lines)
    assert done.stdout == b""


@pytest.mark.parametrize(
    ("body", "code", "error"),
    [
        ("-", 2, "error: stdin is closed: there are no bodies to read"),
        ("text", 1, "error: no nameserver answered: 127.0.0.1:1"),  # stdin not needed
    ],
    ids=["stdin-body", "text-body"],
)
async def test_produce_started_with_stdin_closed(body: str, code: int, error: str) -> None:
    """A command started with no stdin at all (``<&-``) reads none: '-' is refused by
    name, and any other body goes on as ever (no traceback)."""
    closed = ["sh", "-c", 'exec "$@" <&-', "sh", *HAMQ_AS_RUN]
    with trio.fail_after(60):
        done = await trio.run_process(
            [*closed, "produce", "-t", "T", body, "-n", "127.0.0.1:1"],
            capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT, env=user_env(),
        )  # fmt: skip
    assert done.returncode == code and one_error_line(done).startswith(error), done.stderr


async def test_a_body_over_the_brokers_own_limit_is_refused_naming_both(tmp_path: Path) -> None:
    """A broker whose store.max_message_bytes is below the client's 4 MiB refuses the
    message (MESSAGE_ILLEGAL, not retried): the error says refused, with the body's
    size and the broker's limit, not that the time ran out. (Random bytes: the client
    compresses a body over 4 KiB, and the broker's limit is on what it receives.)"""
    path = _write(tmp_path / "two-mib.bin", os.urandom(2 * 1024 * 1024))
    with broker_process(tmp_path, store_toml="max_message_bytes = 1048576\n") as (_, ns):
        done = await hamq_as_run("produce", "-t", "Limited", "--body-file", str(path), "-n", ns)
    line = one_error_line(done)
    assert done.returncode == 1, line
    assert "gave up on message #0: refused (1 attempt(s)" in line, line
    assert f"body of {2 * 1024 * 1024} bytes is over max_message_bytes 1048576" in line, line


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
    ("flags", "error"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "1025"], "--concurrency"),
        (["--batch", "0"], "--batch"),
        (["--batch", "1025"], "--batch"),
        (["--batch", "2", "--delay-level", "3"], "--batch cannot be used with --delay-level"),
        (["-c", "1000", "--batch", "1000", "x" * 5000], "--batch 1000: the batch of 1000"),
        (["--transaction", "commit", "--batch", "2"], "--transaction cannot be used with --batch"),
        (["--transaction", "unknown", "--delay-level", "2"], "cannot be used with --delay-level"),
        (["--transaction", "maybe"], "'maybe' is not one of 'commit', 'rollback', 'unknown'"),
        (["--transaction", "unknown", "--check-answer", "unknown"], "--check-answer"),
        (["--deliver-after", "soon"], "--deliver-after 'soon' is not a duration"),
        (["--deliver-after", "0s"], "--deliver-after '0s' is not a positive duration"),
        (["--deliver-at", "tomorrow"], "--deliver-at 'tomorrow' is not an ISO 8601 time"),
        (["--deliver-at", "2030-01-01", "--deliver-after", "5s"], "not both"),
        (["--batch", "2", "--deliver-after", "5s"], "--batch cannot be used with --deliver"),
        (["--delay-level", "2", "--deliver-after", "5s"], "--delay-level cannot be used"),
    ],
)
async def test_bad_produce_flags_are_refused(flags: list[str], error: str) -> None:
    done = await hamq_as_run("produce", "-t", "T", *flags, "-n", "127.0.0.1:1")
    assert done.returncode == 2
    assert error in one_error_line(done)
    assert done.stdout == b""


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


# ---------------------------------------------------------------- --version, completion


async def test_version_flag_says_what_the_version_command_says() -> None:
    flag, command = await hamq_as_run("--version"), await hamq_as_run("version")
    assert flag.returncode == command.returncode == 0, flag.stderr + command.stderr
    assert flag.stdout == command.stdout and flag.stdout.startswith(b"hamq "), flag.stdout
    assert flag.stderr == b""


async def test_show_completion_prints_the_shells_script() -> None:
    """The shell is found as typer finds it: the process that started hamq (``bash``)."""
    command = shlex.join([*HAMQ_AS_RUN, "--show-completion"])
    with trio.fail_after(60):
        done = await trio.run_process(
            ["bash", "-c", f"{command}; exit $?"],  # a command after: bash stays the parent
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
            env={**user_env(), "SHELL": "/bin/bash"},
        )
    assert done.returncode == 0, done.stderr
    script = done.stdout.decode()
    assert "complete -o default -F _hamq_completion hamq" in script, script
    assert "_HAMQ_COMPLETE=complete_bash" in script, script


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("hamq pro", "produce"),
        ("hamq produce --conc", "--concurrency"),
        ("hamq --ver", "--version"),
    ],
)
async def test_completion_answers_the_shell(words: str, expected: str) -> None:
    """What the completion script asks: hamq itself completes the words typed."""
    env = {
        **user_env(),
        "_HAMQ_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    with trio.fail_after(60):
        done = await trio.run_process(
            HAMQ_AS_RUN, capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT, env=env
        )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout.decode().split(), done.stdout


def test_a_produce_try_outlasts_every_answer_a_broker_makes_it_wait_for() -> None:
    """A try given up while the broker still works (a SYNC_FLUSH broker's 5 s fsync
    wait) would send a second copy: the CLI's per-try cap is above the brokers' waits."""
    from cli.produce import ATTEMPT_TIMEOUT_S
    from hamq.ha import HAConfig
    from hamq.store import StoreConfig

    waits = (StoreConfig(store_dir=ROOT).sync_flush_timeout_s, HAConfig().sync_timeout_s)
    assert max(waits) + 1 < ATTEMPT_TIMEOUT_S
