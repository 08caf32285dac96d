"""The controller: RocketMQ 5's controller requests over the remoting protocol.

A ``Controller`` installs its processors on a dispatcher — its own server's
(``hamq controller``) or a nameserver's (``enableControllerInNamesrv``) — and runs:
- the Raft node (raft.py) holding the replicated state (state.py);
- the live-broker table (heartbeats.py), fed by BROKER_HEARTBEAT (904);
- the election loop: on the Raft leader, every ``scan_interval_s`` and at once when a
  broker's heartbeat connection closes, a group whose master is not alive gets a new
  one (``elect_master`` with the live brokers' epochs and offsets; fenced by the master
  epoch it saw) — but a master this controller has not heard is taken for dead only
  once it has listened to heartbeats for the group's lease since it started
  (heartbeats.py): restarting every controller keeps a master that heartbeats. The
  group's live brokers are told at once (NOTIFY_BROKER_ROLE_CHANGED, oneway over
  their heartbeat connection); every heartbeat's answer carries the group's replica
  info as well.

Requests: CONTROLLER_GET_NEXT_BROKER_ID (1012), CONTROLLER_APPLY_BROKER_ID (1013),
CONTROLLER_REGISTER_BROKER (1003), BROKER_HEARTBEAT (904), CONTROLLER_GET_REPLICA_INFO
(1004), CONTROLLER_ALTER_SYNC_STATE_SET (1001), CONTROLLER_ELECT_MASTER (1002),
CONTROLLER_GET_METADATA_INFO (1005), CONTROLLER_GET_SYNC_STATE_DATA (1006). Changes go
through Raft from whichever controller receives them; a refusal answers the state
machine's code (CONTROLLER_*), no quorum answers CONTROLLER_NOT_LEADER. An election
that would keep the master the group has answers CONTROLLER_MASTER_STILL_EXIST with the
group's replica info, as RocketMQ's does (an admin naming the current master is done);
one that names no broker while this controller has not heard the master and has not
listened for its lease yet answers CONTROLLER_ELECT_MASTER_FAILED, saying so.

ACL (``acl_file``, a standalone controller's; an embedded one is covered by its
nameserver's): heartbeats, registrations, SyncStateSet changes and elections need a
request signed by an admin account (NO_PERMISSION otherwise); the read-outs stay open.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio
from attrs import validators as v

from hamq.acl import CONTROLLER_POLICY, AclGuard
from hamq.controller.heartbeats import LiveBroker, LiveBrokers
from hamq.controller.raft import ControllerUnavailable, RaftState, require_raft_secret
from hamq.controller.state import ControllerError, ReplicaInfo
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import SyncStateSet, decode_body, encode_body
from hamq.protocol.headers import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    ElectMasterRequestHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    ReplicaInfoResponseHeader,
)
from hamq.remoting import Connection, Dispatcher, RemotingError, check_address, check_addresses

if TYPE_CHECKING:
    from hamq.controller.metrics import ControllerCollector

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT_S = 3.0


@attrs.frozen
class ControllerConfig:
    #: this controller's Raft address (host:port), where the other controllers reach it
    raft_address: str = attrs.field(validator=check_address)
    #: where the controller keeps its Raft journal and dumps
    data_dir: Path = attrs.field(converter=Path)
    #: every controller's Raft address, this one's included (empty: a single controller)
    raft_peers: tuple[str, ...] = attrs.field(default=(), validator=check_addresses)
    #: a broker not heard from for this long is dead, unless its heartbeat says otherwise
    lease_s: float = attrs.field(default=3.0, validator=v.gt(0))
    #: how often the leader looks for groups without a live master
    scan_interval_s: float = attrs.field(default=0.2, validator=v.gt(0))
    #: elect a broker outside the SyncStateSet when no member of it is alive
    enable_elect_unclean_master: bool = False
    #: tell a group's brokers when its master changes (NOTIFY_BROKER_ROLE_CHANGED)
    notify_broker_role_changed: bool = True
    #: how long a change may wait for the Raft majority
    commit_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0))
    #: the secret the controllers share: Raft messages are encrypted and authenticated
    #: with it (required for a group of controllers; a single one makes its own)
    raft_secret: str | None = attrs.field(default=None, repr=False)
    #: run a group without a secret (anyone reaching the Raft port can run code)
    insecure_raft: bool = False
    #: the accounts (plain_acl.yml) that may change the controller's state; None: anyone
    acl_file: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))

    def __attrs_post_init__(self) -> None:
        if self.raft_peers and self.raft_address not in self.raft_peers:
            raise ValueError(
                f"raft_peers {list(self.raft_peers)} must include this controller's "
                f"raft_address {self.raft_address}"
            )
        partners = [p for p in self.raft_peers if p != self.raft_address]
        require_raft_secret(partners, self.raft_secret, self.insecure_raft)


def replica_header(info: ReplicaInfo) -> ReplicaInfoResponseHeader:
    return ReplicaInfoResponseHeader(
        master_broker_id=info.master_id if info.master_id is not None else -1,
        master_address=info.master_address or "",
        master_epoch=info.master_epoch,
        sync_state_set_epoch=info.sync_state_set_epoch,
        master_ha_address=info.master_ha_address or "",
    )


def replica_body(info: ReplicaInfo) -> bytes:
    return encode_body(SyncStateSet(list(info.sync_state_set), info.sync_state_set_epoch))


class Controller:
    def __init__(
        self, config: ControllerConfig, *, clock: Callable[[], float] = trio.current_time
    ) -> None:
        self.config = config
        self._clock = clock
        self.raft = RaftState(
            config.raft_address,
            list(config.raft_peers or (config.raft_address,)),
            config.data_dir,
            secret=config.raft_secret,
            insecure=config.insecure_raft,
        )
        self.live = LiveBrokers(config.lease_s)
        #: the ACL (config.acl_file; AclFileError here if the file cannot be used)
        self.acl = AclGuard(config.acl_file, CONTROLLER_POLICY) if config.acl_file else None
        self._wake = trio.Event()
        #: the last election problem logged per group (so it is logged once, not per scan)
        self._stuck: dict[str, str] = {}
        #: groups whose master this controller, leading, found alive since it started
        self._kept: set[str] = set()
        #: groups whose unheard master it waits to hear (logged once each)
        self._waiting: set[str] = set()
        self.elections = 0

    # ------------------------------------------------------------------ wiring
    def install(self, dispatcher: Dispatcher, *, heartbeat: bool = True) -> None:
        """Register the processors. ``heartbeat=False`` when the host (a nameserver)
        answers BROKER_HEARTBEAT itself and passes controller heartbeats on. With an ACL,
        it guards the dispatcher."""
        if self.acl is not None:
            dispatcher.guard = self.acl
        if heartbeat:
            dispatcher.register(RequestCode.BROKER_HEARTBEAT, self.heartbeat)
        dispatcher.register(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, self.next_broker_id)
        dispatcher.register_async(RequestCode.CONTROLLER_APPLY_BROKER_ID, self.apply_broker_id)
        dispatcher.register_async(RequestCode.CONTROLLER_REGISTER_BROKER, self.register_broker)
        dispatcher.register(RequestCode.CONTROLLER_GET_REPLICA_INFO, self.replica_info)
        dispatcher.register_async(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, self.alter)
        dispatcher.register_async(RequestCode.CONTROLLER_ELECT_MASTER, self.elect)
        dispatcher.register(RequestCode.CONTROLLER_GET_METADATA_INFO, self.metadata)
        dispatcher.register(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, self.sync_state_data)

    def collector(self) -> ControllerCollector:
        """This controller's metrics (a prometheus-client collector)."""
        from hamq.controller.metrics import ControllerCollector  # (it imports this module)

        return ControllerCollector(self)

    def connection_closed(self, conn: Connection) -> None:
        """Server close listener: brokers whose heartbeats came over ``conn`` are gone."""
        gone = self.live.connection_closed(conn)
        for broker in gone:
            log.info(
                "broker %s/%d (%s): heartbeat connection closed",
                broker.broker_name,
                broker.broker_id,
                broker.address,
            )
        if gone:
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.raft.start)
        self.live.listen(self._clock())  # (the server serves as soon as this is started)
        try:
            log.info(
                "controller raft node %s up (peers %s, data in %s)",
                self.config.raft_address,
                ", ".join(self.raft.partners) or "none",
                self.config.data_dir,
            )
            async with trio.open_nursery() as nursery:
                if self.acl is not None:
                    await nursery.start(self.acl.run)
                task_status.started()
                await self._election_loop()
        finally:
            with trio.CancelScope(shield=True):  # (run is ended by cancellation)
                await trio.to_thread.run_sync(self.raft.stop)

    # ------------------------------------------------------------------ elections
    async def _election_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.scan_interval_s):
                await self._wake.wait()
            self._wake = trio.Event()
            now = self._clock()
            for broker in self.live.expire(now):
                log.info(
                    "broker %s/%d (%s): lease of %gs ended",
                    broker.broker_name,
                    broker.broker_id,
                    broker.address,
                    broker.lease_s,
                )
            if not self.raft.is_leader():
                continue
            for name, group in list(self.raft.state.groups.items()):
                alive = self.live.alive(name, now)
                if group.master_id is not None and group.master_id in alive:
                    self._stuck.pop(name, None)
                    self._waiting.discard(name)
                    if name not in self._kept:
                        self._kept.add(name)
                        log.info(
                            "broker group %s: master %d (epoch %d) is alive",
                            name,
                            group.master_id,
                            group.master_epoch,
                        )
                    continue
                if group.master_id is None and not alive:
                    continue
                if group.master_id is not None and not self.live.heard_long_enough(name, now):
                    if name not in self._waiting:
                        self._waiting.add(name)
                        log.info(
                            "broker group %s: master %d not heard yet; waiting for its "
                            "heartbeats (a %gs lease) before taking it for dead",
                            name,
                            group.master_id,
                            self.live.lease_of(name),
                        )
                    continue
                self._kept.discard(name)
                await self._elect(name, alive, group.master_epoch)

    async def _elect(self, name: str, alive: dict[int, Any], seen_epoch: int) -> None:
        try:
            info: ReplicaInfo = await self.raft.call(
                "elect_master",
                self.config.commit_timeout_s,
                broker_name=name,
                alive=alive,
                unclean=self.config.enable_elect_unclean_master,
                expected_master_epoch=seen_epoch,
            )
        except (ControllerError, ControllerUnavailable) as exc:
            problem = str(exc)
            if self._stuck.get(name) != problem:
                self._stuck[name] = problem
                log.warning("broker group %s has no master: %s", name, problem)
            return
        self._stuck.pop(name, None)
        if info.master_id is None:
            log.warning(
                "broker group %s lost its master; none of SyncStateSet %s is alive",
                name,
                list(info.sync_state_set),
            )
            return
        await self._elected(info, "its master is gone")

    async def _elected(self, info: ReplicaInfo, why: str) -> None:
        """Count and log an election, and tell the group."""
        self.elections += 1
        log.warning(
            "broker group %s: broker %d (%s) elected master, epoch %d (%s)",
            info.broker_name,
            info.master_id,
            info.master_address,
            info.master_epoch,
            why,
        )
        await self._notify(info)

    async def _notify(self, info: ReplicaInfo) -> None:
        if not self.config.notify_broker_role_changed:
            return
        connections = {
            id(b.connection): b.connection
            for b in self.live.of_group(info.broker_name)
            if isinstance(b.connection, Connection)
        }

        async def one(conn: Connection) -> None:
            request = RemotingCommand.request(
                RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                replica_header(info),
                body=replica_body(info),
                oneway=True,
            )
            try:
                await conn.invoke_oneway(request, NOTIFY_TIMEOUT_S)
            except RemotingError as exc:
                log.info("telling %s of the new master failed: %s", conn, exc)

        async with trio.open_nursery() as nursery:
            for conn in connections.values():
                nursery.start_soon(one, conn)

    # ------------------------------------------------------------------ processors
    def _answer(self, request: RemotingCommand, info: ReplicaInfo) -> RemotingCommand:
        return request.response_to(header=replica_header(info), body=replica_body(info))

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        try:
            return await self.raft.call(operation, self.config.commit_timeout_s, **kwargs)
        except ControllerError as exc:
            raise RequestError(exc.code, exc.message) from None
        except ControllerUnavailable as exc:
            raise RequestError(ResponseCode.CONTROLLER_NOT_LEADER, str(exc)) from None

    def heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(BrokerHeartbeatRequestHeader)
        if header.broker_id is None:
            raise RequestError(
                ResponseCode.CONTROLLER_INVALID_REQUEST,
                "a heartbeat to the controller must name its brokerId",
            )
        lease_ms = header.heartbeat_timeout_mills
        broker = LiveBroker(
            cluster=header.cluster_name,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
            address=header.broker_addr,
            epoch=header.epoch or 0,
            max_offset=header.max_offset or 0,
            confirm_offset=header.confirm_offset or 0,
            priority=header.election_priority or 0,
            last_heard=self._clock(),
            lease_s=lease_ms / 1000 if lease_ms else self.config.lease_s,
            connection=conn,
        )
        if self.live.heard(broker):
            log.info(
                "broker %s/%d (%s) is alive", broker.broker_name, broker.broker_id, broker.address
            )
            self._wake.set()  # a group without a master may get one now
        # (the Raft leader says how fresh its majority is: only its answer renews the
        # broker's lease, and one cut off from the other controllers renews it less and
        # less, so that the broker stops before a new leader may elect another master)
        age = self.raft.majority_contact_age()
        contact_ms = None if age is None else int(age * 1000)
        if header.broker_name in self.raft.state.groups:
            info = self.raft.state.replica_info(header.broker_name)
            answer = attrs.evolve(replica_header(info), leader_contact_ms=contact_ms)
            return request.response_to(header=answer, body=replica_body(info))
        return request.response_to(header=ReplicaInfoResponseHeader(leader_contact_ms=contact_ms))

    def next_broker_id(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetNextBrokerIdRequestHeader)
        answer = GetNextBrokerIdResponseHeader(
            header.cluster_name,
            header.broker_name,
            self.raft.state.next_broker_id(header.broker_name),
        )
        return request.response_to(header=answer)

    async def apply_broker_id(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(ApplyBrokerIdRequestHeader)
        await self._call(
            "apply_broker_id",
            cluster=header.cluster_name,
            broker_name=header.broker_name,
            broker_id=header.applied_broker_id,
            check_code=header.register_check_code,
        )
        return request.response_to()

    async def register_broker(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(RegisterBrokerToControllerRequestHeader)
        info = await self._call(
            "register",
            broker_name=header.broker_name,
            broker_id=header.broker_id,
            check_code=header.register_check_code or "",
            address=header.broker_address,
            ha_address=header.ha_server_addr or "",
        )
        self._wake.set()  # a first broker: the group gets its master now
        return self._answer(request, info)

    def replica_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetReplicaInfoRequestHeader)
        try:
            info = self.raft.state.replica_info(header.broker_name)
        except ControllerError as exc:
            raise RequestError(exc.code, exc.message) from None
        return self._answer(request, info)

    async def alter(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(AlterSyncStateSetRequestHeader)
        body = decode_body(SyncStateSet, request.body)
        alive = self.live.alive(header.broker_name, self._clock())
        info = await self._call(
            "alter_sync_state_set",
            broker_name=header.broker_name,
            master_id=header.master_broker_id,
            master_epoch=header.master_epoch,
            sync_state_set_epoch=body.sync_state_set_epoch,
            new_set=frozenset(body.sync_state_set),
            alive=frozenset(alive),
        )
        log.info(
            "broker group %s: SyncStateSet %s (epoch %d)",
            header.broker_name,
            list(info.sync_state_set),
            info.sync_state_set_epoch,
        )
        return self._answer(request, info)

    async def elect(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """A broker asks for an election, or an admin names the new master."""
        header = request.header(ElectMasterRequestHeader)
        designated = header.broker_id if header.designate_elect else None
        group = self.raft.state.groups.get(header.broker_name)
        now = self._clock()
        if (
            designated is None
            and group is not None
            and group.master_id is not None
            and not self.live.is_alive(header.broker_name, group.master_id, now)
            and not self.live.heard_long_enough(header.broker_name, now)
        ):
            raise RequestError(
                ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                f"this controller has not heard master {group.master_id} of "
                f"{header.broker_name!r} yet, and has listened to heartbeats for less "
                f"than its {self.live.lease_of(header.broker_name):g}s lease: try again",
            )
        try:
            info: ReplicaInfo = await self._call(
                "elect_master",
                broker_name=header.broker_name,
                alive=self.live.alive(header.broker_name, now),
                designated=designated,
                unclean=self.config.enable_elect_unclean_master,
                expected_master_epoch=group.master_epoch if group is not None else None,
            )
        except RequestError as exc:
            if exc.code != ResponseCode.CONTROLLER_MASTER_STILL_EXIST:
                raise
            # RocketMQ's answer: nothing changes, and the refusal says who the master is
            # (its id, address, epochs and SyncStateSet), so an admin naming the master
            # it already has learns that it is done
            still = self.raft.state.replica_info(header.broker_name)
            return request.response_to(
                exc.code, str(exc), replica_header(still), body=replica_body(still)
            )
        if info.master_id is not None:
            await self._elected(info, "by admin" if designated is not None else "on request")
        return self._answer(request, info)

    def metadata(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        raft = self.raft
        leader = raft.leader()
        answer = GetMetaDataResponseHeader(
            group="hamq-controller",
            controller_leader_id=leader,
            controller_leader_address=leader,
            is_leader=raft.is_leader(),
            peers=";".join(sorted([raft.self_address, *raft.partners])),
        )
        return request.response_to(header=answer, body=json.dumps(raft.status()).encode())

    def sync_state_data(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Body: a JSON list of broker names (empty: all). Answer: RocketMQ's
        BrokerReplicasInfo shape, every member with its address and liveness."""
        try:
            names = json.loads(request.body) if request.body else []
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError("not a list of broker names")
        except (ValueError, RecursionError) as exc:  # RecursionError: '[[[[...'
            raise RequestError(
                ResponseCode.CONTROLLER_INVALID_REQUEST,
                f"CONTROLLER_GET_SYNC_STATE_DATA's body must be a JSON list of broker names: {exc}",
            ) from None
        state = self.raft.state
        now = self._clock()
        table: dict[str, Any] = {}
        for name in names or sorted(state.groups):
            if name not in state.groups:
                continue
            info = state.replica_info(name)

            def replica(broker_id: int, address: str, name: str = name) -> dict[str, Any]:
                live = self.live.get(name, broker_id)
                return {
                    "brokerName": name,
                    "brokerId": broker_id,
                    "brokerAddress": address,
                    "alive": self.live.is_alive(name, broker_id, now),
                    "epoch": live.epoch if live else None,
                    "maxOffset": live.max_offset if live else None,
                }

            members = dict(info.members)
            table[name] = {
                "masterBrokerId": info.master_id,
                "masterAddress": info.master_address,
                "masterEpoch": info.master_epoch,
                "syncStateSetEpoch": info.sync_state_set_epoch,
                "inSyncReplicas": [replica(i, members.get(i, "")) for i in info.sync_state_set],
                "notInSyncReplicas": [
                    replica(i, a) for i, a in info.members if i not in info.sync_state_set
                ],
            }
        return request.response_to(body=json.dumps({"replicasInfoTable": table}).encode())
