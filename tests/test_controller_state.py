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


# ---------------------------------------------------------------- registration


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
    """Brokers the group does not know cannot be elected, even unclean (alone, they are
    refused: the refusals below): a live member is, however far ahead they are."""
    state = with_brokers(2)
    info = state.elect_master(GROUP, alive(Candidate(9, epoch=5), 2), unclean=True)
    assert info.master_id == 2


# ---------------------------------------------------------------- automatic elections


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
    no master and no candidate is refused (a case of the refusals below); a candidate
    is elected then."""
    state = with_master()
    info = state.elect_master(GROUP, {})
    assert info.master_id is None
    assert (info.master_address, info.master_ha_address) == (None, None)
    assert (info.master_epoch, info.sync_state_set, info.sync_state_set_epoch) == (1, (1, 2, 3), 2)
    info = state.elect_master(GROUP, alive(3))
    assert (info.master_id, info.master_epoch, info.sync_state_set_epoch) == (3, 2, 3)


def test_returning_old_master_can_be_elected_again() -> None:
    """A cleared master still in the set is elected again under a new epoch."""
    state = with_master()
    state.elect_master(GROUP, {})
    info = state.elect_master(GROUP, alive(1))
    assert (info.master_id, info.master_epoch) == (1, 2)


def test_an_election_expecting_the_current_master_epoch_goes_through() -> None:
    """An election decided on the current epoch goes through (on an older or newer
    view it is fenced: expected_master_epoch_fences_elections in the refusals below)."""
    state = with_master()
    info = state.elect_master(GROUP, alive(2), expected_master_epoch=1)
    assert (info.master_id, info.master_epoch) == (2, 2)


# ---------------------------------------------------------------- designated elections


def test_designated_outside_the_set_needs_unclean() -> None:
    """A designated broker outside the set is elected when the election is unclean (a
    clean one is refused: the refusals below)."""
    state = set_of_1_2()
    info = state.elect_master(GROUP, alive(1, 2, 3), designated=3, unclean=True)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (3, 2, (3,))


def test_designated_handover_while_master_alive() -> None:
    """A designated set member takes over from a live master, whatever its figures."""
    state = with_master()
    info = state.elect_master(GROUP, alive(1, Candidate(2, epoch=9), 3), designated=3)
    assert (info.master_id, info.master_epoch, info.sync_state_set) == (3, 2, (3,))
    assert info.sync_state_set_epoch == 3


# ---------------------------------------------------------------- SyncStateSet


def test_alter_changes_and_bumps_once() -> None:
    """A new set bumps the set epoch by one; the same set again changes nothing."""
    state = with_master()
    info = state.alter_sync_state_set(GROUP, 1, 1, 2, [1, 3], [3])
    assert (info.sync_state_set, info.sync_state_set_epoch, info.master_epoch) == ((1, 3), 3, 1)
    before = copy.deepcopy(state.groups)
    info = state.alter_sync_state_set(GROUP, 1, 1, 3, [3, 1], [3])
    assert (info.sync_state_set, info.sync_state_set_epoch) == ((1, 3), 3)
    assert state.groups == before


# ---------------------------------------------------------------- refusals
# Each case: the state before, the refused call, the code and a part of the remark it
# answers; ``refuses`` also checks that the call changed nothing.


def one_applied() -> ControllerState:
    """Broker 1 of GROUP applied for its id (check code "a"); nothing else."""
    state = ControllerState()
    state.apply_broker_id(CLUSTER, GROUP, 1, "a")
    return state


def master_cleared() -> ControllerState:
    """``with_master`` whose master was cleared (no candidate): epochs and set kept."""
    state = with_master()
    state.elect_master(GROUP, {})
    return state


def master_again() -> ControllerState:
    """Broker 1 master again after being cleared: master epoch 2, set epoch 3."""
    state = master_cleared()
    state.elect_master(GROUP, alive(1))
    return state


def set_of_master_only() -> ControllerState:
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1], [])
    return state


def set_of_1_2() -> ControllerState:
    state = with_master()
    state.alter_sync_state_set(GROUP, 1, 1, 2, [1, 2], [2])
    return state


REFUSALS = [
    # ---- broker ids
    # an id held by one broker is refused to a broker with another check code
    pytest.param(
        one_applied,
        lambda s: s.apply_broker_id(CLUSTER, GROUP, 1, "b"),
        ResponseCode.CONTROLLER_BROKER_ID_INVALID,
        "broker id 1 of 'g' belongs to another broker",
        id="another_check_code_is_refused",
    ),
    # ids below FIRST_BROKER_ID (0 is RocketMQ's MASTER_ID) are never handed out
    *(
        pytest.param(
            ControllerState,
            lambda s, i=broker_id: s.apply_broker_id(CLUSTER, GROUP, i, "a"),
            ResponseCode.CONTROLLER_BROKER_ID_INVALID,
            f"broker id {broker_id} is not one the controller hands out (1 or more)",
            id=f"ids_below_one_are_refused-{broker_id}",
        )
        for broker_id in (0, -1)
    ),
    # a broker must say who it is to apply for an id
    pytest.param(
        ControllerState,
        lambda s: s.apply_broker_id(CLUSTER, GROUP, 1, ""),
        ResponseCode.CONTROLLER_INVALID_REQUEST,
        "applying for an id needs a check code",
        id="empty_check_code_is_refused",
    ),
    # a group belongs to the cluster it was first applied in
    pytest.param(
        one_applied,
        lambda s: s.apply_broker_id("other", GROUP, 2, "b"),
        ResponseCode.CONTROLLER_INVALID_REQUEST,
        "broker group 'g' belongs to cluster 'c', not 'other'",
        id="cluster_mismatch_is_refused",
    ),
    # ---- registration
    # registering in a group nobody applied to: its metadata does not exist
    pytest.param(
        ControllerState,
        lambda s: s.register(GROUP, 1, "a", address(1), ha_address(1)),
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
        "broker group 'g' is not known to the controller",
        id="register_unknown_group_is_refused",
    ),
    pytest.param(
        ControllerState,
        lambda s: s.replica_info(GROUP),
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
        "broker group 'g' is not known to the controller",
        id="register_unknown_group_is_refused-replica_info",
    ),
    # an id never applied for must be applied for first
    pytest.param(
        one_applied,
        lambda s: s.register(GROUP, 2, "a", address(2), ha_address(2)),
        ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
        "broker id 2 of 'g' was never applied for",
        id="register_unknown_id_is_refused",
    ),
    # only the broker that applied for an id may register under it
    pytest.param(
        one_applied,
        lambda s: s.register(GROUP, 1, "b", address(1), ha_address(1)),
        ResponseCode.CONTROLLER_BROKER_ID_INVALID,
        "broker id 1 of 'g' belongs to another broker",
        id="register_with_wrong_check_code_is_refused",
    ),
    # ---- first election
    *(
        pytest.param(
            with_brokers,
            lambda s, u=unclean: s.elect_master(GROUP, {}, unclean=u),
            ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
            "no live member of 'g''s SyncStateSet [] to elect",
            id=f"first_election_with_no_one_alive_is_refused-{unclean}",
        )
        for unclean in (False, True)
    ),
    # brokers the group does not know cannot be elected, even unclean
    pytest.param(
        lambda: with_brokers(2),
        lambda s: s.elect_master(GROUP, alive(Candidate(9, epoch=5)), unclean=True),
        ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
        "no live member of 'g''s SyncStateSet [] to elect",
        id="election_ignores_live_non_members",
    ),
    pytest.param(
        ControllerState,
        lambda s: s.elect_master(GROUP, alive(1), unclean=True),
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
        "broker group 'g' is not known to the controller",
        id="election_in_unknown_group_is_refused",
    ),
    # ---- automatic elections
    # the master is in the caller's live view: nothing to elect
    *(
        pytest.param(
            with_master,
            lambda s, u=unclean: s.elect_master(GROUP, alive(1, 2, 3), unclean=u),
            ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
            "broker 1 is still the live master of 'g'",
            id=f"automatic_election_refused_while_master_alive-{unclean}",
        )
        for unclean in (False, True)
    ),
    # an election decided on an older (or newer) view of the epoch is refused
    *(
        pytest.param(
            with_master,
            lambda s, e=stale: s.elect_master(GROUP, alive(2), expected_master_epoch=e),
            ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
            f"the election expected master epoch {stale}, 'g' is at 1",
            id=f"expected_master_epoch_fences_elections-{stale}",
        )
        for stale in (0, 2)
    ),
    # no master and no candidate (after the master was cleared)
    pytest.param(
        master_cleared,
        lambda s: s.elect_master(GROUP, {}),
        ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
        "no live member of 'g''s SyncStateSet [1, 2, 3] to elect",
        id="no_candidate_clears_the_master_then_refuses",
    ),
    # ---- designated elections
    pytest.param(
        with_master,
        lambda s: s.elect_master(GROUP, alive(9), designated=9, unclean=True),
        ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
        "broker 9 is not a member of 'g'",
        id="designated_non_member_is_refused",
    ),
    pytest.param(
        with_master,
        lambda s: s.elect_master(GROUP, alive(1, 3), designated=2),
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
        "broker 2 of 'g' is not alive",
        id="designated_dead_broker_is_refused",
    ),
    pytest.param(
        with_master,
        lambda s: s.elect_master(GROUP, alive(1, 2), designated=1),
        ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
        "broker 1 is the master of 'g' already",
        id="designated_current_master_is_refused",
    ),
    # a designated broker outside the set is refused unless the election is unclean
    pytest.param(
        set_of_1_2,
        lambda s: s.elect_master(GROUP, alive(1, 2, 3), designated=3),
        ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
        "broker 3 is not in 'g''s SyncStateSet [1, 2] (enableElectUncleanMaster is off)",
        id="designated_outside_the_set_needs_unclean",
    ),
    # ---- SyncStateSet
    # only the current master may change the set; with no master nobody may
    pytest.param(
        with_master,
        lambda s: s.alter_sync_state_set(GROUP, 2, 1, 2, [1, 2], [1, 2, 3]),
        ResponseCode.CONTROLLER_INVALID_MASTER,
        "broker 2 is not the master of 'g' (the master is 1)",
        id="alter_by_non_master_is_refused",
    ),
    pytest.param(
        master_cleared,
        lambda s: s.alter_sync_state_set(GROUP, 1, 1, 2, [1], [2, 3]),
        ResponseCode.CONTROLLER_INVALID_MASTER,
        "broker 1 is not the master of 'g' (the master is None)",
        id="alter_by_non_master_is_refused-no_master",
    ),
    # the old master of an earlier epoch is fenced even with the same id
    pytest.param(
        master_again,
        lambda s: s.alter_sync_state_set(GROUP, 1, 1, 3, [1, 2], [2]),
        ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
        "master epoch 1 is not 'g''s current 2",
        id="alter_with_stale_master_epoch_is_refused",
    ),
    *(
        pytest.param(
            with_master,
            lambda s, e=stale: s.alter_sync_state_set(GROUP, 1, 1, e, [1], [2, 3]),
            ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
            f"SyncStateSet epoch {stale} is not 'g''s current 2",
            id=f"alter_with_stale_set_epoch_is_refused-{stale}",
        )
        for stale in (1, 3)
    ),
    # the new set must hold the master and only members
    *(
        pytest.param(
            with_master,
            lambda s, n=new_set: s.alter_sync_state_set(GROUP, 1, 1, 2, n, [1, 2, 3, 9]),
            ResponseCode.CONTROLLER_INVALID_REPLICAS,
            remark,
            id=f"alter_to_invalid_replicas_is_refused-{new_set}",
        )
        for new_set, remark in (
            ([2, 3], "the SyncStateSet [2, 3] must hold the master 1"),
            ([], "the SyncStateSet [] must hold the master 1"),
            ([1, 9], "brokers [9] are not members of 'g'"),
        )
    ),
    # every member but the master must be alive in the caller's view
    pytest.param(
        set_of_master_only,
        lambda s: s.alter_sync_state_set(GROUP, 1, 1, 3, [1, 2, 3], [2]),
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
        "brokers [3] of 'g' are not alive",
        id="alter_with_dead_members_is_refused",
    ),
]


@pytest.mark.parametrize(("setup", "call", "code", "remark"), REFUSALS)
def test_a_refused_call_says_why_and_changes_nothing(
    setup: Callable[[], ControllerState],
    call: Callable[[ControllerState], object],
    code: ResponseCode,
    remark: str,
) -> None:
    state = setup()
    refused = refuses(state, code, call, state)
    assert remark in refused.message, refused.message


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
