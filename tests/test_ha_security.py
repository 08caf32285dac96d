"""Replication that cannot be faked.

A fake slave (tests/support/ha.py's FakeSlave: plain sockets, struct and hmac) tries
each trick on a master in this process: (a) over-reporting its offset so that a
SYNC_MASTER answers SEND_OK for what no replica has, (b) streaming the CommitLog as a
stranger, (c) a wrong secret or an unknown broker id, (d) a stranger's ack raising the
replicated offset while a real member lags. Plus: an ack counts only what the kernel
took from that connection, a slave checks its master's proof too, real slaves with
the secret replicate, and the secret never shows.

Without ``[ha] secret`` a master admits slaves registered from the peer's host (at
the nameservers, or the controllers); the strangers here are on 127.0.0.1 with no
slave registered from there, or claim an id nobody registered.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from hamq.acl import Secret
from hamq.broker import BrokerNode, build_config
from hamq.broker.live_config import flatten
from hamq.client import Message, Producer, SendStatus
from hamq.controller import ControllerConfig, ControllerServer
from hamq.ha.membership import (
    MAX_AGE_S,
    REFRESH_MIN_S,
    REGISTRY_TIMEOUT_S,
    MemberCache,
    Peer,
    Registry,
    RegistryUnavailable,
    classic_slave_id,
    judge,
)
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import (
    ApplyBrokerIdRequestHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    RegisterBrokerToControllerRequestHeader,
)
from hamq.remoting import RemotingClient
from hamq.remoting.address import ip_of
from tests.support.brokers import namesrv, running_broker, running_nameserver
from tests.support.ha import FakeSlave
from tests.support.processes import free_ports
from tests.support.timing import wait_for

SECRET = "a-long-random-secret-of-group-a"
GROUP = "broker-a"
LIE = 2**62
NOT_REPLICATED = {SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SLAVE_NOT_AVAILABLE}


def ha_options(protocol: str = "classic", secret: str = "", **more: Any) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "sync_timeout_s": 1.0,
        **({"secret": secret} if secret else {}),
        **more,
    }


@asynccontextmanager
async def master_alone(
    tmp_path: Path, *, role: str = "SYNC_MASTER", **ha: Any
) -> AsyncIterator[tuple[str, BrokerNode]]:
    """A nameserver and a master with no slave: (nameserver address, master)."""
    async with (
        running_nameserver() as (_, ns),
        running_broker(
            tmp_path / "master", namesrv_addrs=[ns], store={"role": role}, ha=ha_options(**ha)
        ) as master,
    ):
        yield ns, master


def ha_address(node: BrokerNode) -> str:
    assert node.ha_service is not None
    return node.ha_service.address


def report_of(protocol: str, fake: FakeSlave) -> Callable[[int], Awaitable[None]]:
    return fake.report_classic if protocol == "classic" else fake.report_autoswitch


def refused_in_log(caplog: pytest.LogCaptureFixture, fake: FakeSlave, reason: str) -> bool:
    return any(
        f"HA peer {fake.address} refused: " in r.getMessage() and reason in r.getMessage()
        for r in caplog.records
    )


# ---------------------------------------------------------------- (a) over-reporting

# (protocol, master's secret, what the fake knows, the refusal it gets)
OVER_REPORTERS = {
    "classic stranger": ("classic", "", None),
    "classic, without the secret": ("classic", SECRET, None),
    "autoswitch stranger": ("autoswitch", "", None),
    "a member (it knows the secret) lying": ("classic", SECRET, SECRET),
}


@pytest.mark.parametrize("trick", list(OVER_REPORTERS))
async def test_a_slave_reporting_2_62_does_not_make_a_sync_master_say_send_ok(
    tmp_path: Path, trick: str
) -> None:
    protocol, secret, knows = OVER_REPORTERS[trick]
    async with (
        master_alone(tmp_path, protocol=protocol, secret=secret) as (ns, master),
        Producer("PG", ns) as producer,
        FakeSlave.connect(ha_address(master)) as fake,
        trio.open_nursery() as nursery,
    ):
        await producer.send(Message("Faked", b"before"))  # the topic exists
        if knows is not None:
            assert await fake.prove_secret(knows, GROUP)
        await nursery.start(fake.drain)
        if protocol == "autoswitch":
            await fake.handshake(7)
        report = report_of(protocol, fake)
        await report(master.store.commitlog_max_offset)  # a valid start ...
        nursery.start_soon(fake.keep_reporting, report, LIE)  # ... then the lie, again and again
        # the master had the lie: it refused the stranger, or dropped the member that lied
        # (a report past what was ever sent to it), and closed the connection
        with trio.fail_after(10):
            await fake.closed.wait()
        ha = master.ha_service
        assert ha is not None
        assert ha.refused_peers == (0 if knows else 1)
        assert ha.statistics().acked_offset < master.store.commitlog_max_offset  # never counted
        result = await producer.send(Message("Faked", b"no replica has this"))
        assert result.status in NOT_REPLICATED, result
        assert ha.transfer.replicated_offset() < master.store.commitlog_max_offset
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- (b) streaming the log

# (protocol, master's secret, the refusal logged)
STRANGERS = {
    "classic, no slave registered from its host": (
        "classic",
        "",
        "no slave of broker group broker-a is registered from 127.0.0.1 at the nameservers",
    ),
    "classic, without the secret": ("classic", SECRET, "did not answer the HA secret challenge"),
    "autoswitch, an id nobody registered": (
        "autoswitch",
        "",
        "broker id 7 is not a member of broker group broker-a at the nameservers",
    ),
}


@pytest.mark.parametrize("stranger", list(STRANGERS))
async def test_a_stranger_reporting_offset_0_gets_no_log_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stranger: str
) -> None:
    protocol, secret, reason = STRANGERS[stranger]
    async with master_alone(
        tmp_path, role="ASYNC_MASTER", protocol=protocol, secret=secret, sync_from_last_file=False
    ) as (ns, master):
        async with Producer("PG", ns) as producer:
            for i in range(20):
                await producer.send(Message("Private", f"PRIVATE-PAYLOAD-{i}".encode()))
        async with FakeSlave.connect(ha_address(master)) as fake:
            if protocol == "autoswitch":
                await fake.handshake(7)
            await report_of(protocol, fake)(0)  # "send me everything"
            with trio.move_on_after(5):
                await fake.drain()  # until the master closes it
        assert b"PRIVATE-PAYLOAD" not in fake.received
        assert fake.closed.is_set()
        # not a byte of the log: at most the secret's challenge
        assert len(fake.received) == (36 if secret else 0)
        assert master.ha_service is not None and master.ha_service.refused_peers == 1
        assert refused_in_log(caplog, fake, reason)


async def test_a_flood_of_strangers_is_counted_in_full_and_logged_in_a_few_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """30 strangers on the HA port: a third reset the connection at once (before the
    master's challenge reaches them), a third send a classic report instead of a proof,
    a third just close. Each is a refusal, counted; the log gets a few lines."""
    async with master_alone(tmp_path, secret=SECRET) as (_, master):
        ha = master.ha_service
        assert ha is not None
        host, port = ha_address(master).rsplit(":", 1)
        for i in range(30):
            with trio.socket.socket() as sock:
                await sock.connect((host, int(port)))
                if i % 3 == 0:  # close with a reset (SO_LINGER 0)
                    sock.setsockopt(
                        trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                elif i % 3 == 1:
                    await sock.send(struct.pack(">q", 0))
        await wait_for(lambda: ha.refused_peers == 30)
    lines = [
        r for r in caplog.records if r.name == "hamq.ha.master" and r.levelno >= logging.WARNING
    ]
    refusals = [r for r in lines if "HA peer" in r.getMessage() and "refused" in r.getMessage()]
    assert lines == refusals, [r.getMessage() for r in lines]  # no "dropped" lines besides
    assert 1 <= len(refusals) <= 5
    assert ha.warnings.suppressed["refused"] == 30 - len(refusals)


@pytest.mark.parametrize(("protocol", "secret"), [("classic", SECRET), ("autoswitch", "")])
async def test_a_peer_that_stalls_its_set_up_is_cut_after_connect_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, protocol: str, secret: str
) -> None:
    """Half-open: it connects and never answers the challenge (or never sends its
    HANDSHAKE). Its place on the HA port is freed after connect_timeout_s."""
    async with (
        master_alone(tmp_path, protocol=protocol, secret=secret, connect_timeout_s=0.5) as (
            _,
            master,
        ),
        FakeSlave.connect(ha_address(master)) as fake,
    ):
        started = trio.current_time()
        with trio.fail_after(5):
            await fake.drain()
        assert trio.current_time() - started >= 0.5
        assert len(fake.received) == (36 if secret else 0)
        assert refused_in_log(caplog, fake, "did not complete the HA set-up within 0.5s")


@pytest.mark.parametrize("answered_before", [True, False])
async def test_strangers_ask_a_registry_that_does_not_answer_once_a_second(
    autojump_clock: trio.testing.MockClock, answered_before: bool
) -> None:
    """The nameservers stop answering (each question waits for its 3 s time-out); 20
    strangers arrive at once. The registry is asked once for all of them, not 20 times
    in a row (a minute during which a real slave would queue behind them)."""
    questions = 0

    async def fetch() -> dict[int, str]:
        nonlocal questions
        questions += 1
        if questions == 1 and answered_before:
            return {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
        await trio.sleep(REGISTRY_TIMEOUT_S)
        raise RegistryUnavailable("no nameserver answered")

    cache = MemberCache(Registry("the nameservers", lambda: 0, False, fetch))
    if answered_before:
        await cache.members(lambda _: True)
        # (virtual time passes: the answer gets old, so a stranger asks again; the one
        # question counted below is the proof that it did)
        await trio.sleep(MAX_AGE_S)
    asked_from = questions
    started = trio.current_time()
    outcomes: list[str] = []

    async def stranger() -> None:
        try:
            members = await cache.members(lambda known: 7 in known)
            outcomes.append("last answer" if members else "empty")
        except RegistryUnavailable:
            outcomes.append("unavailable")

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(stranger)
    assert questions - asked_from == 1
    assert trio.current_time() - started <= REGISTRY_TIMEOUT_S + REFRESH_MIN_S
    assert outcomes == ["last answer" if answered_before else "unavailable"] * 20


# ---------------------------------------------------------------- (c) wrong secret, unknown id


@pytest.mark.parametrize(
    ("secret", "group", "reason"),
    [
        ("another-secret-of-some-length", GROUP, "wrong HA secret"),
        (SECRET, "broker-b", "wrong HA secret"),  # the secret, but another group's slave
    ],
)
async def test_a_wrong_secret_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, secret: str, group: str, reason: str
) -> None:
    async with (
        master_alone(tmp_path, secret=SECRET) as (_, master),
        FakeSlave.connect(ha_address(master)) as fake,
    ):
        assert not await fake.prove_secret(secret, group)
        await fake.report_classic(0)
        with trio.fail_after(5):
            await fake.drain()
        assert len(fake.received) == 36 + 37  # the challenge and the refusal, nothing else
        assert refused_in_log(caplog, fake, reason)


async def test_a_real_slave_with_another_secret_gets_nothing(tmp_path: Path) -> None:
    async with master_alone(tmp_path, role="ASYNC_MASTER", secret=SECRET) as (ns, master):
        async with Producer("PG", ns) as producer:
            await producer.send(Message("Private", b"x"))
        async with running_broker(
            tmp_path / "slave",
            namesrv_addrs=[ns],
            broker_id=1,
            store={"role": "SLAVE"},
            ha=ha_options(secret="not-the-groups-secret-at-all"),
        ) as slave:
            assert slave.ha_client is not None and master.ha_service is not None
            client = slave.ha_client
            await wait_for(lambda: "refused this slave's HA secret" in (client.last_error or ""))
            assert slave.store.commitlog_max_offset == 0
            assert (
                master.ha_service.refused_peers >= 1 and not master.ha_service.transfer.available()
            )


async def test_a_slave_takes_nothing_from_a_master_that_cannot_prove_the_secret(
    tmp_path: Path,
) -> None:
    """The check goes both ways: a fake master (someone who took over the master's
    address at the nameserver, say) is answered but never believed."""
    hung_up = trio.Event()

    async def fake_master(stream: trio.SocketStream) -> None:
        await stream.send_all(FakeSlave.AUTH_MAGIC + os.urandom(32))  # a challenge
        data = b""
        while len(data) < 68:
            chunk = await stream.receive_some(68 - len(data))
            if not chunk:
                return
            data += chunk
        await stream.send_all(FakeSlave.AUTH_MAGIC + b"\x01" + bytes(32))  # "accepted"
        body = b"\x00" * 100
        await stream.send_all((0).to_bytes(8, "big") + len(body).to_bytes(4, "big") + body)
        # until the slave hangs up: it had the transfer, and every chance to take it
        with contextlib.suppress(trio.BrokenResourceError):
            while await stream.receive_some():
                pass
        hung_up.set()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, host="127.0.0.1"), fake_master, 0)
        port = listener.socket.getsockname()[1]
        async with running_broker(
            tmp_path / "slave",
            broker_id=1,
            store={"role": "SLAVE"},
            ha_master_address=f"127.0.0.1:{port}",
            ha=ha_options(secret=SECRET),
        ) as slave:
            assert slave.ha_client is not None
            client = slave.ha_client
            await wait_for(lambda: "proof of the HA secret is wrong" in (client.last_error or ""))
            with trio.fail_after(10):
                await hung_up.wait()
            assert slave.store.commitlog_max_offset == 0
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def controller_mode_master(tmp_path: Path) -> AsyncIterator[tuple[str, BrokerNode]]:
    """A controller and one controller-mode broker it made master: (controller, master)."""
    raft = f"127.0.0.1:{free_ports(1)[0]}"
    server = ControllerServer(
        ControllerConfig(raft_address=raft, data_dir=tmp_path / "controller"), port=0
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        async with running_broker(
            tmp_path / "master",
            enable_controller_mode=True,
            controller_addrs=[server.address],
            store={"role": "SYNC_MASTER"},
            ha=ha_options(),
        ) as master:
            await wait_for(lambda: master.roles.is_master, 20)
            yield server.address, master
        nursery.cancel_scope.cancel()


async def register_member(controller: str, address: str) -> int:
    """A broker id of group broker-a at the controller, registered at ``address``."""
    cluster, check = "DefaultCluster", os.urandom(8).hex()

    async def ask(code: RequestCode, header: object) -> RemotingCommand:
        response = await client.invoke(controller, RemotingCommand.request(code, header), 5)
        assert response.code == ResponseCode.SUCCESS, response.remark
        return response

    async with RemotingClient() as client:
        answer = await ask(
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, GetNextBrokerIdRequestHeader(cluster, GROUP)
        )
        broker_id = answer.header(GetNextBrokerIdResponseHeader).next_broker_id
        await ask(
            RequestCode.CONTROLLER_APPLY_BROKER_ID,
            ApplyBrokerIdRequestHeader(cluster, GROUP, broker_id, check),
        )
        await ask(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            RegisterBrokerToControllerRequestHeader(
                cluster, GROUP, broker_id, address, check, "127.0.0.1:1"
            ),
        )
    return broker_id


@pytest.mark.slow
async def test_controller_mode_refuses_ids_the_controllers_do_not_know(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with controller_mode_master(tmp_path) as (controller, master):
        assert master.replicas is not None
        elsewhere = await register_member(controller, "10.9.8.7:10911")
        claims = {
            99: "broker id 99 is not a member of broker group broker-a at the controllers",
            master.replicas.broker_id: "this master's own",
            elsewhere: "but this connection comes from 127.0.0.1",
        }
        for broker_id, reason in claims.items():
            async with FakeSlave.connect(ha_address(master)) as fake:
                await fake.handshake(broker_id)
                await fake.report_autoswitch(0)
                with trio.move_on_after(5):
                    await fake.drain()
                assert fake.received == b"", broker_id  # not even the handshake's answer
                assert fake.closed.is_set()
                assert refused_in_log(caplog, fake, reason), broker_id


# ---------------------------------------------------------------- (d) a stranger's ack


async def lagging_member_and_a_lying_stranger(
    master: BrokerNode,
    ns: str,
    member: Callable[[FakeSlave], Awaitable[None]],
    stranger: Callable[[FakeSlave], Awaitable[None]],
    report: Callable[[FakeSlave], Callable[[int], Awaitable[None]]],
) -> None:
    """A member takes the log and acks only its start; a stranger claims all of it.
    Sends must wait for the member: FLUSH_SLAVE_TIMEOUT, and nothing replicated."""
    ha = master.ha_service
    assert ha is not None
    async with (
        Producer("PG", ns) as producer,
        FakeSlave.connect(ha_address(master)) as real,
        FakeSlave.connect(ha_address(master)) as liar,
        trio.open_nursery() as nursery,
    ):
        await producer.send(Message("Lag", b"before"))
        await member(real)
        await nursery.start(real.drain)
        await report(real)(0)  # and never again: it lags
        end = master.store.commitlog_max_offset
        # it has the log, and has acked its start of it
        await wait_for(
            lambda: (
                ha.transfer.available()
                and len(real.received) >= end
                and ha.transfer.replicated_offset() >= 0
            )
        )
        acked = ha.transfer.replicated_offset()
        assert 0 <= acked < end
        refused_before = ha.refused_peers
        await stranger(liar)
        await nursery.start(liar.drain)
        await report(liar)(master.store.commitlog_max_offset)
        nursery.start_soon(liar.keep_reporting, report(liar), LIE)
        # the lie had its chance: the master refused the stranger and closed on it
        await wait_for(lambda: ha.refused_peers == refused_before + 1 and liar.closed.is_set())
        assert ha.transfer.replicated_offset() == acked
        result = await producer.send(Message("Lag", b"only the master has this"))
        assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT, result
        assert ha.transfer.replicated_offset() == acked < master.store.commitlog_max_offset
        nursery.cancel_scope.cancel()


async def test_a_strangers_ack_does_not_count_while_a_member_lags_classic(tmp_path: Path) -> None:
    async def member(fake: FakeSlave) -> None:
        assert await fake.prove_secret(SECRET, GROUP)

    async def stranger(fake: FakeSlave) -> None:
        assert not await fake.prove_secret("a-guess-of-the-secret-0000", GROUP)

    async with master_alone(tmp_path, secret=SECRET) as (ns, master):
        await lagging_member_and_a_lying_stranger(
            master, ns, member, stranger, lambda f: f.report_classic
        )


@pytest.mark.slow
async def test_a_strangers_ack_does_not_count_while_a_member_lags_controller_mode(
    tmp_path: Path,
) -> None:
    async with controller_mode_master(tmp_path) as (controller, master):
        member_id = await register_member(controller, "127.0.0.1:1")

        async def member(fake: FakeSlave) -> None:
            await fake.handshake(member_id)
            await fake.master_handshake()

        async def stranger(fake: FakeSlave) -> None:
            await fake.handshake(member_id + 50)

        await lagging_member_and_a_lying_stranger(
            master, namesrv(master), member, stranger, lambda f: f.report_autoswitch
        )


# ---------------------------------------------------------------- acks vs what was sent


async def test_an_ack_counts_only_what_the_kernel_took_from_that_connection(
    tmp_path: Path,
) -> None:
    """A member that stops reading, then acks everything the master *meant* to send
    it: only what the kernel took from the connection counts."""
    async with master_alone(
        tmp_path, role="ASYNC_MASTER", secret=SECRET, sync_from_last_file=False
    ) as (ns, master):
        ha = master.ha_service
        assert ha is not None
        async with Producer("PG", ns) as producer:
            for _ in range(32):  # 16 MiB: more than any socket buffer takes
                await producer.send(Message("Big", os.urandom(512 * 1024)))
        async with FakeSlave.connect(ha_address(master), receive_buffer=4096) as fake:
            assert await fake.prove_secret(SECRET, GROUP)
            await fake.report_classic(0)  # and reads nothing from here on
            await wait_for(lambda: len(ha.connections) == 1)
            [conn] = ha.connections
            session = conn.session
            # the master's send is stuck mid-way: every task of this process waits, the
            # writer for the kernel to take more of what it meant to send, which the
            # kernel cannot while the slave reads nothing
            with trio.fail_after(10):
                await trio.testing.wait_all_tasks_blocked(0.1)
            stuck = session.sent_end
            meant = session.next_offset
            assert meant is not None and 0 < stuck < meant and session.sending
            await fake.report_classic(meant)
            await wait_for(lambda: conn.ack_offset == meant)
            assert conn.acked_upto == session.sent_end == stuck < meant
            assert ha.transfer.replicated_offset() == stuck


# ---------------------------------------------------------------- real slaves, the rule


@pytest.mark.parametrize("protocol", ["classic", "autoswitch"])
async def test_slaves_with_the_secret_replicate(tmp_path: Path, protocol: str) -> None:
    async with (
        master_alone(tmp_path, protocol=protocol, secret=SECRET) as (ns, master),
        running_broker(
            tmp_path / "slave",
            namesrv_addrs=[ns],
            broker_id=1,
            store={"role": "SLAVE"},
            ha=ha_options(protocol, secret=SECRET),
        ) as slave,
    ):
        assert master.ha_service is not None
        await wait_for(master.ha_service.transfer.available)
        async with Producer("PG", ns) as producer:
            results = [await producer.send(Message("Shared", f"m{i}")) for i in range(20)]
        assert {r.status for r in results} == {SendStatus.SEND_OK}
        assert slave.store.commitlog_max_offset == master.store.commitlog_max_offset
        assert master.ha_service.refused_peers == 0


def test_the_secret_never_shows() -> None:
    config = build_config({"store": {"store_dir": "unused"}, "ha": {"secret": SECRET}})
    assert config.ha.secret == SECRET
    shown = flatten(config)  # what GET_BROKER_CONFIG answers
    assert shown["ha.secret"] == "******"
    assert SECRET not in repr(config) and SECRET not in f"{config.ha.secret}"
    with pytest.raises(ValueError, match="at least 16 characters"):
        build_config({"store": {"store_dir": "unused"}, "ha": {"secret": "short"}})


def test_the_ha_secret_is_the_one_secret_type_and_shows_itself_only_when_asked() -> None:
    """The HA secret and the ACL secret key are one type (hamq.protocol.secret): unlike
    a str, it gives its text to neither concatenation nor json.dumps."""
    secret = build_config({"store": {"store_dir": "unused"}, "ha": {"secret": SECRET}}).ha.secret
    assert isinstance(secret, Secret)
    with pytest.raises(TypeError):
        json.dumps({"secret": secret})
    with pytest.raises(TypeError):
        _ = "the secret: " + secret  # type: ignore[operator]
    assert (str(secret), f"{secret:>8}", repr(secret)) == ("******", "  ******", "Secret('******')")
    assert secret.reveal() == SECRET and secret.encode() == SECRET.encode()
    assert secret == Secret(secret) and bool(secret) and not Secret("") and str(Secret("")) == ""


LOCAL = ip_of("127.0.0.1")
MEMBERS = {0: "127.0.0.1:10911", 1: "127.0.0.1:10921", 2: "10.0.0.2:10931"}


@pytest.mark.parametrize(
    ("peer", "self_id", "check_host", "refused_because"),
    [
        # classic: some slave (not the master itself) registered from the peer's host
        (Peer("p", LOCAL), 0, True, None),
        (Peer("p", ip_of("10.0.0.9")), 0, True, "no slave of broker group g"),
        (Peer("p", LOCAL), 1, True, None),  # (then 0 is another member on that host)
        # auto-switch: that id, from that member's host
        (Peer("p", LOCAL, 1), 0, True, None),
        (Peer("p", LOCAL, 2), 0, True, "registered at 10.0.0.2:10931"),
        (Peer("p", LOCAL, 2), 0, False, None),  # (proved the secret: no host check)
        (Peer("p", LOCAL, 7), 0, False, "broker id 7 is not a member"),
        (Peer("p", LOCAL, 0), 0, False, "this master's own"),
    ],
)
def test_the_membership_rule(
    peer: Peer, self_id: int, check_host: bool, refused_because: str | None
) -> None:
    reason = judge(
        peer, MEMBERS, self_id=self_id, check_host=check_host, broker_name="g", source="them"
    )
    if refused_because is None:
        assert reason is None
    else:
        assert reason is not None and refused_because in reason
    # a classic peer with no slave registered at all
    assert judge(
        Peer("p", LOCAL),
        {0: "127.0.0.1:1"},
        self_id=0,
        check_host=True,
        broker_name="g",
        source="x",
    )


@pytest.mark.parametrize(
    ("host", "taken", "named"),
    [
        ("10.0.0.2", (), 2),  # the one slave registered from that host
        ("10.0.0.2", (2,), 2),  # (its old connection not dropped yet: still it)
        ("127.0.0.1", (), 1),  # the master (0) is not a slave
        ("127.0.0.1", (1,), 3),  # two slaves on one host: the one no connection has
        ("127.0.0.1", (1, 3), 1),  # all taken: the lowest
        ("10.0.0.9", (), None),  # none registered there
    ],
)
def test_a_classic_slave_is_named_by_its_host(
    host: str, taken: tuple[int, ...], named: int | None
) -> None:
    members = {**MEMBERS, 3: "127.0.0.1:10941"}
    assert classic_slave_id(ip_of(host), members, self_id=0, taken=taken) == named
    assert classic_slave_id(None, members, self_id=0) is None
