"""``hamq produce``'s message bodies: BODY, ``--body-file F`` or stdin, read and checked.

BODY is text whose '{i}' becomes each message's number (DEFAULT_BODY when none is
given); ``--body-file F`` is bytes as they are, one body for every message (``-``:
stdin); BODY ``-`` is stdin, one message a line (``--whole``: all of it one body).

Invariants: whatever is read is read whole (stdin to its end, or to COUNT lines) and
no further than one byte past MAX_BODY_BYTES, before anything is sent; bad input (a
body over MAX_BODY_BYTES, an empty one, stdin with no line or fewer than COUNT, a file
that cannot be read) ends the command with exit code 2 and one line naming it.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

import attrs
import typer

from cli.common import fail
from hamq.client.message import DEFAULT_MAX_MESSAGE_SIZE

#: produce's message body when BODY is not given
DEFAULT_BODY = "hello from hamq #{i}"
#: produce's BODY that reads the bodies from stdin: one message a line (--whole: one)
STDIN = "-"
#: the largest body produce sends: the producer's max_message_size, which is RocketMQ's
#: maxMessageSize and a broker's store.max_message_bytes by default
MAX_BODY_BYTES = DEFAULT_MAX_MESSAGE_SIZE


@attrs.frozen
class Bodies:
    """produce's message bodies: ``template``, text whose '{i}' becomes the message's
    number (BODY), or ``read``, bytes sent as they are (never numbered): one body for
    every message (--body-file, stdin --whole) or one per message (stdin's lines)."""

    template: str | None = None
    read: tuple[bytes, ...] = ()

    def __call__(self, i: int) -> str | bytes:
        if self.template is not None:
            return self.template.replace("{i}", str(i))
        return self.read[i] if len(self.read) > 1 else self.read[0]

    @property
    def per_message(self) -> bool:
        """Whether each message has a body of its own (else the first and the last
        messages are the largest: '{i}' only grows)."""
        return len(self.read) > 1


def _too_large(where: str, size: str) -> typer.Exit:
    return fail(
        f"{where} is {size} bytes, over the largest message body, {MAX_BODY_BYTES} bytes "
        "(RocketMQ's maxMessageSize, a broker's store.max_message_bytes by default); "
        "nothing was sent",
        2,
    )


def _regular_size(stream: BinaryIO) -> int | None:
    """The size of the regular file behind ``stream`` (a pipe or a terminal has none)."""
    try:
        status = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _read_whole(stream: BinaryIO, where: str) -> bytes:
    """All of ``stream`` as one body: bad input (empty, too large) ends the command
    (exit code 2), read no further than one byte past the largest body."""
    size = _regular_size(stream)
    if size is not None and size > MAX_BODY_BYTES:
        raise _too_large(where, str(size))
    data = stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        raise _too_large(where, f"more than {MAX_BODY_BYTES}")
    if not data:
        raise fail(f"{where} is empty: a message needs a body", 2)
    return data


def _read_lines(stream: BinaryIO, count: int | None) -> list[bytes]:
    """stdin's lines, one body each (without its line end, \\n or \\r\\n), up to
    ``count`` of them (else to the end); empty lines are skipped, and said so on stderr.
    Too long a line, or fewer than ``count``, ends the command (exit code 2)."""
    bodies: list[bytes] = []
    skipped = number = 0
    while count is None or len(bodies) < count:
        # (one byte past the largest body and its \r\n: a line longer is told apart)
        line = stream.readline(MAX_BODY_BYTES + 3)
        if not line:
            break
        number += 1
        ended = line.endswith(b"\n")
        body = line[:-1] if ended else line
        body = body[:-1] if body.endswith(b"\r") else body
        if len(body) > MAX_BODY_BYTES:
            raise _too_large(
                f"line {number} of stdin",
                str(len(body)) if ended else f"more than {MAX_BODY_BYTES}",
            )
        if body:
            bodies.append(body)
        else:
            skipped += 1
    if skipped:
        typer.echo(f"skipped {skipped} empty line(s) of stdin: a message needs a body", err=True)
    if not bodies:
        raise fail("stdin has no line to send (BODY '-': one message a line)", 2)
    if count is not None and len(bodies) < count:
        raise fail(f"--count {count}: stdin has only {len(bodies)} line(s) to send", 2)
    return bodies


def read_bodies(
    body: str | None, body_file: Path | None, whole: bool, count: int | None
) -> tuple[Bodies, int]:
    """produce's bodies and how many messages it sends (COUNT, else 1, else one per line
    of stdin). Bad input ends the command here (exit code 2), before anything is sent."""
    if body is not None and body_file is not None:
        raise fail("give BODY or --body-file, not both", 2)
    if whole and body != STDIN:
        raise fail("--whole goes with BODY '-' (stdin); --body-file is one body already", 2)
    if body == STDIN or body_file == Path(STDIN):
        return _stdin_bodies(lines=body == STDIN and not whole, count=count)
    if body_file is not None:
        try:
            with body_file.open("rb") as file:
                data = _read_whole(file, f"--body-file {body_file}")
        except OSError as exc:
            reason = str(exc.strerror or exc)
            raise fail(f"--body-file {body_file}: {reason[:1].lower()}{reason[1:]}", 2) from None
        return Bodies(read=(data,)), count or 1
    return Bodies(template=body if body is not None else DEFAULT_BODY), count or 1


def _stdin_bodies(*, lines: bool, count: int | None) -> tuple[Bodies, int]:
    """``read_bodies`` from stdin: one a line, or all of it one body."""
    if sys.stdin is None:  # (the command started with its stdin closed)
        raise fail("stdin is closed: there are no bodies to read", 2)
    stdin = sys.stdin.buffer
    if stdin.isatty():
        how = "one message a line" if lines else "all of it one body"
        typer.echo(f"reading stdin, {how} (Ctrl-D ends)", err=True)
    if lines:
        read = _read_lines(stdin, count)
        return Bodies(read=tuple(read)), len(read)
    return Bodies(read=(_read_whole(stdin, "stdin"),)), count or 1
