"""The README's Security walkthrough, taken from README.md and run line by line in a
shell, as a reader would type it:

    hamq cluster up --profile acl             (in the background: the first terminal)
    export HAMQ_ACCESS_KEY=... HAMQ_SECRET_KEY=...
    hamq produce ...                          (each line checked against its comment)

Two things differ from a reader's machine, neither in the lines themselves: ``hamq`` is
this checkout's (a script on PATH), and the profile's ports are moved to free ones
(tests/support/processes.py copy_profile, into tmp_path: ``--profile acl`` names that copy,
the one word replaced) with HAMQ_NAMESRV naming its nameservers, which the CLI's
default names at the shipped ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import attrs
import pytest
import trio

from tests.support.cluster import child_pids
from tests.support.processes import ROOT, copy_profile, kill_and_reap, open_child, user_env

README = ROOT / "README.md"
#: the comment that starts the second terminal's lines (as in the failover walkthrough)
SECOND_TERMINAL = "# in a second terminal:"
#: what each command of the walkthrough must do, by the promise its comment makes:
#: (exit code, text its output must hold); ``up`` is checked by its ready line
PROMISES = {
    "signed: allowed": (0, "10 acknowledged (SEND_OK)"),
    "the 10 messages, as demo-group": (0, "consumed 10 message(s) from Demo as demo-group"),
    "NO_PERMISSION: No PUB permission for topic Other": (
        1,
        "No PUB permission for topic Other (AccessKey demo-app)",
    ),
}
READY_S = 60
COMMAND_S = 60
STOP_S = 30


@attrs.frozen
class Line:
    """One line of the walkthrough: the command as written, and its comment."""

    command: str
    comment: str


def walkthrough() -> tuple[Line, list[Line]]:
    """The Security section's sh block: the first terminal's one command, and the
    second terminal's lines."""
    section = README.read_text().split("\n## Security\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "no sh block in the README's Security section"
    text = block.group(1)
    assert SECOND_TERMINAL in text, f"the walkthrough does not say {SECOND_TERMINAL!r}"
    first, second = text.split(SECOND_TERMINAL, 1)
    return _one(_lines(first)), _lines(second)


def _lines(text: str) -> list[Line]:
    lines = []
    for raw in text.splitlines():
        command, _, comment = raw.partition(" #")
        if command.strip():
            lines.append(Line(command.strip(), comment.strip()))
    return lines


def _one(lines: list[Line]) -> Line:
    assert len(lines) == 1, f"the first terminal runs one command: {lines}"
    return lines[0]


def hamq_on_path(directory: Path) -> Path:
    """A directory holding ``hamq``: this checkout's CLI, as an installed one runs."""
    directory.mkdir()
    script = directory / "hamq"
    script.write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec "
        f'{shlex.quote(sys.executable)} -m cli.main "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


async def in_shell(
    script: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(COMMAND_S):
        return await anyio.run_process(
            ["sh", "-c", script], stdin=subprocess.DEVNULL, cwd=cwd, env=env, check=False
        )


@pytest.mark.slow
async def test_the_readme_security_walkthrough(tmp_path: Path) -> None:
    up_line, lines = walkthrough()
    assert up_line.command == "hamq cluster up --profile acl", up_line
    moved = copy_profile("acl", tmp_path / "acl", tmp_path / "data")
    (tmp_path / "acl" / "plain_acl.yml").write_text(
        (ROOT / "conf" / "acl" / "plain_acl.yml").read_text()
    )
    env = {
        **user_env(),
        "PATH": f"{hamq_on_path(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}",
        "HAMQ_NAMESRV": f"127.0.0.1:{moved[9876]};127.0.0.1:{moved[9877]}",
    }
    command = up_line.command.replace("--profile acl", f"--profile {tmp_path / 'acl'}")
    out, ready = bytearray(), b"hamq cluster ready: acl, 2 process(es)"
    with (tmp_path / "up.stderr").open("wb") as stderr:
        up = await open_child(["sh", "-c", f"exec {command}"], cwd=tmp_path, env=env, stderr=stderr)
    try:
        assert up.stdout is not None
        with trio.fail_after(READY_S):
            async for chunk in up.stdout:
                out += chunk
                if ready in out:
                    break
        assert ready in out, out.decode() + (tmp_path / "up.stderr").read_text()
        assert "master and slave with ACL on" in up_line.comment

        exports: list[str] = []
        checked = set()
        for line in lines:
            if line.command.startswith("export "):
                exports.append(line.command)
                continue
            assert line.comment in PROMISES, f"no check for the README's promise: {line}"
            code, text = PROMISES[line.comment]
            done = await in_shell("\n".join([*exports, line.command]), tmp_path, env)
            output = (done.stdout + done.stderr).decode()
            assert done.returncode == code, f"{line.command}: {output}"
            assert text in output, f"{line.command}: {output}"
            checked.add(line.comment)
        assert checked == set(PROMISES), (
            f"the walkthrough no longer shows {set(PROMISES) - checked}"
        )

        os.kill(up.pid, signal.SIGINT)  # (Ctrl-C in the first terminal)
        with trio.fail_after(STOP_S):
            assert await up.wait() == 0, (tmp_path / "up.stderr").read_text()
    finally:
        children = child_pids(up.pid)
        await kill_and_reap(up)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
