"""The controller in this process: liveness (pure, virtual time), the Raft-replicated
state across 1 and 3 nodes on loopback, and its requests over the remoting protocol."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from hamq.controller import ControllerConfig, ControllerServer, ControllerUnavailable
from hamq.controller.heartbeats import LiveBroker, LiveBrokers
from hamq.controller.state import Candidate, ControllerError
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import SyncStateSet, decode_body, encode_body
from hamq.protocol.headers import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    ReplicaInfoResponseHeader,
)
from hamq.remoting import RemotingClient
from tests.support.processes import free_ports
from tests.support.raft import raft_group
from tests.support.timing import wait_for


def live(broker_id: int, heard: float, connection: object = None) -> LiveBroker:
    return LiveBroker("c", "b", broker_id, f"h:{broker_id}", 1, 100, 100, 0, heard, 3.0, connection)


def test_a_broker_is_alive_until_its_lease_ends_or_its_connection_closes() -> None:
    brokers = LiveBrokers()
    conn = object()
    assert brokers.heard(live(1, 0.0, conn)) is True
    assert brokers.heard(live(2, 0.0)) is True
    assert brokers.heard(live(2, 2.0)) is False  # already alive
    assert set(brokers.alive("b", 3.0)) == {1, 2}
    assert set(brokers.alive("b", 3.5)) == {2}  # broker 1's 3 s lease ended
    assert [b.broker_id for b in brokers.expire(3.5)] == [1]
    brokers.heard(live(1, 4.0, conn))
    assert [b.broker_id for b in brokers.connection_closed(conn)] == [1]
    assert set(brokers.alive("b", 4.0)) == {2}
    assert brokers.alive("other", 4.0) == {}


def test_an_unheard_broker_is_dead_only_after_a_lease_of_listening() -> None:
    """A controller that has just started has heard nobody yet."""
    brokers = LiveBrokers(default_lease_s=3.0)
    assert not brokers.heard_long_enough("b", 100.0)  # (not listening yet)
    brokers.listen(10.0)
    assert not brokers.heard_long_enough("b", 12.9)
    assert brokers.heard_long_enough("b", 13.0)
    slow = live(2, 11.0)
    slow.lease_s = 10.0  # a member announcing a longer lease: the group's is that long
    brokers.heard(slow)
    assert brokers.lease_of("b") == 10.0
    assert not brokers.heard_long_enough("b", 19.9)
    assert brokers.heard_long_enough("b", 20.0)
    assert brokers.heard_long_enough("other", 13.0)


def test_controller_config_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must include"):
        ControllerConfig(raft_address="127.0.0.1:1", data_dir=tmp_path, raft_peers=("127.0.0.1:2",))
    with pytest.raises(ValueError):
        ControllerConfig(raft_address="no-port", data_dir=tmp_path)


async def test_three_raft_nodes_lose_one_and_keep_everything(tmp_path: Path) -> None:
    """Every node applies every change; with one of three stopped the other two still
    commit, and keep what was committed before."""
    async with raft_group(tmp_path) as (_, nodes):
        with trio.fail_after(30):
            await nodes[0].call(
                "apply_broker_id", cluster="c", broker_name="b", broker_id=1, check_code="one"
            )
            await nodes[1].call(
                "register",
                broker_name="b",
                broker_id=1,
                check_code="one",
                address="h:1",
                ha_address="h:2",
            )
            info = await nodes[2].call("elect_master", broker_name="b", alive={1: Candidate(1)})
        assert info.master_id == 1 and info.master_epoch == 1
        with pytest.raises(ControllerError) as refused:
            await nodes[0].call(
                "apply_broker_id", cluster="c", broker_name="b", broker_id=1, check_code="two"
            )
        assert refused.value.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID

        leader = next(n for n in nodes if n.is_leader())
        await trio.to_thread.run_sync(leader.stop)
        rest = [n for n in nodes if n is not leader]
        with trio.fail_after(30):
            while True:  # a new leader is elected among the two
                try:
                    await rest[0].call(
                        "apply_broker_id",
                        2.0,
                        cluster="c",
                        broker_name="b",
                        broker_id=2,
                        check_code="two",
                    )
                    break
                except ControllerUnavailable:
                    await trio.sleep(0.1)
            # (another thread applies it: polled)
            await wait_for(lambda: rest[1].state.groups["b"].members.keys() == {1, 2}, 30)
        for node in rest:
            assert node.state.replica_info("b").master_id == 1


async def ask(
    client: RemotingClient, addr: str, code: RequestCode, header: object = None, body: bytes = b""
) -> RemotingCommand:
    return await client.invoke(addr, RemotingCommand.request(code, header, body=body), 10)


async def alter(
    client: RemotingClient, addr: str, *, master: int, set_epoch: int
) -> RemotingCommand:
    """Ask for SyncStateSet [1, 2] of group b as ``master`` at master epoch 1."""
    header = AlterSyncStateSetRequestHeader("b", master, 1)
    body = encode_body(SyncStateSet([1, 2], set_epoch))
    return await ask(client, addr, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, header, body)


async def test_brokers_join_get_a_master_and_the_admin_can_move_it(tmp_path: Path) -> None:
    raft = f"127.0.0.1:{free_ports(1)[0]}"
    server = ControllerServer(ControllerConfig(raft_address=raft, data_dir=tmp_path), port=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        addr = server.address
        async with RemotingClient() as client:
            for check in ("first", "second"):
                response = await ask(
                    client,
                    addr,
                    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                    GetNextBrokerIdRequestHeader("c", "b"),
                )
                broker_id = response.header(GetNextBrokerIdResponseHeader).next_broker_id
                response = await ask(
                    client,
                    addr,
                    RequestCode.CONTROLLER_APPLY_BROKER_ID,
                    ApplyBrokerIdRequestHeader("c", "b", broker_id, check),
                )
                assert response.code == ResponseCode.SUCCESS, response.remark
                response = await ask(
                    client,
                    addr,
                    RequestCode.CONTROLLER_REGISTER_BROKER,
                    RegisterBrokerToControllerRequestHeader(
                        "c", "b", broker_id, f"127.0.0.1:{broker_id}", check, f"h:{broker_id}"
                    ),
                )
                assert response.code == ResponseCode.SUCCESS, response.remark
                beat = BrokerHeartbeatRequestHeader(
                    "c", f"127.0.0.1:{broker_id}", "b", broker_id, 0, 0, 0, 3000
                )
                await ask(client, addr, RequestCode.BROKER_HEARTBEAT, beat)
            with trio.fail_after(10):  # the election loop makes the first live broker master
                while True:
                    response = await ask(client, addr, RequestCode.BROKER_HEARTBEAT, beat)
                    info = response.header(ReplicaInfoResponseHeader)
                    if info.master_broker_id == 1:
                        break
                    await trio.sleep(0.05)
            assert info.master_epoch == 1 and info.master_ha_address == "h:1"

            # only the master, with the current epochs, changes the SyncStateSet
            wrong = await alter(client, addr, master=2, set_epoch=1)
            assert wrong.code == ResponseCode.CONTROLLER_INVALID_MASTER
            stale = await alter(client, addr, master=1, set_epoch=0)
            assert stale.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            ok = await alter(client, addr, master=1, set_epoch=1)
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            assert decode_body(SyncStateSet, ok.body).sync_state_set == [1, 2]

            # the admin names broker 2: a new epoch, broker 2 alone in the set
            moved = await ask(
                client,
                addr,
                RequestCode.CONTROLLER_ELECT_MASTER,
                ElectMasterRequestHeader("c", "b", 2, True),
            )
            assert moved.code == ResponseCode.SUCCESS, moved.remark
            header = moved.header(ReplicaInfoResponseHeader)
            assert (header.master_broker_id, header.master_epoch) == (2, 2)
            again = await ask(
                client,
                addr,
                RequestCode.CONTROLLER_ELECT_MASTER,
                ElectMasterRequestHeader("c", "b", 2, True),
            )
            assert again.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
            # as RocketMQ's: the refusal says who the master is, nothing changed
            kept = again.header(ReplicaInfoResponseHeader)
            assert (kept.master_broker_id, kept.master_epoch) == (2, 2)
            assert decode_body(SyncStateSet, again.body).sync_state_set == [2]

            data = await ask(
                client, addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=b'["b"]'
            )
            table = json.loads(data.body)["replicasInfoTable"]["b"]
            assert table["masterBrokerId"] == 2
            assert [r["brokerId"] for r in table["inSyncReplicas"]] == [2]
            bad = await ask(
                client, addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=b"{not json"
            )
            assert bad.code == ResponseCode.CONTROLLER_INVALID_REQUEST
            unknown = await ask(
                client,
                addr,
                RequestCode.CONTROLLER_GET_REPLICA_INFO,
                GetReplicaInfoRequestHeader("nope"),
            )
            assert unknown.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
        nursery.cancel_scope.cancel()
