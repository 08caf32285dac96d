"""``hamq``: the root command. One typer app per command group, combined here.

Global options live in the callback and reach the commands through ``ctx.obj``.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from cli import bench, clients, cluster, servers, topic

app = typer.Typer(
    name="hamq",
    help="hamq: a RocketMQ-style, highly available message broker on Trio.",
    no_args_is_help=True,
    add_completion=False,
)
app.command()(servers.broker)
app.command()(servers.nameserver)
app.command()(servers.controller)
app.command()(clients.produce)
app.command()(clients.consume)
app.add_typer(topic.app, name="topic")
app.add_typer(topic.admin_app, name="admin")
app.add_typer(bench.app, name="bench")
app.add_typer(cluster.app, name="cluster")

_LOG_LEVELS = ("debug", "info", "warning", "error")


@app.callback()
def _root(
    ctx: typer.Context,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level", help=f"One of {', '.join(_LOG_LEVELS)}.", envvar="HAMQ_LOG_LEVEL"
        ),
    ] = "info",
) -> None:
    if log_level.lower() not in _LOG_LEVELS:
        raise typer.BadParameter(
            f"{log_level!r} is not a log level; use one of {', '.join(_LOG_LEVELS)}",
            param_hint="--log-level",
        )
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    ctx.obj = {"log_level": log_level.lower()}


@app.command("version")
def version_command() -> None:
    """Print hamq's version and the RocketMQ protocol version it speaks."""
    from hamq.protocol import HAMQ_PROTOCOL_VERSION

    try:
        hamq_version = version("hamq")
    except PackageNotFoundError:
        hamq_version = "unknown (not installed)"
    typer.echo(f"hamq {hamq_version} (RocketMQ remoting protocol version {HAMQ_PROTOCOL_VERSION})")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
