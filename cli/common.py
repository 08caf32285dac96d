"""What the command groups share: running Trio under Ctrl-C / SIGTERM, errors, options."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import trio
import typer

from hamq.broker import ConfigError
from hamq.client import ClientError
from hamq.store import StoreError

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
DEFAULT_NAMESRV = "127.0.0.1:9876"

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


class CommandError(Exception):
    """A failure a command reports as one line (exit code 1): a server's refusal, no
    server answering. The text says what failed and where."""


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


#: errors a command reports as one line (no traceback): bad input, a port in use,
#: a store another broker holds, a refusal from a server
EXPECTED = (ConfigError, ClientError, OSError, StoreError, CommandError)


def _expected(exc: BaseException) -> Exception | None:
    """``exc``, or the one error inside nested exception groups, if it is expected."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, EXPECTED) else None


def run(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``trio.run(main, *args)``; SIGINT and SIGTERM cancel it (shutdown runs), client
    and configuration errors end the command with their message."""

    result: Any = None
    error: Exception | None = None

    async def supervised() -> None:
        async with trio.open_nursery() as nursery:

            async def until_signalled() -> None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

            async def body() -> None:
                nonlocal result, error
                try:
                    result = await main(*args)
                except Exception as exc:
                    error = _expected(exc)
                    if error is None:
                        raise
                finally:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(until_signalled)
            nursery.start_soon(body)

    trio.run(supervised)
    if isinstance(error, ConfigError):
        raise fail(str(error), 2)
    if error is not None:
        raise fail(str(error))
    return result
