"""Who belongs in a controller-mode master's SyncStateSet (hamq/ha/sync_state_set.py):
pure decisions, time passed in, each rule with its numbers.

The master is broker 1 throughout; ``LIMIT`` is ha_max_time_slave_not_catchup_s."""

from __future__ import annotations

import math

import pytest

from hamq.ha.sync_state_set import (
    JOIN_BACKOFF_MAX_S,
    MARK_MERGE_S,
    AckClock,
    SlaveFacts,
    SyncStateSetKeeper,
)

LIMIT = 2.0
JOIN_LAG = 4096
END = 100_000


def keeper() -> SyncStateSetKeeper:
    return SyncStateSetKeeper(LIMIT, JOIN_LAG)


def acking(report_at: float, acked: int = END) -> SlaveFacts:
    """A slave that has acked everything it was sent, last reporting at ``report_at``."""
    return SlaveFacts(acked, 0.0, report_at)


def silent(behind_s: float, acked: int = END) -> SlaveFacts:
    """A slave whose oldest unacked byte was sent ``behind_s`` ago; its last report is old."""
    return SlaveFacts(acked, behind_s, 0.0)


def test_the_ack_clock_says_how_long_ago_the_oldest_unacked_byte_left() -> None:
    clock = AckClock()
    assert clock.behind_s(10.0) == 0.0
    clock.sent(100, 10.0)
    clock.sent(200, 10.0 + MARK_MERGE_S / 2)  # merged into the first mark
    clock.sent(300, 11.0)
    assert clock.behind_s(12.5) == pytest.approx(2.5)
    clock.acked(150)  # part of the first mark: its bytes are still the oldest unacked
    assert clock.behind_s(12.5) == pytest.approx(2.5)
    clock.acked(200)
    assert clock.behind_s(12.5) == pytest.approx(1.5)
    clock.acked(300)
    assert clock.behind_s(12.5) == 0.0  # everything sent is acked: not behind, however idle
    clock.sent(400, 20.0)
    assert clock.behind_s(19.0) == 0.0  # (never negative)


def test_a_member_that_stops_acking_leaves_after_the_limit_and_not_before() -> None:
    k = keeper()
    members = frozenset({1, 2, 3})
    decision = k.decide(1, members, {2: acking(9.0), 3: silent(LIMIT)}, END, 10.0)
    assert decision.wanted == members  # behind by exactly the limit: still in
    decision = k.decide(1, members, {2: acking(9.0), 3: silent(LIMIT + 0.1)}, END, 10.1)
    assert decision.wanted == {1, 2}
    # the same slave acking again before the controllers took it out stays
    decision = k.decide(1, members, {2: acking(9.0), 3: acking(10.2)}, END, 10.2)
    assert decision.wanted == members


def test_a_member_without_a_connection_leaves_after_the_limit() -> None:
    k = keeper()
    members = frozenset({1, 2})
    assert k.decide(1, members, {}, END, 10.0).wanted == members
    assert k.decide(1, members, {}, END, 10.0 + LIMIT).wanted == members
    assert k.decide(1, members, {}, END, 10.1 + LIMIT).wanted == {1}
    # reconnected in time, it would have stayed: the clock starts again
    k = keeper()
    k.decide(1, members, {}, END, 10.0)
    k.decide(1, members, {2: acking(11.0)}, END, 11.0)
    assert k.decide(1, members, {}, END, 11.5 + LIMIT).wanted == members


def test_a_dropped_slave_is_not_taken_back_on_its_old_ack() -> None:
    """The slave went silent: its connection stays (nothing closed it) with an ack that
    looks close to the end. It joins again only once it has reported since it left."""
    k = keeper()
    k.decide(1, frozenset({1, 2}), {2: silent(LIMIT + 0.5)}, END, 20.0)  # it leaves at 20.0
    members = frozenset({1})  # the controllers' set without it
    for now in (20.5, 21.0, 30.0):
        decision = k.decide(1, members, {2: silent(now - 17.5)}, END, now)
        assert decision.joining == frozenset() and decision.wanted == {1}
    # it acks again (a report after it left): it joins, sends wait for it from now on
    decision = k.decide(1, members, {2: acking(30.2, END - 100)}, END, 30.5)
    assert decision.joining == {2} and decision.wanted == {1}
    # and once it has acked up to where it joined, it is wanted in the set
    decision = k.decide(1, members, {2: acking(30.6, END)}, END + 50, 30.6)
    assert decision.wanted == {1, 2} and decision.joining == {2}
    k.adopted(frozenset({1, 2}))
    assert k.joining == frozenset()


def test_a_join_has_a_deadline_and_a_slow_slave_backs_off() -> None:
    k = keeper()
    members = frozenset({1})
    behind = SlaveFacts(END - 1000, 0.5, 5.0)  # reports, acks, never reaches its join offset
    assert k.decide(1, members, {2: behind}, END, 10.0).joining == {2}
    assert k.decide(1, members, {2: behind}, END + 10, 10.0 + LIMIT).joining == {2}
    given_up = k.decide(1, members, {2: behind}, END + 10, 10.1 + LIMIT)
    assert given_up.joining == frozenset() and given_up.wanted == {1}  # sends stop waiting
    # it has reported since, but must wait its back-off: LIMIT from when it was given up
    left = 10.1 + LIMIT
    assert k.decide(1, members, {2: fresh_at(left + 0.1)}, END, left + 0.1).joining == set()
    second = left + LIMIT
    assert k.decide(1, members, {2: fresh_at(second, END - 1)}, END, second).joining == {2}
    # it fails again: the next back-off is twice as long
    left = second + LIMIT + 0.1
    assert k.decide(1, members, {2: fresh_at(left, END - 1)}, END, left).joining == set()
    again = left + 2 * LIMIT
    assert k.decide(1, members, {2: fresh_at(again - 0.1)}, END, again - 0.1).joining == set()
    assert k.decide(1, members, {2: fresh_at(again)}, END, again).joining == {2}
    # a join that succeeds clears the back-off
    assert k.decide(1, members, {2: fresh_at(again + 0.1)}, END, again + 0.1).wanted == {1, 2}
    k.adopted(frozenset({1, 2}))
    assert k.joining == frozenset()
    k.decide(1, frozenset({1, 2}), {2: silent(LIMIT + 1)}, END, again + 5)  # leaves
    back = again + 5.1
    assert k.decide(1, members, {2: fresh_at(back)}, END, back).joining == {2}


def fresh_at(now: float, acked: int = END) -> SlaveFacts:
    """A slave that reported at ``now``, not behind, having acked ``acked``."""
    return SlaveFacts(acked, 0.0, now)


def test_a_joining_slave_that_falls_behind_or_goes_is_given_up() -> None:
    k = keeper()
    members = frozenset({1})
    assert k.decide(1, members, {2: acking(5.0, END - 10)}, END, 5.0).joining == {2}
    # it reached its offset but then stopped acking before the controllers took it in
    assert k.decide(1, members, {2: silent(0.5)}, END + 10, 5.5).wanted == {1, 2}
    assert k.decide(1, members, {2: silent(LIMIT + 0.1)}, END + 10, 7.6).joining == set()
    k = keeper()
    assert k.decide(1, members, {2: acking(5.0, END - 10)}, END, 5.0).joining == {2}
    assert k.decide(1, members, {}, END, 5.5).joining == frozenset()  # its connection went


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (SlaveFacts(END - JOIN_LAG - 1, 0.0, 5.0), "too far behind the log's end"),
        (SlaveFacts(-1, 0.0, 5.0), "has acked nothing"),
        (SlaveFacts(END, LIMIT + 0.1, 5.0), "behind by more than the limit"),
        (SlaveFacts(END, 0.0, -math.inf), "has never reported"),
    ],
)
def test_who_may_not_start_to_join(facts: SlaveFacts, why: str) -> None:
    decision = keeper().decide(1, frozenset({1}), {2: facts}, END, 6.0)
    assert decision.joining == frozenset(), why


def test_the_back_off_is_bounded() -> None:
    k = keeper()
    now = 0.0
    for _ in range(20):
        assert k.decide(1, frozenset({1}), {2: fresh_at(now, END - 1)}, END, now).joining == {2}
        now += LIMIT + 0.1
        k.decide(1, frozenset({1}), {2: fresh_at(now, END - 1)}, END, now)  # given up
        now += JOIN_BACKOFF_MAX_S + 0.1  # at most the maximum later it may try again
