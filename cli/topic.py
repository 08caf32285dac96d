"""``hamq topic``: create, list, route, status, delete; and ``hamq admin``: cluster,
ha-status, and for automatic failover sync-state-set, elect-master, broker-epoch.

The failover commands speak to the controllers (``--controller``, a controller's or a
nameserver's remoting address) and to brokers directly, each request bounded by
REQUEST_TIMEOUT_S. Controllers are asked in turn: one that cannot be reached, has no
Raft quorum (CONTROLLER_NOT_LEADER) or serves no controller (REQUEST_CODE_NOT_SUPPORTED)
passes the question on to the next; any other refusal ends the command with its code
and remark, as does no controller answering (exit code 1).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import attrs
import typer
from rich.console import Console
from rich.table import Table

from cli.common import (
    DEFAULT_NAMESRV,
    CommandError,
    ControllerOption,
    NamesrvOption,
    fail,
    run,
)
from hamq.client import AdminClient, InvalidArgumentError
from hamq.client.admin import TopicShrinkError
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode, code_name
from hamq.protocol.bodies import (
    PERM_READ,
    PERM_WRITE,
    EpochEntryCache,
    SyncStateSet,
    decode_body,
)
from hamq.protocol.headers import ElectMasterRequestHeader, ReplicaInfoResponseHeader
from hamq.remoting import RemotingClient, RemotingError, parse_address

app = typer.Typer(help="Create, list and inspect topics.", no_args_is_help=True)
admin_app = typer.Typer(help="Look at the cluster; automatic failover.", no_args_is_help=True)
console = Console()

#: how long one request to a controller or a broker may take
REQUEST_TIMEOUT_S = 3.0


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
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Create TOPIC (or change its queue count) on every master, or on one broker.

    Fewer queues than the topic has hide the others from consumers: refused (exit
    code 2, naming each queue and its messages) while one of them holds messages,
    unless --force."""

    async def main() -> None:
        async with AdminClient(namesrv) as admin:
            brokers = await admin.create_topic(
                topic,
                queues,
                perm=PERM_READ if read_only else PERM_READ | PERM_WRITE,
                cluster=cluster,
                broker_addr=broker,
                force=force,
            )
        typer.echo(f"topic {topic}: {queues} queue(s) on {', '.join(brokers)}")

    _run_refusing_bad_input(main, shrink_hint="; --force shrinks it anyway")


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

    _run_refusing_bad_input(main)


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


# ---------------------------------------------------------------- automatic failover
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


#: refusals that say "ask another controller"
_ASK_ANOTHER = (ResponseCode.CONTROLLER_NOT_LEADER, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)


async def _ask_controllers(
    addrs: list[str], code: RequestCode, header: Any = None, body: bytes = b""
) -> tuple[str, RemotingCommand]:
    """The first controller's SUCCESS answer, with its address (see the module doc)."""
    problems = []
    async with RemotingClient() as client:
        for addr in addrs:
            request = RemotingCommand.request(code, header, body=body)
            try:
                response = await client.invoke(addr, request, REQUEST_TIMEOUT_S)
            except RemotingError as exc:
                problems.append(str(exc))
                continue
            if response.code == ResponseCode.SUCCESS:
                return addr, response
            refusal = (
                f"controller {addr} answered {code_name(response.code, response=True)}: "
                f"{response.remark or 'no reason given'}"
            )
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                refusal += " (not a controller, nor a nameserver started with --controller?)"
            if response.code not in _ASK_ANOTHER:
                raise CommandError(refusal)
            problems.append(refusal)
    raise CommandError("no controller answered: " + "; ".join(problems))


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


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


@admin_app.command("sync-state-set")
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
        addr, response = await _ask_controllers(
            addrs, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=json.dumps(names).encode()
        )
        try:
            answer = json.loads(response.body)
            table = answer["replicasInfoTable"]
            if not isinstance(table, dict):
                raise TypeError("replicasInfoTable is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise CommandError(
                f"controller {addr}: an answer that is not understood: {exc}"
            ) from None
        if as_json:
            typer.echo(json.dumps(answer, indent=2, sort_keys=True))
        elif not table:
            typer.echo(f"no broker group is known to controller {addr}")
        for name, group in sorted(table.items()):
            if not as_json:
                _print_group(name, group)
        missing = [name for name in names if name not in table]
        if missing:
            _, everything = await _ask_controllers(
                [addr], RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=b"[]"
            )
            known = sorted(json.loads(everything.body).get("replicasInfoTable") or {})
            raise CommandError(
                f"controller {addr} knows no broker group {', '.join(missing)} "
                f"(known: {', '.join(known) or 'none'})"
            )

    run(main)


@admin_app.command("elect-master")
def elect_master(
    controller: ControllerOption,
    broker: Annotated[str, typer.Option("--broker", "-b", help="The broker group (broker name).")],
    broker_id: Annotated[
        int,
        typer.Option("--broker-id", min=0, help="The broker (its id in the group) to make master."),
    ],
    cluster: Annotated[
        str, typer.Option("--cluster", help="The group's cluster.")
    ] = "DefaultCluster",
) -> None:
    """Make a broker the master of its group now (a designated election).

    The broker must be alive and, unless the controllers allow unclean elections, in
    the SyncStateSet; a refusal is printed with the controller's code and reason."""
    addrs = _addresses(controller, "--controller")
    header = ElectMasterRequestHeader(cluster, broker, broker_id, designate_elect=True)

    async def main() -> None:
        addr, response = await _ask_controllers(addrs, RequestCode.CONTROLLER_ELECT_MASTER, header)
        try:
            info = response.header(ReplicaInfoResponseHeader)
            members = decode_body(SyncStateSet, response.body) if response.body else None
        except (RequestError, ValueError) as exc:
            raise CommandError(
                f"controller {addr}: an answer that is not understood: {exc}"
            ) from None
        in_sync = sorted(members.sync_state_set) if members else []
        master = info.master_broker_id
        who = (
            f"broker {master} ({info.master_address}) is master"
            if master is not None and master >= 0
            else "no master"
        )
        typer.echo(
            f"{broker}: {who}, master epoch {info.master_epoch}; SyncStateSet {in_sync} "
            f"epoch {info.sync_state_set_epoch} (controller {addr})"
        )

    run(main)


@attrs.frozen
class EpochTable:
    """A broker's epochs: (epoch, start offset, end offset) each; the last one ends at
    the log end, ``max_offset``."""

    broker_name: str
    broker_id: int | None
    role: str | None
    entries: tuple[tuple[int, int, int], ...]
    max_offset: int | None


def _from_epoch_cache(cache: EpochEntryCache) -> EpochTable:
    entries = tuple((e.epoch, e.start_offset, e.end_offset) for e in cache.epoch_list)
    return EpochTable(cache.broker_name, cache.broker_id, None, entries, cache.max_offset)


def _from_ha_status(status: dict[str, Any]) -> EpochTable:
    """From GET_BROKER_HA_STATUS: ``epochs`` [[epoch, start], ...] and the log end of
    its ``master`` or ``slave`` part."""
    max_offset = None
    for side in ("master", "slave"):
        part = status.get(side)
        if isinstance(part, dict) and isinstance(part.get("max_offset"), int):
            max_offset = part["max_offset"]
            break
    epochs = [(int(epoch), int(start)) for epoch, start in status.get("epochs") or []]
    entries = tuple(
        (epoch, start, epochs[i + 1][1] if i + 1 < len(epochs) else (max_offset or start))
        for i, (epoch, start) in enumerate(epochs)
    )
    broker_id = status.get("brokerId")
    controller = status.get("controller")
    if isinstance(controller, dict) and controller.get("brokerIdAtController") is not None:
        broker_id = controller["brokerIdAtController"]  # (a master registers as id 0)
    return EpochTable(
        str(status.get("broker")),
        broker_id if isinstance(broker_id, int) else None,
        str(status["role"]) if status.get("role") else None,
        entries,
        max_offset,
    )


async def _epoch_table(addr: str) -> EpochTable:
    """GET_BROKER_EPOCH_CACHE (1007); a broker without it: GET_BROKER_HA_STATUS (907)."""
    async with RemotingClient() as client:

        async def ask(code: RequestCode) -> RemotingCommand:
            try:
                return await client.invoke(addr, RemotingCommand.request(code), REQUEST_TIMEOUT_S)
            except RemotingError as exc:
                raise CommandError(f"broker {exc}") from None

        def refused(response: RemotingCommand) -> CommandError:
            name = code_name(response.code, response=True)
            return CommandError(f"broker {addr} answered {name}: {response.remark or ''}")

        response = await ask(RequestCode.GET_BROKER_EPOCH_CACHE)
        try:
            if response.code == ResponseCode.SUCCESS:
                return _from_epoch_cache(decode_body(EpochEntryCache, response.body))
            if response.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise refused(response)
            response = await ask(RequestCode.GET_BROKER_HA_STATUS)
            if response.code != ResponseCode.SUCCESS:
                raise refused(response)
            status = json.loads(response.body)
            if not isinstance(status, dict):
                raise TypeError("not a JSON object")
            return _from_ha_status(status)
        except (RequestError, ValueError, TypeError) as exc:
            raise CommandError(f"broker {addr}: an answer that is not understood: {exc}") from None


@admin_app.command("broker-epoch")
def broker_epoch(
    broker: Annotated[str, typer.Option("--broker", "-b", help="The broker's address, host:port.")],
) -> None:
    """A broker's epochs: where each starts and ends in its CommitLog; its max offset.

    GET_BROKER_EPOCH_CACHE, or from GET_BROKER_HA_STATUS where the broker has no such
    request; the last epoch ends at the max offset."""
    addr = _addresses(broker, "--broker")[0]

    async def main() -> None:
        epochs = await _epoch_table(addr)
        about = [f"id {epochs.broker_id}" if epochs.broker_id is not None else "", epochs.role]
        typer.echo(
            f"epochs of {epochs.broker_name} at {addr}" + "".join(f", {a}" for a in about if a)
        )
        table = Table()
        for column in ("epoch", "start offset", "end offset"):
            table.add_column(column)
        for epoch, start, end in epochs.entries:
            table.add_row(str(epoch), str(start), str(end))
        console.print(table)
        shown = "unknown" if epochs.max_offset is None else str(epochs.max_offset)
        typer.echo(f"max offset {shown}")

    run(main)
