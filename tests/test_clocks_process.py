"""Clocks, with real processes: a broker restarted with its clock an
hour behind (libfaketime: tests/support/faketime.py installs Debian's package, or the
test is skipped saying why) checks back open transactions and delivers delayed
messages in time, talking to the real client. tests/test_clocks.py has the same in
virtual time, and the clock set back while running.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from hamq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from tests.support.brokers import SMALL_STORE, create_topic, topic_messages
from tests.support.faketime import faketime_env
from tests.support.processes import (
    HAMQ,
    kill_and_reap,
    open_child,
    read_ready_line,
    ready_addresses,
    write_toml,
)
from tests.support.timing import wait_for

pytestmark = pytest.mark.slow

GROUP = "clock-tx"
TOPIC = "clock"


class Ledger:
    """A TransactionProducer's listener: every local transaction stays unknown until
    the broker asks; a check-back is answered COMMIT and noted."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message.keys[0])
        return LocalTransactionState.COMMIT_MESSAGE


class Broker:
    """A ``hamq broker`` process on free ports (its embedded nameserver too)."""

    def __init__(self, proc: Any, ready: str) -> None:
        self.proc = proc
        self.address, self.namesrv = ready_addresses(ready)

    async def stop(self) -> None:
        """A clean stop (SIGTERM), bounded."""
        os.kill(self.proc.pid, signal.SIGTERM)
        with trio.fail_after(30):
            assert await self.proc.wait() == 0


def broker_toml(directory: Path, transaction_timeout_s: float) -> Path:
    return write_toml(
        directory / f"broker-{transaction_timeout_s}.toml",
        {
            "broker_name": "broker-clock",
            "transaction_timeout_s": transaction_timeout_s,
            "transaction_check_interval_s": 1.0,
            "store": {
                "store_dir": str(directory / "store"),
                "message_delay_level": "1s 20s",
                **SMALL_STORE,
            },
        },
    )


async def start_broker(config: Path, env: dict[str, str] | None = None) -> Broker:
    args = ["broker", "-c", str(config), "--port", "0", "--namesrv-port", "0"]
    proc = await open_child([*HAMQ, *args], env=env)
    try:
        return Broker(proc, await read_ready_line(proc, "hamq broker", 60))
    except BaseException:
        await kill_and_reap(proc)
        raise


async def test_a_broker_restarted_an_hour_behind_checks_back_and_delivers_in_time(
    tmp_path: Path,
) -> None:
    """Stored by a broker whose clock is right: 3 transactions left open and 3 messages
    of delay level 2 (20 s), the broker stopped at once. Restarted with its clock an
    hour behind (libfaketime), with transaction_timeout_s 2: the transactions are
    checked back, and 3 new ones left open under the wrong clock too (each committed
    once), and the delayed messages are delivered (20 s after the restart, not an
    hour) — within bounded waits far shorter than the hour."""
    behind = faketime_env("-1h")  # (skips when libfaketime cannot be installed)
    ledger = Ledger()
    options: dict[str, Any] = {"heartbeat_broker_interval_s": 0.5, "send_timeout_s": 20.0}
    broker = await start_broker(broker_toml(tmp_path, 3600.0))  # (nothing checked here)
    try:
        await create_topic(broker.namesrv, TOPIC)
        async with TransactionProducer(GROUP, broker.namesrv, ledger, **options) as producer:
            for i in range(3):
                await producer.send_in_transaction(Message(TOPIC, b"tx", keys=f"before-{i}"))
            for i in range(3):
                await producer.send(Message(TOPIC, b"delayed", keys=f"delayed-{i}", delay_level=2))
        await broker.stop()
    finally:
        await kill_and_reap(broker.proc)
    assert ledger.checked == []

    broker = await start_broker(broker_toml(tmp_path, 2.0), env=behind)
    try:
        assert await topic_messages(broker.namesrv, TOPIC) == []  # (nothing delivered before)
        async with TransactionProducer(GROUP, broker.namesrv, ledger, **options) as producer:
            for i in range(3):
                await producer.send_in_transaction(Message(TOPIC, b"tx", keys=f"after-{i}"))
            every = {f"{when}-{i}" for when in ("before", "after") for i in range(3)}
            await wait_for(
                lambda: set(ledger.checked) >= every,
                40,
                what=lambda: f"the check-backs: {sorted(set(ledger.checked))}",
            )
            stored: list[MessageExt] = []

            async def all_stored() -> bool:
                stored[:] = await topic_messages(broker.namesrv, TOPIC)
                return len(stored) >= len(every) + 3

            await wait_for(
                all_stored,
                40,
                what=lambda: f"the committed and delayed messages: {_keys(stored)}",
            )
        keys = _keys(stored)
        assert keys == sorted([*every, *(f"delayed-{i}" for i in range(3))])
        # the broker's clock was an hour behind: its own stamps say so
        assert all(m.store_timestamp < time.time() * 1000 - 3_000_000 for m in stored)
    finally:
        await kill_and_reap(broker.proc)


def _keys(messages: list[MessageExt]) -> list[str]:
    return sorted(m.keys[0] for m in messages)
