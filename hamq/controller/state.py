"""The controller's state machine: pure and deterministic — no I/O, no clock.

Per broker group (a broker name) it keeps the members (controller-assigned broker
ids with their addresses), the master (its id and its *epoch*), and the SyncStateSet
(the ids holding everything the master acknowledged) with its own epoch.

Every change is a method whose outcome depends only on the state and its arguments:
what the caller knew when it asked (which brokers are alive, their epochs and
offsets) travels in the arguments. So every controller that applies the same log of
calls ends in the same state; raft.py replicates the calls with pysyncobj.

Rules (RocketMQ 5's ReplicasInfoManager and DefaultElectPolicy):
- ids are applied for by the brokers (``next_broker_id``, ``apply_broker_id``) and
  kept for good; a broker proves an id is its own with the check code it applied with.
- an election picks, among the live members of the SyncStateSet, the one with the
  newest epoch, then the largest max offset, then the lowest election priority, then
  the lowest id; only ``unclean`` elections may pick a live broker outside the set
  (and the first election of a group, which has acknowledged nothing yet).
  Each election bumps the master epoch and makes the set ``{new master}`` (its epoch
  bumps too). With no one to elect the group has no master (its epoch stays).
- the SyncStateSet changes only at the request of the current master, naming the
  current master epoch and SyncStateSet epoch; the new set holds the master and only
  live members.
Invariants (tests/test_controller_state.py checks them over random histories): one
master per epoch, epochs only grow, the master is always in the SyncStateSet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from hamq.protocol.codes import ResponseCode

#: the id a broker group's master registers with nameservers under (RocketMQ MASTER_ID)
MASTER_ID = 0
#: ids the controller hands out start here
FIRST_BROKER_ID = 1


class ControllerError(Exception):
    """A request the state machine refuses: a RocketMQ controller response code and why."""

    def __init__(self, code: ResponseCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[ControllerError], tuple[ResponseCode, str]]:
        return (ControllerError, (self.code, self.message))


@attrs.define
class Member:
    broker_id: int
    #: who applied for the id (the broker's identity token); proves the id is its own
    check_code: str
    address: str = ""
    ha_address: str = ""


@attrs.define
class BrokerGroup:
    cluster: str
    broker_name: str
    members: dict[int, Member] = attrs.field(factory=dict)
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0

    def next_id(self) -> int:
        return max(self.members, default=FIRST_BROKER_ID - 1) + 1


@attrs.frozen
class Candidate:
    """What the controller knows of a live broker from its heartbeats."""

    broker_id: int
    epoch: int = 0
    max_offset: int = 0
    #: lower is preferred (RocketMQ's electionPriority)
    priority: int = 0


@attrs.frozen
class ReplicaInfo:
    """A group's replication state, as answered to brokers and admins."""

    broker_name: str
    master_id: int | None
    master_address: str | None
    master_ha_address: str | None
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    #: id -> remoting address of every member
    members: tuple[tuple[int, str], ...] = ()


class ControllerState:
    def __init__(self) -> None:
        self.groups: dict[str, BrokerGroup] = {}

    # ------------------------------------------------------------------ queries
    def group(self, broker_name: str) -> BrokerGroup:
        group = self.groups.get(broker_name)
        if group is None:
            raise ControllerError(
                ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                f"broker group {broker_name!r} is not known to the controller",
            )
        return group

    def replica_info(self, broker_name: str) -> ReplicaInfo:
        group = self.group(broker_name)
        master = group.members.get(group.master_id) if group.master_id is not None else None
        return ReplicaInfo(
            broker_name=broker_name,
            master_id=group.master_id,
            master_address=master.address if master else None,
            master_ha_address=master.ha_address if master else None,
            master_epoch=group.master_epoch,
            sync_state_set=tuple(sorted(group.sync_state_set)),
            sync_state_set_epoch=group.sync_state_set_epoch,
            members=tuple((i, m.address) for i, m in sorted(group.members.items())),
        )

    def next_broker_id(self, broker_name: str) -> int:
        group = self.groups.get(broker_name)
        return group.next_id() if group is not None else FIRST_BROKER_ID

    # ------------------------------------------------------------------ membership
    def apply_broker_id(
        self, cluster: str, broker_name: str, broker_id: int, check_code: str
    ) -> int:
        """Give ``broker_id`` to the broker that says ``check_code``; the same broker
        asking again gets it again, another one is refused."""
        if broker_id < FIRST_BROKER_ID:
            raise ControllerError(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"broker id {broker_id} is not one the controller hands out "
                f"({FIRST_BROKER_ID} or more)",
            )
        if not check_code:
            raise ControllerError(
                ResponseCode.CONTROLLER_INVALID_REQUEST, "applying for an id needs a check code"
            )
        group = self.groups.get(broker_name)
        if group is None:
            group = self.groups[broker_name] = BrokerGroup(cluster, broker_name)
        elif group.cluster != cluster:
            raise ControllerError(
                ResponseCode.CONTROLLER_INVALID_REQUEST,
                f"broker group {broker_name!r} belongs to cluster {group.cluster!r}, "
                f"not {cluster!r}",
            )
        member = group.members.get(broker_id)
        if member is not None:
            if member.check_code != check_code:
                raise ControllerError(
                    ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                    f"broker id {broker_id} of {broker_name!r} belongs to another broker",
                )
            return broker_id
        group.members[broker_id] = Member(broker_id, check_code)
        return broker_id

    def register(
        self,
        broker_name: str,
        broker_id: int,
        check_code: str,
        address: str,
        ha_address: str,
    ) -> ReplicaInfo:
        """A member says where it is now (at every start)."""
        member = self._member(broker_name, broker_id, check_code)
        member.address = address
        member.ha_address = ha_address
        return self.replica_info(broker_name)

    def _member(self, broker_name: str, broker_id: int, check_code: str) -> Member:
        member = self.group(broker_name).members.get(broker_id)
        if member is None:
            raise ControllerError(
                ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                f"broker id {broker_id} of {broker_name!r} was never applied for",
            )
        if member.check_code != check_code:
            raise ControllerError(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"broker id {broker_id} of {broker_name!r} belongs to another broker",
            )
        return member

    # ------------------------------------------------------------------ elections
    def elect_master(
        self,
        broker_name: str,
        alive: Mapping[int, Candidate],
        *,
        designated: int | None = None,
        unclean: bool = False,
        expected_master_epoch: int | None = None,
    ) -> ReplicaInfo:
        """Elect a master among ``alive`` brokers (the caller's view). Automatic
        (``designated`` None): only when the master is not alive. ``expected_master_epoch``
        fences an election decided on a view older than the last one."""
        group = self.group(broker_name)
        if expected_master_epoch is not None and expected_master_epoch != group.master_epoch:
            raise ControllerError(
                ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                f"the election expected master epoch {expected_master_epoch}, "
                f"{broker_name!r} is at {group.master_epoch}",
            )
        live = {i: c for i, c in alive.items() if i in group.members}
        if designated is not None:
            chosen = self._designated(group, live, designated, unclean)
        else:
            if group.master_id is not None and group.master_id in live:
                raise ControllerError(
                    ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                    f"broker {group.master_id} is still the live master of {broker_name!r}",
                )
            # a group that never had a master has acknowledged nothing: anyone will do
            first = group.master_epoch == 0
            pool = [c for i, c in live.items() if first or i in group.sync_state_set]
            if not pool and unclean:
                pool = list(live.values())
            if not pool:
                if group.master_id is not None:
                    group.master_id = None  # the group has no master until one can be elected
                    return self.replica_info(broker_name)
                raise ControllerError(
                    ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                    f"no live member of {broker_name!r}'s SyncStateSet "
                    f"{sorted(group.sync_state_set)} to elect"
                    + ("" if unclean else " (enableElectUncleanMaster is off)"),
                )
            chosen = max(pool, key=lambda c: (c.epoch, c.max_offset, -c.priority, -c.broker_id))
        group.master_id = chosen.broker_id
        group.master_epoch += 1
        group.sync_state_set = frozenset({chosen.broker_id})
        group.sync_state_set_epoch += 1
        return self.replica_info(broker_name)

    @staticmethod
    def _designated(
        group: BrokerGroup, live: Mapping[int, Candidate], designated: int, unclean: bool
    ) -> Candidate:
        name = group.broker_name
        if designated not in group.members:
            raise ControllerError(
                ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                f"broker {designated} is not a member of {name!r}",
            )
        if designated not in live:
            raise ControllerError(
                ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
                f"broker {designated} of {name!r} is not alive",
            )
        if designated == group.master_id:
            raise ControllerError(
                ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                f"broker {designated} is the master of {name!r} already",
            )
        first = group.master_epoch == 0  # nothing acknowledged yet: anyone will do
        if designated not in group.sync_state_set and not (unclean or first):
            raise ControllerError(
                ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                f"broker {designated} is not in {name!r}'s SyncStateSet "
                f"{sorted(group.sync_state_set)} (enableElectUncleanMaster is off)",
            )
        return live[designated]

    # ------------------------------------------------------------------ SyncStateSet
    def alter_sync_state_set(
        self,
        broker_name: str,
        master_id: int,
        master_epoch: int,
        sync_state_set_epoch: int,
        new_set: Iterable[int],
        alive: Iterable[int],
    ) -> ReplicaInfo:
        group = self.group(broker_name)
        proposed = frozenset(new_set)
        if group.master_id != master_id:
            raise ControllerError(
                ResponseCode.CONTROLLER_INVALID_MASTER,
                f"broker {master_id} is not the master of {broker_name!r} "
                f"(the master is {group.master_id})",
            )
        if master_epoch != group.master_epoch:
            raise ControllerError(
                ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                f"master epoch {master_epoch} is not {broker_name!r}'s current "
                f"{group.master_epoch}",
            )
        if sync_state_set_epoch != group.sync_state_set_epoch:
            raise ControllerError(
                ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                f"SyncStateSet epoch {sync_state_set_epoch} is not {broker_name!r}'s "
                f"current {group.sync_state_set_epoch}",
            )
        if master_id not in proposed:
            raise ControllerError(
                ResponseCode.CONTROLLER_INVALID_REPLICAS,
                f"the SyncStateSet {sorted(proposed)} must hold the master {master_id}",
            )
        strangers = sorted(proposed - group.members.keys())
        if strangers:
            raise ControllerError(
                ResponseCode.CONTROLLER_INVALID_REPLICAS,
                f"brokers {strangers} are not members of {broker_name!r}",
            )
        dead = sorted(proposed - {master_id} - set(alive))
        if dead:
            raise ControllerError(
                ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
                f"brokers {dead} of {broker_name!r} are not alive",
            )
        if proposed != group.sync_state_set:
            group.sync_state_set = proposed
            group.sync_state_set_epoch += 1
        return self.replica_info(broker_name)
