"""The nemesis harness (issue 31): a controller-mode cluster in network namespaces, faults
injected into it, a workload recording every SEND_OK, and a checker.

**The cluster** (``nemesis_cluster``): every process in a host of its own on one bridge
(tests/support/netns.py): three nameservers embedding the controllers (``c1``-``c3``,
Raft between them), broker group ``broker-a`` of three controller-mode brokers
(``a1``-``a3``) and group ``broker-b`` of two (``b1``, ``b2``), both with
``all_ack_in_sync_state_set``; and ``client``, the host the test itself acts from
(``netns.entered``): producers, consumers and admin requests. Inside a namespace every
port is free, so the ports are fixed (nameserver 9876, Raft 9880, broker 10911, HA
10912). Stores and logs live under the cluster's directory on the machine's own disk,
where the checker reads the CommitLogs.

**The workload** (``Workload``): topic ``nemesis``, four queues in each group. One task
per queue sends numbered messages (``<queue>:<n>``) to that queue alone, one at a time,
recording every SEND_OK with its time (Trio's clock); an error is counted and the task
goes on with the next number. A push consumer group reads everything concurrently.

**The faults** (``NEMESES``): each picks its target when it starts (the current master
of ``broker-a``, the Raft leader, ...), holds the fault, heals it, and the schedule
waits for the group to settle (a master, every broker in its SyncStateSet, the slaves
at the master's end) before the next.

**The checker** (``check``): after the last fault, every queue is read whole from its
group's final master; a message acknowledged and absent is **lost**; one present twice
is **duplicated**; acknowledged messages of a queue out of their sending order are
**reordered**; brokers of a group whose CommitLogs differ in their common length are
**divergent**. Per fault: the **unavailable** window (the longest stretch with no
SEND_OK in the faulted group, from the fault's start to the first SEND_OK after its
heal) and the **recovery** time (heal to settled). Any lost or divergent message fails a
run.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import random
import signal
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from hamq.client import Message, MessageQueue, Producer, PullConsumer, PullStatus, SendStatus
from hamq.client.errors import ClientError
from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient, RemotingError
from tests.support import netns
from tests.support.autoswitch import Server
from tests.support.brokers import SMALL_STORE
from tests.support.processes import write_toml

TOPIC = "nemesis"
GROUPS = {"broker-a": 3, "broker-b": 2}
QUEUES_PER_GROUP = 4
NAMESRV_PORT, RAFT_PORT, BROKER_PORT, HA_PORT = 9876, 9880, 10911, 10912
#: how long a send may take, retries included (the producer's own)
SEND_TIMEOUT_S = 6.0
#: how long a group may take to settle after a fault is healed
SETTLE_S = 60.0


# ---------------------------------------------------------------- the cluster


@attrs.define
class Member:
    """A process of the cluster and the host it runs in."""

    name: str
    host: netns.Host
    server: Server
    group: str | None = None
    store: Path | None = None

    @property
    def address(self) -> str:
        return self.server.address


@attrs.define
class NemesisCluster:
    root: Path
    network: netns.Network
    client: netns.Host
    controllers: list[Member]
    brokers: dict[str, list[Member]]

    @property
    def namesrv(self) -> str:
        return ";".join(c.address for c in self.controllers)

    @property
    def members(self) -> list[Member]:
        return [*self.controllers, *(b for group in self.brokers.values() for b in group)]

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    async def ask(self, code: RequestCode, timeout_s: float = 2.0) -> RemotingCommand:
        """A controller request to the first running controller that answers."""
        problems = []
        async with RemotingClient() as client:
            for member in self.controllers:
                if not member.server.running:
                    continue
                try:
                    return await client.invoke(
                        member.address, RemotingCommand.request(code), timeout_s
                    )
                except RemotingError as exc:
                    problems.append(f"{member.address}: {exc}")
        raise RuntimeError(f"no controller answered: {problems}")

    async def group_state(self, group: str) -> dict[str, Any]:
        response = await self.ask(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA)
        table: dict[str, Any] = json.loads(response.body)["replicasInfoTable"]
        return dict(table.get(group, {}))

    async def master(self, group: str) -> Member | None:
        with contextlib.suppress(RuntimeError, RemotingError):
            address = (await self.group_state(group)).get("masterAddress")
            return next((b for b in self.brokers[group] if b.address == address), None)
        return None

    async def raft_leader(self) -> Member | None:
        with contextlib.suppress(RuntimeError, RemotingError, ValueError, KeyError):
            response = await self.ask(RequestCode.CONTROLLER_GET_METADATA_INFO)
            leader = json.loads(response.body)["leader"]
            return next(
                (c for c in self.controllers if leader and leader.startswith(c.host.ip)), None
            )
        return None

    async def settled(self, group: str) -> dict[str, Any] | None:
        """The group's state if it has a master whose SyncStateSet holds every broker
        of the group, each running and at the master's CommitLog end; else None."""
        try:
            state = await self.group_state(group)
        except (RuntimeError, RemotingError):
            return None
        members = self.brokers[group]
        master = state.get("masterAddress")
        if not master or len(state.get("inSyncReplicas", [])) < len(members):
            return None
        if not all(m.server.running for m in members):
            return None
        try:
            async with RemotingClient() as client:
                response = await client.invoke(
                    master, RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 2
                )
        except RemotingError:
            return None
        slaves = json.loads(response.body).get("master", {}).get("slaves", [])
        caught_up = [s for s in slaves if s["lag_bytes"] == 0]
        return state if len(caught_up) >= len(members) - 1 else None

    async def wait_settled(self, group: str, timeout_s: float = SETTLE_S) -> float:
        """Wait until ``group`` settles (``settled``); how long it took. AssertionError
        naming the last state seen after ``timeout_s``."""
        start = trio.current_time()
        seen: dict[str, Any] | None = None
        with trio.move_on_after(timeout_s):
            while True:
                seen = await self.settled(group)
                if seen is not None:
                    return trio.current_time() - start
                await trio.sleep(0.1)
        with contextlib.suppress(Exception):
            seen = await self.group_state(group)
        raise AssertionError(f"{group} did not settle within {timeout_s:g} s: {seen}")


def commitlog_end(store: Path | None) -> int:
    """How far a store's CommitLog holds data, from its files (zeros are not data)."""
    if store is None:
        return 0
    segments = sorted((store / "commitlog").glob("[0-9]" * 20))
    if not segments:
        return 0
    last = segments[-1]
    return int(last.name) + len(last.read_bytes().rstrip(b"\0"))


def commitlog_bytes(store: Path, length: int) -> bytes:
    out = bytearray()
    for segment in sorted((store / "commitlog").glob("[0-9]" * 20)):
        out += segment.read_bytes()[: length - len(out)]
        if len(out) >= length:
            break
    return bytes(out)


@asynccontextmanager
async def nemesis_cluster(root: Path) -> AsyncIterator[NemesisCluster]:
    """The cluster (module docstring), every process started and each group settled;
    everything killed by PID and every namespace removed at the end. The caller acts
    from ``cluster.client`` (``netns.entered``)."""
    network = netns.Network.create()
    try:
        client = network.add("client")
        controllers = [network.add(f"c{i}") for i in (1, 2, 3)]
        peers = ";".join(f"{h.ip}:{RAFT_PORT}" for h in controllers)
        secret = root / "raft.secret"
        secret.write_text("nemesis-raft-secret\n")
        members = [
            Member(
                host.name,
                host,
                Server(
                    host.name,
                    [
                        "nameserver",
                        "--host",
                        host.ip,
                        "--port",
                        str(NAMESRV_PORT),
                        "--controller",
                        "--raft-address",
                        f"{host.ip}:{RAFT_PORT}",
                        "--raft-peers",
                        peers,
                        "--raft-secret-file",
                        str(secret),
                        "--controller-dir",
                        str(root / f"{host.name}-controller"),
                    ],
                    root / f"{host.name}.log",
                    f"{host.ip}:{NAMESRV_PORT}",
                    prefix=host.command([]),
                ),
            )
            for host in controllers
        ]
        namesrv = [m.address for m in members]
        brokers: dict[str, list[Member]] = {}
        for group, count in GROUPS.items():
            brokers[group] = []
            for i in range(1, count + 1):
                host = network.add(f"{group[-1]}{i}")
                store = root / f"{host.name}-store"
                config = write_toml(
                    root / f"{host.name}.toml",
                    {
                        "broker_name": group,
                        "listen_host": host.ip,
                        "listen_port": BROKER_PORT,
                        "ha_listen_port": HA_PORT,
                        "namesrv_addrs": namesrv,
                        "enable_controller_mode": True,
                        "controller_addrs": namesrv,
                        "all_ack_in_sync_state_set": True,
                        "ha": {"secret": "nemesis-ha-secret-0123456789"},
                        "store": {"store_dir": str(store), **SMALL_STORE},
                    },
                )
                server = Server(
                    host.name,
                    ["broker", "-c", str(config)],
                    root / f"{host.name}.log",
                    f"{host.ip}:{BROKER_PORT}",
                    prefix=host.command([]),
                )
                brokers[group].append(Member(host.name, host, server, group, store))
        cluster = NemesisCluster(root, network, client, members, brokers)
        try:
            async with trio.open_nursery() as nursery:
                for member in cluster.controllers:
                    nursery.start_soon(member.server.start)
            async with trio.open_nursery() as nursery:
                for member in cluster.members[3:]:
                    nursery.start_soon(member.server.start)
            with netns.entered(client):
                for group in GROUPS:
                    await cluster.wait_settled(group)
                await _create_topic(cluster)
            yield cluster
        finally:
            with trio.CancelScope(shield=True):
                for member in cluster.members:
                    if member.server.running:
                        with contextlib.suppress(ProcessLookupError):
                            member.server.send_signal(signal.SIGCONT)
                    with contextlib.suppress(Exception):
                        await member.server.kill()
    finally:
        network.close()


async def _create_topic(cluster: NemesisCluster) -> None:
    from hamq.client import AdminClient

    async with AdminClient(cluster.namesrv) as admin:
        await admin.create_topic(TOPIC, QUEUES_PER_GROUP)


# ---------------------------------------------------------------- the workload


@attrs.define
class Ack:
    at: float
    group: str
    queue: int
    n: int


@attrs.define
class Workload:
    """Producers (one task per queue) and a consumer, running until ``stop``."""

    cluster: NemesisCluster
    acks: list[Ack] = attrs.field(factory=list)
    errors: collections.Counter[str] = attrs.field(factory=collections.Counter)
    received: list[str] = attrs.field(factory=list)
    _stopping: trio.Event = attrs.field(factory=trio.Event)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with (
            Producer(
                "nemesis-producer", self.cluster.namesrv, send_timeout_s=SEND_TIMEOUT_S
            ) as producer,
            trio.open_nursery() as nursery,
        ):
            for group in GROUPS:
                for queue_id in range(QUEUES_PER_GROUP):
                    queue = MessageQueue(TOPIC, group, queue_id)
                    nursery.start_soon(self._send_to, producer, queue)
            task_status.started()
            await self._stopping.wait()
            nursery.cancel_scope.cancel()

    async def _send_to(self, producer: Producer, queue: MessageQueue) -> None:
        n = 0
        while True:
            n += 1
            body = f"{queue.broker_name}/{queue.queue_id}:{n}".encode()
            try:
                result = await producer.send(Message(TOPIC, body), queue=queue)
            except ClientError as exc:
                self.errors[type(exc).__name__] += 1
                await trio.sleep(0.05)
                continue
            if result.status is SendStatus.SEND_OK:
                self.acks.append(Ack(trio.current_time(), queue.broker_name, queue.queue_id, n))
            else:
                self.errors[result.status.name] += 1

    def acked_since(self, group: str, since: float) -> int:
        return sum(1 for a in self.acks if a.group == group and a.at >= since)


# ---------------------------------------------------------------- faults


@attrs.define
class Fault:
    """One fault as it happened: what, on whom, when (Trio's clock)."""

    nemesis: str
    group: str
    targets: list[str]
    start: float
    healed: float = 0.0
    settled: float = 0.0


Nemesis = Callable[[NemesisCluster, random.Random], Awaitable[tuple[list[str], "Heal"]]]
Heal = Callable[[], Awaitable[None]]


async def _master_of_a(cluster: NemesisCluster) -> Member:
    master = await cluster.master("broker-a")
    assert master is not None, "broker-a has no master"
    return master


def _heal_network(cluster: NemesisCluster) -> Heal:
    async def heal() -> None:
        cluster.network.heal()

    return heal


async def split_master(cluster: NemesisCluster, rng: random.Random) -> tuple[list[str], Heal]:
    """The master cut from the controllers and its slaves; the client still reaches it."""
    master = await _master_of_a(cluster)
    others = [m.name for m in cluster.controllers + cluster.brokers["broker-a"] if m is not master]
    cluster.network.cut_between([master.name], others)
    return [master.name], _heal_network(cluster)


async def master_from_slaves(cluster: NemesisCluster, rng: random.Random) -> tuple[list[str], Heal]:
    """The master cut from its slaves only."""
    master = await _master_of_a(cluster)
    slaves = [m.name for m in cluster.brokers["broker-a"] if m is not master]
    cluster.network.cut_between([master.name], slaves)
    return [master.name], _heal_network(cluster)


async def isolate_slave(cluster: NemesisCluster, rng: random.Random) -> tuple[list[str], Heal]:
    """One slave cut from every other host (the client too)."""
    master = await _master_of_a(cluster)
    slave = rng.choice([m for m in cluster.brokers["broker-a"] if m is not master])
    others = [h for h in cluster.network.hosts if h != slave.name]
    cluster.network.cut_between([slave.name], others)
    return [slave.name], _heal_network(cluster)


async def controller_minority(
    cluster: NemesisCluster, rng: random.Random
) -> tuple[list[str], Heal]:
    """The Raft leader (or any controller) cut from every other host."""
    leader = await cluster.raft_leader() or rng.choice(cluster.controllers)
    others = [h for h in cluster.network.hosts if h != leader.name]
    cluster.network.cut_between([leader.name], others)
    return [leader.name], _heal_network(cluster)


async def controller_majority(
    cluster: NemesisCluster, rng: random.Random
) -> tuple[list[str], Heal]:
    """Two controllers cut from every other host (and each other): no quorum anywhere."""
    cut = rng.sample(cluster.controllers, 2)
    names = [c.name for c in cut]
    for member in cut:
        cluster.network.cut_between(
            [member.name], [h for h in cluster.network.hosts if h != member.name]
        )
    return names, _heal_network(cluster)


async def master_with_leader(cluster: NemesisCluster, rng: random.Random) -> tuple[list[str], Heal]:
    """{master of broker-a, Raft leader} cut from the other controllers and brokers."""
    master = await _master_of_a(cluster)
    leader = await cluster.raft_leader() or rng.choice(cluster.controllers)
    side = [master.name, leader.name]
    rest = [m.name for m in cluster.members if m.name not in side]
    cluster.network.cut_between(side, rest)
    return side, _heal_network(cluster)


async def bridge(cluster: NemesisCluster, rng: random.Random) -> tuple[list[str], Heal]:
    """Controllers: one sees both others, the other two do not see each other."""
    middle = rng.choice(cluster.controllers)
    ends = [c.name for c in cluster.controllers if c is not middle]
    cluster.network.cut(ends[0], ends[1])
    return ends, _heal_network(cluster)


def _process_fault(
    pick: Callable[[NemesisCluster, random.Random], Awaitable[list[Member]]], sig: int
) -> Nemesis:
    async def nemesis(cluster: NemesisCluster, rng: random.Random) -> tuple[list[str], Heal]:
        targets = await pick(cluster, rng)
        for member in targets:
            if sig == signal.SIGKILL:
                await member.server.kill()
            else:
                member.server.send_signal(sig)

        async def heal() -> None:
            for member in targets:
                if sig == signal.SIGKILL:
                    await member.server.start()
                else:
                    member.server.send_signal(signal.SIGCONT)

        return [m.name for m in targets], heal

    return nemesis


async def _pick_master(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    return [await _master_of_a(cluster)]


async def _pick_slave(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    master = await _master_of_a(cluster)
    return [rng.choice([m for m in cluster.brokers["broker-a"] if m is not master])]


async def _pick_controller(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    return [await cluster.raft_leader() or rng.choice(cluster.controllers)]


async def _pick_all_controllers(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    return list(cluster.controllers)


#: every nemesis by name (the fault it holds until healed)
NEMESES: dict[str, Nemesis] = {
    "split-master": split_master,
    "master-from-slaves": master_from_slaves,
    "isolate-slave": isolate_slave,
    "controller-minority": controller_minority,
    "controller-majority": controller_majority,
    "master-with-leader": master_with_leader,
    "bridge": bridge,
    "kill-master": _process_fault(_pick_master, signal.SIGKILL),
    "kill-slave": _process_fault(_pick_slave, signal.SIGKILL),
    "kill-controller": _process_fault(_pick_controller, signal.SIGKILL),
    "kill-controllers": _process_fault(_pick_all_controllers, signal.SIGKILL),
    "stop-master": _process_fault(_pick_master, signal.SIGSTOP),
    "stop-slave": _process_fault(_pick_slave, signal.SIGSTOP),
    "stop-controller": _process_fault(_pick_controller, signal.SIGSTOP),
}


async def inject(
    cluster: NemesisCluster, workload: Workload, name: str, hold_s: float, rng: random.Random
) -> Fault:
    """Run nemesis ``name``: start it, hold it ``hold_s``, heal it, wait for broker-a to
    settle again; the Fault with its times."""
    start = trio.current_time()
    targets, heal = await NEMESES[name](cluster, rng)
    fault = Fault(name, "broker-a", targets, start)
    await trio.sleep(hold_s)
    await heal()
    fault.healed = trio.current_time()
    await cluster.wait_settled("broker-a")
    await cluster.wait_settled("broker-b")
    fault.settled = trio.current_time()
    return fault


# ---------------------------------------------------------------- the checker


@attrs.frozen
class FaultReport:
    nemesis: str
    targets: list[str]
    acked_during: int
    unavailable_s: float
    recovery_s: float


@attrs.frozen
class Report:
    acked: int
    errors: dict[str, int]
    lost: list[str]
    duplicated: list[str]
    reordered: list[str]
    divergent: list[str]
    faults: list[FaultReport]

    @property
    def ok(self) -> bool:
        return not self.lost and not self.divergent

    def summary(self) -> str:
        lines = [
            f"acknowledged {self.acked}, lost {len(self.lost)}, duplicated "
            f"{len(self.duplicated)}, reordered {len(self.reordered)}, divergent "
            f"{len(self.divergent)}; errors {dict(self.errors)}"
        ]
        by_nemesis: dict[str, list[FaultReport]] = collections.defaultdict(list)
        for fault in self.faults:
            by_nemesis[fault.nemesis].append(fault)
        for name, faults in sorted(by_nemesis.items()):
            windows = [f.unavailable_s for f in faults]
            recoveries = [f.recovery_s for f in faults]
            lines.append(
                f"  {name}: {len(faults)} run(s), {sum(f.acked_during for f in faults)} "
                f"SEND_OK, unavailable p50 {statistics.median(windows):.1f} s max "
                f"{max(windows):.1f} s, recovery p50 {statistics.median(recoveries):.1f} s"
            )
        return "\n".join(lines)


def unavailable_window(acks: Sequence[float], fault: Fault) -> float:
    """The longest stretch with no SEND_OK between the fault's start and the first
    SEND_OK after its heal (``acks``: the group's SEND_OK times, sorted)."""
    times = [t for t in acks if fault.start <= t <= fault.settled]
    after = next((t for t in acks if t >= fault.healed), fault.settled)
    points = [fault.start, *[t for t in times if t <= after], after]
    return max(b - a for a, b in itertools.pairwise(points)) if len(points) > 1 else 0.0


async def read_queue(consumer: PullConsumer, queue: MessageQueue) -> list[str]:
    found: list[str] = []
    offset = 0
    while True:
        result = await consumer.pull(queue, offset, max_nums=256)
        if result.status is not PullStatus.FOUND:
            if result.next_begin_offset > offset and result.status is not PullStatus.NO_NEW_MSG:
                offset = result.next_begin_offset
                continue
            return found
        found += [m.body.decode() for m in result.messages]
        offset = result.next_begin_offset


async def check(cluster: NemesisCluster, workload: Workload, faults: list[Fault]) -> Report:
    """Read every queue whole from its group's master and judge (module docstring);
    call it with every group settled."""
    stored: dict[str, list[str]] = {}
    async with PullConsumer("nemesis-checker", cluster.namesrv) as consumer:
        for group in GROUPS:
            for queue_id in range(QUEUES_PER_GROUP):
                queue = MessageQueue(TOPIC, group, queue_id)
                stored[f"{group}/{queue_id}"] = await read_queue(consumer, queue)
    acked_by_queue: dict[str, list[int]] = collections.defaultdict(list)
    for ack in workload.acks:
        acked_by_queue[f"{ack.group}/{ack.queue}"].append(ack.n)
    lost, duplicated, reordered = [], [], []
    for name, bodies in stored.items():
        counts = collections.Counter(bodies)
        duplicated += [b for b, c in counts.items() if c > 1]
        present = set(bodies)
        acked = acked_by_queue.get(name, [])
        lost += [f"{name}:{n}" for n in acked if f"{name}:{n}" not in present]
        position = {b: i for i, b in reversed(list(enumerate(bodies)))}
        places = [position[f"{name}:{n}"] for n in sorted(acked) if f"{name}:{n}" in position]
        reordered += [f"{name}: {b} before {a}" for a, b in itertools.pairwise(places) if b < a]
    divergent = []
    for group, members in cluster.brokers.items():
        stores = [m.store for m in members if m.store is not None]
        common = min(commitlog_end(s) for s in stores)
        logs = {m.name: commitlog_bytes(m.store, common) for m in members if m.store}
        if len(set(logs.values())) > 1:
            divergent.append(f"{group}: CommitLogs differ within their first {common} bytes")
    reports = []
    for fault in faults:
        times = sorted(a.at for a in workload.acks if a.group == fault.group)
        reports.append(
            FaultReport(
                fault.nemesis,
                fault.targets,
                sum(1 for t in times if fault.start <= t <= fault.settled),
                unavailable_window(times, fault),
                fault.settled - fault.healed,
            )
        )
    return Report(
        len(workload.acks), dict(workload.errors), lost, duplicated, reordered, divergent, reports
    )


async def run_schedule(
    cluster: NemesisCluster,
    schedule: Sequence[tuple[str, float]],
    *,
    seed: int = 0,
    warmup_s: float = 2.0,
) -> Report:
    """Run the workload under ``schedule`` (nemesis names and hold times, one after
    another, each healed and settled before the next) and check; the caller acts from
    the client host."""
    rng = random.Random(seed)
    workload = Workload(cluster)
    faults: list[Fault] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(workload.run)
        await trio.sleep(warmup_s)
        for name, hold_s in schedule:
            faults.append(await inject(cluster, workload, name, hold_s, rng))
        await trio.sleep(1.0)  # (acks of the last fault's recovery)
        workload.stop()
    for group in GROUPS:
        await cluster.wait_settled(group)
    return await check(cluster, workload, faults)


def random_schedule(
    seed: int, duration_s: float, names: Sequence[str] = ()
) -> list[tuple[str, float]]:
    """Nemeses and hold times drawn with ``seed`` until their holds add up to
    ``duration_s`` (settling comes on top)."""
    rng = random.Random(seed)
    choices = sorted(names or NEMESES)
    schedule: list[tuple[str, float]] = []
    total = 0.0
    while total < duration_s:
        hold = round(rng.uniform(2.0, 10.0), 1)
        schedule.append((rng.choice(choices), hold))
        total += hold
    return schedule
