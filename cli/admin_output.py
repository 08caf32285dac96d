"""What ``hamq admin`` prints for people: a table or a line per answer (not ``--json``).

Each ``show_*`` takes an answer as hamq/client/admin.py decodes it and prints it on
stdout: tables through rich, and the summary lines that scripts read (a group's lag, an
election, a SyncStateSet) with ``typer.echo``, never wrapped. Times are local, to the ms
(cli/topic.py's ``when``); a value that is none is ``-``. Nothing here asks a server or
reads the command line: cli/admin.py does both, and prints ``--json`` itself.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from cli.topic import when

if TYPE_CHECKING:
    from hamq.client.admin_views import (
        BrokerConfigView,
        BrokerStatus,
        ConsumerProgress,
        Election,
        EpochTable,
        FoundMessage,
        GroupConnection,
        GroupSummary,
        ResetResult,
    )

console = Console()

#: a message body longer than this is cut short unless --body-full
BODY_SHOWN_CHARS = 512


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


def _name(value: Any) -> str:
    """An enum member's name (``CLUSTERING``), ``-`` for none."""
    return "-" if value is None else str(value.name)


# ---------------------------------------------------------------- the cluster
def show_clusters(rows: list[tuple[str, str, int, str]]) -> None:
    """``cluster``: (cluster, broker name, broker id, address) rows."""
    table = Table(title="clusters")
    for column in ("cluster", "broker", "id", "address"):
        table.add_column(column)
    for name, broker, broker_id, addr in rows:
        table.add_row(name, broker, str(broker_id), addr)
    console.print(table)


def show_broker_statuses(statuses: list[BrokerStatus]) -> None:
    """``broker-status``: a table of names and values per broker."""
    for status in statuses:
        table = Table(title=f"broker {status.address}")
        table.add_column("name")
        table.add_column("value")
        for key, value in status.values.items():
            shown = value if isinstance(value, str) else json.dumps(value)
            table.add_row(key, "-" if value is None else shown)
        console.print(table)


def show_broker_config(addr: str, view: BrokerConfigView) -> None:
    """``broker-config``: every key and value; "live" marks what can change."""
    table = Table(title=f"configuration of {addr}")
    for column in ("key", "value", "live"):
        table.add_column(column)
    for key, value in sorted(view.values.items()):
        table.add_row(key, value, "live" if key in view.live_keys else "")
    console.print(table)


def show_updated(addr: str, updated: dict[str, str]) -> None:
    """``update-broker-config``: one line, the settings as the broker has them now."""
    shown = ", ".join(f"{k} = {v}" for k, v in sorted(updated.items()))
    typer.echo(f"broker {addr}: {shown} (until it stops)")


def show_ha_statuses(statuses: list[dict[str, Any]]) -> None:
    """``ha-status``: a row per broker, its replication in words."""
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


# ---------------------------------------------------------------- consumer groups
def show_summaries(summaries: list[GroupSummary], *, lag: bool) -> None:
    """``groups`` (their topics) and ``consumer-progress`` without a group (their lag)."""
    if not summaries:
        typer.echo("no consumer group is known")
        return
    table = Table(title="consumer groups")
    columns = ["group", "members", "type", "model"]
    columns += ["consume TPS", "total lag"] if lag else ["topics"]
    for column in columns:
        table.add_column(column)
    for s in summaries:
        row = [s.group, str(s.members), _name(s.consume_type), _name(s.message_model)]
        row += [f"{s.consume_tps:g}", str(s.total_lag)] if lag else [" ".join(s.topics) or "-"]
        table.add_row(*row)
    console.print(table)


def show_progress(group: str, topic: str | None, progress: ConsumerProgress) -> None:
    """``consumer-progress --group``: a row per queue, then the group's totals in a line."""
    if not progress.queues:
        where = f" in {topic}" if topic else ""
        typer.echo(f"group {group} has no committed offsets{where}")
        return
    table = Table(title=f"progress of {group}")
    table.add_column("topic")
    table.add_column("queue", no_wrap=True)
    for column in ("broker offset", "consumer offset", "lag", "in flight"):
        table.add_column(column, justify="right")
    table.add_column("last consumed (stored)", no_wrap=True)
    for q in progress.queues:
        table.add_row(
            q.queue.topic,
            f"{q.queue.broker_name}:{q.queue.queue_id}",
            str(q.broker_offset),
            str(q.consumer_offset),
            str(q.lag),
            str(q.in_flight),
            when(q.last_timestamp_ms),
        )
    console.print(table)
    typer.echo(
        f"group {group}: total lag {progress.total_lag}, "
        f"consume TPS {progress.consume_tps:g}, "
        f"last consumed message stored {when(progress.last_timestamp_ms)}"
    )


def show_connection(group: str, connection: GroupConnection) -> None:
    """``consumer-connection``: a line, the members, the subscriptions."""
    typer.echo(
        f"group {group}: {len(connection.members)} member(s), "
        f"{_name(connection.consume_type)}, {_name(connection.message_model)}, "
        f"{_name(connection.consume_from_where)}"
    )
    members = Table(title="members")
    members.add_column("client id", no_wrap=True)
    members.add_column("address", no_wrap=True)
    for column in ("language", "version", "brokers"):
        members.add_column(column)
    for m in connection.members:
        brokers = str(len(m.brokers))
        members.add_row(m.client_id, m.client_addr, m.language, str(m.version), brokers)
    console.print(members)
    subscriptions = Table(title="subscriptions")
    for column in ("topic", "expression"):
        subscriptions.add_column(column)
    for name, sub in sorted(connection.subscriptions.items()):
        subscriptions.add_row(name, sub.sub_string)
    console.print(subscriptions)


def show_reset(group: str, topic: str, stamp: int, result: ResetResult) -> None:
    """``reset-offset``: the new offsets, then a line saying from when and who was told."""
    table = Table(title=f"offsets of {group} in {topic}")
    for column in ("queue", "offset"):
        table.add_column(column)
    for queue, offset in sorted(result.offsets.items(), key=lambda i: str(i[0])):
        table.add_row(str(queue), str(offset))
    console.print(table)
    told = (
        f"{result.notified} consumer connection(s) told to go on from them"
        if result.notified
        else "no consumer online: the group starts from them when it next runs"
    )
    at = {-1: "the end of each queue", 0: "the beginning"}.get(stamp) or when(stamp)
    typer.echo(f"group {group}: offsets in {topic} reset to {at}; {told}")


# ---------------------------------------------------------------- messages
def show_messages(found: list[FoundMessage], *, body_full: bool) -> None:
    """``query-message``: each message's fields, then its body (cut to BODY_SHOWN_CHARS
    unless ``body_full``)."""
    for i, item in enumerate(found, 1):
        _print_message(item, i, len(found), body_full)


def _print_message(found: FoundMessage, index: int, total: int, body_full: bool) -> None:
    m = found.message
    text = m.body.decode("utf-8", errors="replace")
    shown = text if body_full else text[:BODY_SHOWN_CHARS]
    cut = "" if len(shown) == len(text) else f", first {len(shown)} characters (--body-full)"
    lines = [
        ("topic", m.topic),
        ("queue", f"{found.broker}:{m.queue_id} offset {m.queue_offset}"),
        ("msg id", m.msg_id),
        ("offset msg id", f"{m.offset_msg_id} (commit log offset {m.physical_offset})"),
        ("tags", _shown(m.tags)),
        ("keys", " ".join(m.keys) or "-"),
        ("store host", m.store_host),
        ("store time", when(m.store_timestamp)),
        ("born host", m.born_host),
        ("born time", when(m.born_timestamp)),
        ("reconsume times", str(m.reconsume_times)),
        ("properties", ", ".join(f"{k}={v}" for k, v in sorted(m.properties.items())) or "-"),
        ("body", f"{len(m.body)} bytes{cut}"),
    ]
    typer.echo(f"message {index} of {total}")
    for name, value in lines:
        typer.echo(f"  {name:<16}{value}")
    typer.echo(shown)


# ---------------------------------------------------------------- automatic failover
def show_sync_state(controller: str, table: dict[str, Any]) -> None:
    """``sync-state-set``: per broker group a line and its replicas, by name."""
    if not table:
        typer.echo(f"no broker group is known to controller {controller}")
    for name, group in sorted(table.items()):
        _print_group(name, group)


def _print_group(name: str, group: dict[str, Any]) -> None:
    """A summary line (never wrapped: scripts read it) and a table of the replicas."""
    master = group.get("masterBrokerId")
    master_text = (
        f"master {master} ({group.get('masterAddress')})" if master is not None else "no master"
    )
    in_sync = group.get("inSyncReplicas") or []
    typer.echo(
        f"{name}: {master_text}, master epoch {group.get('masterEpoch')}; "
        f"SyncStateSet {sorted(r.get('brokerId') for r in in_sync)} "
        f"epoch {group.get('syncStateSetEpoch')}"
    )
    table = Table()
    for column in ("id", "address", "role", "in sync", "alive", "epoch", "max offset"):
        table.add_column(column)
    rows = [(r, True) for r in in_sync] + [(r, False) for r in group.get("notInSyncReplicas") or []]
    for replica, member in sorted(rows, key=lambda row: row[0].get("brokerId", 0)):
        broker_id = replica.get("brokerId")
        table.add_row(
            _shown(broker_id),
            _shown(replica.get("brokerAddress")),
            "master" if broker_id == master else "slave",
            "yes" if member else "NO",
            "yes" if replica.get("alive") else "NO",
            _shown(replica.get("epoch")),
            _shown(replica.get("maxOffset")),
        )
    console.print(table)


def show_election(broker: str, election: Election) -> None:
    """``elect-master``: one line, who is master now and the group's epochs."""
    who = (
        f"broker {election.master_broker_id} ({election.master_address}) is master"
        if election.master_broker_id is not None
        else "no master"
    )
    if not election.elected:
        who += " already; nothing changed"
    typer.echo(
        f"{broker}: {who}, master epoch {election.master_epoch}; SyncStateSet "
        f"{list(election.sync_state_set)} epoch {election.sync_state_set_epoch} "
        f"(controller {election.controller})"
    )


def show_epochs(addr: str, epochs: EpochTable) -> None:
    """``broker-epoch``: a line naming the broker, its epochs, its max offset."""
    about = [f"id {epochs.broker_id}" if epochs.broker_id is not None else "", epochs.role]
    typer.echo(f"epochs of {epochs.broker_name} at {addr}" + "".join(f", {a}" for a in about if a))
    table = Table()
    for column in ("epoch", "start offset", "end offset"):
        table.add_column(column)
    for epoch, start, end in epochs.entries:
        table.add_row(str(epoch), str(start), str(end))
    console.print(table)
    shown = "unknown" if epochs.max_offset is None else str(epochs.max_offset)
    typer.echo(f"max offset {shown}")
