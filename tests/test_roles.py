"""The broker's role table (hamq/broker/roles.py): every allowed move, with what it
starts and stops, and moves it refuses. A real BrokerNode's parts: its store runs (in
tmp_path), its HA service and client are built but not started — a move only switches
them (``active``, the replica policy, a kick)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from hamq.broker import BrokerNode
from hamq.broker.roles import LEASE_MARGIN_S, MOVES, IllegalRoleChange, Role
from hamq.ha import ReplicaPolicy
from hamq.protocol import ResponseCode
from hamq.store import BrokerRole, MessageToStore, PutMessageStatus
from tests.support.brokers import broker_config

CONTROLLED = {"enable_controller_mode": True, "controller_addrs": ["127.0.0.1:1"]}


@asynccontextmanager
async def node_parts(tmp_path: Path, **overrides: Any) -> AsyncIterator[BrokerNode]:
    """A broker whose store and transaction service run; nothing else of it does."""
    node = BrokerNode(broker_config(tmp_path / "store", **overrides))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.store.run)
        await nursery.start(node.transactions.run)
        yield node
        nursery.cancel_scope.cancel()


def takes_puts(node: BrokerNode) -> bool:
    result = node.store.put_message_nowait(MessageToStore("T", 0, b"x"))
    return result.status is PutMessageStatus.PUT_OK


def serves_slaves(node: BrokerNode) -> bool:
    assert node.ha_service is not None
    return node.ha_service.active


def policy(node: BrokerNode) -> ReplicaPolicy:
    assert node.ha_service is not None
    return node.ha_service.transfer.policy


async def test_controlled_moves_switch_store_replication_and_id_together(tmp_path: Path) -> None:
    done: set[tuple[Role, Role]] = set()
    overrides = {**CONTROLLED, "all_ack_in_sync_state_set": True, "min_in_sync_replicas": 2}
    async with node_parts(tmp_path, **overrides) as node:
        roles = node.roles
        heard: list[Role] = []
        roles.listeners.append(lambda: heard.append(roles.role))
        assert (roles.role, roles.broker_id, roles.is_master) == (Role.STARTING, -1, False)
        roles.own_id = 3  # (the controllers gave it)

        async def move(to: Role, **how: Any) -> None:
            before = roles.role
            if to is Role.MASTER:
                await roles.become_master(how["epoch"], "test", how.get("members", frozenset()))
            else:
                await roles.become_slave("test")
            done.add((before, to))
            assert roles.role is to and heard[-1] is to

        await move(Role.SLAVE)
        assert roles.broker_id == 3 and roles.broker_role is BrokerRole.SLAVE
        assert not takes_puts(node) and not serves_slaves(node)
        await move(Role.SLAVE)  # a new master
        await move(Role.MASTER, epoch=2, members=frozenset({3}))
        assert roles.broker_id == 0 and roles.broker_role is BrokerRole.ASYNC_MASTER
        assert takes_puts(node) and serves_slaves(node) and node.transactions.checking
        assert node.epochs.last_epoch == 2
        assert policy(node) is ReplicaPolicy.SYNC_STATE_SET
        assert roles.sends_refused is not None  # the set {3} is below min_in_sync_replicas 2
        roles.adopt_sync_state_set(frozenset({3, 4}))
        assert roles.sends_refused is None
        assert node.ha_service is not None and node.ha_service.transfer.must_ack == {4}
        await move(Role.MASTER, epoch=3, members=frozenset({3, 4}))  # re-elected
        assert node.epochs.last_epoch == 3 and takes_puts(node)
        await move(Role.SLAVE)
        assert roles.broker_id == 3 and roles.sends_refused is None
        assert not takes_puts(node) and not serves_slaves(node) and not node.transactions.checking
        assert policy(node) is ReplicaPolicy.NONE
        await move(Role.MASTER, epoch=4)
        assert takes_puts(node)
    async with node_parts(tmp_path / "second", **CONTROLLED) as node:
        node.roles.own_id = 1
        await node.roles.become_master(1, "the controllers' first word")
        done.add((Role.STARTING, Role.MASTER))
        assert takes_puts(node) and policy(node) is ReplicaPolicy.NONE
    assert done == set(MOVES)


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER"])
async def test_a_configured_master_starts_as_master_and_stays(
    tmp_path: Path, role: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with node_parts(tmp_path, store={"role": role}) as node:
        roles = node.roles
        assert serves_slaves(node)  # (its slaves may catch up while it starts)
        assert not takes_puts(node) and roles.broker_id == 0
        await roles.become_master(1, "configured master")
        assert takes_puts(node) and roles.broker_role.value == role
        expected = ReplicaPolicy.ONE_SLAVE if role == "SYNC_MASTER" else ReplicaPolicy.NONE
        assert policy(node) is expected
        for illegal in (roles.become_slave("test"), roles.become_master(2, "test")):
            with pytest.raises(IllegalRoleChange, match=r"MASTER -> (SLAVE|MASTER) is not"):
                await illegal
        assert roles.role is Role.MASTER and takes_puts(node) and node.epochs.last_epoch == 1
    assert any("is not a role change" in r.getMessage() for r in caplog.records)


async def test_a_configured_slave_never_becomes_master(tmp_path: Path) -> None:
    async with node_parts(tmp_path, broker_id=1, store={"role": "SLAVE"}) as node:
        roles = node.roles
        await roles.become_slave("configured slave")
        assert roles.broker_id == 1 and not takes_puts(node)
        with pytest.raises(IllegalRoleChange, match="SLAVE -> MASTER is not"):
            await roles.become_master(1, "test")
        with pytest.raises(IllegalRoleChange, match="SLAVE -> SLAVE is not"):
            await roles.become_slave("test")
        assert roles.role is Role.SLAVE and not takes_puts(node)
        assert node.epochs.last_epoch == 0  # the refused promotion wrote no epoch


async def test_a_master_without_its_lease_is_fenced_and_says_why(tmp_path: Path) -> None:
    """Controller mode, no allAckInSyncStateSet: the lease alone decides (roles.py)."""
    async with node_parts(tmp_path, **CONTROLLED, controller_lease_s=3.0) as node:
        roles = node.roles
        lease = roles.lease
        assert lease is not None and lease.margin_s == LEASE_MARGIN_S
        heard: list[int] = []
        roles.listeners.append(lambda: heard.append(roles.broker_id))
        roles.own_id = 2
        now = trio.current_time()
        lease.renew(now)
        await roles.become_master(1, "test", frozenset({2}))
        assert roles.refusal(now) is None and roles.broker_id == 0
        end = now + 3.0 - LEASE_MARGIN_S  # (before the controllers' count could end)
        assert lease.until == end
        assert roles.refusal(end - 0.01) is None
        refusal = roles.refusal(end)
        assert refusal is not None and refusal.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "lost its controller lease" in refusal.why and "for 2.5s" in refusal.why
        # a send stored before and answered now is told to go again, whatever acked it
        for replicated in (True, False):
            why = roles.answer_refusal(replicated=replicated, now=end)
            assert why is not None and "send it again" in why
        assert roles.answer_refusal(replicated=True, now=end - 0.01) is None
        # fenced: it registers under its own id, not as the master
        roles.check_fence(end)
        assert roles.fenced and roles.broker_id == 2 and heard[-1] == 2
        roles.check_fence(end + 1)  # (no change, nothing said)
        assert len(heard) == 2
        lease.renew(end + 1)  # a controller answered again
        assert roles.refusal(end + 1) is None
        roles.check_fence(end + 1)
        assert not roles.fenced and roles.broker_id == 0 and heard[-1] == 0


async def test_all_ack_master_keeps_taking_sends_without_a_lease_while_its_set_acks(
    tmp_path: Path,
) -> None:
    """allAckInSyncStateSet: a SEND_OK waits for every broker the controllers may elect,
    so while they all ack (here: none but the master is in the set) the lease is not
    needed; with a member that does not ack (none connected) it is fenced."""
    overrides = {**CONTROLLED, "all_ack_in_sync_state_set": True}
    async with node_parts(tmp_path, **overrides) as node:
        roles = node.roles
        roles.own_id = 2
        await roles.become_master(1, "test", frozenset({2}))
        now = trio.current_time()
        assert roles.lease is not None and not roles.lease.held(now)  # never answered
        assert roles.refusal(now) is None
        assert roles.answer_refusal(replicated=True, now=now) is None
        roles.adopt_sync_state_set(frozenset({2, 3}))
        refusal = roles.refusal(now)
        assert refusal is not None and "lost its controller lease" in refusal.why
        assert roles.answer_refusal(replicated=True, now=now) is None  # 3 acked it: safe
        assert roles.answer_refusal(replicated=False, now=now) is not None


async def test_sends_waiting_for_replicas_are_never_acknowledged_after_stepping_down(
    tmp_path: Path,
) -> None:
    """A master with SyncStateSet {3, 4, 5} steps down while a put waits: slave 4 has
    acked it, slave 5 has not, so the new master may lack it. Stepping down answers the
    wait as not replicated; it must not count slave 4's ack as enough (the replica
    policy changing to NONE once made it do so)."""
    overrides = {**CONTROLLED, "all_ack_in_sync_state_set": True}
    async with node_parts(tmp_path, **overrides) as node:
        assert node.ha_service is not None
        roles, transfer = node.roles, node.ha_service.transfer
        roles.own_id = 3
        await roles.become_master(1, "test", frozenset({3, 4, 5}))
        ticket = node.store.durability.ticket(wait_store_ok=True)
        assert ticket is not None
        stored = node.store.put_message_nowait(MessageToStore("T", 0, b"x")).append
        assert stored is not None
        end = stored.end_offset
        outcome: list[PutMessageStatus] = []
        ticket.wait(end, lambda status, _remark: outcome.append(status))
        transfer._acked_upto = lambda: [(4, end)]  # (slave 4's ack; 5 has sent none)
        transfer.slave_acked(end)
        assert outcome == []  # still waiting for 5
        await roles.become_slave("another broker was elected")
        assert outcome == [PutMessageStatus.FLUSH_SLAVE_TIMEOUT]
        assert roles.answer_refusal(replicated=False, now=trio.current_time()) is not None
