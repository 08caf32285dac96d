"""``hamq topic``: create, list, route, status, delete.

Each command prints a table (or a line) for people, and with ``--json`` one JSON
object instead, its keys stable and listed in the README ("Operating a cluster").
The requests and their decoding live in hamq/client/admin.py (AdminClient); this
module only chooses what to print.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli.common import (
    DEFAULT_NAMESRV,
    HELP_MARKUP,
    NamesrvOption,
    client_options,
    fail,
    run,
)
from hamq.client import AdminClient, InvalidArgumentError
from hamq.client.admin import TopicShrinkError
from hamq.protocol.bodies import PERM_READ, PERM_WRITE, TopicRouteData, encode_body

app = typer.Typer(
    help="Create, list and inspect topics.", no_args_is_help=True, rich_markup_mode=HELP_MARKUP
)
console = Console()

#: ``--json``: one JSON object instead of tables
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON object (keys: see the README).")
]


def print_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def when(ms: int) -> str:
    """A store time (ms since the epoch) in local time, to the ms; ``-`` for none."""
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _perm(perm: int) -> str:
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-")


def _run_refusing_bad_input(main: Callable[[], Awaitable[None]], shrink_hint: str = "") -> None:
    """``run(main)``; input the admin client refused before changing anything (a topic
    that does not exist, queues that hold messages) ends the command with exit code 2."""
    refused: InvalidArgumentError | None = None

    async def checked() -> None:
        nonlocal refused
        try:
            await main()
        except InvalidArgumentError as exc:
            refused = exc

    run(checked)
    if refused is not None:
        hint = shrink_hint if isinstance(refused, TopicShrinkError) else ""
        raise fail(f"{refused}{hint}", 2)


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
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Shrink the queue count even if the queues it hides hold messages."
        ),
    ] = False,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Create TOPIC (or change its queue count) on every master, or on one broker.

    Fewer queues than the topic has hide the others from consumers: refused (exit
    code 2, naming each queue and its messages) while one of them holds messages,
    unless --force."""
    perm = PERM_READ if read_only else PERM_READ | PERM_WRITE

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            brokers = await admin.create_topic(
                topic, queues, perm=perm, cluster=cluster, broker_addr=broker, force=force
            )
        if as_json:
            print_json({"topic": topic, "queues": queues, "perm": _perm(perm), "brokers": brokers})
        else:
            typer.echo(f"topic {topic}: {queues} queue(s) on {', '.join(brokers)}")

    _run_refusing_bad_input(main, shrink_hint="; --force shrinks it anyway")


@app.command("list")
def list_topics(as_json: JsonOption = False, namesrv: NamesrvOption = DEFAULT_NAMESRV) -> None:
    """Every topic the nameserver knows."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            topics = await admin.topic_list()
        if as_json:
            print_json({"topics": topics})
        for name in [] if as_json else topics:
            typer.echo(name)

    run(main)


def _route_json(topic: str, data: TopicRouteData) -> dict[str, Any]:
    """The route as the nameserver gives it (RocketMQ's TopicRouteData), and the topic."""
    route = json.loads(encode_body(data))
    return {
        "topic": topic,
        "queueDatas": sorted(route.get("queueDatas", []), key=lambda q: q["brokerName"]),
        "brokerDatas": sorted(route.get("brokerDatas", []), key=lambda b: b["brokerName"]),
    }


@app.command()
def route(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Which brokers serve TOPIC, with how many queues, at which addresses."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            data = await admin.topic_route(topic)
        if as_json:
            print_json(_route_json(topic, data))
            return
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
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Each queue of TOPIC: min and max offset, messages, when the last one was stored.

    GET_TOPIC_STATS_INFO at each broker of the topic's route (its master; a slave while
    the master is away)."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            queues = await admin.topic_stats(topic)
        if as_json:
            print_json(
                {
                    "topic": topic,
                    "queues": [q.to_json() for q in queues],
                    "totalMessages": sum(q.messages for q in queues),
                }
            )
            return
        table = Table(title=f"queues of {topic}")
        table.add_column("queue", no_wrap=True)
        for column in ("min offset", "max offset", "messages"):
            table.add_column(column, justify="right")
        table.add_column("last stored", no_wrap=True)
        for q in queues:
            table.add_row(
                str(q.queue),
                str(q.min_offset),
                str(q.max_offset),
                str(q.messages),
                when(q.last_update_ms),
            )
        console.print(table)
        typer.echo(f"{sum(q.messages for q in queues)} message(s) in {len(queues)} queue(s)")

    run(main)


@app.command()
def delete(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    cluster: Annotated[str | None, typer.Option("--cluster", help="Only this cluster.")] = None,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Delete TOPIC from the masters and from every nameserver given."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            brokers = await admin.delete_topic(topic, cluster=cluster)
        if as_json:
            print_json({"topic": topic, "brokers": brokers})
        else:
            typer.echo(f"topic {topic} deleted from {', '.join(brokers)}")

    _run_refusing_bad_input(main)
