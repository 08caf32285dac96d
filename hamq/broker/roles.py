"""The broker's role: one value, changed only through ``MOVES``.

Everything that decides whether this broker takes sends lives here (h11's rule for a
state machine: one module): the role, the broker id it registers as, the refusal of
sends while a SyncStateSet is too small, and the order in which the role's services
start and stop. hamq/ha/states.py does the same for the HA slave's connection. The
store and the HA service keep no copy of the role: they read this object
(hamq/store/role.py's ``RoleReader``: ``is_master``, ``serves_slaves``), and the
broker's other role-dependent answers are made here too (``retention_floor``,
``confirm_offset``, ``master_ha_statistics``, ``slave_ha_statistics``).

    STARTING ──a configured master, serving and registered──────────▶ MASTER
    STARTING ──a configured slave──────────────────────────────────▶ SLAVE
    STARTING ──the controllers' first word──────────────────────────▶ MASTER | SLAVE
    SLAVE    ──elected by the controllers───────────────────────────▶ MASTER
    MASTER   ──re-elected at a newer epoch──────────────────────────▶ MASTER
    MASTER   ──another broker was elected──────────────────────────▶ SLAVE
    SLAVE    ──a new master─────────────────────────────────────────▶ SLAVE

The last four are controller mode's only (replicas.py asks for them); a statically
configured broker keeps the role it started in. Anything else raises
``IllegalRoleChange``, logged as an error.

Becoming master, in this order: the HA client stops replicating; (controller mode) a
partial record a replica's log ends with is trimmed; the new epoch is written at the
log's end; puts wait for the replicas the replication mode names
(hamq/ha/group_transfer.py's ReplicaPolicy); the HA service serves slaves while the
store settles (everything dispatched, each queue's next offset from its queue); then
the role is MASTER — sends pass the processors and the store from here — the store
runs the delayed-message scheduler, and the listeners (registration with the
nameservers) hear of it. Becoming slave undoes it in reverse: the role first (sends
are refused, by the store too), then the store's scheduler, then the HA service's
replica policy and slaves; the HA client then follows the new master. The master's
own services (``master_services``: the transaction check-back,
hamq/broker/transactions.py) start right after the store's scheduler and stop right
before it. Becoming slave also answers at once every send still waiting for the
replicas (``SERVICE_NOT_AVAILABLE``: stored here, not known to be on the new master).

**Whether a master takes sends** (``refusal``; the send and END_TRANSACTION processors
ask it for every request): a slave or a starting broker never does; a master does
unless (controller mode) it has lost its *lease*, or its SyncStateSet is below
``min_in_sync_replicas`` (SYSTEM_ERROR, as before).

The lease (``Lease``): the controllers count a broker alive until ``controller_lease_s``
(3 s, sent in every heartbeat) passes after they *received* its last heartbeat, and
then elect another master. Only the Raft leader's answer renews the lease, and the
leader says how long ago it last heard from a majority of the controllers (``contact``;
a follower's answer renews nothing: a controller cut off from the majority, or a
stale leader that has not stepped down yet, must not keep an old master going while
the majority elects another). The broker counts its lease from when it *sent* the
heartbeat, less that age — never later than the count of any controller of that
majority, which then received the heartbeat too or heard from the leader after the
broker did — and holds it until ``LEASE_MARGIN_S`` (or a quarter of the lease, if less)
before that ends: a master that cannot reach the leader of a majority stops taking
sends before another master could be elected. While its lease is lost, a master is
*fenced*:

- new sends are refused at once with SERVICE_NOT_AVAILABLE and a remark that says why
  (RocketMQ's retry code for a broker that cannot take sends now, such as a slave:
  hamq's producer looks the route up again on it, RocketMQ's 4.x Java producer retries
  on another broker group; a code of its own, as RocketMQ 5's NOT_LEADER_FOR_QUEUE,
  would end a 4.x producer's send at once);
- every send waiting for its replicas is answered SERVICE_NOT_AVAILABLE at once
  (``check_fence``), and so is any answer given later that the lease no longer
  covers (``answer_refusal``): the message is stored here but may be cut when this
  broker rejoins under a new master, so the producer must send it again (a duplicate
  if it survives);
- it registers with the nameservers under its own id, not as the master (id 0), so that
  a nameserver it still reaches does not send clients back to it.

One exception keeps a healthy group writable while every controller is down: with
``all_ack_in_sync_state_set``, a SEND_OK needs the ack of every member of the
SyncStateSet (and of every joining slave), the only brokers the controllers may elect
(unless ``--elect-unclean-master``); each such SEND_OK is therefore on whichever is
elected, lease or not. So such a master is fenced only when its lease is lost *and*
some member is behind by more than ``ha_max_time_slave_not_catchup_s`` (not acking,
hamq/ha/sync_state_set.py) — which is what happens once another broker is elected: it
stops acking this one. A fenced master takes sends again as soon as its lease is back
(a controller answers and still names it master at its epoch) or, in that mode, its
members ack again; a newer epoch naming another master makes it a slave.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from typing import Protocol

import attrs

from hamq.broker.config import BrokerConfig
from hamq.ha import (
    EpochFile,
    HAClient,
    HAService,
    MasterHAStatistics,
    ReplicaPolicy,
    SlaveHAStatistics,
)
from hamq.ha.group_transfer import policy_for
from hamq.protocol import ResponseCode
from hamq.store import BrokerRole, MessageStore

log = logging.getLogger(__name__)

#: a lease ends this long (or a quarter of the lease, if less) before the controllers'
#: count of it could
LEASE_MARGIN_S = 0.5


class Role(enum.Enum):
    #: recovering and binding: no sends yet, registered only with a configured id
    STARTING = "STARTING"
    #: taking sends (the store too), serving slaves
    MASTER = "MASTER"
    #: replicating from a master (or waiting to learn one): sends are refused
    SLAVE = "SLAVE"


@attrs.frozen
class Move:
    why: str
    #: only the controllers make this move (controller mode)
    controlled_only: bool = False


MOVES: dict[tuple[Role, Role], Move] = {
    (Role.STARTING, Role.MASTER): Move("a configured master, or the controllers' choice"),
    (Role.STARTING, Role.SLAVE): Move("a configured slave, or the controllers' choice"),
    (Role.SLAVE, Role.MASTER): Move("elected by the controllers", controlled_only=True),
    (Role.MASTER, Role.MASTER): Move("re-elected at a newer epoch", controlled_only=True),
    (Role.MASTER, Role.SLAVE): Move("another broker was elected", controlled_only=True),
    (Role.SLAVE, Role.SLAVE): Move("a new master (or none)", controlled_only=True),
}


class MasterService(Protocol):
    """A service that runs on a master only (RocketMQ's startProcessorByHa)."""

    async def set_master(self, master: bool) -> None: ...


class IllegalRoleChange(RuntimeError):
    """A move ``MOVES`` does not allow (a bug: nothing is changed)."""


@attrs.frozen
class Refusal:
    """Why this broker takes no send now: the code to answer and the remark."""

    code: ResponseCode
    why: str


class Lease:
    """A controller-mode broker's lease (the module doc): held until ``until``, which
    each answered heartbeat moves on to its sending time + ``lease_s`` - the margin.
    Times are Trio's clock."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.margin_s = min(LEASE_MARGIN_S, lease_s / 4)
        #: when the last heartbeat a controller answered was sent (-inf: none yet)
        self.heard_at = -math.inf

    @property
    def until(self) -> float:
        return self.heard_at + self.lease_s - self.margin_s

    def renew(self, sent_at: float, contact_s: float = 0.0) -> None:
        """The Raft leader answered the heartbeat sent at ``sent_at``, having heard
        from a majority of the controllers ``contact_s`` before it answered."""
        self.heard_at = max(self.heard_at, sent_at - contact_s)

    def held(self, now: float) -> bool:
        return now < self.until


class Roles:
    """This broker's role and what follows from it (one per broker)."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        epochs: EpochFile,
        *,
        ha_service: HAService | None = None,
        ha_client: HAClient | None = None,
        address: Callable[[], str] | None = None,
    ) -> None:
        self.config = config
        #: this broker's address as clients reach it, once bound (for remarks)
        self._address = address or (lambda: f"{config.advertised_host}:{config.listen_port}")
        self.controlled = config.enable_controller_mode
        self.store = store
        self.epochs = epochs
        self.ha_service = ha_service
        self.ha_client = ha_client
        self.role = Role.STARTING
        #: this broker's own id: configured, or (controller mode) given by the controllers
        self.own_id = -1 if self.controlled else config.broker_id
        #: why sends are refused while master (the SyncStateSet is below
        #: min_in_sync_replicas), None when they are not
        self.sends_refused: str | None = None
        #: controller mode: the controllers' word that this broker is alive
        self.lease: Lease | None = Lease(config.controller_lease_s) if self.controlled else None
        #: a master without its lease, as ``check_fence`` last saw (registration reads it;
        #: sends ask ``refusal``, which looks at the clock itself)
        self.fenced = False
        #: called after every move (the registrar registers the new role)
        self.listeners: list[Callable[[], None]] = []
        #: started on becoming master, stopped on becoming slave, next to the scheduler
        self.master_services: list[MasterService] = []
        self.changes = 0
        #: becoming master: the HA service serves slaves already
        self._promoting = False
        store.use_role(self)
        if ha_service is not None:
            ha_service.use_role(self)
            store.use_replicas(ha_service.replica_gate)

    # ------------------------------------------------------------------ what it says
    @property
    def is_master(self) -> bool:
        """Does this broker take sends (the store reads it too: hamq/store/role.py)?"""
        return self.role is Role.MASTER

    @property
    def serves_slaves(self) -> bool:
        """Does the HA service serve slaves (it reads this): as master, and while a
        configured master starts (its slaves may catch up while its recovered log takes
        no sends yet); a controlled broker serves none until the controllers make it
        master."""
        if self.role is Role.MASTER or self._promoting:
            return True
        return self.role is Role.STARTING and not self.controlled and self.config.is_master

    @property
    def broker_id(self) -> int:
        """The id this broker registers with: its own (-1: not known yet, not
        registered), and in controller mode 0 while master and not fenced."""
        if self.controlled and self.role is Role.MASTER and not self.fenced:
            return 0
        if self.controlled and self.role is Role.STARTING:
            return -1
        return self.own_id

    @property
    def broker_role(self) -> BrokerRole:
        """As RocketMQ reports it: SYNC_MASTER or ASYNC_MASTER while master, else SLAVE."""
        return self.master_role if self.role is Role.MASTER else BrokerRole.SLAVE

    @property
    def master_role(self) -> BrokerRole:
        """The kind of master this broker is when it is one: as configured (a controlled
        broker configured SLAVE masters asynchronously)."""
        configured = self.config.store.role
        return configured if configured.is_master else BrokerRole.ASYNC_MASTER

    def retention_floor(self) -> int:
        """What retention may not delete past: as master, what an in-sync slave still
        needs (hamq/ha/master.py's ``floor``); else nothing beyond the log's end."""
        if self.ha_service is not None and self.role is Role.MASTER:
            return self.ha_service.floor()
        return self.store.commitlog_max_offset

    def confirm_offset(self) -> int:
        """What every in-sync replica has (the checkpoint's confirm offset): as master,
        the HA service's count of its slaves' acks; as a slave, its HA client's."""
        if self.ha_service is not None and self.role is Role.MASTER:
            return self.ha_service.confirm_offset
        return self.ha_client.confirm_offset if self.ha_client is not None else 0

    def master_ha_statistics(self) -> MasterHAStatistics | None:
        """The HA service's view of its slaves while this broker is master, else None."""
        if self.ha_service is not None and self.role is Role.MASTER:
            return self.ha_service.statistics()
        return None

    def slave_ha_statistics(self) -> SlaveHAStatistics | None:
        """The HA client's view of its master while this broker is not master, else None."""
        if self.ha_client is not None and self.role is not Role.MASTER:
            return self.ha_client.statistics()
        return None

    def replica_policy(self) -> ReplicaPolicy:
        """Who this broker's puts wait for as master, besides the disk (group_transfer.py)."""
        all_ack = self.controlled and self.config.all_ack_in_sync_state_set
        return policy_for(self.master_role, all_ack_in_sync_state_set=all_ack)

    # ------------------------------------------------------------------ taking sends
    def refusal(self, now: float) -> Refusal | None:
        """Why a send (or any write a master takes) is refused now, None if it is taken
        (the module doc has the rules)."""
        role, lease = self.role, self.lease
        if role is Role.MASTER and (lease is None or now < lease.until):  # (most sends)
            if self.sends_refused is None:
                return None
            return Refusal(ResponseCode.SYSTEM_ERROR, self.sends_refused)
        name, address = self.config.broker_name, self.address
        if role is Role.SLAVE:
            return Refusal(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"the broker[{name} at {address}] is a slave (broker id {self.broker_id}): "
                f"send to the master of {name}",
            )
        if role is Role.STARTING:
            return Refusal(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"the broker[{name} at {address}] is starting: it takes no sends yet",
            )
        if self._fenced_at(now):
            return Refusal(ResponseCode.SERVICE_NOT_AVAILABLE, self._lease_lost(now))
        if self.sends_refused is not None:
            return Refusal(ResponseCode.SYSTEM_ERROR, self.sends_refused)
        return None

    def answer_refusal(self, *, replicated: bool, now: float) -> str | None:
        """Why a send stored before and answered now (its replicas acked it:
        ``replicated``, or its wait for them ended) must be answered
        SERVICE_NOT_AVAILABLE instead of its status: this broker is no longer master,
        or has lost its lease and the status's promise no longer holds. None: the
        status stands."""
        stored = "the message is stored on this broker but not known to be on its replicas"
        if self.role is not Role.MASTER:
            return (
                f"{stored}, and this broker[{self.config.broker_name} at {self.address}] "
                "is no longer master: a new master may not have it (it is then cut when "
                "this broker follows the new one); send it again"
            )
        lease = self.lease
        if lease is None or lease.held(now):
            return None
        if replicated and self._all_ack():
            return None  # every broker the controllers may elect has it
        if replicated or self._fenced_at(now):
            return f"{stored}: {self._lease_lost(now)}; send it again"
        return None

    def check_fence(self, now: float) -> None:
        """Note whether this master is fenced now (replicas.py calls it as its lease
        runs out and every fraction of a second): when that changes, log it, and on
        fencing answer the sends waiting for replicas at once (``answer_refusal`` says
        what); the listeners hear of it (registration: the id changes)."""
        fenced = self._fenced_at(now)
        if fenced == self.fenced:
            return
        self.fenced = fenced
        if fenced:
            log.warning("broker %s: %s", self.config.broker_name, self._lease_lost(now))
            abandoned = self.store.durability.abandon_replica_waits()
            if abandoned:
                log.warning(
                    "%d send(s) waiting for replicas answered SERVICE_NOT_AVAILABLE", abandoned
                )
        else:
            log.warning(
                "broker %s (id %d): takes sends again as master (%s)",
                self.config.broker_name,
                self.own_id,
                "a controller answered" if self._lease_held(now) else "its replicas ack again",
            )
        for listener in self.listeners:
            listener()

    def _lease_held(self, now: float) -> bool:
        return self.lease is None or self.lease.held(now)

    def _fenced_at(self, now: float) -> bool:
        """A master without its lease, and (allAckInSyncStateSet) with a member of its
        SyncStateSet or a joining slave behind."""
        if self.role is not Role.MASTER or self._lease_held(now):
            return False
        return not (self._all_ack() and self._replicas_acking(now))

    def _all_ack(self) -> bool:
        service = self.ha_service
        return service is not None and service.replica_policy is ReplicaPolicy.SYNC_STATE_SET

    def _replicas_acking(self, now: float) -> bool:
        """Every broker a SEND_OK waits for is behind by at most
        ``ha_max_time_slave_not_catchup_s`` (hamq/ha/sync_state_set.py)."""
        service = self.ha_service
        assert service is not None
        must_ack = service.must_ack
        if not must_ack:
            return True
        facts = service.slave_facts(now)
        limit = self.config.ha_max_time_slave_not_catchup_s
        return all(m in facts and facts[m].behind_s <= limit for m in must_ack)

    def _lease_lost(self, now: float) -> str:
        lease = self.lease
        assert lease is not None
        heard = (
            f"for {now - lease.heard_at:.1f}s" if lease.heard_at > -math.inf else "since it started"
        )
        return (
            f"the broker[{self.config.broker_name} at {self.address}] has lost its "
            f"controller lease: no controller has answered its heartbeats {heard} "
            f"(controller_lease_s {lease.lease_s:g}), so another master may be elected; "
            "it takes no sends until a controller answers"
        )

    @property
    def address(self) -> str:
        """This broker's address as clients reach it (for remarks)."""
        return self._address()

    # ------------------------------------------------------------------ moves
    def _check(self, new: Role, why: str) -> None:
        move = MOVES.get((self.role, new))
        if move is None or (move.controlled_only and not self.controlled):
            problem = (
                f"broker {self.config.broker_name}: {self.role.value} -> {new.value} "
                f"is not a role change this broker may make ({why})"
            )
            log.error("%s", problem)
            raise IllegalRoleChange(problem)

    def _moved(self, before: Role, why: str) -> None:
        """The role moved from ``before`` (``self.role`` is the new one): log it and
        tell the listeners."""
        self.changes += 1
        log.log(
            logging.WARNING if self.controlled else logging.INFO,  # (a failover is news)
            "broker %s (id %d): %s -> %s (%s)",
            self.config.broker_name,
            self.own_id,
            before.value,
            self.role.value,
            why,
        )
        for listener in self.listeners:
            listener()

    async def become_master(
        self, epoch: int, why: str, sync_state_set: frozenset[int] = frozenset()
    ) -> None:
        """Take sends from the end of the log on, as epoch ``epoch``; with a SyncStateSet
        (controller mode) its members are who puts wait for."""
        self._check(Role.MASTER, why)
        before, store = self.role, self.store
        self.fenced = False
        if self.ha_client is not None:
            self.ha_client.kick()  # (its master is this broker now: it replicates nothing)
        if self.controlled:
            await store.trim_partial_tail()
        await self.epochs.append(epoch, store.commitlog_max_offset)
        if self.ha_service is not None:
            self.ha_service.set_replica_policy(self.replica_policy())
        self.adopt_sync_state_set(sync_state_set)
        if before is not Role.MASTER:
            self._promoting = True  # (slaves may connect while the store settles)
            try:
                await store.prepare_master()  # (until the reput task dispatched everything)
            finally:
                self._promoting = False
        self.role = Role.MASTER  # (sends are taken from here on: the processors, the store)
        await store.follow_role()  # (the delayed-message scheduler)
        for service in self.master_services:
            await service.set_master(True)
        self._moved(before, f"{why}; epoch {epoch} from offset {store.commitlog_max_offset}")

    async def become_slave(self, why: str) -> None:
        """Stop taking sends and serving slaves; the HA client follows whichever master
        its address callback names now."""
        self._check(Role.SLAVE, why)
        before, self.role = self.role, Role.SLAVE  # (sends are refused from here on)
        self.sends_refused = None
        self.fenced = False
        # (before the policy changes: none of these may be answered SEND_OK now)
        self.store.durability.abandon_replica_waits()
        for service in self.master_services:
            await service.set_master(False)
        await self.store.follow_role()
        if self.ha_service is not None:
            self.ha_service.set_replica_policy(ReplicaPolicy.NONE)
            self.ha_service.drop_slaves()
        if self.ha_client is not None:
            self.ha_client.kick()
        self._moved(before, why)

    def adopt_sync_state_set(
        self, members: frozenset[int], joining: frozenset[int] = frozenset()
    ) -> None:
        """A master's SyncStateSet, or the slaves joining it, changed: with
        allAckInSyncStateSet puts wait for all of them; below min_in_sync_replicas
        members sends are refused. (Controller mode; a no-op for a configured master.)"""
        if not self.controlled:
            return
        service = self.ha_service
        if service is not None and service.replica_policy is ReplicaPolicy.SYNC_STATE_SET:
            service.set_replica_policy(ReplicaPolicy.SYNC_STATE_SET, members | joining, self.own_id)
        least = self.config.min_in_sync_replicas
        self.sends_refused = (
            None
            if len(members) >= least
            else f"in-sync replicas not enough: the SyncStateSet {sorted(members)} "
            f"has {len(members)}, min_in_sync_replicas is {least}"
        )
