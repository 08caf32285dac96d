"""``hamq``: the root command. One typer app per command group, combined here.

Global options live in the callback and reach the commands through ``ctx.obj``, the
client access options (TLS, the ACL account) through cli/common.py's ``access()``.
``main`` runs the app and owns how every command ends (cli/common.py's comment): a
usage error is one ``error: ...`` line and exit code 2, a closed stdout ends quietly,
Ctrl-C outside Trio exits 130 without a traceback.

Shell completion is typer's (``--install-completion``, ``--show-completion``): the
script a shell sources runs ``hamq`` again with COMPLETE_VAR set, and ``run_command``
answers with the completions of the words typed instead of running a command.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated

import typer
import typer.completion
import typer.main

from cli import admin, bench, cluster, consume, produce, servers, topic
from cli.common import (
    ACCESS,
    HELP_MARKUP,
    STDOUT_CLOSED_EXIT,
    ClientAccess,
    is_broken_pipe,
    silence_stdout,
    tls_remoting,
)
from hamq.acl import credentials_from

app = typer.Typer(
    name="hamq",
    help="hamq: a RocketMQ-style, highly available message broker on Trio.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=HELP_MARKUP,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command()(servers.broker)
app.command()(servers.nameserver)
app.command()(servers.controller)
app.command()(produce.produce)
app.command()(consume.consume)
app.add_typer(topic.app, name="topic")
app.add_typer(admin.app, name="admin")
app.add_typer(bench.app, name="bench")
app.add_typer(cluster.app, name="cluster")

#: the environment variable of a completion request (typer's, from the program's name)
COMPLETE_VAR = "_HAMQ_COMPLETE"

_LOG_LEVELS = ("debug", "info", "warning", "error")
#: commands that run servers log what they do (info); the others, the client commands,
#: only what went wrong (warning): their output is their answer
_SERVER_COMMANDS = frozenset({"broker", "nameserver", "controller", "cluster", "bench"})


def _version_line() -> str:
    from hamq.protocol import HAMQ_PROTOCOL_VERSION

    try:
        hamq_version = version("hamq")
    except PackageNotFoundError:
        hamq_version = "unknown (not installed)"
    return f"hamq {hamq_version} (RocketMQ remoting protocol version {HAMQ_PROTOCOL_VERSION})"


def _print_version(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(_version_line())
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help=f"One of {', '.join(_LOG_LEVELS)} (default: info for servers, warning "
            "for client commands).",
            envvar="HAMQ_LOG_LEVEL",
        ),
    ] = None,
    access_key: Annotated[
        str | None,
        typer.Option(
            "--access-key",
            envvar="HAMQ_ACCESS_KEY",
            help="An ACL account's access key: client commands sign their requests with "
            "it and --secret-key (RocketMQ's ACL 1.0).",
        ),
    ] = None,
    secret_key: Annotated[
        str | None,
        typer.Option(
            "--secret-key",
            envvar="HAMQ_SECRET_KEY",
            help="The secret key of --access-key (better in HAMQ_SECRET_KEY than on a "
            "command line others can see).",
            show_default=False,
        ),
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Client commands connect over TLS (servers' certificates checked against "
            "--tls-ca, else the system's CAs).",
        ),
    ] = False,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            "--tls-ca",
            envvar="HAMQ_TLS_CA",
            help="PEM CA certificate(s) that sign the servers' certificates (implies --tls).",
        ),
    ] = None,
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print hamq's version (as 'hamq version') and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    if log_level is None:
        log_level = "info" if ctx.invoked_subcommand in _SERVER_COMMANDS else "warning"
    if log_level.lower() not in _LOG_LEVELS:
        raise typer.BadParameter(
            f"{log_level!r} is not a log level; use one of {', '.join(_LOG_LEVELS)}",
            param_hint="--log-level",
        )
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    try:
        account = credentials_from(access_key, secret_key)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--access-key / --secret-key") from None
    try:
        remoting = tls_remoting(tls, tls_ca)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls-ca") from None
    ACCESS.set(ClientAccess(account, remoting))
    ctx.obj = {"log_level": log_level.lower()}


@app.command("version")
def version_command() -> None:
    """Print hamq's version and the RocketMQ protocol version it speaks."""
    typer.echo(_version_line())


def _one_line(message: str) -> str:
    """A click message as one line, starting lower-case: 'no such option: --bogus'."""
    line = " ".join(message.split()).rstrip(".")
    if len(line) > 1 and line[0].isupper() and line[1].islower():
        line = line[0].lower() + line[1:]
    return line


def run_command(args: Sequence[str]) -> int:
    """Run ``hamq <args>``; its exit code. With COMPLETE_VAR set (by the script of
    ``--show-completion``), answer the shell's completion request instead. The command
    runs in a copy of the caller's context: what the root options set (cli/common.py's
    ACCESS) ends with it, also for a caller that runs several (tests)."""
    return contextvars.copy_context().run(_run_command, args)


def _run_command(args: Sequence[str]) -> int:
    command = typer.main.get_command(app)
    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:
        return typer.completion.shell_complete(command, {}, "hamq", COMPLETE_VAR, instruction)
    try:
        with command.make_context("hamq", list(args)) as ctx:
            command.invoke(ctx)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # click's errors: usage, bad parameters
        message = exc.format_message()
        if "\n" in message:  # a group called without a command: its help
            typer.echo(message, err=True)
        else:
            usage = getattr(exc, "ctx", None)
            hint = f" (see '{usage.command_path} -h')" if usage is not None else ""
            typer.echo(f"error: {_one_line(message)}{hint}", err=True)
        return getattr(exc, "exit_code", 1)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if is_broken_pipe(exc):
            silence_stdout()
            return STDOUT_CLOSED_EXIT
        if isinstance(exc, BaseExceptionGroup):
            _, rest = exc.split(KeyboardInterrupt)
            if rest is None:
                return 130
        raise
    return 0


def main() -> None:
    sys.exit(run_command(sys.argv[1:]))


if __name__ == "__main__":
    main()
