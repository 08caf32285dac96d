"""``hamq cluster up`` as a supervisor: a child that dies is reported in one line while
the others keep running, and (``--restart``) started again with a backoff, given up
after quick failures in a row; the children die with ``up`` (SIGKILL, SIGHUP); earlier
logs are rotated, never emptied.

Real processes on 127.0.0.1 with ports found free at run time (tests/test_cluster.py's
profile and ``cluster_up``, which kills every process it saw by PID at the end); every
wait is bounded and polls a condition.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path

import pytest
import trio

from cli.children import open_log, spawn
from cli.supervisor import RESTART_GIVE_UP, restart_delay
from hamq.client import Message, Producer, SendStatus
from tests.support.cluster import (
    READY_S,
    STOP_S,
    Ports,
    alive,
    cluster_up,
    wait_gone,
    write_profile,
)
from tests.support.processes import free_ports

#: how long ``up`` may take to notice a death and say so
NOTICE_S = 15
#: how long children may take to stop once ``up`` is gone (SIGTERM: they stop cleanly)
ORPHAN_S = 30


def ready_pattern(profile: str) -> str:
    return rf"^hamq cluster ready: {profile}, 3 process\(es\)"


# ---------------------------------------------------------------- pieces
def test_earlier_logs_are_rotated_not_emptied(tmp_path: Path) -> None:
    log = tmp_path / "p-broker.log"
    (tmp_path / "p-broker.log.1").write_text("two runs ago\n")
    log.write_text("the last run\n")
    with open_log(log) as f:
        f.write(b"this run\n")
    assert log.read_text() == "this run\n"
    assert (tmp_path / "p-broker.log.1").read_text() == "the last run\n"
    with open_log(log) as f:  # an empty log does not push the last one out
        pass
    with open_log(log) as f:
        pass
    assert (tmp_path / "p-broker.log.1").read_text() == "this run\n"


@pytest.mark.parametrize(
    ("quick_failures", "delay_s"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (RESTART_GIVE_UP, None), (9, None)],
)
def test_restarts_back_off_then_give_up(quick_failures: int, delay_s: float | None) -> None:
    assert restart_delay(quick_failures) == delay_s


async def test_children_are_forked_by_the_main_thread_with_a_parent_death_signal(
    tmp_path: Path,
) -> None:
    """The parent-death signal fires when the *thread* that forked the child ends: a
    worker thread (trio's open_process uses one, idle ones end after 10 s) would take
    the children along long before ``up`` ends."""
    code = (
        "import ctypes, time\n"
        "sig = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print(sig.value, flush=True)\n"
        "time.sleep(60)\n"
    )
    with (tmp_path / "child.log").open("ab") as log:
        child = spawn([sys.executable, "-c", code], log)
    try:
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                chunk = await child.stdout.receive_some(64)
                assert chunk, "the child ended"
                line += chunk
        assert int(line) == signal.SIGTERM
        assert child.pid in forked_by(threading.main_thread().native_id)
        assert os.getpgid(child.pid) == child.pid  # its own process group: not our Ctrl-C
    finally:
        child.kill()
        with trio.fail_after(10):
            await child.wait()
        await child.stdout.aclose()
    assert child.returncode == -signal.SIGKILL


def forked_by(thread_id: int | None) -> set[int]:
    """The children a thread of this process forked."""
    children = Path(f"/proc/{os.getpid()}/task/{thread_id}/children").read_text()
    return {int(pid) for pid in children.split()}


# ---------------------------------------------------------------- up dies
@pytest.mark.slow
async def test_kill_9_of_up_takes_its_children_along(tmp_path: Path) -> None:
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "orphans", tmp_path / "data", ports)
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(ready_pattern("orphans"), READY_S)
        pids = up.table_pids()
        assert len(pids) == 3, up.text
        os.kill(up.proc.pid, signal.SIGKILL)
        with trio.fail_after(10):
            assert await up.proc.wait() == -signal.SIGKILL
        assert not await wait_gone(list(pids.values()), ORPHAN_S), pids


@pytest.mark.slow
async def test_sighup_of_up_stops_the_cluster_as_sigterm_does(tmp_path: Path) -> None:
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "hangup", tmp_path / "data", ports)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "hangup-master.log").write_text("an earlier run\n")
    async with cluster_up(profile, logs) as up:
        await up.read_until(ready_pattern("hangup"), READY_S)
        pids = up.table_pids()
        os.kill(up.proc.pid, signal.SIGHUP)
        with trio.fail_after(STOP_S):
            code = await up.proc.wait()
        text = await up.read_to_end(5)
        errors = up.stderr.read_text()
        assert code == 0, text + errors
        assert "SIGHUP: stopping the cluster" in errors, errors
        for name in ("slave", "master", f"nameserver-{ports.namesrv}"):
            assert re.search(
                rf"^  {name} \(.*\): ended .* after SIGTERM \(exit code 0\)", text, re.M
            )
        assert not await wait_gone(list(pids.values())), text
    assert (logs / "hangup-master.log.1").read_text() == "an earlier run\n"
    assert "hamq broker ready:" in (logs / "hangup-master.log").read_text()


# ---------------------------------------------------------------- a child dies
@pytest.mark.slow
async def test_a_dead_slave_is_one_line_and_the_others_keep_running(tmp_path: Path) -> None:
    """Without controllers ``--restart`` is off by default."""
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "norestart", tmp_path / "data", ports)
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(ready_pattern("norestart"), READY_S)
        assert "restarts: off" in up.text, up.text
        pids = up.table_pids()
        os.kill(pids["slave"], signal.SIGKILL)
        await up.stderr_until(
            rf"^error: slave \(slave, pid {pids['slave']}\) exited unexpectedly "
            r"\(killed by SIGKILL\); not started again \(--no-restart\), the others keep "
            r"running; its log: \S+norestart-slave\.log$",
            NOTICE_S,
        )
        # the master still serves (without its slave a SYNC_MASTER stores and says so)
        async with Producer("PG", f"127.0.0.1:{ports.namesrv}", send_timeout_s=5) as producer:
            sent = await producer.send(Message("Demo", b"alone"))
        assert sent.status is SendStatus.SLAVE_NOT_AVAILABLE
        assert up.proc.returncode is None
        assert [name for name, pid in pids.items() if not alive(pid)] == ["slave"]
        assert len(up.stderr.read_text().splitlines()) == 1, up.stderr.read_text()

        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(STOP_S):
            code = await up.proc.wait()
        text = await up.read_to_end(5)
    assert code == 1, text
    assert re.search(r"^  slave \(.*\): had already ended \(killed by SIGKILL\)", text, re.M)
    assert re.search(r"^  master \(.*\): ended .* after SIGTERM \(exit code 0\)", text, re.M)


@pytest.mark.slow
async def test_restart_brings_a_slave_back_and_gives_up_on_one_that_cannot_start(
    tmp_path: Path,
) -> None:
    ports = Ports(*free_ports(4))
    profile = write_profile(tmp_path / "restarts", tmp_path / "data", ports)
    logs = tmp_path / "logs"
    async with cluster_up(profile, logs, "--restart") as up:
        await up.read_until(ready_pattern("restarts"), READY_S)
        assert "restarts: on" in up.text, up.text
        pids = up.table_pids()
        os.kill(pids["slave"], signal.SIGKILL)
        again = await up.read_until(
            rf"^  slave: slave ready again at 127\.0\.0\.1:{ports.slave} in [\d.]+ s "
            r"\(pid (\d+), restart 1\)$",
            NOTICE_S + READY_S,
        )
        restarted = int(again.group(1))
        assert restarted != pids["slave"] and alive(restarted)
        errors = up.stderr.read_text().splitlines()
        assert len(errors) == 1, errors
        assert re.fullmatch(
            rf"warning: slave \(slave, pid {pids['slave']}\) exited unexpectedly \(killed by "
            r"SIGKILL\); starting it again in [\d.]+ s",
            errors[0],
        ), errors
        assert all(alive(pids[name]) for name in pids if name != "slave")
        # the same log, appended: both starts are in it
        log = (logs / "restarts-slave.log").read_text()
        assert log.count("hamq broker ready:") == 2, log
        # the new slave replicates: the SYNC_MASTER acknowledges sends again
        async with Producer("PG", f"127.0.0.1:{ports.namesrv}", send_timeout_s=3) as producer:
            with trio.fail_after(20):
                while True:
                    sent = await producer.send(Message("Demo", b"m"))
                    if sent.status is SendStatus.SEND_OK:
                        break
                    await trio.sleep(0.1)

        # from now on it cannot start (its file no longer parses): a few quick tries, then
        # one line saying it gave up; the others keep running
        (profile / "slave.toml").write_text('broker_name = "broken\n')
        os.kill(restarted, signal.SIGKILL)
        await up.stderr_until(
            rf"^error: slave \(slave, pid \d+\) .*; {RESTART_GIVE_UP} quick failures in a row: "
            r"not starting it again; its log: \S+restarts-slave\.log$",
            READY_S * 2,
        )
        # one line per end: the kill, then starts that failed after longer and longer
        # pauses, the last one giving up (how many: the kills count among the quick
        # failures in a row when they came soon after a start)
        errors = up.stderr.read_text().splitlines()
        kill = (
            rf"warning: slave \(slave, pid {restarted}\) exited unexpectedly \(killed by SIGKILL\)"
        )
        assert re.match(kill, errors[1]), errors
        failed = r"ended before it was ready \(exit code 2\)"
        tries = [
            re.fullmatch(rf"warning: slave \(.*\) {failed}; starting it again in ([\d.]+) s", e)
            for e in errors[2:-1]
        ]
        assert all(tries) and 1 <= len(tries) < RESTART_GIVE_UP, errors
        pauses = [float(m.group(1)) for m in tries if m]
        assert pauses == sorted(set(pauses)), errors
        assert pauses[-1] == restart_delay(RESTART_GIVE_UP - 1), errors
        assert re.search(failed, errors[-1]), errors
        assert up.proc.returncode is None
        assert all(alive(pids[name]) for name in pids if name != "slave")

        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(STOP_S):
            code = await up.proc.wait()
        text = await up.read_to_end(5)
    assert code == 1, text
    assert re.search(r"^  master \(.*\): ended .* after SIGTERM \(exit code 0\)", text, re.M)
