"""HA's pure parts: epochs and where logs agree, ack waiters, the slave's states."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

from hamq.ha.epoch import EpochFile, EpochFileError, consistent_point
from hamq.ha.states import IllegalTransition, StateMachine
from hamq.protocol.ha_wire import EpochEntry, HAState
from hamq.store.offset_waiters import OffsetWaiters


def entries(*pairs: tuple[int, int]) -> list[EpochEntry]:
    return [EpochEntry(e, s) for e, s in pairs]


@pytest.mark.parametrize(
    ("local", "local_max", "remote", "remote_max", "point"),
    [
        # the same history: agree up to the shorter log
        (entries((1, 0)), 500, entries((1, 0)), 800, 500),
        # the slave has an old master's tail (epoch 1 past 300); the new master (epoch 2)
        # started at 300: cut at 300
        (entries((1, 0)), 500, entries((1, 0), (2, 300)), 900, 300),
        # both saw epoch 2 start at 300; the slave is behind
        (entries((1, 0), (2, 300)), 400, entries((1, 0), (2, 300), (3, 700)), 900, 400),
        # epoch 2 started at different places: only epoch 1 is shared, up to the lesser end
        (entries((1, 0), (2, 350)), 600, entries((1, 0), (2, 300)), 900, 300),
        # nothing in common
        (entries((5, 0)), 100, entries((1, 0)), 100, -1),
    ],
)
def test_the_consistent_point_is_where_the_newest_shared_epoch_ends(
    local: list[EpochEntry], local_max: int, remote: list[EpochEntry], remote_max: int, point: int
) -> None:
    assert consistent_point(local, local_max, remote, remote_max) == point


async def test_the_epoch_file_persists_truncates_and_refuses_going_back(tmp_path: Path) -> None:
    epochs = EpochFile(tmp_path / "epochFileCheckpoint")
    epochs.load()  # no file: no epochs
    await epochs.append(1, 0)
    await epochs.append(2, 300)
    await epochs.append(2, 400)  # the same epoch again: nothing new
    with pytest.raises(EpochFileError, match="cannot follow"):
        await epochs.append(1, 500)
    again = EpochFile(epochs.path)
    again.load()
    assert again.entries == entries((1, 0), (2, 300))
    assert again.entry_at(299) == EpochEntry(1, 0) and again.entry_at(300) == EpochEntry(2, 300)
    assert (
        again.end_of(EpochEntry(1, 0), 900) == 300 and again.end_of(EpochEntry(2, 300), 900) == 900
    )
    await again.truncate(300)
    assert again.entries == entries((1, 0))
    (tmp_path / "bad").write_text("{not json")
    broken = EpochFile(tmp_path / "bad")
    with pytest.raises(EpochFileError, match="bad is not an epoch file"):
        broken.load()


async def test_offset_waiters_wake_in_order_and_time_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    acks = OffsetWaiters()
    results: dict[int, bool] = {}

    def waiter(offset: int) -> Callable[[bool], None]:
        return lambda acked: results.setdefault(offset, acked)

    async with trio.open_nursery() as nursery:
        await nursery.start(acks.run)
        for offset in (100, 200, 300):
            acks.notify(offset, waiter(offset), 3.0)
        await trio.sleep(1)
        acks.reached(250)  # wakes 100 and 200 at once
        assert results == {100: True, 200: True}
        await trio.sleep(2.5)
        assert results[300] is False  # nobody acked it within 3 s
        assert acks.waiting == 0
        acks.notify(250, waiter(250), 1.0)  # already acked: answered at once
        assert results[250] is True
        nursery.cancel_scope.cancel()


def test_the_slave_state_machine_allows_only_its_table() -> None:
    machine = StateMachine("test")
    machine.set(HAState.HANDSHAKE)
    machine.set(HAState.TRANSFER)
    with pytest.raises(IllegalTransition, match="TRANSFER -> HANDSHAKE"):
        machine.set(HAState.HANDSHAKE)
    machine.set(HAState.READY)
    # SUSPEND keeps RocketMQ's wire ordinal, but no move leads to it
    for state in HAState:
        if state is not HAState.SUSPEND:
            with pytest.raises(IllegalTransition, match="-> SUSPEND is not allowed"):
                StateMachine("test", state).set(HAState.SUSPEND)
    with pytest.raises(IllegalTransition, match="cannot start in SUSPEND"):
        StateMachine("test", HAState.SUSPEND)
    machine.set(HAState.SHUTDOWN)  # always allowed
    with pytest.raises(IllegalTransition):
        machine.set(HAState.TRANSFER)
