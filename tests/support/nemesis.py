"""The nemesis harness: a controller-mode cluster in network namespaces, faults
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
recording every SEND_OK with its time (``time.monotonic``); an error is counted and the
task goes on with the next number. With ``cpp``, RocketMQ's C++ client (a process in
the client host) sends ``cpp:<n>`` too, to the queues it picks. A push consumer group
reads everything concurrently.

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
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from hamq.client import (
    ConsumeResult,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
)
from hamq.client.errors import ClientError
from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient, RemotingError
from tests.support import netns
from tests.support.autoswitch import Server, controller_mode_broker, controller_server
from tests.support.faketime import faketime_env

TOPIC = "nemesis"
GROUPS = {"broker-a": 3, "broker-b": 2}
QUEUES_PER_GROUP = 4
NAMESRV_PORT, RAFT_PORT, BROKER_PORT, HA_PORT = 9876, 9880, 10911, 10912
#: what every broker of the cluster is configured with, on top of controller mode
BROKER_SETTINGS = {
    "all_ack_in_sync_state_set": True,
    "ha": {"secret": "nemesis-ha-secret-0123456789"},
}
#: how long a send may take, retries included (the producer's own)
SEND_TIMEOUT_S = 6.0
#: how long a group may take to settle after a fault is healed
SETTLE_S = 60.0
#: a3's store is a tmpfs of this size, for the full-disk nemesis
FULL_DISK_BYTES = 1 << 30
#: RocketMQ's C++ client (PyPI rocketmq 0.4.4) driven as a process (Linux x86_64 only)
CPP_DRIVER = Path(__file__).with_name("rocketmq_driver.py")


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
    #: stores on a tmpfs of their own (the full-disk nemesis needs one)
    tmpfs: list[Path] = attrs.field(factory=list)

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
        """The group's state as the controllers hold it: the newest (highest master
        epoch, then SyncStateSet epoch) of those that answer within 2 s — a controller
        cut off from the majority holds an old one. RuntimeError if none answers."""
        states: list[dict[str, Any]] = []

        async def ask(client: RemotingClient, member: Member) -> None:
            request = RemotingCommand.request(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA)
            with contextlib.suppress(RemotingError, ValueError, KeyError):
                response = await client.invoke(member.address, request, 2.0)
                states.append(dict(json.loads(response.body)["replicasInfoTable"].get(group, {})))

        async with RemotingClient() as client, trio.open_nursery() as nursery:
            for member in self.controllers:
                if member.server.running:
                    nursery.start_soon(ask, client, member)
        if not states:
            raise RuntimeError("no controller answered")
        return max(states, key=lambda s: (s.get("masterEpoch", 0), s.get("syncStateSetEpoch", 0)))

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
                controller_server(
                    host.name,
                    root,
                    host=host.ip,
                    port=NAMESRV_PORT,
                    raft_port=RAFT_PORT,
                    peers=peers,
                    secret=secret,
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
                server = controller_mode_broker(
                    host.name,
                    root,
                    host=host.ip,
                    port=BROKER_PORT,
                    ha_port=HA_PORT,
                    controllers=namesrv,
                    store=store,
                    group=group,
                    settings=BROKER_SETTINGS,
                    prefix=host.command([]),
                )
                brokers[group].append(Member(host.name, host, server, group, store))
        cluster = NemesisCluster(root, network, client, members, brokers)
        try:
            cluster.tmpfs = _mount_tmpfs(cluster.member("a3").store)
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
                for mount in cluster.tmpfs:
                    await trio.run_process(["umount", str(mount)], check=False, capture_stderr=True)
    finally:
        network.close()


def _mount_tmpfs(store: Path | None) -> list[Path]:
    """``store`` made a tmpfs of FULL_DISK_BYTES (for the full-disk nemesis); [] if it
    cannot be (the nemesis then is not run)."""
    assert store is not None
    store.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FULL_DISK_BYTES}", "tmpfs", str(store)],
        capture_output=True,
        check=False,
    )
    return [store] if done.returncode == 0 else []


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
    """Producers (one task per queue; with ``cpp``, RocketMQ's C++ client too, sending
    ``cpp:<n>`` to whichever queue it picks) running until ``stop``."""

    cluster: NemesisCluster
    cpp: bool = False
    acks: list[Ack] = attrs.field(factory=list)
    #: the C++ client's SEND_OKs: (time, n)
    cpp_acks: list[tuple[float, int]] = attrs.field(factory=list)
    #: messages the concurrent push consumer was given (a message may come twice)
    consumed: int = 0
    errors: collections.Counter[str] = attrs.field(factory=collections.Counter)
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
            if self.cpp:
                await nursery.start(self._cpp_producer)
            nursery.start_soon(self._consume)
            task_status.started()
            await self._stopping.wait()
            nursery.cancel_scope.cancel()

    async def _consume(self) -> None:
        """A push consumer group reading the topic while the faults happen (the pull
        path under the same faults); how many messages it was given."""
        consumer = PushConsumer(
            "nemesis-consumer", self.cluster.namesrv, consume_from="FIRST_OFFSET"
        )
        consumer.subscribe(TOPIC)

        def handle(messages: list[MessageExt]) -> ConsumeResult:
            self.consumed += len(messages)
            return ConsumeResult.SUCCESS

        await consumer.run(handle)

    async def _cpp_producer(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The C++ client sending until cancelled; its SEND_OKs into ``cpp_acks``."""
        home = self.cluster.root / "cpp-home"  # (it logs to $HOME/logs/rocketmq-cpp)
        home.mkdir(exist_ok=True)
        args = [
            sys.executable, str(CPP_DRIVER), "send", "--namesrv", self.cluster.namesrv,
            "--topic", TOPIC, "--group", "CPP_NEMESIS", "--mode", "sync", "--keep-going",
            "--count", "1000000000", "--body", "cpp:{i}",
        ]  # fmt: skip
        process = await trio.lowlevel.open_process(
            self.cluster.client.command(args),  # (Trio starts it from a worker thread)
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "HOME": str(home)},
        )
        task_status.started()
        try:
            assert process.stdout is not None
            pending = b""
            async for chunk in process.stdout:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    record = json.loads(line)
                    if record.get("status") == "OK":
                        self.cpp_acks.append((float(record["at"]), int(record["i"])))
                    elif "error" in record or "status" in record:
                        self.errors["cpp " + str(record.get("status", "error"))] += 1
        finally:
            with trio.CancelScope(shield=True):
                process.kill()
                await process.wait()

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
                self.acks.append(Ack(time.monotonic(), queue.broker_name, queue.queue_id, n))
            else:
                self.errors[result.status.name] += 1

    def acked_since(self, group: str, since: float) -> int:
        return sum(1 for a in self.acks if a.group == group and a.at >= since)


# ---------------------------------------------------------------- faults


@attrs.define
class Fault:
    """One fault as it happened: what, on whom, when (``time.monotonic``: the system's
    monotonic clock, which the C++ producer's process reads too)."""

    nemesis: str
    group: str
    targets: list[str]
    start: float
    healed: float = 0.0
    settled: float = 0.0


#: a nemesis starts its fault, holds it ``hold_s`` (as it sees fit) and returns its
#: targets and how to heal it
Nemesis = Callable[[NemesisCluster, random.Random, float], Awaitable[tuple[list[str], "Heal"]]]
Heal = Callable[[], Awaitable[None]]


async def _master_of_a(cluster: NemesisCluster) -> Member:
    master = await cluster.master("broker-a")
    assert master is not None, "broker-a has no master"
    return master


#: a fault as it starts: its targets, and how to heal it
Started = tuple[list[str], Heal]


def _held(start: Callable[[NemesisCluster, random.Random], Awaitable[Started]]) -> Nemesis:
    """A nemesis that starts its fault with ``start`` and holds it."""

    async def nemesis(cluster: NemesisCluster, rng: random.Random, hold_s: float) -> Started:
        started = await start(cluster, rng)
        await trio.sleep(hold_s)
        return started

    nemesis.__doc__ = start.__doc__
    return nemesis


def _heal_network(cluster: NemesisCluster) -> Heal:
    async def heal() -> None:
        cluster.network.heal()

    return heal


def _cut_off(cluster: NemesisCluster, names: list[str]) -> Started:
    """Each of ``names`` cut from every other host (the client too)."""
    for name in names:
        cluster.network.cut_between([name], [h for h in cluster.network.hosts if h != name])
    return names, _heal_network(cluster)


async def split_master(cluster: NemesisCluster, rng: random.Random) -> Started:
    """The master cut from the controllers and its slaves; the client still reaches it."""
    master = await _master_of_a(cluster)
    others = [m.name for m in cluster.controllers + cluster.brokers["broker-a"] if m is not master]
    cluster.network.cut_between([master.name], others)
    return [master.name], _heal_network(cluster)


async def master_from_slaves(cluster: NemesisCluster, rng: random.Random) -> Started:
    """The master cut from its slaves only."""
    master = await _master_of_a(cluster)
    slaves = [m.name for m in cluster.brokers["broker-a"] if m is not master]
    cluster.network.cut_between([master.name], slaves)
    return [master.name], _heal_network(cluster)


async def isolate_slave(cluster: NemesisCluster, rng: random.Random) -> Started:
    """One slave cut from every other host (the client too)."""
    master = await _master_of_a(cluster)
    slave = rng.choice([m for m in cluster.brokers["broker-a"] if m is not master])
    return _cut_off(cluster, [slave.name])


async def controller_minority(cluster: NemesisCluster, rng: random.Random) -> Started:
    """The Raft leader (or any controller) cut from every other host."""
    leader = await cluster.raft_leader() or rng.choice(cluster.controllers)
    return _cut_off(cluster, [leader.name])


async def controller_majority(cluster: NemesisCluster, rng: random.Random) -> Started:
    """Two controllers cut from every other host and each other: no quorum anywhere."""
    return _cut_off(cluster, [c.name for c in rng.sample(cluster.controllers, 2)])


async def master_with_leader(cluster: NemesisCluster, rng: random.Random) -> Started:
    """{master of broker-a, Raft leader} cut from the other controllers and brokers."""
    master = await _master_of_a(cluster)
    leader = await cluster.raft_leader() or rng.choice(cluster.controllers)
    side = [master.name, leader.name]
    rest = [m.name for m in cluster.members if m.name not in side]
    cluster.network.cut_between(side, rest)
    return side, _heal_network(cluster)


async def bridge(cluster: NemesisCluster, rng: random.Random) -> Started:
    """Controllers: one sees both others, the other two do not see each other."""
    middle = rng.choice(cluster.controllers)
    ends = [c.name for c in cluster.controllers if c is not middle]
    cluster.network.cut(ends[0], ends[1])
    return ends, _heal_network(cluster)


async def flapping(cluster: NemesisCluster, rng: random.Random, hold_s: float) -> Started:
    """The master of broker-a cut from the controllers and its slaves and healed again,
    over and over (0.5-2 s each way) for ``hold_s``; whoever is master when a cut
    starts is cut."""
    targets: list[str] = []
    until = time.monotonic() + hold_s
    while time.monotonic() < until:
        master = await cluster.master("broker-a")
        if master is not None:
            others = [
                m.name for m in cluster.controllers + cluster.brokers["broker-a"] if m is not master
            ]
            cluster.network.cut_between([master.name], others)
            targets.append(master.name)
        await trio.sleep(rng.uniform(0.5, 2.0))
        cluster.network.heal()
        await trio.sleep(rng.uniform(0.5, 2.0))
    return targets, _heal_network(cluster)


def _process_fault(
    pick: Callable[[NemesisCluster, random.Random], Awaitable[list[Member]]], sig: int
) -> Nemesis:
    """A nemesis that sends ``sig`` to the members ``pick`` chooses (SIGKILL: and
    starts them again to heal; SIGSTOP: SIGCONT)."""

    async def start(cluster: NemesisCluster, rng: random.Random) -> Started:
        targets = await pick(cluster, rng)
        for member in targets:
            if sig == signal.SIGKILL:
                await member.server.kill()
            else:
                member.server.send_signal(sig)

        async def heal() -> None:
            if sig == signal.SIGKILL:  # (controllers first: brokers wait for them to start)
                async with trio.open_nursery() as nursery:
                    for member in targets:
                        if member.group is None:
                            nursery.start_soon(member.server.start)
                async with trio.open_nursery() as nursery:
                    for member in targets:
                        if member.group is not None:
                            nursery.start_soon(member.server.start)
            else:
                for member in targets:
                    member.server.send_signal(signal.SIGCONT)

        return [m.name for m in targets], heal

    start.__doc__ = f"{signal.Signals(sig).name} of {pick.__doc__}"
    return _held(start)


async def _pick_master(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    """the master of broker-a"""
    return [await _master_of_a(cluster)]


async def _pick_slave(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    """a slave of broker-a"""
    master = await _master_of_a(cluster)
    return [rng.choice([m for m in cluster.brokers["broker-a"] if m is not master])]


async def _pick_controller(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    """the Raft leader"""
    return [await cluster.raft_leader() or rng.choice(cluster.controllers)]


async def _pick_controllers(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    """every controller"""
    return list(cluster.controllers)


async def _pick_everyone(cluster: NemesisCluster, rng: random.Random) -> list[Member]:
    """every process of the cluster at once"""
    return list(cluster.members)


def _clock_skew(offset: str) -> Nemesis:
    """A nemesis that restarts a broker of broker-a (any role) with its wall clock
    ``offset`` off (libfaketime), and restarts it with a true clock to heal."""

    async def start(cluster: NemesisCluster, rng: random.Random) -> Started:
        member = rng.choice(cluster.brokers["broker-a"])
        await member.server.kill()
        member.server.env = faketime_env(offset)
        await member.server.start()

        async def heal() -> None:
            await member.server.kill()
            member.server.env = None
            await member.server.start()

        return [member.name], heal

    start.__doc__ = f"a broker of broker-a restarted with its clock {offset} off"
    return _held(start)


async def full_disk(cluster: NemesisCluster, rng: random.Random) -> Started:
    """The disk of a3 (a tmpfs of FULL_DISK_BYTES) filled up but for a few KiB; the
    filler removed to heal."""
    member = cluster.member("a3")
    assert member.store is not None
    filler = member.store / "filler"
    free = os.statvfs(member.store).f_bavail * os.statvfs(member.store).f_frsize
    with filler.open("wb") as out:
        os.posix_fallocate(out.fileno(), 0, max(0, free - 64 * 1024))

    async def heal() -> None:
        filler.unlink(missing_ok=True)

    return [member.name], heal


#: every nemesis by name (the fault it holds until healed)
NEMESES: dict[str, Nemesis] = {
    "split-master": _held(split_master),
    "master-from-slaves": _held(master_from_slaves),
    "isolate-slave": _held(isolate_slave),
    "controller-minority": _held(controller_minority),
    "controller-majority": _held(controller_majority),
    "master-with-leader": _held(master_with_leader),
    "bridge": _held(bridge),
    "flapping": flapping,
    "kill-master": _process_fault(_pick_master, signal.SIGKILL),
    "kill-slave": _process_fault(_pick_slave, signal.SIGKILL),
    "kill-controller": _process_fault(_pick_controller, signal.SIGKILL),
    "kill-controllers": _process_fault(_pick_controllers, signal.SIGKILL),
    "kill-all": _process_fault(_pick_everyone, signal.SIGKILL),
    "stop-master": _process_fault(_pick_master, signal.SIGSTOP),
    "stop-slave": _process_fault(_pick_slave, signal.SIGSTOP),
    "stop-controller": _process_fault(_pick_controller, signal.SIGSTOP),
    "stop-all": _process_fault(_pick_everyone, signal.SIGSTOP),
    "clock-ahead": _clock_skew("+30s"),
    "clock-behind": _clock_skew("-30s"),
    "full-disk": _held(full_disk),
}


async def inject(
    cluster: NemesisCluster, workload: Workload, name: str, hold_s: float, rng: random.Random
) -> Fault:
    """Run nemesis ``name``: start it, hold it ``hold_s``, heal it, wait for broker-a to
    settle again; the Fault with its times."""
    start = time.monotonic()
    targets, heal = await NEMESES[name](cluster, rng, hold_s)
    fault = Fault(name, "broker-a", targets, start)
    await heal()
    fault.healed = time.monotonic()
    for group in GROUPS:
        await cluster.wait_settled(group)
    fault.settled = time.monotonic()
    return fault


# ---------------------------------------------------------------- the checker


@attrs.frozen
class FaultReport:
    nemesis: str
    targets: list[str]
    #: SEND_OKs of the faulted group from the fault's start to its group settled
    acked_during: int
    unavailable_s: float
    recovery_s: float
    #: lost, duplicated and reordered messages sent from the fault's start to the next's
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0


@attrs.frozen
class Report:
    acked: int
    cpp_acked: int
    consumed: int
    errors: dict[str, int]
    lost: list[str]
    duplicated: list[str]
    reordered: list[str]
    divergent: list[str]
    faults: list[FaultReport]

    @property
    def ok(self) -> bool:
        """No acknowledged message lost, no CommitLogs that differ."""
        return not self.lost and not self.divergent

    def by_nemesis(self) -> dict[str, dict[str, Any]]:
        """Per nemesis: runs, SEND_OK, lost, duplicated, reordered, unavailable p50/max,
        recovery p50/max (seconds)."""
        grouped: dict[str, list[FaultReport]] = collections.defaultdict(list)
        for fault in self.faults:
            grouped[fault.nemesis].append(fault)
        table = {}
        for name, faults in sorted(grouped.items()):
            windows = [f.unavailable_s for f in faults]
            recoveries = [f.recovery_s for f in faults]
            table[name] = {
                "runs": len(faults),
                "sendOk": sum(f.acked_during for f in faults),
                "lost": sum(f.lost for f in faults),
                "duplicated": sum(f.duplicated for f in faults),
                "reordered": sum(f.reordered for f in faults),
                "unavailableP50": round(statistics.median(windows), 2),
                "unavailableMax": round(max(windows), 2),
                "recoveryP50": round(statistics.median(recoveries), 2),
                "recoveryMax": round(max(recoveries), 2),
            }
        return table

    def summary(self) -> str:
        lines = [
            f"acknowledged {self.acked} (the C++ client {self.cpp_acked}), consumed "
            f"concurrently {self.consumed}, lost "
            f"{len(self.lost)}, duplicated {len(self.duplicated)}, reordered "
            f"{len(self.reordered)}, divergent {len(self.divergent)}; errors {self.errors}",
            "nemesis               runs  SEND_OK  lost  dup  reord  unavailable p50/max  "
            "recovery p50/max",
        ]
        for name, row in self.by_nemesis().items():
            lines.append(
                f"{name:<21} {row['runs']:>5} {row['sendOk']:>8} {row['lost']:>5} "
                f"{row['duplicated']:>4} {row['reordered']:>6}  {row['unavailableP50']:>8.1f} s "
                f"{row['unavailableMax']:>6.1f} s  {row['recoveryP50']:>6.1f} s "
                f"{row['recoveryMax']:>5.1f} s"
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
    """Every message of ``queue`` from offset 0, by body. A nameserver restarted by a
    fault knows no route until the brokers register again (every 30 s): a pull that
    finds no route is tried again for up to SETTLE_S."""
    found: list[str] = []
    offset = 0
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            result = await consumer.pull(queue, offset, max_nums=256)
        except ClientError:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.5)
            continue
        if result.status is not PullStatus.FOUND:
            if result.next_begin_offset > offset and result.status is not PullStatus.NO_NEW_MSG:
                offset = result.next_begin_offset
                continue
            return found
        found += [m.body.decode() for m in result.messages]
        offset = result.next_begin_offset


async def check(cluster: NemesisCluster, workload: Workload, faults: list[Fault]) -> Report:
    """Read every queue whole from its group's master and judge (module docstring);
    call it with every group settled. Each problem is counted against the fault during
    which its message was acknowledged (from its start to the next fault's)."""
    stored: dict[str, list[str]] = {}
    async with PullConsumer("nemesis-checker", cluster.namesrv) as consumer:
        for group in GROUPS:
            for queue_id in range(QUEUES_PER_GROUP):
                queue = MessageQueue(TOPIC, group, queue_id)
                stored[f"{group}/{queue_id}"] = await read_queue(consumer, queue)
    acked_at = {f"{a.group}/{a.queue}:{a.n}": a.at for a in workload.acks}
    acked_at.update({f"cpp:{n}": at for at, n in workload.cpp_acks})
    everywhere = collections.Counter(b for bodies in stored.values() for b in bodies)
    duplicated = sorted(b for b, c in everywhere.items() if c > 1)
    lost = sorted(b for b in acked_at if b not in everywhere)
    acked_by_queue: dict[str, list[int]] = collections.defaultdict(list)
    for ack in workload.acks:
        acked_by_queue[f"{ack.group}/{ack.queue}"].append(ack.n)
    reordered: list[str] = []
    for name, bodies in stored.items():
        position = {b: i for i, b in reversed(list(enumerate(bodies)))}
        acked = [f"{name}:{n}" for n in sorted(acked_by_queue.get(name, []))]
        places = [(position[b], b) for b in acked if b in position]
        reordered += [f"{b} before {a}" for (i, a), (j, b) in itertools.pairwise(places) if j < i]
    divergent = []
    for group, members in cluster.brokers.items():
        stores = [m.store for m in members if m.store is not None]
        common = min(commitlog_end(s) for s in stores)
        if len({commitlog_bytes(s, common) for s in stores}) > 1:
            divergent.append(f"{group}: CommitLogs differ within their first {common} bytes")
    starts = [f.start for f in faults[1:]] + [float("inf")]

    def during(fault: Fault, until: float, bodies: list[str]) -> int:
        return sum(1 for b in bodies if fault.start <= acked_at.get(b, -1.0) < until)

    reports = []
    for fault, until in zip(faults, starts, strict=True):
        times = sorted(a.at for a in workload.acks if a.group == fault.group)
        reports.append(
            FaultReport(
                fault.nemesis,
                fault.targets,
                sum(1 for t in times if fault.start <= t <= fault.settled),
                unavailable_window(times, fault),
                fault.settled - fault.healed,
                during(fault, until, lost),
                during(fault, until, duplicated),
                during(fault, until, [r.split(" before ")[0] for r in reordered]),
            )
        )
    return Report(
        len(workload.acks) + len(workload.cpp_acks),
        len(workload.cpp_acks),
        workload.consumed,
        dict(workload.errors),
        lost,
        duplicated,
        reordered,
        divergent,
        reports,
    )


async def run_schedule(
    cluster: NemesisCluster,
    schedule: Sequence[tuple[str, float]],
    *,
    seed: int = 0,
    warmup_s: float = 2.0,
    cpp: bool = False,
) -> Report:
    """Run the workload under ``schedule`` (nemesis names and hold times, one after
    another, each healed and settled before the next) and check; the caller acts from
    the client host."""
    rng = random.Random(seed)
    workload = Workload(cluster, cpp)
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
