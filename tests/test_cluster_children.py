"""One child of ``hamq cluster up`` (cli/children.py) on its own: a real process,
spawned as ``up`` spawns it, watched until its ready line and until it ends; what it
prints goes to its log, and its ready line tells its address (and a broker's
nameservers). No supervisor, no server: a Python one-liner stands in for the command,
each wait bounded.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import trio

from cli.children import Child, open_log, spawn
from cli.profiles import ChildSpec, Kind


def start(tmp_path: Path, code: str, kind: Kind = Kind.MASTER) -> Child:
    """``code`` run by this Python as a child of kind ``kind``, its log in tmp_path."""
    log_path = tmp_path / "p-child.log"
    log = open_log(log_path)
    process = spawn([sys.executable, "-c", code], log)
    return Child(ChildSpec("child", kind, ()), process, log_path, log)


async def stop(child: Child) -> None:
    if child.process.returncode is None:
        child.process.kill()
    with trio.fail_after(10):
        await child.process.wait()
    await child.process.aclose()
    child.log.close()


async def test_a_brokers_ready_line_gives_its_address_and_nameservers(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "print('starting', flush=True)\n"
        "print('hamq broker ready: broker-a (master, id 0) at 127.0.0.1:10911, "
        "nameserver 127.0.0.1:9876;127.0.0.1:9877', flush=True)\n"
        "print('after ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = start(tmp_path, code)
    try:
        assert await child.until_ready() is None
        assert child.ready_at is not None
        assert child.address == "127.0.0.1:10911"
        assert child.namesrvs == ["127.0.0.1:9876", "127.0.0.1:9877"]
    finally:
        await stop(child)
    log = (tmp_path / "p-child.log").read_text()
    assert log.startswith("starting\nhamq broker ready: broker-a (master, id 0) at ")


async def test_a_nameservers_ready_line_gives_its_address(tmp_path: Path) -> None:
    code = "import time\nprint('hamq nameserver ready: 127.0.0.1:9876', flush=True)\ntime.sleep(60)"
    child = start(tmp_path, code, Kind.NAMESERVER)
    try:
        assert await child.until_ready() is None
        assert child.address == "127.0.0.1:9876"
        assert child.namesrvs == []
    finally:
        await stop(child)


async def test_a_child_that_ends_before_its_ready_line_says_how(tmp_path: Path) -> None:
    code = "import sys\nprint('cannot bind', flush=True)\nsys.exit(3)"
    child = start(tmp_path, code)
    try:
        assert await child.until_ready() == "ended before it was ready (exit code 3)"
        assert child.ready_at is None
        assert child.address == "-"
    finally:
        await stop(child)
    assert (tmp_path / "p-child.log").read_text() == "cannot bind\n"


async def test_until_exit_copies_stdout_to_the_log_and_says_how_it_ended(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"  # the child prints again only once until_ready has returned
    code = (
        "import os, pathlib, signal, time\n"
        "print('hamq nameserver ready: 127.0.0.1:9876', flush=True)\n"
        f"while not pathlib.Path({str(go)!r}).exists():\n"
        "    time.sleep(0.01)\n"
        "print('serving', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(60)\n"
    )
    child = start(tmp_path, code, Kind.NAMESERVER)
    try:
        assert await child.until_ready() is None
        assert (tmp_path / "p-child.log").read_text() == "hamq nameserver ready: 127.0.0.1:9876\n"
        go.touch()
        with trio.fail_after(20):
            how = await child.until_exit()
        assert how == "exited unexpectedly (killed by SIGTERM)"
        assert child.process.returncode == -signal.SIGTERM
    finally:
        await stop(child)
    log = (tmp_path / "p-child.log").read_text()
    assert log == "hamq nameserver ready: 127.0.0.1:9876\nserving\n"
