"""Clocks: a wall clock behind, or set back, stalls neither the
check-backs of open transactions nor delay-level messages.

The first tests run a store and the transaction check in virtual time (Trio's
MockClock), with a wall clock that follows it ``skew_ms`` off, set by the test: a
"restart" is the store closed and opened again with the clock behind, as a broker
restarted with a wrong clock or a new master whose clock is behind the old one's
would read the records. Check passes are run by hand, so what each pass could see is
known; no producer is connected, so a check shows as the copy it puts back in the
half queue (TRANSACTION_CHECK_TIMES one higher).

tests/test_clocks_process.py does it with ``hamq broker`` processes under libfaketime.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from hamq.broker.clients import ProducerManager
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.transactions import (
    PROGRESS_GROUP,
    OpenSince,
    TransactionService,
    half_message,
)
from hamq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    TRANS_HALF_TOPIC,
)
from hamq.protocol.record import StoredMessage
from hamq.store import MessageStore
from hamq.store.schedule import SEEN_GRAIN_S, SeenMarks
from tests.support.brokers import broker_config
from tests.support.store import message, open_store, put, small_config
from tests.support.timing import wait_for

HOUR_MS = 3_600_000
#: how far behind the clock is at the restart: a new master's few seconds, or an hour
BEHIND_MS = [pytest.param(5_000, id="5s-behind"), pytest.param(HOUR_MS, id="1h-behind")]
#: delay levels of the store tests: level 3 is 10 s
LEVELS = "1s 5s 10s"
LEVEL_3_S = 10.0
TIMEOUT_S = 6.0  # transaction_timeout_s


@attrs.define
class WallClock:
    """A wall clock (ms) that follows Trio's clock, ``skew_ms`` off (behind: negative)."""

    skew_ms: int = 0
    base_ms: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.base_ms + int(trio.current_time() * 1000) + self.skew_ms

    def trio_time(self, stamp_ms: int) -> float:
        """The Trio time at which this clock, as it is set now, read ``stamp_ms``."""
        return (stamp_ms - self.base_ms - self.skew_ms) / 1000


async def settle(store: MessageStore) -> None:
    with trio.fail_after(10):
        await store.wait_dispatched()


# ---------------------------------------------------------------------- delay levels
def delivered(store: MessageStore, queue_id: int) -> list[StoredMessage]:
    """The messages in topic T's queue ``queue_id``: the delivered copies."""
    queue = store.queues.get("T", queue_id)
    found = []
    for offset in range(queue.max_offset if queue is not None else 0):
        assert queue is not None
        entry = queue.entry(offset)
        assert entry is not None
        found.append(store.look_message_by_offset(entry[0], entry[1]))
    return found


async def put_delayed(store: MessageStore, body: str) -> None:
    result = await put(store, message(queue_id=1, body=body.encode(), DELAY="3"))
    assert result.append is not None, result


@pytest.mark.parametrize("behind_ms", BEHIND_MS)
async def test_delayed_messages_stored_before_a_restart_with_the_clock_behind_come_in_one_delay(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, behind_ms: int
) -> None:
    """Stored at 0, 1, 2 s (due at 10, 11, 12 s by that clock), restarted at about 3 s
    with the clock behind: each is delivered one level delay (10 s) after the restart,
    in order, and a message stored after the restart comes after them."""
    wall = WallClock()
    config = small_config(tmp_path, message_delay_level=LEVELS)
    async with open_store(config, clock=wall) as store:
        for i in range(3):
            await put_delayed(store, f"before {i}")
            await trio.sleep(1)
        await settle(store)
    wall.skew_ms = -behind_ms
    async with open_store(config, clock=wall) as store:
        restart = trio.current_time()
        await put_delayed(store, "after")
        copies = await wait_for(
            lambda: len(found := delivered(store, 1)) == 4 and found,
            60,
            what=lambda: f"the delayed messages: {[m.body for m in delivered(store, 1)]}",
        )
    assert [m.body for m in copies] == [b"before 0", b"before 1", b"before 2", b"after"]
    for copy in copies:
        at = wall.trio_time(copy.store_timestamp) - restart
        assert LEVEL_3_S <= at <= LEVEL_3_S + SEEN_GRAIN_S, (copy.body, at)


async def test_a_clock_set_back_while_messages_wait_delays_none_of_them(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Stored at 0 and 1 s, the clock set back an hour at 2 s, one more stored then:
    each is delivered 10 s after it was stored, as if nothing had happened."""
    wall = WallClock()
    config = small_config(tmp_path, message_delay_level=LEVELS)
    async with open_store(config, clock=wall) as store:
        start = trio.current_time()
        await put_delayed(store, "first")
        await trio.sleep(1)
        await put_delayed(store, "second")
        await trio.sleep(1)
        wall.skew_ms = -HOUR_MS
        await put_delayed(store, "third")
        copies = await wait_for(
            lambda: len(found := delivered(store, 1)) == 3 and found, 60, what="3 deliveries"
        )
    assert [m.body for m in copies] == [b"first", b"second", b"third"]
    for stored_at, copy in enumerate(copies):
        at = wall.trio_time(copy.store_timestamp) - start
        assert stored_at + LEVEL_3_S <= at <= stored_at + LEVEL_3_S + SEEN_GRAIN_S, (copy.body, at)


def test_seen_marks_count_an_entry_seen_late_by_less_than_the_grain_never_early() -> None:
    marks = SeenMarks()
    marks.saw(3, 100.0)  # entries 0-2, at the start
    marks.saw(4, 100.4)  # entry 3: the same mark, which now counts as seen at 100.4
    marks.saw(4, 100.5)  # (nothing new)
    marks.saw(6, 101.2)  # entries 4-5: a new mark, past the first one's grain
    assert [marks.seen(offset) for offset in range(7)] == [
        100.4,
        100.4,
        100.4,
        100.4,
        101.2,
        101.2,
        None,  # not seen yet: the caller counts it as seen now
    ]


# ---------------------------------------------------------------------- transactions
def transactions(store: MessageStore, directory: Path, wall: WallClock) -> TransactionService:
    """A master's check, on ``store``, with nobody to ask (each check puts a copy back)."""
    config = broker_config(directory / "store", transaction_timeout_s=TIMEOUT_S)
    offsets = ConsumerOffsetManager(directory / "consumerOffset.json")
    return TransactionService(
        config,
        store,
        offsets,
        ProducerManager(),
        clock=wall,
        store_host=lambda: ("127.0.0.1", 10911),
    )


async def put_half(store: MessageStore, body: str, **properties: str) -> None:
    half = half_message(message("T", body=body.encode(), UNIQ_KEY=body, **properties), "PG")
    result = await put(store, half)
    assert result.append is not None, result


def checked(store: MessageStore) -> list[str]:
    """The half messages checks put back (one copy each time one is checked), in order."""
    queue = store.queues.get(TRANS_HALF_TOPIC, 0)
    assert queue is not None
    found = []
    for offset in range(queue.min_offset, queue.max_offset):
        entry = queue.entry(offset)
        assert entry is not None
        half = store.look_message_by_offset(entry[0], entry[1])
        if PROPERTY_TRANSACTION_CHECK_TIMES in half.properties:
            found.append(half.body.decode())
    return found


async def check_pass(service: TransactionService) -> list[str]:
    """One check pass; then every half message checked so far."""
    await service.check_once()
    await settle(service.store)
    return checked(service.store)


@pytest.mark.parametrize("behind_ms", BEHIND_MS)
async def test_half_messages_stored_before_a_restart_with_the_clock_behind_wait_one_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, behind_ms: int
) -> None:
    """Two half messages stored at 0 s; restarted at once with the clock behind, one
    more stored: the first pass reads all three, the pass just before the timeout
    (6 s) after it checks none, the pass at the timeout all three."""
    wall = WallClock()
    config = small_config(tmp_path / "store")
    async with open_store(config, clock=wall) as store:
        await put_half(store, "old 0")
        await put_half(store, "old 1")
        await settle(store)
    wall.skew_ms = -behind_ms
    async with open_store(config, clock=wall) as store:
        service = transactions(store, tmp_path, wall)
        await put_half(store, "new")
        await settle(store)
        assert await check_pass(service) == []  # (their ages are counted from now)
        await trio.sleep(TIMEOUT_S - 0.5)
        assert await check_pass(service) == []
        await trio.sleep(0.5)
        assert sorted(await check_pass(service)) == ["new", "old 0", "old 1"]
        assert service.offsets.query(PROGRESS_GROUP, TRANS_HALF_TOPIC, 0) == 3


async def test_a_half_message_not_due_holds_back_none_behind_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The first half message asks for an hour (CHECK_IMMUNITY_TIME_IN_SECONDS): the two
    after it are checked at the timeout all the same; the progress offset waits at it."""
    wall = WallClock()
    async with open_store(small_config(tmp_path / "store"), clock=wall) as store:
        service = transactions(store, tmp_path, wall)
        await put_half(store, "immune", **{PROPERTY_CHECK_IMMUNITY_TIME: "3600"})
        await put_half(store, "plain 1")
        await put_half(store, "plain 2")
        await settle(store)
        assert await check_pass(service) == []
        await trio.sleep(TIMEOUT_S)
        assert await check_pass(service) == ["plain 1", "plain 2"]
        assert service.offsets.query(PROGRESS_GROUP, TRANS_HALF_TOPIC, 0) == 0
        assert await check_pass(service) == ["plain 1", "plain 2"]  # settled, not asked again
        await trio.sleep(3600)
        assert "immune" in await check_pass(service)


async def test_a_clock_set_back_while_running_delays_no_check(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A half message read by a pass at 1 s, the clock set back an hour at 2 s, one more
    stored then: each is checked 6 s after it was stored."""
    wall = WallClock()
    async with open_store(small_config(tmp_path / "store"), clock=wall) as store:
        service = transactions(store, tmp_path, wall)
        await put_half(store, "before")
        await trio.sleep(1)
        assert await check_pass(service) == []
        await trio.sleep(1)
        wall.skew_ms = -HOUR_MS
        await put_half(store, "after")
        await trio.sleep(TIMEOUT_S - 2)
        assert await check_pass(service) == ["before"]
        await trio.sleep(2)
        assert await check_pass(service) == ["before", "after"]


@pytest.mark.parametrize(
    ("stamped_ms", "age_ms"),
    [
        (-2_000, 2_000),  # stored 2 s ago by this clock: 2 s old
        (0, 0),
        (5_000, 0),  # stamped 5 s ahead of this clock: read now, so new
        (HOUR_MS, 0),
    ],
)
def test_a_half_message_is_as_old_as_its_timestamp_says_but_never_from_the_future(
    stamped_ms: int, age_ms: int
) -> None:
    ages = OpenSince()
    wall_ms = 1_700_000_000_000
    assert ages.age_ms(7, wall_ms + stamped_ms, wall_ms, 50.0) == age_ms
    # later passes count on from that first read, whatever the wall clock says then
    assert ages.age_ms(7, wall_ms + stamped_ms, wall_ms - HOUR_MS, 53.0) == age_ms + 3_000
    ages.forget_below(8)
    assert ages.age_ms(7, wall_ms + stamped_ms, wall_ms, 60.0) == age_ms  # (read anew)
