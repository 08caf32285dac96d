"""The controller's replica state machine (hamq/controller/state.py): id applications,
registration, elections and SyncStateSet changes, example by example and over random
histories of one or two broker groups of up to five brokers.

A refused call (ControllerError) must leave the state as it was; ``refuses`` checks both.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hamq.controller.state import (
    FIRST_BROKER_ID,
    Candidate,
    ControllerError,
    ControllerState,
    ReplicaInfo,
)
from hamq.protocol.codes import ResponseCode

CLUSTER = "c"
GROUP = "g"


def code_of(broker_id: int, group: str = GROUP) -> str:
    return f"{group}-{broker_id}"


def address(broker_id: int) -> str:
    return f"10.0.0.{broker_id}:10911"


def ha_address(broker_id: int) -> str:
    return f"10.0.0.{broker_id}:10912"


def alive(*candidates: Candidate | int) -> dict[int, Candidate]:
    """The caller's view of live brokers; a bare id is a candidate with zero figures."""
    cands = [c if isinstance(c, Candidate) else Candidate(c) for c in candidates]
    return {c.broker_id: c for c in cands}


def refuses(
    state: ControllerState, code: ResponseCode, call: Callable[..., Any], *args: Any, **kw: Any
) -> ControllerError:
    """``call`` raises ControllerError ``code`` and leaves every group as it was."""
    before = copy.deepcopy(state.groups)
    with pytest.raises(ControllerError) as info:
        call(*args, **kw)
    assert info.value.code == code, info.value.message
    assert state.groups == before
    return info.value


def with_brokers(n: int = 3, group: str = GROUP) -> ControllerState:
    """A group whose brokers 1..n applied for their ids and registered; no master yet."""
    state = ControllerState()
    for i in range(FIRST_BROKER_ID, FIRST_BROKER_ID + n):
        state.apply_broker_id(CLUSTER, group, i, code_of(i, group))
        state.register(group, i, code_of(i, group), address(i), ha_address(i))
    return state


def with_master(n: int = 3, master: int = 1) -> ControllerState:
    """Brokers 1..n, ``master`` elected (epoch 1) and every broker in the SyncStateSet."""
    state = with_brokers(n)
    state.elect_master(GROUP, alive(*range(1, n + 1)), designated=master, unclean=True)
    state.alter_sync_state_set(GROUP, master, 1, 1, range(1, n + 1), range(1, n + 1))
    info = state.replica_info(GROUP)
    assert (info.master_id, info.master_epoch) == (master, 1)
    assert info.sync_state_set == tuple(range(1, n + 1))
    assert info.sync_state_set_epoch == 2
    return state


# ---------------------------------------------------------------- broker ids


def test_ids_start_at_one_and_grow() -> None:
    """next_broker_id is 1 for an unknown group, then the id after those handed out."""
    state = ControllerState()
    assert state.next_broker_id(GROUP) == FIRST_BROKER_ID == 1
    assert state.apply_broker_id(CLUSTER, GROUP, 1, "a") == 1
    assert state.next_broker_id(GROUP) == 2
    assert state.apply_broker_id(CLUSTER, GROUP, 2, "b") == 2
    assert state.next_broker_id(GROUP) == 3
    assert state.next_broker_id("other") == 1


def test_same_check_code_gets_its_id_again() -> None:
    """Applying again with the same check code returns the id and changes nothing."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    state.register(GROUP, 1, "a", address(1), ha_address(1))
    before = copy.deepcopy(state.groups)
    assert state.apply_broker_id(CLUSTER, GROUP, 1, "a") == 1
    assert state.groups == before


def test_another_check_code_is_refused() -> None:
    """An id held by one broker is refused to a broker with another check code."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_ID_INVALID,
        state.apply_broker_id,
        CLUSTER,
        GROUP,
        1,
        "b",
    )


@pytest.mark.parametrize("broker_id", [0, -1])
def test_ids_below_one_are_refused(broker_id: int) -> None:
    """Ids below FIRST_BROKER_ID (0 is RocketMQ's MASTER_ID) are never handed out."""
    state = ControllerState()
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_ID_INVALID,
        state.apply_broker_id,
        CLUSTER,
        GROUP,
        broker_id,
        "a",
    )
    assert GROUP not in state.groups


def test_empty_check_code_is_refused() -> None:
    """A broker must say who it is to apply for an id."""
    state = ControllerState()
    refuses(
        state, ResponseCode.CONTROLLER_INVALID_REQUEST, state.apply_broker_id, CLUSTER, GROUP, 1, ""
    )
    assert GROUP not in state.groups


def test_cluster_mismatch_is_refused() -> None:
    """A group belongs to the cluster it was first applied in."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    refuses(
        state,
        ResponseCode.CONTROLLER_INVALID_REQUEST,
        state.apply_broker_id,
        "other",
        GROUP,
        2,
        "b",
    )


# ---------------------------------------------------------------- registration


def test_register_unknown_group_is_refused() -> None:
    """Registering in a group nobody applied to: its metadata does not exist."""
    state = ControllerState()
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
        state.register,
        GROUP,
        1,
        "a",
        address(1),
        ha_address(1),
    )
    refuses(state, ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, state.replica_info, GROUP)


def test_register_unknown_id_is_refused() -> None:
    """An id never applied for must be applied for first."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
        state.register,
        GROUP,
        2,
        "a",
        address(2),
        ha_address(2),
    )


def test_register_with_wrong_check_code_is_refused() -> None:
    """Only the broker that applied for an id may register under it."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_ID_INVALID,
        state.register,
        GROUP,
        1,
        "b",
        address(1),
        ha_address(1),
    )


def test_register_records_addresses() -> None:
    """Addresses show in replica_info's members, and the master's as the master's;
    registering again replaces them."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    state.apply_broker_id(CLUSTER, GROUP, 2, "b")
    info = state.register(GROUP, 1, "a", "h1:1", "h1:2")
    assert info == ReplicaInfo(GROUP, None, None, None, 0, (), 0, ((1, "h1:1"), (2, "")))
    state.elect_master(GROUP, alive(1), unclean=True)
    info = state.register(GROUP, 1, "a", "h1b:1", "h1b:2")
    assert (info.master_id, info.master_address, info.master_ha_address) == (1, "h1b:1", "h1b:2")
    assert info.members == ((1, "h1b:1"), (2, ""))


# ---------------------------------------------------------------- first election


def test_first_automatic_election_picks_any_live_member() -> None:
    """A group that never had a master has acknowledged nothing: a clean automatic
    election ranks every live member; both epochs become 1."""
    state = with_brokers()
    info = state.elect_master(GROUP, alive(Candidate(1), Candidate(3, max_offset=5), 2))
    assert info.master_id == 3
    assert (info.master_address, info.master_ha_address) == (address(3), ha_address(3))
    assert (info.master_epoch, info.sync_state_set, info.sync_state_set_epoch) == (1, (3,), 1)


@pytest.mark.parametrize("unclean", [False, True])
def test_first_election_with_no_one_alive_is_refused(unclean: bool) -> None:
    state = with_brokers()
    refuses(
        state,
        ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
        state.elect_master,
        GROUP,
        {},
        unclean=unclean,
    )


def test_first_designated_election() -> None:
    """A group that never had a master may be given one by an admin, clean or not."""
    state = with_brokers()
    info = state.elect_master(GROUP, alive(1, 2), designated=2)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (2, 1, (2,))


def test_first_designated_unclean_election() -> None:
    state = with_brokers()
    info = state.elect_master(GROUP, alive(1, 2), designated=2, unclean=True)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (2, 1, (2,))


def test_first_unclean_election() -> None:
    """An unclean first election ranks the live members just the same."""
    state = with_brokers()
    info = state.elect_master(
        GROUP, alive(Candidate(1, epoch=1), Candidate(3, max_offset=5)), unclean=True
    )
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (1, 1, (1,))


def test_election_ignores_live_non_members() -> None:
    """Brokers the group does not know cannot be elected, even unclean."""
    state = with_brokers(2)
    refuses(
        state,
        ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
        state.elect_master,
        GROUP,
        alive(Candidate(9, epoch=5)),
        unclean=True,
    )
    info = state.elect_master(GROUP, alive(Candidate(9, epoch=5), 2), unclean=True)
    assert info.master_id == 2


def test_election_in_unknown_group_is_refused() -> None:
    state = ControllerState()
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
        state.elect_master,
        GROUP,
        alive(1),
        unclean=True,
    )


# ---------------------------------------------------------------- automatic elections


@pytest.mark.parametrize("unclean", [False, True])
def test_automatic_election_refused_while_master_alive(unclean: bool) -> None:
    """The master is in the caller's live view: nothing to elect."""
    state = with_master()
    refuses(
        state,
        ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
        state.elect_master,
        GROUP,
        alive(1, 2, 3),
        unclean=unclean,
    )


@pytest.mark.parametrize(
    ("candidates", "winner"),
    [
        # newest epoch beats everything else
        ([Candidate(2, epoch=1, max_offset=99), Candidate(3, epoch=2)], 3),
        # then the largest max offset
        ([Candidate(2, max_offset=5, priority=9), Candidate(3, max_offset=6, priority=9)], 3),
        # then the lowest election priority
        ([Candidate(2, priority=2), Candidate(3, priority=1)], 3),
        # then the lowest id
        ([Candidate(3, epoch=1, max_offset=5, priority=1), Candidate(2, 1, 5, 1)], 2),
        ([Candidate(2, epoch=1), Candidate(3, epoch=1, max_offset=1, priority=5)], 3),
    ],
)
def test_automatic_election_ranking(candidates: list[Candidate], winner: int) -> None:
    """Among live SyncStateSet members: epoch, then offset, then priority, then id."""
    state = with_master()
    info = state.elect_master(GROUP, alive(*candidates))
    assert info.master_id == winner


def test_election_bumps_both_epochs_and_resets_the_set() -> None:
    """The new master's epoch and the set's epoch each grow by one; the set is {master}."""
    state = with_master()
    info = state.elect_master(GROUP, alive(2, 3))
    assert info.master_id == 2
    assert (info.master_epoch, info.sync_state_set, info.sync_state_set_epoch) == (2, (2,), 3)


def test_clean_election_stays_inside_the_set() -> None:
    """A live broker outside the SyncStateSet is not elected, however far ahead it is;
    with no live set member the group loses its master and keeps its epochs."""
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1, 2], [2, 3])
    info = state.elect_master(GROUP, alive(2, Candidate(3, epoch=9, max_offset=9)))
    assert info.master_id == 2
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1], [2, 3])
    info = state.elect_master(GROUP, alive(Candidate(3, epoch=9)))
    assert info.master_id is None
    assert (info.master_epoch, info.sync_state_set, info.sync_state_set_epoch) == (1, (1,), 3)


def test_unclean_election_prefers_the_set() -> None:
    """Unclean falls back to every live member only when no set member is alive."""
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1, 2], [2, 3])
    info = state.elect_master(GROUP, alive(2, Candidate(3, epoch=9)), unclean=True)
    assert info.master_id == 2
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1], [2, 3])
    info = state.elect_master(GROUP, alive(2, Candidate(3, epoch=9)), unclean=True)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (3, 2, (3,))


def test_no_candidate_clears_the_master_then_refuses() -> None:
    """No one to elect: the master is cleared (epochs and set kept); asking again with
    no master and no candidate is refused."""
    state = with_master()
    info = state.elect_master(GROUP, {})
    assert info.master_id is None
    assert (info.master_address, info.master_ha_address) == (None, None)
    assert (info.master_epoch, info.sync_state_set, info.sync_state_set_epoch) == (1, (1, 2, 3), 2)
    refuses(state, ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE, state.elect_master, GROUP, {})
    info = state.elect_master(GROUP, alive(3))
    assert (info.master_id, info.master_epoch, info.sync_state_set_epoch) == (3, 2, 3)


def test_returning_old_master_can_be_elected_again() -> None:
    """A cleared master still in the set is elected again under a new epoch."""
    state = with_master()
    state.elect_master(GROUP, {})
    info = state.elect_master(GROUP, alive(1))
    assert (info.master_id, info.master_epoch) == (1, 2)


def test_expected_master_epoch_fences_elections() -> None:
    """An election decided on an older (or newer) view of the epoch is refused."""
    state = with_master()
    for stale in (0, 2):
        refuses(
            state,
            ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
            state.elect_master,
            GROUP,
            alive(2),
            expected_master_epoch=stale,
        )
    info = state.elect_master(GROUP, alive(2), expected_master_epoch=1)
    assert (info.master_id, info.master_epoch) == (2, 2)


# ---------------------------------------------------------------- designated elections


def test_designated_non_member_is_refused() -> None:
    state = with_master()
    refuses(
        state,
        ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
        state.elect_master,
        GROUP,
        alive(9),
        designated=9,
        unclean=True,
    )


def test_designated_dead_broker_is_refused() -> None:
    state = with_master()
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
        state.elect_master,
        GROUP,
        alive(1, 3),
        designated=2,
    )


def test_designated_current_master_is_refused() -> None:
    state = with_master()
    refuses(
        state,
        ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
        state.elect_master,
        GROUP,
        alive(1, 2),
        designated=1,
    )


def test_designated_outside_the_set_needs_unclean() -> None:
    """A designated broker outside the set is refused, unless the election is unclean."""
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1, 2], [2])
    refuses(
        state,
        ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
        state.elect_master,
        GROUP,
        alive(1, 2, 3),
        designated=3,
    )
    info = state.elect_master(GROUP, alive(1, 2, 3), designated=3, unclean=True)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (3, 2, (3,))


def test_designated_handover_while_master_alive() -> None:
    """A designated set member takes over from a live master, whatever its figures."""
    state = with_master()
    info = state.elect_master(GROUP, alive(1, Candidate(2, epoch=9), 3), designated=3)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (3, 2, (3,))
    assert info.sync_state_set_epoch == 3


# ---------------------------------------------------------------- SyncStateSet


def test_alter_by_non_master_is_refused() -> None:
    """Only the current master may change the set; with no master nobody may."""
    state = with_master()
    refuses(
        state,
        ResponseCode.CONTROLLER_INVALID_MASTER,
        state.alter_sync_state_set,
        GROUP,
        2,
        1,
        2,
        [1, 2],
        [1, 2, 3],
    )
    state.elect_master(GROUP, {})
    refuses(
        state,
        ResponseCode.CONTROLLER_INVALID_MASTER,
        state.alter_sync_state_set,
        GROUP,
        1,
        1,
        2,
        [1],
        [2, 3],
    )


def test_alter_with_stale_master_epoch_is_refused() -> None:
    """The old master of an earlier epoch is fenced even with the same id."""
    state = with_master()
    state.elect_master(GROUP, {})
    state.elect_master(GROUP, alive(1))  # epoch 2, set epoch 3
    refuses(
        state,
        ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
        state.alter_sync_state_set,
        GROUP,
        1,
        1,
        3,
        [1, 2],
        [2],
    )


def test_alter_with_stale_set_epoch_is_refused() -> None:
    state = with_master()
    for stale in (1, 3):
        refuses(
            state,
            ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
            state.alter_sync_state_set,
            GROUP,
            1,
            1,
            stale,
            [1],
            [2, 3],
        )


@pytest.mark.parametrize("new_set", [[2, 3], [], [1, 9]])
def test_alter_to_invalid_replicas_is_refused(new_set: list[int]) -> None:
    """The new set must hold the master and only members."""
    state = with_master()
    refuses(
        state,
        ResponseCode.CONTROLLER_INVALID_REPLICAS,
        state.alter_sync_state_set,
        GROUP,
        1,
        1,
        2,
        new_set,
        [1, 2, 3, 9],
    )


def test_alter_with_dead_members_is_refused() -> None:
    """Every member but the master must be alive in the caller's view."""
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1], [])
    refuses(
        state,
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
        state.alter_sync_state_set,
        GROUP,
        1,
        1,
        3,
        [1, 2, 3],
        [2],
    )


def test_alter_changes_and_bumps_once() -> None:
    """A new set bumps the set epoch by one; the same set again changes nothing."""
    state = with_master()
    info = state.alter_sync_state_set(GROUP, 1, 1, 2, [1, 3], [3])
    assert (info.sync_state_set, info.sync_state_set_epoch, info.master_epoch) == ((1, 3), 3, 1)
    before = copy.deepcopy(state.groups)
    info = state.alter_sync_state_set(GROUP, 1, 1, 3, [3, 1], [3])
    assert (info.sync_state_set, info.sync_state_set_epoch) == ((1, 3), 3)
    assert state.groups == before


# ---------------------------------------------------------------- pickling


def test_controller_error_pickles() -> None:
    """pysyncobj pickles results: the code and message survive."""
    err = ControllerError(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, "epoch 1 is not 2")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ControllerError
    assert (back.code, back.message, str(back)) == (err.code, err.message, str(err))


def test_controller_state_pickles() -> None:
    """A state with two groups unpickles equal, check codes included."""
    state = with_master()
    state.apply_broker_id(CLUSTER, "g2", 1, "x")
    state.elect_master("g2", alive(1), unclean=True)
    back = pickle.loads(pickle.dumps(state))
    assert back.groups == state.groups
    for name in ("g2", GROUP):
        assert back.replica_info(name) == state.replica_info(name)


# ---------------------------------------------------------------- random histories

GROUPS = ("g1", "g2")
IDS = st.integers(1, 5)
ID_SETS = st.frozensets(IDS)
CANDIDATES = st.builds(
    Candidate,
    broker_id=IDS,
    epoch=st.integers(0, 3),
    max_offset=st.integers(0, 3),
    priority=st.integers(0, 2),
)
# how a caller's epoch relates to the group's current one
EPOCH_VIEW = st.sampled_from(["current"] * 4 + ["older", "newer"])
MOSTLY = st.sampled_from([True, True, True, False])


def viewed(epoch: int, view: str) -> int:
    return {"current": epoch, "older": epoch - 1, "newer": epoch + 1}[view]


class ControllerHistory(RuleBasedStateMachine):
    """Random calls on two groups; refused calls change nothing, invariants always hold."""

    def __init__(self) -> None:
        super().__init__()
        self.state = ControllerState()
        #: (group, master epoch) -> the one master ever seen under it
        self.masters: dict[tuple[str, int], int] = {}
        #: group -> (master epoch, SyncStateSet epoch) last seen
        self.epochs: dict[str, tuple[int, int]] = {}

    def attempt(self, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run a call; if it is refused, check nothing changed and return None."""
        before = copy.deepcopy(self.state.groups)
        infos = {name: self.state.replica_info(name) for name in self.state.groups}
        try:
            return call(*args, **kw)
        except ControllerError as err:
            assert isinstance(err.code, ResponseCode)
            assert self.state.groups == before
            assert {n: self.state.replica_info(n) for n in self.state.groups} == infos
            return None

    def members(self, group: str) -> frozenset[int]:
        known = self.state.groups.get(group)
        return frozenset(known.members) if known else frozenset()

    @initialize(sizes=st.tuples(IDS, IDS), elect_first=st.booleans())
    def brokers_start(self, sizes: tuple[int, int], elect_first: bool) -> None:
        """Both groups get brokers; mostly they also elect a first master."""
        for group, size in zip(GROUPS, sizes, strict=True):
            for i in range(1, size + 1):
                self.apply_and_register(group, i, honest=True, cluster=CLUSTER)
            if elect_first:
                self.state.elect_master(group, alive(*range(1, size + 1)))

    @rule(
        group=st.sampled_from(GROUPS),
        broker_id=st.integers(0, 6),
        honest=st.booleans(),
        cluster=st.sampled_from([CLUSTER] * 5 + ["other"]),
    )
    def apply_and_register(self, group: str, broker_id: int, honest: bool, cluster: str) -> None:
        check_code = code_of(broker_id, group) if honest else "intruder"
        if self.attempt(self.state.apply_broker_id, cluster, group, broker_id, check_code):
            self.attempt(
                self.state.register,
                group,
                broker_id,
                check_code,
                address(broker_id),
                ha_address(broker_id),
            )

    @rule(
        group=st.sampled_from(GROUPS),
        candidates=st.lists(CANDIDATES, max_size=5, unique_by=lambda c: c.broker_id),
        designated=st.none() | st.none() | IDS,
        unclean=st.booleans(),
        fence=st.none() | EPOCH_VIEW,
    )
    def elect(
        self,
        group: str,
        candidates: list[Candidate],
        designated: int | None,
        unclean: bool,
        fence: str | None,
    ) -> None:
        known = self.state.group(group)
        set_before, epoch_before = known.sync_state_set, known.master_epoch
        expected = None if fence is None else viewed(epoch_before, fence)
        info = self.attempt(
            self.state.elect_master,
            group,
            alive(*candidates),
            designated=designated,
            unclean=unclean,
            expected_master_epoch=expected,
        )
        if fence not in (None, "current"):
            assert info is None, "an election on a stale view must be fenced"
        if info is None or info.master_id is None:
            return
        assert info.master_epoch == epoch_before + 1
        assert info.master_id in {c.broker_id for c in candidates}
        assert info.sync_state_set == (info.master_id,)
        if not unclean and epoch_before > 0:
            assert info.master_id in set_before
        if designated is not None:
            assert info.master_id == designated

    @rule(
        group=st.sampled_from(GROUPS),
        by_master=MOSTLY,
        other=IDS,
        master_view=EPOCH_VIEW,
        set_view=EPOCH_VIEW,
        well_formed=MOSTLY,
        new_set=ID_SETS,
        live=ID_SETS,
    )
    def alter(
        self,
        group: str,
        by_master: bool,
        other: int,
        master_view: str,
        set_view: str,
        well_formed: bool,
        new_set: frozenset[int],
        live: frozenset[int],
    ) -> None:
        """The master (or another broker) proposes a set: well formed ones hold the
        master, live members only; others are whatever was drawn."""
        known = self.state.group(group)
        master = known.master_id if by_master and known.master_id is not None else other
        if well_formed:
            new_set = (new_set & known.members.keys()) | {master}
            live = live | new_set
        set_before, set_epoch_before = known.sync_state_set, known.sync_state_set_epoch
        info = self.attempt(
            self.state.alter_sync_state_set,
            group,
            master,
            viewed(known.master_epoch, master_view),
            viewed(set_epoch_before, set_view),
            new_set,
            live,
        )
        if (master_view, set_view) != ("current", "current"):
            assert info is None, "a change naming a stale epoch must be fenced"
        if info is not None:
            assert info.master_id == master
            assert set(info.sync_state_set) == new_set
            assert new_set - {master} <= live
            assert info.sync_state_set_epoch == set_epoch_before + (new_set != set_before)

    @rule()
    def pickle_round_trip(self) -> None:
        """Carry on from an unpickled copy, as a restored controller would."""
        back = pickle.loads(pickle.dumps(self.state))
        assert back.groups == self.state.groups
        self.state = back

    @invariant()
    def one_master_per_epoch(self) -> None:
        for name, group in self.state.groups.items():
            if group.master_id is not None:
                seen = self.masters.setdefault((name, group.master_epoch), group.master_id)
                assert seen == group.master_id

    @invariant()
    def epochs_never_decrease(self) -> None:
        for name, group in self.state.groups.items():
            now = (group.master_epoch, group.sync_state_set_epoch)
            last = self.epochs.get(name, (0, 0))
            assert now[0] >= last[0] and now[1] >= last[1]
            self.epochs[name] = now

    @invariant()
    def master_in_set_and_set_of_members(self) -> None:
        for group in self.state.groups.values():
            if group.master_id is not None:
                assert group.master_id in group.sync_state_set
            assert group.sync_state_set <= group.members.keys()


# max_examples comes from the hypothesis profile (conftest.py: 200 in CI)
ControllerHistory.TestCase.settings = settings(stateful_step_count=30)
test_controller_history = ControllerHistory.TestCase
