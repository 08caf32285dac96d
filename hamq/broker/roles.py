"""The broker's role: one value, changed only through ``MOVES``.

Everything that decides whether this broker takes sends lives here (h11's rule for a
state machine: one module): the role, the broker id it registers as, the refusal of
sends while a SyncStateSet is too small, and the order in which the role's services
start and stop. hamq/ha/states.py does the same for the HA slave's connection.

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
log's end; the HA service serves slaves, and puts wait for the replicas the
replication mode names (hamq/ha/group_transfer.py's ReplicaPolicy); the store takes
puts and runs the delayed-message scheduler (once everything is dispatched); only then
is the role MASTER — sends pass the processors from here — and the listeners
(registration with the nameservers) hear of it. Becoming slave undoes it in reverse:
the role first (sends are refused), then the store's puts and scheduler, then the HA
service's slaves and replica policy; the HA client then follows the new master.
The master's own services (``master_services``: the transaction check-back,
hamq/broker/transactions.py) start right after the store's scheduler and stop right
before it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Protocol

import attrs

from hamq.broker.config import BrokerConfig
from hamq.ha import EpochFile, HAClient, HAService, ReplicaPolicy
from hamq.ha.group_transfer import policy_for
from hamq.store import BrokerRole, MessageStore

log = logging.getLogger(__name__)


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
    ) -> None:
        self.config = config
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
        #: called after every move (the registrar registers the new role)
        self.listeners: list[Callable[[], None]] = []
        #: started on becoming master, stopped on becoming slave, next to the scheduler
        self.master_services: list[MasterService] = []
        self.changes = 0
        if ha_service is not None:
            # a configured master's slaves may catch up while it starts (its log is
            # recovered and takes no sends yet); a controlled broker serves none until
            # the controllers make it master
            ha_service.active = not self.controlled
            store.use_replicas(ha_service.transfer)

    # ------------------------------------------------------------------ what it says
    @property
    def is_master(self) -> bool:
        return self.role is Role.MASTER

    @property
    def broker_id(self) -> int:
        """The id this broker registers with: its own (-1: not known yet, not
        registered), and in controller mode 0 while master."""
        if self.controlled and self.role is Role.MASTER:
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

    def replica_policy(self) -> ReplicaPolicy:
        """Who this broker's puts wait for as master, besides the disk (group_transfer.py)."""
        all_ack = self.controlled and self.config.all_ack_in_sync_state_set
        return policy_for(self.master_role, all_ack_in_sync_state_set=all_ack)

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

    def _moved(self, before: Role, new: Role, why: str) -> None:
        self.role = new
        self.changes += 1
        log.log(
            logging.WARNING if self.controlled else logging.INFO,  # (a failover is news)
            "broker %s (id %d): %s -> %s (%s)",
            self.config.broker_name,
            self.own_id,
            before.value,
            new.value,
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
        if self.ha_client is not None:
            self.ha_client.kick()  # (its master is this broker now: it replicates nothing)
        if self.controlled:
            await store.trim_partial_tail()
        await self.epochs.append(epoch, store.commitlog_max_offset)
        if self.ha_service is not None:
            self.ha_service.transfer.set_policy(self.replica_policy())
            self.ha_service.active = True
        self.adopt_sync_state_set(sync_state_set)
        await store.set_master(True)  # (waits until the reput task dispatched everything)
        for service in self.master_services:
            await service.set_master(True)
        self._moved(
            before, Role.MASTER, f"{why}; epoch {epoch} from offset {store.commitlog_max_offset}"
        )

    async def become_slave(self, why: str) -> None:
        """Stop taking sends and serving slaves; the HA client follows whichever master
        its address callback names now."""
        self._check(Role.SLAVE, why)
        before, self.role = self.role, Role.SLAVE  # (sends are refused from here on)
        self.sends_refused = None
        for service in self.master_services:
            await service.set_master(False)
        await self.store.set_master(False)
        if self.ha_service is not None:
            self.ha_service.transfer.set_policy(ReplicaPolicy.NONE)
            self.ha_service.deactivate()
        if self.ha_client is not None:
            self.ha_client.kick()
        self._moved(before, Role.SLAVE, why)

    def adopt_sync_state_set(
        self, members: frozenset[int], joining: frozenset[int] = frozenset()
    ) -> None:
        """A master's SyncStateSet, or the slaves joining it, changed: with
        allAckInSyncStateSet puts wait for all of them; below min_in_sync_replicas
        members sends are refused. (Controller mode; a no-op for a configured master.)"""
        if not self.controlled:
            return
        service = self.ha_service
        if service is not None and service.transfer.policy is ReplicaPolicy.SYNC_STATE_SET:
            service.transfer.set_policy(
                ReplicaPolicy.SYNC_STATE_SET, members | joining, self.own_id
            )
        least = self.config.min_in_sync_replicas
        self.sends_refused = (
            None
            if len(members) >= least
            else f"in-sync replicas not enough: the SyncStateSet {sorted(members)} "
            f"has {len(members)}, min_in_sync_replicas is {least}"
        )
