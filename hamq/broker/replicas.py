"""Controller mode: the broker's side of automatic failover (RocketMQ 5's ReplicasManager).

At start the broker finds its identity — a broker id applied for once at a controller
(CONTROLLER_GET_NEXT_BROKER_ID, CONTROLLER_APPLY_BROKER_ID) and kept in
``<store>/brokerIdentity.json`` with the check code that proves it is this broker's —
and registers its addresses (CONTROLLER_REGISTER_BROKER). Then, until it stops:

- it heartbeats every controller every ``controller_heartbeat_interval_s`` (1 s) with
  its epoch, max offset and confirm offset; the answers carry the group's replica
  info, and so do the controllers' NOTIFY_BROKER_ROLE_CHANGED pushes. The Raft leader's
  answer renews the broker's lease from when the heartbeat was sent, less how long ago
  the leader last heard from a majority — a master's only when the answer still names
  it master (roles.py: a master without its lease is fenced, and ``_lease_loop`` notes
  when that starts and ends);
- one task applies every newer replica info, in order, as a move of the broker's role
  (roles.py has the table and the order in which each move starts and stops things):
  * this broker is the master: stop replicating, trim a partial record at the log's
    end, write the new epoch entry, serve slaves, take sends (once the reput task has
    dispatched everything), register with the nameservers as brokerId 0;
  * another broker is: stop taking sends, drop slaves, replicate from the new master
    with the auto-switch protocol (which truncates this log to where it agrees with
    the master's), register as this broker's own id;
- as master it keeps the SyncStateSet through the controller, as
  hamq/ha/sync_state_set.py decides: a member behind by more than
  ``ha_max_time_slave_not_catchup_s`` (2 s: it has not acked bytes sent that long ago),
  or without an HA connection for that long, is dropped; a slave close to the master's
  end that has reported since it was dropped first *joins* — sends wait for its ack
  from then on — and is added once it has acked everything up to where it joined (so
  a member always has every acknowledged message), or given up (and backed off) if it
  has not within that time. With ``all_ack_in_sync_state_set`` sends wait for every
  member; ``min_in_sync_replicas`` refuses sends while the set is smaller;
- as master it admits on its HA port only members of its group as the controllers
  know them (``ha_registry``: CONTROLLER_GET_SYNC_STATE_DATA, every registered broker
  id and address; hamq/ha/membership.py has the rule).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import trio

from hamq.broker.context import BrokerContext
from hamq.ha import EpochFile, HAClient
from hamq.ha.membership import Registry, RegistryUnavailable
from hamq.ha.sync_state_set import SyncStateSetKeeper
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import SyncStateSet, decode_body, encode_body
from hamq.protocol.headers import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    ReplicaInfoResponseHeader,
)
from hamq.remoting import Connection, Dispatcher, RemotingClient, RemotingError
from hamq.store import StoreError
from hamq.store.files import write_atomically

log = logging.getLogger(__name__)

IDENTITY_FILE = "brokerIdentity.json"
#: how often a master looks at its slaves for SyncStateSet changes
SYNC_STATE_CHECK_S = 0.5
#: a slave this close to the master's end may join the SyncStateSet
JOIN_LAG_BYTES = 4 * 1024 * 1024
#: how long to wait between rounds when no controller answers
RETRY_S = 1.0
#: how often a master looks whether it is fenced (and at once when its lease ends)
FENCE_CHECK_S = 0.25


class ControllersUnreachable(Exception):
    """No controller answered."""


@attrs.frozen
class ReplicaView:
    """What a controller said of this broker's group."""

    master_id: int | None
    master_address: str | None
    master_ha_address: str | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int

    @property
    def version(self) -> tuple[int, int]:
        return (self.master_epoch, self.sync_state_set_epoch)

    @classmethod
    def from_command(cls, command: RemotingCommand) -> ReplicaView | None:
        """From a controller's answer or push; None if it carries no replica info."""
        header = command.header(ReplicaInfoResponseHeader)
        if header.master_epoch is None:
            return None
        body = decode_body(SyncStateSet, command.body) if command.body else SyncStateSet()
        master = header.master_broker_id
        set_epoch = header.sync_state_set_epoch
        return cls(
            master_id=master if master is not None and master >= 0 else None,
            master_address=header.master_address or None,
            master_ha_address=header.master_ha_address or None,
            master_epoch=header.master_epoch,
            sync_state_set=frozenset(body.sync_state_set),
            sync_state_set_epoch=body.sync_state_set_epoch if set_epoch is None else set_epoch,
        )


@attrs.define
class Identity:
    broker_id: int
    check_code: str

    @classmethod
    def load(cls, path: Path) -> Identity | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            raw = json.loads(text)
            return cls(int(raw["brokerId"]), str(raw["checkCode"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{path} is not a broker identity file: {exc}") from None

    def save(self, path: Path) -> None:
        data = {"brokerId": self.broker_id, "checkCode": self.check_code}
        write_atomically(path, json.dumps(data).encode())


class ReplicasManager:
    def __init__(
        self,
        ctx: BrokerContext,
        client: RemotingClient,
        epochs: EpochFile,
        ha_client: HAClient,
        *,
        confirm_offset: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.client = client
        self.epochs = epochs
        self.ha_client = ha_client
        self._confirm_offset = confirm_offset
        self.roles = ctx.roles
        self.controllers = list(self.config.controller_addrs)
        self.identity: Identity | None = None
        #: the view this broker acts on, and the newest one offered
        self.applied: ReplicaView | None = None
        self._offered: ReplicaView | None = None
        self._new_view = trio.Event()
        #: who belongs in the SyncStateSet while this broker is master
        self.keeper = SyncStateSetKeeper(ctx.config.ha_max_time_slave_not_catchup_s, JOIN_LAG_BYTES)
        #: how often, as master, it has looked at its slaves for SyncStateSet changes
        self.sync_state_checks = 0
        self.role_changes = 0

    # ------------------------------------------------------------------ what others ask
    @property
    def broker_id(self) -> int:
        return self.identity.broker_id if self.identity else -1

    @property
    def master_address(self) -> str | None:
        """The master's remoting address while this broker is a slave (metadata sync)."""
        view = self.applied
        if view is None or view.master_id is None or view.master_id == self.broker_id:
            return None
        return view.master_address

    @property
    def master_ha_address(self) -> str | None:
        view = self.applied
        if view is None or view.master_id is None or view.master_id == self.broker_id:
            return None
        return view.master_ha_address

    def ha_registry(self) -> Registry:
        """The group's members as the controllers know them: who may replicate from
        this broker while it is master (their ids are the group's identities)."""
        return Registry("the controllers", lambda: self.broker_id, True, self._members)

    async def _members(self) -> Mapping[int, str]:
        """broker id -> registered address of every member of this group;
        RegistryUnavailable if no controller answers (or the answer is not one)."""
        name = self.config.broker_name
        try:
            response = await self._ask(
                RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None, json.dumps([name]).encode()
            )
            group = json.loads(response.body)["replicasInfoTable"].get(name, {})
            replicas = [*group.get("inSyncReplicas", []), *group.get("notInSyncReplicas", [])]
            return {int(r["brokerId"]): str(r["brokerAddress"]) for r in replicas}
        except (ControllersUnreachable, RequestError) as exc:
            raise RegistryUnavailable(str(exc)) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RegistryUnavailable(f"a controller's answer is not replica info: {exc}") from None

    def install(self, dispatcher: Dispatcher) -> None:
        """Take NOTIFY_BROKER_ROLE_CHANGED pushes on the connections to the controllers."""
        dispatcher.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._notified)

    def _notified(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        view = ReplicaView.from_command(request)
        if view is not None:
            self.offer(view)
        return None if request.is_oneway else request.response_to()

    def offer(self, view: ReplicaView) -> None:
        """A controller's view of the group: acted on if it is newer than the last one."""
        latest = self._offered or self.applied
        if latest is None or view.version > latest.version:
            self._offered = view
            self._new_view.set()

    def status(self) -> dict[str, object]:
        view = self.applied
        return {
            "controllerMode": True,
            "controllers": self.controllers,
            "brokerIdAtController": self.broker_id,
            "masterBrokerId": view.master_id if view else None,
            "masterAddress": view.master_address if view else None,
            "masterEpoch": view.master_epoch if view else None,
            "syncStateSet": sorted(view.sync_state_set) if view else [],
            "syncStateSetEpoch": view.sync_state_set_epoch if view else None,
            "joining": sorted(self.keeper.joining),
            "syncStateChecks": self.sync_state_checks,
            "roleChanges": self.role_changes,
            "role": self.roles.role.value,
            "leaseLeftS": self._lease_left(),
            "fenced": self.roles.fenced,
        }

    def _lease_left(self) -> float | None:
        """How long this broker's lease still holds (negative: lost so long ago)."""
        lease = self.roles.lease
        if lease is None or lease.heard_at == -math.inf:
            return None
        return round(lease.until - trio.current_time(), 3)

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        view = await self._identify()
        if view is not None:
            self.offer(view)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._apply_loop)
            for addr in self.controllers:
                nursery.start_soon(self._heartbeat_loop, addr)
            nursery.start_soon(self._sync_state_set_loop)
            nursery.start_soon(self._lease_loop)
            task_status.started()

    async def _ask(self, code: RequestCode, header: object, body: bytes = b"") -> RemotingCommand:
        """Ask the controllers in turn until one answers; a refusal raises RequestError
        with the controller's code; none answering raises ControllersUnreachable."""
        problems = []
        for addr in list(self.controllers):
            try:
                request = RemotingCommand.request(code, header, body=body)
                response = await self.client.invoke(addr, request, self.config.controller_timeout_s)
            except RemotingError as exc:
                problems.append(f"{addr}: {exc}")
                continue
            if response.code == ResponseCode.SUCCESS:
                # the one that answered goes first next time
                self.controllers.remove(addr)
                self.controllers.insert(0, addr)
                return response
            if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
                problems.append(f"{addr}: {response.remark}")
                continue
            raise RequestError(response.code, f"controller {addr}: {response.remark}")
        raise ControllersUnreachable("; ".join(problems))

    async def _identify(self) -> ReplicaView | None:
        """This broker's id (applied for once) and its registration; retried until a
        controller answers."""
        path = Path(self.config.store.store_dir) / IDENTITY_FILE
        identity = await trio.to_thread.run_sync(Identity.load, path)
        config = self.config
        reported = ""
        while True:
            try:
                if identity is None:
                    identity = await self._apply_for_id()
                    await trio.to_thread.run_sync(identity.save, path)
                    log.info("broker id %d given by the controller", identity.broker_id)
                self.identity = identity
                self.roles.own_id = identity.broker_id
                self.ha_client.broker_id = identity.broker_id
                header = RegisterBrokerToControllerRequestHeader(
                    cluster_name=config.cluster_name,
                    broker_name=config.broker_name,
                    broker_id=identity.broker_id,
                    broker_address=self.ctx.address,
                    register_check_code=identity.check_code,
                    ha_server_addr=self.ctx.ha_address,
                )
                response = await self._ask(RequestCode.CONTROLLER_REGISTER_BROKER, header)
                log.info(
                    "registered with the controllers as broker %d of %s",
                    identity.broker_id,
                    config.broker_name,
                )
                return ReplicaView.from_command(response)
            except ControllersUnreachable as exc:
                if str(exc) != reported:
                    reported = str(exc)
                    log.warning("no controller answers (%s); trying again", exc)
                await trio.sleep(RETRY_S)

    async def _apply_for_id(self) -> Identity:
        config = self.config
        check_code = f"{self.ctx.address};{uuid.uuid4().hex}"
        while True:
            asked = GetNextBrokerIdRequestHeader(config.cluster_name, config.broker_name)
            response = await self._ask(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, asked)
            next_id = response.header(GetNextBrokerIdResponseHeader).next_broker_id
            apply = ApplyBrokerIdRequestHeader(
                config.cluster_name, config.broker_name, next_id, check_code
            )
            try:
                await self._ask(RequestCode.CONTROLLER_APPLY_BROKER_ID, apply)
            except RequestError as exc:
                if exc.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID:
                    continue  # another broker took it first: the next one
                raise
            return Identity(next_id, check_code)

    async def _heartbeat_loop(self, addr: str) -> None:
        config = self.config
        lease = self.roles.lease
        assert lease is not None  # (controller mode)
        reported = ""
        while True:
            header = BrokerHeartbeatRequestHeader(
                cluster_name=config.cluster_name,
                broker_addr=self.ctx.address,
                broker_name=config.broker_name,
                broker_id=self.broker_id,
                epoch=self.epochs.last_epoch,
                max_offset=self.ctx.store.commitlog_max_offset,
                confirm_offset=self._confirm_offset(),
                heartbeat_timeout_mills=int(config.controller_lease_s * 1000),
                election_priority=config.election_priority,
            )
            request = RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, header)
            problem = ""
            sent_at = trio.current_time()
            try:
                response = await self.client.invoke(
                    addr, request, config.controller_heartbeat_interval_s
                )
                if response.code == ResponseCode.SUCCESS:
                    view = ReplicaView.from_command(response)
                    if view is not None:
                        self.offer(view)
                    # only the Raft leader's answer renews the lease (roles.py), and a
                    # master's only when it names it master: one naming another (a newer
                    # epoch, which the apply loop acts on next) must not let it take
                    # sends meanwhile
                    contact_ms = response.header(ReplicaInfoResponseHeader).leader_contact_ms
                    named = not (self.roles.is_master and view and view.master_id != self.broker_id)
                    if contact_ms is not None and contact_ms >= 0 and named:
                        lease.renew(sent_at, contact_ms / 1000)
                else:
                    problem = f"refused: {response.remark}"
            except RemotingError as exc:
                problem = str(exc)
            if problem != reported:
                reported = problem
                if problem:
                    log.warning("heartbeat to controller %s failed: %s", addr, problem)
                else:
                    log.info("heartbeats to controller %s go through", addr)
            await trio.sleep(config.controller_heartbeat_interval_s)

    # ------------------------------------------------------------------ role changes
    async def _apply_loop(self) -> None:
        while True:
            await self._new_view.wait()
            self._new_view = trio.Event()
            view = self._offered
            if view is None or (self.applied and view.version <= self.applied.version):
                continue
            await self._apply(view)

    async def _apply(self, view: ReplicaView) -> None:
        before = self.applied
        is_master = self.roles.is_master
        if view.master_id == self.broker_id:
            if before is None or before.master_epoch != view.master_epoch or not is_master:
                await self._become_master(view)
            else:
                self._adopt_sync_state_set(view)
        elif (
            before is None
            or is_master
            or (before.master_id, before.master_epoch) != (view.master_id, view.master_epoch)
        ):
            await self._become_slave(view)
        else:
            self.applied = view

    async def _become_master(self, view: ReplicaView) -> None:
        self.applied = view  # (no master address for the HA client from here on)
        self.keeper.reset()
        await self.roles.become_master(
            view.master_epoch, "elected by the controllers", view.sync_state_set
        )
        self.role_changes += 1

    async def _become_slave(self, view: ReplicaView) -> None:
        was_master = self.roles.is_master
        self.keeper.reset()
        self.applied = view  # (the HA client follows this view's master)
        if view.master_id is None:
            why = f"broker group {self.config.broker_name} has no master now"
        else:
            why = f"master {view.master_id} at {view.master_address} (epoch {view.master_epoch})"
        await self.roles.become_slave(why)
        if was_master:
            self.role_changes += 1

    def _adopt_sync_state_set(self, view: ReplicaView) -> None:
        """Sends wait for the members of ``view``'s set (and for joining slaves)."""
        self.applied = view
        self.keeper.adopted(view.sync_state_set)
        self._wait_for(view.sync_state_set)

    def _wait_for(self, members: frozenset[int]) -> None:
        self.roles.adopt_sync_state_set(members, self.keeper.joining)

    # ------------------------------------------------------------------ SyncStateSet
    async def _sync_state_set_loop(self) -> None:
        while True:
            await trio.sleep(SYNC_STATE_CHECK_S)
            view = self.applied
            if view is None or not self.roles.is_master or view.master_id != self.broker_id:
                continue
            ha = self.ctx.ha
            assert ha is not None
            now = trio.current_time()
            self.sync_state_checks += 1
            joining = self.keeper.joining
            decision = self.keeper.decide(
                self.broker_id,
                view.sync_state_set,
                ha.slave_facts(now),
                self.ctx.store.commitlog_max_offset,
                now,
            )
            if decision.joining != joining:
                self._wait_for(view.sync_state_set)  # (sends wait for joining slaves too)
            if decision.wanted != view.sync_state_set:
                await self._alter(view, decision.wanted)

    async def _lease_loop(self) -> None:
        """Note when this master's lease runs out (or comes back): roles.py's
        ``check_fence``, at the lease's end and every FENCE_CHECK_S."""
        lease = self.roles.lease
        assert lease is not None
        while True:
            now = trio.current_time()
            self.roles.check_fence(now)
            wake = now + FENCE_CHECK_S
            await trio.sleep_until(lease.until if now < lease.until < wake else wake)

    async def _alter(self, view: ReplicaView, wanted: frozenset[int]) -> None:
        header = AlterSyncStateSetRequestHeader(
            broker_name=self.config.broker_name,
            master_broker_id=self.broker_id,
            master_epoch=view.master_epoch,
        )
        body = encode_body(SyncStateSet(sorted(wanted), view.sync_state_set_epoch))
        try:
            response = await self._ask(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, header, body)
        except (ControllersUnreachable, RequestError) as exc:
            log.warning(
                "changing the SyncStateSet %s -> %s failed: %s",
                sorted(view.sync_state_set),
                sorted(wanted),
                exc,
            )
            return
        answer = ReplicaView.from_command(response)
        if answer is None:
            return
        log.info(
            "SyncStateSet of %s: %s -> %s (epoch %d)",
            self.config.broker_name,
            sorted(view.sync_state_set),
            sorted(answer.sync_state_set),
            answer.sync_state_set_epoch,
        )
        if self.applied is view and answer.master_epoch == view.master_epoch:
            self._adopt_sync_state_set(answer)
        else:
            self.offer(answer)
