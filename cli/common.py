"""What the command groups share: running Trio under Ctrl-C / SIGTERM, errors, options.

How a command ends (``run`` and cli/main.py's ``main`` keep these for every command):
- an error is one line on stderr, ``error: ...``; exit code 2 for bad input (usage,
  configuration, arguments the client refuses), 1 for a failure (a server refused,
  none answered);
- SIGINT / SIGTERM cancel the command, which shuts down in order; a server then exits
  0 (a clean stop), a client command run with ``interruptible=True`` exits 128 + the
  signal (130 for Ctrl-C), as shells report an interrupted program;
- stdout closed by its reader (``hamq consume ... | head -3``): the command ends at
  once and quietly, as ``cat`` does: nothing on stderr, exit code 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import stat
import sys
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Final

import attrs
import trio
import typer

from hamq.acl import AclFileError, Credentials
from hamq.broker import ConfigError
from hamq.client import ClientError, InvalidArgumentError
from hamq.protocol import RequestError
from hamq.remoting import RemotingConfig, RemotingError
from hamq.remoting.tls import TlsConfig
from hamq.store import StoreError

#: how help texts are shown (every command group's ``rich_markup_mode``): markdown joins
#: the source lines of a paragraph and leaves brackets alone, where typer's "rich" mode
#: keeps each line break and takes ``[ha]`` for a style (and drops it)
HELP_MARKUP: Final = "markdown"

#: ``--namesrv``: one or more nameservers, ``;``-separated as RocketMQ writes them
NamesrvOption = Annotated[
    str,
    typer.Option(
        "--namesrv",
        "-n",
        envvar="HAMQ_NAMESRV",
        help="Nameserver address(es), host:port, several separated by ';'.",
    ),
]
#: ``make run``'s nameservers (conf/1m-1s-sync: the master embeds one, the slave the
#: other; conf/2m-2s-*: two processes), so that a client finds the slave while the
#: master is down
DEFAULT_NAMESRV = "127.0.0.1:9876;127.0.0.1:9877"

#: ``--controller``: controllers (automatic failover), asked in turn; no default
ControllerOption = Annotated[
    str,
    typer.Option(
        "--controller",
        envvar="HAMQ_CONTROLLER",
        help="Controller address(es), host:port: a controller's, or a nameserver's that "
        "embeds one (--controller); several separated by ';', asked in turn.",
    ),
]


@attrs.frozen
class ClientAccess:
    """How client commands reach the servers: ``hamq --tls/--tls-ca`` (TLS) and
    ``hamq --access-key/--secret-key`` (the ACL account they sign with). The root
    callback (cli/main.py) sets it; commands get it with ``access()``."""

    credentials: Credentials | None = None
    remoting: RemotingConfig | None = None

    def client_options(self) -> dict[str, Any]:
        """Options of hamq's clients: ``Producer(group, namesrv, **access().client_options())``."""
        options: dict[str, Any] = {}
        if self.remoting is not None:
            options["remoting"] = self.remoting
        if self.credentials is not None:
            options["access_key"] = self.credentials.access_key
            options["secret_key"] = self.credentials.secret_key
        return options

    def call_options(self) -> dict[str, Any]:
        """Options of hamq.client.controller_calls' functions that ask a controller or a broker
        directly: ``elect_master(..., **access().call_options())``."""
        return {"credentials": self.credentials, "remoting": self.remoting}


def tls_remoting(tls: bool, ca_file: Path | None) -> RemotingConfig | None:
    """Client connections over TLS for ``--tls`` / ``--tls-ca`` (None: plain TCP);
    ValueError naming the CA file when it cannot be used."""
    if not tls and ca_file is None:
        return None
    return RemotingConfig(tls=TlsConfig(ca_file=ca_file))


#: this command's ClientAccess: set by the root callback (cli/main.py) before the command
#: runs. A context variable, not ``ctx.obj``: the commands do not take their context,
#: and typer keeps its (vendored) click's current context private; Trio's tasks start
#: from the command's context, so they see it.
ACCESS: ContextVar[ClientAccess | None] = ContextVar("hamq_cli_access", default=None)


def access() -> ClientAccess:
    """This command's ClientAccess (none given: plain TCP, unsigned)."""
    return ACCESS.get() or ClientAccess()


def client_options() -> dict[str, Any]:
    """``access().client_options()``: the options every client a command makes gets."""
    return access().client_options()


class CommandError(Exception):
    """A failure a command reports as one line (exit code 1): a server's refusal, no
    server answering. The text says what failed and where."""


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


#: errors a command reports as one line (no traceback): bad input, a port in use,
#: a store another broker holds, a refusal from a server, a server not answering (or
#: answering what does not decode)
EXPECTED = (
    ConfigError,
    AclFileError,
    ClientError,
    OSError,
    StoreError,
    CommandError,
    RemotingError,
    RequestError,
)
#: of those, the ones that mean bad input (exit code 2)
BAD_INPUT = (ConfigError, AclFileError, InvalidArgumentError)
#: the exit code of a command whose stdout was closed (a shell's for SIGPIPE)
STDOUT_CLOSED_EXIT = 128 + signal.SIGPIPE
#: how often a command that prints as it goes looks whether its stdout's reader left
STDOUT_CHECK_S = 0.2


def _only(exc: BaseException) -> BaseException:
    """``exc``, or the one error inside nested exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _expected(exc: BaseException) -> Exception | None:
    """``exc``, or the one error inside nested exception groups, if it is expected."""
    exc = _only(exc)
    return exc if isinstance(exc, EXPECTED) else None


def _one_broken_pipe(exc: BaseException) -> bool:
    # (rich's Console answers a broken pipe with SystemExit(1))
    return isinstance(exc, BrokenPipeError) or (
        isinstance(exc, SystemExit) and isinstance(exc.__context__, BrokenPipeError)
    )


def is_broken_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to a closed pipe (or a group of nothing else)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(_one_broken_pipe)
        return rest is None
    return _one_broken_pipe(exc)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (Linux reports POLLERR on
    the write end; nothing is written to find out)."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
    except (OSError, ValueError, AttributeError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: only POLLERR / POLLHUP come back
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that what is still buffered (flushed at exit)
    cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def run(
    main: Callable[..., Awaitable[Any]],
    *args: Any,
    interruptible: bool = False,
    watch_stdout: bool = False,
) -> Any:
    """``trio.run(main, *args)``; SIGINT and SIGTERM cancel it (shutdown runs), client
    and configuration errors end the command with their message (exit code 2 for bad
    input, else 1).

    ``interruptible``: a signal ends the command with 128 + its number (130 for
    Ctrl-C) once ``main`` has shut down; otherwise a signal is a clean stop (0).
    ``watch_stdout``: the command ends as soon as stdout's reader goes away, even
    when it has nothing to write (a consumer waiting for messages). A closed stdout
    (BrokenPipeError) ends any command quietly: BrokenPipeError propagates, for
    cli/main.py's ``main`` to end with STDOUT_CLOSED_EXIT.
    """

    result: Any = None
    error: Exception | None = None
    signalled: int | None = None
    stdout_closed = False

    async def supervised() -> None:
        async with trio.open_nursery() as nursery:

            async def until_signalled() -> None:
                nonlocal signalled
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        signalled = signum
                        nursery.cancel_scope.cancel()
                        return

            async def until_stdout_closes() -> None:
                nonlocal stdout_closed
                while True:
                    if stdout_reader_gone():
                        stdout_closed = True
                        nursery.cancel_scope.cancel()
                        return
                    await trio.sleep(STDOUT_CHECK_S)

            async def body() -> None:
                nonlocal result, error, stdout_closed
                try:
                    result = await main(*args)
                except (Exception, SystemExit) as exc:
                    if is_broken_pipe(exc):
                        stdout_closed = True
                        return
                    error = _expected(exc) if isinstance(exc, Exception) else None
                    if error is None:
                        raise
                finally:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(until_signalled)
            if watch_stdout:
                nursery.start_soon(until_stdout_closes)
            nursery.start_soon(body)

    trio.run(supervised)
    if stdout_closed:
        raise BrokenPipeError(errno.EPIPE, "stdout was closed")
    if isinstance(error, BAD_INPUT):
        raise fail(str(error), 2)
    if error is not None:
        raise fail(str(error))
    if signalled is not None and interruptible:
        raise typer.Exit(128 + signalled)
    return result
