"""``hamq topic``: create, list, route, status, delete; and ``hamq admin cluster``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import DEFAULT_NAMESRV, NamesrvOption, run
from hamq.client import AdminClient
from hamq.protocol.bodies import PERM_READ, PERM_WRITE

app = typer.Typer(help="Create, list and inspect topics.", no_args_is_help=True)
admin_app = typer.Typer(help="Look at the cluster.", no_args_is_help=True)
console = Console()


def _perm(perm: int) -> str:
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-")


@app.command()
def create(
    topic: Annotated[str, typer.Argument(help="Topic name: letters, digits, %|_- (<=127).")],
    queues: Annotated[int, typer.Option("--queues", "-q", help="Read and write queues.")] = 8,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Create on this cluster's masters.")
    ] = None,
    broker: Annotated[
        str | None, typer.Option("--broker", help="Create on this broker (host:port) only.")
    ] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="No writes.")] = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Create TOPIC (or change its queue count) on every master, or on one broker."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            brokers = await admin.create_topic(
                topic,
                queues,
                perm=PERM_READ if read_only else PERM_READ | PERM_WRITE,
                cluster=cluster,
                broker_addr=broker,
            )
        typer.echo(f"topic {topic}: {queues} queue(s) on {', '.join(brokers)}")

    run(main)


@app.command("list")
def list_topics(namesrv: NamesrvOption = DEFAULT_NAMESRV) -> None:
    """Every topic the nameserver knows."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            for name in await admin.topic_list():
                typer.echo(name)

    run(main)


@app.command()
def route(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Which brokers serve TOPIC, with how many queues, at which addresses."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            data = await admin.topic_route(topic)
        table = Table(title=f"route of {topic}")
        for column in ("broker", "read queues", "write queues", "perm", "addresses (id=addr)"):
            table.add_column(column)
        addrs = {b.broker_name: b.broker_addrs for b in data.broker_datas}
        for queue in sorted(data.queue_datas, key=lambda q: q.broker_name):
            table.add_row(
                queue.broker_name,
                str(queue.read_queue_nums),
                str(queue.write_queue_nums),
                _perm(queue.perm),
                " ".join(f"{i}={a}" for i, a in sorted(addrs.get(queue.broker_name, {}).items())),
            )
        console.print(table)

    run(main)


@app.command()
def status(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Each queue of TOPIC with its min and max offset."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            queues = await admin.queue_status(topic)
        table = Table(title=f"queues of {topic}")
        for column in ("queue", "min offset", "max offset", "messages"):
            table.add_column(column)
        for q in queues:
            table.add_row(
                str(q.queue), str(q.min_offset), str(q.max_offset), str(q.max_offset - q.min_offset)
            )
        console.print(table)

    run(main)


@app.command()
def delete(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    cluster: Annotated[str | None, typer.Option("--cluster", help="Only this cluster.")] = None,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Delete TOPIC from the masters and from every nameserver given."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            brokers = await admin.delete_topic(topic, cluster=cluster)
        typer.echo(f"topic {topic} deleted from {', '.join(brokers)}")

    run(main)


@admin_app.command()
def cluster(namesrv: NamesrvOption = DEFAULT_NAMESRV) -> None:
    """Clusters, their brokers and addresses, as the nameserver sees them."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            info = await admin.cluster_info()
        table = Table(title="clusters")
        for column in ("cluster", "broker", "id", "address"):
            table.add_column(column)
        for name, brokers in sorted(info.cluster_addr_table.items()):
            for broker in sorted(brokers):
                data = info.broker_addr_table.get(broker)
                for broker_id, addr in sorted((data.broker_addrs if data else {}).items()):
                    table.add_row(name, broker, str(broker_id), addr)
        console.print(table)

    run(main)


@admin_app.command("ha-status")
def ha_status(
    broker: Annotated[
        str | None, typer.Option("--broker", help="One broker (host:port); default: all.")
    ] = None,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Replication: each master's slaves (ack, lag, in sync) and each slave's state."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            if broker is not None:
                addrs = [broker]
            else:
                info = await admin.cluster_info()
                addrs = sorted(
                    addr
                    for data in info.broker_addr_table.values()
                    for addr in data.broker_addrs.values()
                )
            statuses = [await admin.ha_status(addr) for addr in addrs]
        table = Table(title="replication")
        for column in ("broker", "id", "address", "role", "epoch", "replication"):
            table.add_column(column)
        for status in statuses:
            epochs = status.get("epochs") or []
            table.add_row(
                str(status.get("broker")),
                str(status.get("brokerId")),
                str(status.get("address")),
                str(status.get("role")),
                str(epochs[-1][0]) if epochs else "-",
                _describe_ha(status),
            )
        console.print(table)

    run(main)


def _describe_ha(status: dict[str, object]) -> str:
    master = status.get("master")
    if isinstance(master, dict):
        slaves = master.get("slaves") or []
        if not slaves:
            return f"no slave connected (log end {master.get('max_offset')})"
        return "\n".join(
            f"slave {s['address']}: ack {s['ack_offset']}, {s['lag_bytes']} B / "
            f"{s['lag_s']} s behind, {'in sync' if s['in_sync'] else 'NOT in sync'}"
            for s in slaves
        )
    slave = status.get("slave")
    if isinstance(slave, dict):
        error = f", last error: {slave['last_error']}" if slave.get("last_error") else ""
        return (
            f"{slave['state']} from {slave['master_address']}, log end {slave['max_offset']}{error}"
        )
    return "-"
