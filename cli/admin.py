"""``hamq admin``: look at and operate a cluster, as RocketMQ's mqadmin does.

- the cluster: ``cluster``, ``broker-status``, ``broker-config``,
  ``update-broker-config``, ``ha-status``;
- consumer groups: ``groups``, ``consumer-progress``, ``consumer-connection``,
  ``update-group``, ``reset-offset``;
- messages: ``query-message`` (by key, or by id);
- automatic failover, with the controllers: ``sync-state-set``, ``elect-master``,
  ``broker-epoch``.

Each command prints tables for people, and with ``--json`` one JSON object instead,
its keys stable and listed in the README ("Operating a cluster: hamq admin"): field
names in camelCase, values typed (hamq/client/admin_views.py's ``to_json``; a
broker's settings by their types, hamq/broker/live_config.py's ``typed_settings``).
The requests and their decoding live in hamq/client/admin.py and, for the
controllers and a broker's epochs, hamq/client/controller_calls.py; this module
parses the command line, asks, and prints ``--json``; the tables and lines for people
are cli/admin_output.py's. A broker or controller that
refuses, or that no one answers, ends a command with one ``error:`` line (exit code
1); input that cannot be right (a bad address, a timestamp that is none, a setting
the broker refuses) with exit code 2.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from cli.admin_output import (
    BODY_SHOWN_CHARS,
    show_broker_config,
    show_broker_statuses,
    show_clusters,
    show_connection,
    show_election,
    show_epochs,
    show_ha_statuses,
    show_messages,
    show_progress,
    show_reset,
    show_summaries,
    show_sync_state,
    show_updated,
)
from cli.common import (
    DEFAULT_NAMESRV,
    HELP_MARKUP,
    CommandError,
    ControllerOption,
    NamesrvOption,
    access,
    client_options,
    fail,
    run,
)
from cli.topic import JsonOption, print_json
from hamq.broker.live_config import typed_settings
from hamq.client import AdminClient
from hamq.client.admin_views import GroupSummary, camel_case_keys, setting_name
from hamq.client.controller_calls import (
    broker_epochs,
    elect_master,
    known_broker_groups,
    sync_state_data,
)
from hamq.remoting import parse_address

app = typer.Typer(
    help="Look at and operate the cluster: brokers, consumer groups, messages, failover.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _addresses(value: str, option: str) -> list[str]:
    """The ';'-separated addresses of ``option``; a bad one ends the command (exit 2)."""
    addrs = [a.strip() for a in value.split(";") if a.strip()]
    if not addrs:
        raise fail(f"{option}: no address given", 2)
    for addr in addrs:
        try:
            parse_address(addr)
        except ValueError as exc:
            raise fail(f"{option}: {exc}", 2) from None
    return addrs


BrokerOption = Annotated[
    str, typer.Option("--broker", "-b", help="The broker's address, host:port.")
]


# ---------------------------------------------------------------- the cluster
@app.command()
def cluster(as_json: JsonOption = False, namesrv: NamesrvOption = DEFAULT_NAMESRV) -> None:
    """Clusters, their brokers and addresses, as the nameserver sees them."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            info = await admin.cluster_info()
        rows = []
        for name, brokers in sorted(info.cluster_addr_table.items()):
            for broker in sorted(brokers):
                data = info.broker_addr_table.get(broker)
                for broker_id, addr in sorted((data.broker_addrs if data else {}).items()):
                    rows.append((name, broker, broker_id, addr))
        if as_json:
            print_json(
                {
                    "clusters": {k: sorted(v) for k, v in info.cluster_addr_table.items()},
                    "brokers": [
                        {"cluster": c, "brokerName": b, "brokerId": i, "address": a}
                        for c, b, i, a in rows
                    ],
                }
            )
            return
        show_clusters(rows)

    run(main)


@app.command("broker-status")
def broker_status(
    broker: Annotated[
        str | None, typer.Option("--broker", "-b", help="One broker (host:port); default: all.")
    ] = None,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """A broker's runtime statistics (GET_BROKER_RUNTIME_INFO), sorted by name; every
    broker of the cluster without --broker. Names in camelCase; with --json, numbers,
    booleans and null typed as such."""
    addrs = _addresses(broker, "--broker") if broker is not None else None

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            targets = addrs if addrs is not None else await admin.all_broker_addrs()
            statuses = [await admin.broker_status(addr) for addr in targets]
        if as_json:
            print_json({"brokers": [status.to_json() for status in statuses]})
            return
        show_broker_statuses(statuses)

    run(main)


@app.command("broker-config")
def broker_config(
    broker: BrokerOption, as_json: JsonOption = False, namesrv: NamesrvOption = DEFAULT_NAMESRV
) -> None:
    """A running broker's configuration (GET_BROKER_CONFIG); "live" marks what
    update-broker-config can change."""
    addr = _addresses(broker, "--broker")[0]

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            view = await admin.broker_config(addr)
        if as_json:
            print_json(view.to_json(typed_settings(view.values)))
            return
        show_broker_config(addr, view)

    run(main)


@app.command("update-broker-config")
def update_broker_config(
    broker: BrokerOption,
    settings: Annotated[
        list[str], typer.Argument(help="KEY=VALUE, as in the configuration file; several.")
    ],
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Change settings of a running broker (UPDATE_BROKER_CONFIG), all or none.

    Only settings the broker reads afresh each time can change (broker-config marks
    them "live"); any other is refused by name (exit code 2), and so is a value of the
    wrong type or range, as in the configuration file. The change lasts until the
    broker stops: put it in the configuration file to keep it."""
    addr = _addresses(broker, "--broker")[0]
    changes: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise fail(f"{item!r} is not KEY=VALUE", 2)
        changes[key.strip()] = value.strip()

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            await admin.update_broker_config(addr, changes)
            now = await admin.broker_config(addr)
        updated = {setting_name(k): now.values.get(setting_name(k), v) for k, v in changes.items()}
        if as_json:
            print_json({"address": addr, "updated": typed_settings(updated)})
        else:
            show_updated(addr, updated)

    run(main)


@app.command("ha-status")
def ha_status(
    broker: Annotated[
        str | None, typer.Option("--broker", help="One broker (host:port); default: all.")
    ] = None,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Replication: each master's slaves (ack, lag, in sync) and each slave's state."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            addrs = [broker] if broker is not None else await admin.all_broker_addrs()
            statuses = [await admin.ha_status(addr) for addr in addrs]
        if as_json:
            print_json({"brokers": [camel_case_keys(status) for status in statuses]})
            return
        show_ha_statuses(statuses)

    run(main)


# ---------------------------------------------------------------- consumer groups
GroupOption = Annotated[str, typer.Option("--group", "-g", help="The consumer group.")]


async def _summaries(admin: AdminClient) -> list[GroupSummary]:
    return [await admin.group_summary(group) for group in await admin.consumer_groups()]


@app.command()
def groups(as_json: JsonOption = False, namesrv: NamesrvOption = DEFAULT_NAMESRV) -> None:
    """Every consumer group the brokers know, with its members online now.

    A group is known once it has connected, committed an offset or had a retry topic
    made; members come from GET_CONSUMER_CONNECTION_LIST at every broker."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            summaries = await _summaries(admin)
        if as_json:
            print_json({"groups": [s.to_json() for s in summaries]})
        else:
            show_summaries(summaries, lag=False)

    run(main)


@app.command("consumer-progress")
def consumer_progress(
    group: Annotated[
        str | None,
        typer.Option("--group", "-g", help="The consumer group; none: every group's total."),
    ] = None,
    topic: Annotated[
        str | None, typer.Option("--topic", "-t", help="Only this topic (with --group).")
    ] = None,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Where a group is: per queue the broker's offset, the group's, the lag, and when
    the last message it consumed was stored (GET_CONSUME_STATS); without --group every
    group with its members and total lag."""
    if topic is not None and group is None:
        raise fail("--topic needs --group", 2)

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            if group is None:
                summaries = await _summaries(admin)
            else:
                progress = await admin.consumer_progress(group, topic)
        if group is None:
            if as_json:
                print_json({"groups": [s.to_json() for s in summaries]})
            else:
                show_summaries(summaries, lag=True)
            return
        if as_json:
            print_json(progress.to_json())
            return
        show_progress(group, topic, progress)

    run(main)


@app.command("consumer-connection")
def consumer_connection(
    group: GroupOption, as_json: JsonOption = False, namesrv: NamesrvOption = DEFAULT_NAMESRV
) -> None:
    """A group's members online (client id, address, language, version) and what it
    subscribes to (GET_CONSUMER_CONNECTION_LIST at every broker)."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            connection = await admin.consumer_connection(group)
        if connection is None:
            raise CommandError(f"group {group} has no consumer online")
        if as_json:
            print_json(connection.to_json())
            return
        show_connection(group, connection)

    run(main)


def parse_timestamp(text: str, now_ms: int) -> int:
    """``--timestamp``: ms since the epoch, ``now``, or ISO-8601 (``2025-01-31T12:00``,
    local time unless it names its offset: ``...Z``, ``...+02:00``). ValueError."""
    value = text.strip()
    if value.lower() == "now":
        return now_ms
    if value.lstrip("-").isdigit():
        number = int(value)
        if number < -1:
            raise ValueError("ms since the epoch, or -1 for the end of each queue")
        return number
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not ms since the epoch, 'now', nor ISO-8601") from None
    return (moment.astimezone() - _EPOCH) // timedelta(milliseconds=1)  # (exact: no floats)


@app.command("update-group")
def update_group(
    group: GroupOption,
    orderly: Annotated[
        bool,
        typer.Option(
            "--orderly/--concurrently",
            help="--orderly: FIFO (RocketMQ 5 clients receive each message group in order).",
        ),
    ] = False,
    retry_max_times: Annotated[
        int,
        typer.Option(
            "--retry-max-times",
            min=0,
            max=1000,
            help="Deliveries after the first before a message goes to the group's DLQ.",
        ),
    ] = 16,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Only this cluster's masters.")
    ] = None,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Create or change a consumer group on every master (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    as mqadmin updateSubGroup); its slaves copy it within metadata_sync_interval_s."""

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            brokers = await admin.update_group(
                group, orderly=orderly, retry_max_times=retry_max_times, cluster=cluster
            )
        kind = "orderly" if orderly else "concurrent"
        typer.echo(f"group {group} ({kind}, {retry_max_times} retries) on {', '.join(brokers)}")

    run(main)


@app.command("reset-offset")
def reset_offset(
    group: GroupOption,
    topic: Annotated[str, typer.Option("--topic", "-t", help="The topic.")],
    timestamp: Annotated[
        str,
        typer.Option(
            "--timestamp",
            help="Go on from the first message stored at or after this time: ms since "
            "the epoch, ISO-8601 (local time unless it says), 'now' (skip everything), "
            "-1 (the end of each queue).",
        ),
    ],
    force: Annotated[
        bool,
        typer.Option("--force/--no-force", help="--no-force: only move offsets back."),
    ] = True,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Reset a group's offsets in a topic by time (INVOKE_BROKER_TO_RESET_OFFSET).

    Each master commits the new offsets and tells the group's consumers online, which
    go on from them at once (RESET_CONSUMER_CLIENT_OFFSET); a group with no one online
    starts from them when it next runs."""
    try:
        stamp = parse_timestamp(timestamp, int(time.time() * 1000))
    except ValueError as exc:
        raise fail(f"--timestamp {timestamp!r}: {exc}", 2) from None

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            result = await admin.reset_offset(group, topic, stamp, force=force)
        if as_json:
            print_json(result.to_json())
            return
        show_reset(group, topic, stamp, result)

    run(main)


# ---------------------------------------------------------------- messages
@app.command("query-message")
def query_message(
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="The topic.")] = None,
    key: Annotated[
        str | None, typer.Option("--key", "-k", help="A key (KEYS) of the message; --topic too.")
    ] = None,
    msg_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="The message id (UNIQ_KEY) or offset message id; --topic narrows the "
            "search (else every topic is searched for a UNIQ_KEY).",
        ),
    ] = None,
    body_full: Annotated[
        bool, typer.Option("--body-full", help=f"The whole body (else {BODY_SHOWN_CHARS} chars).")
    ] = False,
    as_json: JsonOption = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Messages by key (QUERY_MESSAGE) or by id (VIEW_MESSAGE_BY_ID for an offset
    message id, else the index by UNIQ_KEY): topic, queue, offset, tags, keys, hosts,
    times, properties and body."""
    if (key is None) == (msg_id is None):
        raise fail("give --key (with --topic) or --id", 2)
    if key is not None and topic is None:
        raise fail("--key needs --topic", 2)

    async def main() -> None:
        async with AdminClient(namesrv, **client_options()) as admin:
            if key is not None:
                assert topic is not None
                found = await admin.query_messages(topic, key)
            else:
                assert msg_id is not None
                found = await admin.find_message(msg_id, topic)
        if not found:
            raise CommandError(f"no message of {topic} has the key {key}")
        if as_json:
            limit = None if body_full else BODY_SHOWN_CHARS
            print_json({"messages": [f.to_json(limit) for f in found]})
            return
        show_messages(found, body_full=body_full)

    run(main)


# ---------------------------------------------------------------- automatic failover
@app.command("sync-state-set")
def sync_state_set(
    controller: ControllerOption,
    brokers: Annotated[
        list[str] | None,
        typer.Option("--broker", "-b", help="A broker group (broker name); repeat; default: all."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the controller's JSON answer as it is.")
    ] = False,
) -> None:
    """Each broker group's master, epochs and SyncStateSet, from a controller.

    CONTROLLER_GET_SYNC_STATE_DATA: per group a line (master id and address, master
    epoch, SyncStateSet and its epoch) and its brokers (in sync, alive, epoch, max
    offset as their last heartbeat said)."""
    addrs = _addresses(controller, "--controller")
    names = list(dict.fromkeys(brokers or []))

    async def main() -> None:
        addr, answer = await sync_state_data(addrs, names, **access().call_options())
        table = answer["replicasInfoTable"]
        if as_json:
            print_json(answer)
        else:
            show_sync_state(addr, table)
        missing = [name for name in names if name not in table]
        if missing:
            known = await known_broker_groups(addr, **access().call_options())
            raise CommandError(
                f"controller {addr} knows no broker group {', '.join(missing)} "
                f"(known: {', '.join(known) or 'none'})"
            )

    run(main)


@app.command("elect-master")
def elect_master_command(
    controller: ControllerOption,
    broker: Annotated[str, typer.Option("--broker", "-b", help="The broker group (broker name).")],
    broker_id: Annotated[
        int,
        typer.Option("--broker-id", min=0, help="The broker (its id in the group) to make master."),
    ],
    cluster: Annotated[
        str, typer.Option("--cluster", help="The group's cluster.")
    ] = "DefaultCluster",
    as_json: JsonOption = False,
) -> None:
    """Make a broker the master of its group now (a designated election).

    The broker must be alive and, unless the controllers allow unclean elections, in
    the SyncStateSet; a refusal is printed with the controller's code and reason. A
    broker that is the master already is a success: the line says so."""
    addrs = _addresses(controller, "--controller")

    async def main() -> None:
        election = await elect_master(addrs, cluster, broker, broker_id, **access().call_options())
        if as_json:
            print_json(election.to_json())
            return
        show_election(broker, election)

    run(main)


@app.command("broker-epoch")
def broker_epoch(broker: BrokerOption, as_json: JsonOption = False) -> None:
    """A broker's epochs: where each starts and ends in its CommitLog; its max offset.

    GET_BROKER_EPOCH_CACHE, or from GET_BROKER_HA_STATUS where the broker has no such
    request; the last epoch ends at the max offset."""
    addr = _addresses(broker, "--broker")[0]

    async def main() -> None:
        epochs = await broker_epochs(addr, **access().call_options())
        if as_json:
            print_json({"address": addr, **epochs.to_json()})
            return
        show_epochs(addr, epochs)

    run(main)
