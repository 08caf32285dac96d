"""The durability ticket on its own (hamq/store/durability.py): what a put waits for,
decided once, and its one answer — SLAVE_NOT_AVAILABLE, PUT_OK once the replicas report,
FLUSH_SLAVE_TIMEOUT when they do not in time or when the waits are abandoned — for one
put and for a group of puts sharing one ticket. No store, no broker: the replica gate is
a plain object (the broker's is hamq/ha/group_transfer.py), no flush (ASYNC_FLUSH), and
Trio's MockClock for the timeouts (no thread or socket runs here)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import trio
import trio.testing

from hamq.store import StoreConfig
from hamq.store.durability import (
    SLAVE_NOT_AVAILABLE_REMARK,
    Durability,
    PutMessageStatus,
    replica_timeout_remark,
)

TIMEOUT_S = 3.0


@attrs.define
class Gate:
    """A replica gate: puts wait for replicas while ``waiting``; ``in_sync`` says
    whether there is one to wait for."""

    waiting: bool = True
    in_sync: bool = True
    timeout_s: float = TIMEOUT_S

    def waits(self) -> bool:
        return self.waiting

    def available(self) -> bool:
        return self.in_sync


def durability(tmp_path: object, gate: Gate | None) -> Durability:
    result = Durability(StoreConfig(store_dir=str(tmp_path)))
    result.replicas = gate
    return result


Answers = list[tuple[PutMessageStatus, str]]


def collect(answers: Answers) -> Callable[[PutMessageStatus, str], None]:
    return lambda status, remark: answers.append((status, remark))


def test_nothing_to_wait_for_gives_no_ticket(tmp_path: object) -> None:
    assert durability(tmp_path, None).ticket(wait_store_ok=True) is None
    assert durability(tmp_path, Gate(waiting=False)).ticket(wait_store_ok=True) is None
    assert durability(tmp_path, Gate()).ticket(wait_store_ok=False) is None  # WAIT=false


def test_no_replica_in_sync_is_slave_not_available_at_once(tmp_path: object) -> None:
    ticket = durability(tmp_path, Gate(in_sync=False)).ticket(wait_store_ok=True)
    assert ticket is not None
    answers: Answers = []
    ticket.wait(100, collect(answers))
    assert answers == [(PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK)]


async def test_a_group_of_puts_is_answered_once_when_the_replicas_pass_its_end(
    tmp_path: object, autojump_clock: trio.testing.MockClock
) -> None:
    waits = durability(tmp_path, Gate())
    async with trio.open_nursery() as nursery:
        await nursery.start(waits.replica_acks.run)
        group, alone = waits.ticket(True), waits.ticket(True)
        assert group is not None and alone is not None
        group_answers: Answers = []
        alone_answers: Answers = []
        group.wait(300, collect(group_answers))  # (three puts, one wait: their end)
        alone.wait(400, collect(alone_answers))
        waits.replicated(299)
        assert group_answers == [] and waits.waiting_for_replicas == 2
        waits.replicated(300)
        assert group_answers == [(PutMessageStatus.PUT_OK, "")]
        await trio.sleep(TIMEOUT_S + 0.1)
        assert alone_answers == [
            (PutMessageStatus.FLUSH_SLAVE_TIMEOUT, replica_timeout_remark(TIMEOUT_S))
        ]
        assert group_answers == [(PutMessageStatus.PUT_OK, "")]  # (answered once only)
        nursery.cancel_scope.cancel()


async def test_abandoned_waits_are_answered_flush_slave_timeout_and_a_ticket_waits_once(
    tmp_path: object,
) -> None:
    waits = durability(tmp_path, Gate())
    ticket = waits.ticket(True)
    assert ticket is not None
    answers: Answers = []
    ticket.wait(100, collect(answers))
    assert waits.abandon_replica_waits() == 1
    assert [status for status, _ in answers] == [PutMessageStatus.FLUSH_SLAVE_TIMEOUT]
    waits.replicated(100)  # (a late ack changes nothing)
    assert len(answers) == 1
    with pytest.raises(RuntimeError, match="waited on once"):
        ticket.wait(200, collect(answers))
