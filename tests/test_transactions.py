"""Transactional messages on the broker (hamq/broker/transactions.py), over the wire.

The producer here is raw remoting, as a RocketMQ client sends it: a half message is a
SEND_MESSAGE_V2 with TRAN_MSG=true, END_TRANSACTION goes oneway, and check-backs
(CHECK_TRANSACTION_STATE) arrive on the connection the producer heartbeats on. The
check timers are short (the broker's own options) and waits bounded.

A test that says nothing was asked (or stored) waits for the check loop's proof that it
had its chance (``more_passes``), never for a while: a sleep is there only when the
time must pass for a half message to be due.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from hamq.broker import BrokerNode, transactions
from hamq.broker.transactions import COMMIT, PROGRESS_GROUP, ROLLBACK, UNKNOWN
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import HeartbeatData, ProducerData, encode_body
from hamq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageResponseHeader,
)
from hamq.protocol.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    parse_offset_msg_id,
)
from hamq.protocol.record import StoredMessage, decode_message
from hamq.remoting import Connection, Dispatcher, RemotingClient
from tests.support.brokers import running_broker, send_request
from tests.support.timing import wait_for

TIMEOUT_S = 10.0
#: short check timers: a half message is checked 0.5 s after it is stored
FAST_CHECKS: dict[str, Any] = {
    "transaction_timeout_s": 0.5,
    "transaction_check_interval_s": 0.1,
    "transaction_check_max": 3,
}


@attrs.define
class Half:
    """A half message as its send's answer names it."""

    uniq: str
    queue_offset: int
    commit_log_offset: int


def messages_in(node: BrokerNode, topic: str) -> list[StoredMessage]:
    """Every message in ``topic``'s consume queues (what consumers would get)."""
    found = []
    for (name, _queue_id), queue in sorted(node.store.queues.queues.items()):
        if name != topic:
            continue
        for offset in range(queue.min_offset, queue.max_offset):
            entry = queue.entry(offset)
            assert entry is not None
            found.append(node.store.look_message_by_offset(entry[0], entry[1]))
    return found


class Producer:
    """A producer of group PG on one connection: sends halves, ends them, and answers
    check-backs with ``answer`` (None: does not answer)."""

    def __init__(self, node: BrokerNode, client: RemotingClient) -> None:
        self.node = node
        self.client = client
        self.checks: list[tuple[CheckTransactionStateRequestHeader, StoredMessage]] = []
        self.answer: int | None = None
        self._send, self._receive = trio.open_memory_channel[tuple[Connection, RemotingCommand]](
            100
        )

    def on_check(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        header = request.header(CheckTransactionStateRequestHeader)
        message = decode_message(request.body, check_crc=False)
        self.checks.append((header, message))
        if self.answer is not None:
            end = end_request(
                header.tran_state_table_offset,
                header.commit_log_offset,
                header.msg_id or "",
                self.answer,
                from_check=True,
            )
            self._send.send_nowait((conn, end))
        return None

    async def answer_checks(self) -> None:
        async for conn, end in self._receive:
            await conn.invoke_oneway(end, TIMEOUT_S)

    async def heartbeat(self) -> None:
        body = encode_body(HeartbeatData("127.0.0.1@tx-test", [ProducerData("PG")], []))
        request = RemotingCommand.request(RequestCode.HEART_BEAT, body=body)
        response = await self.client.invoke(self.node.address, request, TIMEOUT_S)
        assert response.code == ResponseCode.SUCCESS, response.remark

    async def half(self, topic: str = "T", body: bytes = b"tx", **properties: str) -> Half:
        request = send_request(topic, body, **{PROPERTY_TRANSACTION_PREPARED: "true"}, **properties)
        response = await self.client.invoke(self.node.address, request, TIMEOUT_S)
        assert response.code == ResponseCode.SUCCESS, response.remark
        answer = response.header(SendMessageResponseHeader)
        assert answer.transaction_id is not None
        offset = parse_offset_msg_id(answer.msg_id)[1]
        return Half(answer.transaction_id, answer.queue_offset, offset)

    async def end(self, half: Half, state: int, *, group: str = "PG") -> RemotingCommand:
        """END_TRANSACTION as a two-way request (to see the answer)."""
        request = end_request(
            half.queue_offset, half.commit_log_offset, half.uniq, state, group=group
        )
        return await self.client.invoke(self.node.address, request, TIMEOUT_S)

    async def end_oneway(self, half: Half, state: int) -> None:
        request = end_request(half.queue_offset, half.commit_log_offset, half.uniq, state)
        await self.client.invoke_oneway(self.node.address, request, TIMEOUT_S)


@asynccontextmanager
async def producer(node: BrokerNode, *, answer: int | None = None) -> AsyncIterator[Producer]:
    """A connected producer of group PG (heartbeat sent) answering checks with ``answer``."""
    dispatcher = Dispatcher()
    async with RemotingClient(dispatcher=dispatcher) as client, trio.open_nursery() as nursery:
        made = Producer(node, client)
        made.answer = answer
        dispatcher.register(RequestCode.CHECK_TRANSACTION_STATE, made.on_check)
        nursery.start_soon(made.answer_checks)
        await made.heartbeat()
        yield made
        nursery.cancel_scope.cancel()


def end_request(
    queue_offset: int,
    commit_log_offset: int,
    uniq: str,
    state: int,
    *,
    group: str = "PG",
    from_check: bool = False,
) -> RemotingCommand:
    header = EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=queue_offset,
        commit_log_offset=commit_log_offset,
        commit_or_rollback=state,
        msg_id=uniq,
        from_transaction_check=from_check,
        transaction_id=uniq,
    )
    return RemotingCommand.request(RequestCode.END_TRANSACTION, header)


async def more_passes(node: BrokerNode) -> None:
    """Wait until the check loop completed two more passes than it had (the first may
    have begun before): every half message as it stands now has been looked at, and
    what a check-back stores (its put-back copy) dispatched. Then the half queue's
    length says whether anything was checked back meanwhile."""
    seen = node.transactions.check_passes
    await wait_for(lambda: node.transactions.check_passes >= seen + 2, TIMEOUT_S)
    await node.store.wait_dispatched()


#: longer than FAST_CHECKS' transaction_timeout_s: a half message read now is due then
PAST_TIMEOUT_S = 0.6


async def settled(node: BrokerNode, count: int) -> None:
    """Wait until the broker settled ``count`` transactions and dispatched the result."""
    await wait_for(
        lambda: node.transactions.committed + node.transactions.rolled_back >= count, TIMEOUT_S
    )
    await node.store.wait_dispatched()


# ---------------------------------------------------------------------- end
async def test_a_committed_half_message_reaches_its_topic_once(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, producer(node) as p:
        half = await p.half("T", b"order 1", KEYS="o1")
        await node.store.wait_dispatched()
        assert messages_in(node, "T") == []  # invisible until committed
        [stored] = messages_in(node, TRANS_HALF_TOPIC)
        assert stored.properties[PROPERTY_REAL_TOPIC] == "T"
        assert node._message_topic(half.commit_log_offset) == "T"  # (what the ACL checks)
        await p.end_oneway(half, COMMIT)
        await settled(node, 1)
        [message] = messages_in(node, "T")
        assert message.body == b"order 1" and message.msg_id == half.uniq
        assert message.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_COMMIT
        assert message.prepared_transaction_offset == half.commit_log_offset
        assert PROPERTY_REAL_TOPIC not in message.properties
        assert PROPERTY_TRANSACTION_PREPARED not in message.properties
        # the same end again, and a rollback after it: nothing more
        assert (await p.end(half, COMMIT)).code == ResponseCode.SUCCESS
        assert (await p.end(half, ROLLBACK)).code == ResponseCode.SUCCESS
        await node.store.wait_dispatched()
        assert [m.body for m in messages_in(node, "T")] == [b"order 1"]
        assert node.transactions.duplicates == 2


async def test_a_rolled_back_half_message_never_reaches_its_topic(tmp_path: Path) -> None:
    async with running_broker(tmp_path, **FAST_CHECKS) as node, producer(node) as p:
        half = await p.half()
        await p.end_oneway(half, ROLLBACK)
        await settled(node, 1)
        assert (await p.end(half, COMMIT)).code == ResponseCode.SUCCESS  # (first one wins)
        await trio.sleep(PAST_TIMEOUT_S)  # (it would be due now, were it open)
        await more_passes(node)  # settled, so never asked
        assert messages_in(node, "T") == []
        assert len(messages_in(node, TRANS_HALF_TOPIC)) == 1  # no copy put back to ask
        assert p.checks == []


async def test_an_end_that_names_no_half_message_of_its_group_is_refused(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as node, producer(node) as p:
        half = await p.half()
        wrong_group = await p.end(half, COMMIT, group="OTHER")
        assert wrong_group.code == ResponseCode.SYSTEM_ERROR
        assert "not of producer group OTHER" in wrong_group.remark
        wrong_offset = await p.end(attrs.evolve(half, queue_offset=7), COMMIT)
        assert "has queue offset 0, not 7" in wrong_offset.remark
        nowhere = await p.end(attrs.evolve(half, commit_log_offset=10**9), COMMIT)
        assert "no half message at commit log offset" in nowhere.remark
        wrong_id = await p.end(attrs.evolve(half, uniq="0" * 32), COMMIT)
        assert f"is not {'0' * 32}" in wrong_id.remark
        bad_state = await p.end(half, 5)
        assert "commitOrRollback 5" in bad_state.remark
        assert (await p.end(half, UNKNOWN)).code == ResponseCode.SUCCESS
        await node.store.wait_dispatched()
        assert messages_in(node, "T") == []


async def test_half_messages_in_a_batch_or_delayed_are_refused(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        delayed = send_request("T", **{PROPERTY_TRANSACTION_PREPARED: "true", "DELAY": "3"})
        answer = await client.invoke(node.address, delayed, TIMEOUT_S)
        assert answer.code == ResponseCode.MESSAGE_ILLEGAL
        assert "cannot have a delay level" in answer.remark
        batch = send_request(
            "T", code=RequestCode.SEND_BATCH_MESSAGE, **{PROPERTY_TRANSACTION_PREPARED: "true"}
        )
        answer = await client.invoke(node.address, batch, TIMEOUT_S)
        assert answer.code == ResponseCode.MESSAGE_ILLEGAL
        assert "batch cannot hold transactional" in answer.remark


# ---------------------------------------------------------------------- check-back
async def test_an_unknown_transaction_is_checked_back_and_committed_once(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, **FAST_CHECKS) as node, producer(node) as p:
        half = await p.half("T", b"later")
        await p.end_oneway(half, UNKNOWN)
        p.answer = COMMIT
        await settled(node, 1)
        [(header, message)] = p.checks
        assert message.topic == "T" and message.body == b"later"  # its real place
        assert header.msg_id == half.uniq and header.transaction_id == half.uniq
        assert message.properties[PROPERTY_TRANSACTION_CHECK_TIMES] == "1"
        await trio.sleep(PAST_TIMEOUT_S)  # (the copy put back would be due now, were it open)
        await more_passes(node)  # nothing left to ask
        assert len(messages_in(node, TRANS_HALF_TOPIC)) == 2  # the original and one copy
        assert len(p.checks) == 1
        assert [m.body for m in messages_in(node, "T")] == [b"later"]
        assert node.ctx.offsets.query(PROGRESS_GROUP, TRANS_HALF_TOPIC, 0) == 2


async def test_a_transaction_nobody_settles_is_discarded_after_max_checks(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, **FAST_CHECKS) as node, producer(node) as p:
        await p.half("T", b"orphan")
        await wait_for(lambda: node.transactions.discarded == 1, TIMEOUT_S)
        await node.store.wait_dispatched()
        assert len(p.checks) == 3  # transaction_check_max
        assert [int(m.properties[PROPERTY_TRANSACTION_CHECK_TIMES]) for _, m in p.checks] == [
            1,
            2,
            3,
        ]
        [discarded] = messages_in(node, TRANS_CHECK_MAX_TIME_TOPIC)
        assert discarded.body == b"orphan" and discarded.properties[PROPERTY_REAL_TOPIC] == "T"
        await more_passes(node)  # (a half message checked the most times is discarded at once)
        assert (
            messages_in(node, "T") == [] and len(messages_in(node, TRANS_CHECK_MAX_TIME_TOPIC)) == 1
        )
        assert len(messages_in(node, TRANS_HALF_TOPIC)) == 4  # the original and 3 copies
        assert len(p.checks) == 3


async def test_a_backlog_of_half_messages_is_checked_batch_after_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass looks at CHECK_BATCH half messages and says whether more wait (the loop
    then goes on at once, not one batch per interval)."""
    monkeypatch.setattr(transactions, "CHECK_BATCH", 2)
    manual = {**FAST_CHECKS, "transaction_check_interval_s": 3600.0}  # (passes by hand)
    async with running_broker(tmp_path, **manual) as node, producer(node) as p:
        halves = [await p.half("T", f"late {i}".encode()) for i in range(5)]
        await node.store.wait_dispatched()
        await trio.sleep(PAST_TIMEOUT_S)  # (every one due)
        passes = [await node.transactions.check_once() for _ in range(3)]
        assert passes == [True, True, False]
        await wait_for(lambda: len(p.checks) == 5, TIMEOUT_S)
        assert sorted(m.msg_id for _, m in p.checks) == sorted(h.uniq for h in halves)


async def test_a_check_without_a_producer_connected_counts(tmp_path: Path) -> None:
    async with running_broker(tmp_path, **FAST_CHECKS) as node, RemotingClient() as client:
        request = send_request("T", **{PROPERTY_TRANSACTION_PREPARED: "true"})
        assert (await client.invoke(node.address, request, TIMEOUT_S)).code == 0
        await wait_for(lambda: node.transactions.discarded == 1, TIMEOUT_S)
        assert node.transactions.checks_sent == 0


# ---------------------------------------------------------------------- restarts
def _forget_progress(store_dir: Path) -> None:
    """Drop the check's progress offsets, as a crash before they were saved would."""
    path = store_dir / "config" / "consumerOffset.json"
    if not path.exists():
        return  # (no check pass saved any)
    saved = json.loads(path.read_text())
    saved["offsetTable"] = {
        k: v for k, v in saved["offsetTable"].items() if not k.endswith(f"@{PROGRESS_GROUP}")
    }
    path.write_text(json.dumps(saved))


async def test_a_restart_mid_transaction_checks_back_and_commits_once(tmp_path: Path) -> None:
    slow = {**FAST_CHECKS, "transaction_timeout_s": 60.0}
    async with running_broker(tmp_path, **slow) as node, producer(node) as p:
        open_half = await p.half("T", b"open")
        done_half = await p.half("T", b"done")
        await p.end_oneway(done_half, COMMIT)
        await settled(node, 1)
    _forget_progress(tmp_path)
    async with running_broker(tmp_path, **FAST_CHECKS) as node, producer(node, answer=COMMIT) as p:
        await settled(node, 1)
        await trio.sleep(PAST_TIMEOUT_S)  # (the copy put back would be due now, were it open)
        await more_passes(node)
        # open, done, and open's one copy put back: nothing more was checked back
        assert len(messages_in(node, TRANS_HALF_TOPIC)) == 3
        assert [m.msg_id for _, m in p.checks] == [open_half.uniq]
        assert sorted(m.body for m in messages_in(node, "T")) == [b"done", b"open"]


async def test_a_copy_of_a_transaction_committed_before_a_restart_is_not_committed_again(
    tmp_path: Path,
) -> None:
    """The producer commits the original after a check put a copy back; after a restart
    (nothing remembered) the copy is neither asked about nor committed: the index has
    the committed message."""
    async with running_broker(tmp_path, **FAST_CHECKS) as node, producer(node) as p:
        half = await p.half("T", b"once")
        await wait_for(lambda: len(p.checks) == 1, TIMEOUT_S)  # (the producer says nothing)
        copy_header, _ = p.checks[0]
        await p.end_oneway(half, COMMIT)  # the original
        await settled(node, 1)
        node.transactions.settled.clear()  # (what a restart forgets: see the next block too)
        copy = Half(half.uniq, copy_header.tran_state_table_offset, copy_header.commit_log_offset)
        assert (await p.end(copy, COMMIT)).code == ResponseCode.SUCCESS
        assert node.transactions.duplicates == 1
    async with running_broker(tmp_path, **FAST_CHECKS) as node, producer(node) as p:
        await trio.sleep(PAST_TIMEOUT_S)  # (due now, were they open)
        await more_passes(node)
        assert len(messages_in(node, TRANS_HALF_TOPIC)) == 2  # the original and its copy
        assert p.checks == []
        assert [m.body for m in messages_in(node, "T")] == [b"once"]
