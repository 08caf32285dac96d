"""``hamq broker`` and ``hamq nameserver``: the servers, in the foreground.

Both print one line when they serve (``hamq broker ready: ...``), log to stderr, and
stop cleanly on Ctrl-C or SIGTERM (the broker writes its state and closes its store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import trio
import typer

from cli.common import fail, run
from hamq.broker import BrokerNode, ConfigError, load_config
from nameserver import DEFAULT_PORT, NameServer, NameServerConfig


def broker(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="A TOML file (see conf/broker.toml)."),
    ] = None,
    broker_name: Annotated[str | None, typer.Option("--name", help="Broker name.")] = None,
    cluster_name: Annotated[str | None, typer.Option("--cluster", help="Cluster name.")] = None,
    broker_id: Annotated[
        int | None, typer.Option("--broker-id", help="0 for a master, 1, 2, ... for slaves.")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on.")] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="Port to listen on (0: any free one).")
    ] = None,
    namesrv: Annotated[
        str | None,
        typer.Option(
            "--namesrv",
            "-n",
            envvar="HAMQ_NAMESRV",
            help="Nameserver address(es), ';'-separated; none: run one in this process.",
        ),
    ] = None,
    namesrv_port: Annotated[
        int | None,
        typer.Option("--namesrv-port", help="Port of the embedded nameserver (default 9876)."),
    ] = None,
    store_dir: Annotated[
        Path | None, typer.Option("--store-dir", help="Where the data goes (./data/store).")
    ] = None,
    flush: Annotated[str | None, typer.Option("--flush", help="ASYNC_FLUSH or SYNC_FLUSH.")] = None,
) -> None:
    """Run a broker. With no nameserver address it embeds one: one command, a broker."""
    overrides: dict[str, Any] = {
        "broker_name": broker_name,
        "cluster_name": cluster_name,
        "broker_id": broker_id,
        "listen_host": host,
        "listen_port": port,
        "embedded_namesrv_port": namesrv_port,
        "store.store_dir": str(store_dir) if store_dir is not None else None,
        "store.flush_disk_type": flush,
    }
    if namesrv is not None:
        overrides["namesrv_addrs"] = [a.strip() for a in namesrv.split(";") if a.strip()]
    try:
        node = BrokerNode(load_config(config, overrides))
    except ConfigError as exc:
        raise fail(str(exc), 2) from None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            embedded = " (embedded)" if node.nameserver is not None else ""
            typer.echo(
                f"hamq broker ready: broker {node.config.broker_name} at {node.address}, "
                f"nameserver {';'.join(node.namesrv_addrs)}{embedded}, "
                f"store {node.config.store.store_dir}"
            )

    run(main)


def nameserver(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="Port (0: any free one).")
    ] = DEFAULT_PORT,
) -> None:
    """Run a nameserver. Several may run side by side; they never talk to each other."""
    server = NameServer(NameServerConfig(host=host, port=port))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(server.run)
            typer.echo(f"hamq nameserver ready: {host}:{bound}")

    run(main)
