"""TransactionProducer (hamq/client/transaction.py), the client side of transactional
messages.

Most tests talk to a fake broker in the test's own event loop: a real socket on
127.0.0.1 speaking the remoting protocol (hamq's Connection for the framing) that serves
routes, heartbeats and sends like a broker, records what the producer put on the wire
(the half message's sysflag and properties, END_TRANSACTION's header and remark, the
connection each came on) and sends CHECK_TRANSACTION_STATE over the producer's own
connection, as a broker does. The last tests run against a real broker (in a Trio
thread, its check-back timers short): what consumers see after commit, rollback and a
check-back. That nothing more came is seen after what proves it had its chance: a
request after it on the same connection, a check queued after it, the broker's check
passes (``_more_passes``), never a sleep. Every coroutine test runs on Trio, asyncio
and uvloop (``anyio_backend``, tests/conftest.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import attrs
import pytest
from anyio.abc import SocketAttribute

from hamq.broker import BrokerNode
from hamq.client import (
    InvalidArgumentError,
    LocalTransactionState,
    Message,
    MessageExt,
    NoRouteError,
    PullConsumer,
    SendError,
    SendStatus,
    TransactionProducer,
    TransactionSendResult,
)
from hamq.client.blocking import TransactionProducer as BlockingTransactionProducer
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import (
    BrokerData,
    HeartbeatData,
    QueueData,
    TopicRouteData,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from hamq.protocol.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_PREPARED,
    TRANS_HALF_TOPIC,
    decode_properties,
    encode_properties,
    offset_msg_id,
    pack_host,
)
from hamq.protocol.record import make_record_template
from hamq.protocol.send_fields import decode_send_header, send_response_fields
from hamq.remoting import Connection, Dispatcher, RemotingConfig
from tests.support.acl import APP, acl_text, write_acl
from tests.support.acl import BROKER as ACL_BROKER
from tests.support.backends import BrokerThread, broker_thread
from tests.support.timing import wait_for

pytestmark = pytest.mark.anyio

GROUP = "TXG"
TOPIC = "TxTopic"
BROKER = "fake-a"

COMMIT, ROLLBACK, UNKNOW = (
    LocalTransactionState.COMMIT_MESSAGE,
    LocalTransactionState.ROLLBACK_MESSAGE,
    LocalTransactionState.UNKNOW,
)
#: END_TRANSACTION's commitOrRollback per state
END_TYPE = {COMMIT: 8, ROLLBACK: 12, UNKNOW: 0}


# ---------------------------------------------------------------- the fake broker


@attrs.frozen
class Sent:
    header: SendMessageRequestHeader
    properties: dict[str, str]


@attrs.frozen
class Ended:
    header: EndTransactionRequestHeader
    request: RemotingCommand
    conn: Connection


class FakeBroker:
    """A nameserver and a broker at one address (see the module's comment)."""

    def __init__(self) -> None:
        self.addr = ""
        self.port = 0
        #: what SEND_MESSAGE_V2 is answered with (a stored code or a refusal)
        self.send_code = ResponseCode.SUCCESS
        self.queue_offset = 7
        self.physical_offset = 4096
        self.sends: list[Sent] = []
        self.ends: list[Ended] = []
        self.heartbeats: list[tuple[HeartbeatData, Connection]] = []
        d = self.dispatcher = Dispatcher()
        d.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self._route)
        d.register(RequestCode.HEART_BEAT, self._heartbeat)
        d.register(RequestCode.UNREGISTER_CLIENT, lambda r, c: r.response_to())
        d.register(RequestCode.SEND_MESSAGE_V2, self._send)
        d.register(RequestCode.END_TRANSACTION, self._end)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeBroker]:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(SocketAttribute.local_port)
        self.addr = f"127.0.0.1:{self.port}"
        async with listener, anyio.create_task_group() as tasks:
            tasks.start_soon(listener.serve, self._serve)
            try:
                yield self
            finally:
                tasks.cancel_scope.cancel()

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        host, port = stream.extra(SocketAttribute.remote_address)[:2]
        conn = Connection(
            stream, peer=f"{host}:{port}", dispatcher=self.dispatcher, config=RemotingConfig()
        )
        await conn.run()

    def _route(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        route = TopicRouteData(
            queue_datas=[QueueData(BROKER, 1, 1, 6)],
            broker_datas=[BrokerData("C", BROKER, {0: self.addr})],
        )
        return request.response_to(body=encode_body(route))

    def _heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.heartbeats.append((decode_body(HeartbeatData, request.body), conn))
        return request.response_to()

    def _send(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = decode_send_header(request.ext_fields, v2=True)
        self.sends.append(Sent(header, decode_properties(header.properties or "")))
        answer = SendMessageResponseHeader(
            msg_id=offset_msg_id(pack_host("127.0.0.1", self.port), self.physical_offset),
            queue_id=header.queue_id,
            queue_offset=self.queue_offset,
        )
        return request.response_to(self.send_code, ext_fields=send_response_fields(answer))

    def _end(self, request: RemotingCommand, conn: Connection) -> None:
        self.ends.append(Ended(request.header(EndTransactionRequestHeader), request, conn))

    def producer_conn(self) -> Connection:
        """The connection the producer's group heartbeated over."""
        [conn] = {conn for data, conn in self.heartbeats if data.producer_data_set}
        return conn

    async def check(
        self, body: bytes, *, uniq: str = "UNIQ-1", table_offset: int = 3, log_offset: int = 999
    ) -> None:
        """CHECK_TRANSACTION_STATE over the producer's connection, oneway (as a broker)."""
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=table_offset,
            commit_log_offset=log_offset,
            msg_id=uniq,
            transaction_id=uniq,
            offset_msg_id=offset_msg_id(pack_host("127.0.0.1", self.port), log_offset),
        )
        request = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, header, body=body, oneway=True
        )
        await self.producer_conn().invoke_oneway(request, 5)


def half_record(uniq: str = "UNIQ-1", group: str = GROUP, body: bytes = b"order 1") -> bytes:
    """A half message as a broker's check carries it: real topic and queue, PGROUP,
    TRAN_MSG, UNIQ_KEY, TRANSACTION_CHECK_TIMES."""
    properties = {
        PROPERTY_PRODUCER_GROUP: group,
        PROPERTY_TRANSACTION_PREPARED: "true",
        PROPERTY_UNIQ_KEY: uniq,
        "TRANSACTION_CHECK_TIMES": "1",
    }
    template = make_record_template(
        topic=TOPIC, queue_id=0, body=body, properties=encode_properties(properties)
    )
    return template.encode(queue_offset=3, physical_offset=999, store_timestamp=1)


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    async with FakeBroker().running() as fake:
        yield fake


# ---------------------------------------------------------------- listeners


class Listener:
    """Answers ``execute`` and ``check`` with the states given (or raises them), as
    coroutine functions or plain ones; records what it was given and on which thread."""

    def __init__(
        self,
        execute: LocalTransactionState | Exception | None = COMMIT,
        check: LocalTransactionState | Exception | object = COMMIT,
        *,
        sync: bool = False,
    ) -> None:
        self.execute_answer = execute
        self.check_answer = check
        self.executed: list[tuple[Message, Any, int]] = []
        self.checked: list[tuple[MessageExt, int]] = []
        if sync:
            self.execute: Callable[..., Any] = self._answer_execute
            self.check: Callable[..., Any] = self._answer_check
        else:
            self.execute, self.check = self._execute_async, self._check_async

    def _answer_execute(self, message: Message, arg: Any) -> Any:
        self.executed.append((message, arg, threading.get_ident()))
        return _answer(self.execute_answer)

    def _answer_check(self, message: MessageExt) -> Any:
        self.checked.append((message, threading.get_ident()))
        return _answer(self.check_answer)

    async def _execute_async(self, message: Message, arg: Any) -> Any:
        return self._answer_execute(message, arg)

    async def _check_async(self, message: MessageExt) -> Any:
        return self._answer_check(message)


def _answer(answer: object) -> Any:
    if isinstance(answer, Exception):
        raise answer
    return answer


class LocalFailure(Exception):
    """The listener's own failure."""


# ---------------------------------------------------------------- send_in_transaction


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("state", [COMMIT, ROLLBACK, UNKNOW, None], ids=str)
async def test_a_half_message_then_end_transaction_with_the_listeners_state(
    broker: FakeBroker, state: LocalTransactionState | None, sync: bool
) -> None:
    listener = Listener(state, sync=sync)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        result = await producer.send_in_transaction(Message(TOPIC, b"order 1"), arg={"id": 1})
        await wait_for(lambda: broker.ends, 5, what="END_TRANSACTION")
    expected = state or UNKNOW  # None is RocketMQ's null: UNKNOW
    assert isinstance(result, TransactionSendResult)
    assert result.status is SendStatus.SEND_OK
    assert result.local_transaction_state is expected
    # the half message: TRAN_MSG, PGROUP, the prepared sysflag
    [sent] = broker.sends
    assert sent.header.sys_flag & SYSFLAG_TRANSACTION_PREPARED
    assert sent.properties[PROPERTY_TRANSACTION_PREPARED] == "true"
    assert sent.properties[PROPERTY_PRODUCER_GROUP] == GROUP
    assert sent.properties[PROPERTY_UNIQ_KEY] == result.msg_id
    # execute saw the message (its UNIQ_KEY: the transaction id) and the arg, in a
    # worker thread when it is a plain function
    [(message, arg, thread)] = listener.executed
    assert message.body == b"order 1" and arg == {"id": 1}
    assert message.properties[PROPERTY_UNIQ_KEY] == result.msg_id
    assert (thread != threading.get_ident()) is sync
    # END_TRANSACTION, oneway, naming the half message as the broker stored it
    [end] = broker.ends
    assert end.request.is_oneway and end.request.remark is None
    assert end.header == EndTransactionRequestHeader(
        producer_group=GROUP,
        tran_state_table_offset=broker.queue_offset,
        commit_log_offset=broker.physical_offset,
        commit_or_rollback=END_TYPE[expected],
        msg_id=result.msg_id,
        topic=TOPIC,
        from_transaction_check=False,
        transaction_id=result.msg_id,
    )


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_execute_raising_ends_unknown_then_raises_to_the_caller(
    broker: FakeBroker, sync: bool
) -> None:
    listener = Listener(LocalFailure("the database is down"), sync=sync)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        with pytest.raises(LocalFailure, match="the database is down"):
            await producer.send_in_transaction(Message(TOPIC, b"order 1"))
        await wait_for(lambda: broker.ends, 5, what="END_TRANSACTION")
    [end] = broker.ends
    assert end.header.commit_or_rollback == 0  # UNKNOW: the broker asks back
    assert "LocalFailure" in (end.request.remark or "")
    assert "the database is down" in (end.request.remark or "")


async def test_a_listener_answer_that_is_no_state_is_an_error_after_end_unknown(
    broker: FakeBroker,
) -> None:
    listener = Listener(execute="COMMIT_MESSAGE")  # type: ignore[arg-type]
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        with pytest.raises(Exception, match="returned 'COMMIT_MESSAGE', not a Local"):
            await producer.send_in_transaction(Message(TOPIC, b"order 1"))
        await wait_for(lambda: broker.ends, 5, what="END_TRANSACTION")
    assert [e.header.commit_or_rollback for e in broker.ends] == [0]


async def test_stored_short_of_send_ok_rolls_back_without_executing(broker: FakeBroker) -> None:
    broker.send_code = ResponseCode.FLUSH_DISK_TIMEOUT
    listener = Listener(COMMIT)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        result = await producer.send_in_transaction(Message(TOPIC, b"order 1"))
        await wait_for(lambda: broker.ends, 5, what="END_TRANSACTION")
    assert result.status is SendStatus.FLUSH_DISK_TIMEOUT
    assert result.local_transaction_state is ROLLBACK
    assert listener.executed == []
    assert [e.header.commit_or_rollback for e in broker.ends] == [12]


async def test_a_half_message_not_stored_raises_and_ends_nothing(broker: FakeBroker) -> None:
    broker.send_code = ResponseCode.MESSAGE_ILLEGAL
    listener = Listener(COMMIT)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        with pytest.raises(SendError):
            await producer.send_in_transaction(Message(TOPIC, b"order 1"))
        # an END would have gone before the error came back, on the one connection to
        # the broker: a send after it arrives after the END
        broker.send_code = ResponseCode.SUCCESS
        await producer.send(Message(TOPIC, b"after"))
    assert len(broker.sends) == 2 and listener.executed == []
    assert broker.ends == []


async def test_plain_sends_of_a_transaction_producer_are_not_prepared(broker: FakeBroker) -> None:
    async with TransactionProducer(GROUP, broker.addr, Listener()) as producer:
        result = await producer.send(Message(TOPIC, b"plain"))
    assert result.status is SendStatus.SEND_OK
    [sent] = broker.sends
    assert not sent.header.sys_flag & SYSFLAG_TRANSACTION_PREPARED
    assert PROPERTY_TRANSACTION_PREPARED not in sent.properties
    assert broker.ends == []


async def test_a_delay_level_is_refused_before_anything_is_sent(broker: FakeBroker) -> None:
    listener = Listener()
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        with pytest.raises(InvalidArgumentError, match="cannot have a delay level"):
            await producer.send_in_transaction(Message(TOPIC, b"x", delay_level=3))
    assert broker.sends == [] and listener.executed == []


class NoCheck:
    async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
        return COMMIT


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"check_thread_pool_max_size": 0}, "check_thread_pool_max_size 0 is below 1"),
        ({"check_request_hold_max": 0}, "check_request_hold_max 0 is below 1"),
        ({"check_request_hold_max": -5}, "check_request_hold_max -5 is below 1"),
        ({"check_thread_pool_max_size": "2"}, "check_thread_pool_max_size must be an int"),
        ({"check_request_hold_max": True}, "check_request_hold_max must be an int"),
        ({"listener": NoCheck()}, r"has no callable check\(\)"),
        ({"listener": None}, r"has no callable execute\(\)"),
        ({"send_timeout_s": 0}, "send_timeout_s 0 is below"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any], named: str) -> None:
    listener = options.pop("listener", Listener())
    with pytest.raises(InvalidArgumentError, match=named):
        TransactionProducer(GROUP, "127.0.0.1:9876", listener, **options)


# ---------------------------------------------------------------- check-backs


async def _announced(broker: FakeBroker, producer: TransactionProducer) -> None:
    """A transactional send, so that the producer heartbeats its group to the broker at
    once (not 30 s later): the connection checks come over."""
    await producer.send_in_transaction(Message(TOPIC, b"order 0"))
    await wait_for(lambda: broker.ends, 5, what="END_TRANSACTION")
    await wait_for(
        lambda: any(data.producer_data_set for data, _ in broker.heartbeats), 5, what="heartbeat"
    )
    broker.ends.clear()


@pytest.mark.parametrize(
    ("sync", "answer", "expected"),
    [
        (False, COMMIT, 8),
        (True, ROLLBACK, 12),
        (False, UNKNOW, 0),
        (True, LocalFailure("lost track"), 0),
        (False, "yes", 0),
    ],
    ids=["async-commit", "sync-rollback", "async-unknown", "sync-raises", "async-junk"],
)
async def test_a_check_back_is_answered_over_the_connection_it_came_on(
    broker: FakeBroker, sync: bool, answer: object, expected: int
) -> None:
    listener = Listener(UNKNOW, answer, sync=sync)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        await _announced(broker, producer)
        await broker.check(half_record("UNIQ-7"), uniq="UNIQ-7", table_offset=11, log_offset=5555)
        await wait_for(lambda: broker.ends, 5, what="the check's END_TRANSACTION")
    [(message, thread)] = listener.checked
    assert message.topic == TOPIC and message.body == b"order 1"
    assert message.msg_id == "UNIQ-7"
    assert (thread != threading.get_ident()) is sync
    [end] = broker.ends
    assert end.conn is broker.producer_conn() and end.request.is_oneway
    assert end.header == EndTransactionRequestHeader(
        producer_group=GROUP,
        tran_state_table_offset=11,
        commit_log_offset=5555,
        commit_or_rollback=expected,
        msg_id="UNIQ-7",
        topic=TOPIC,
        from_transaction_check=True,
        transaction_id="UNIQ-7",
    )
    if isinstance(answer, Exception):
        assert "lost track" in (end.request.remark or "")


async def test_checks_past_the_hold_max_are_refused_and_logged(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """One worker, two checks held: with the worker busy, the fourth and fifth checks
    are refused (a warning each), the others answered once the listener goes on."""
    entered, release = anyio.Event(), anyio.Event()
    checked: list[str] = []

    class Slow:
        async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
            return UNKNOW

        async def check(self, message: MessageExt) -> LocalTransactionState:
            checked.append(message.msg_id)
            entered.set()
            await release.wait()
            return COMMIT

    async with TransactionProducer(
        GROUP, broker.addr, Slow(), check_thread_pool_max_size=1, check_request_hold_max=2
    ) as producer:
        await _announced(broker, producer)
        await broker.check(half_record("U1"), uniq="U1")
        with anyio.fail_after(5):
            await entered.wait()
        with caplog.at_level(logging.WARNING, logger="hamq.client.transaction"):
            for uniq in ("U2", "U3", "U4", "U5"):
                await broker.check(half_record(uniq), uniq=uniq)
            await wait_for(
                lambda: len([r for r in caplog.records if "queue full" in r.getMessage()]) == 2,
                5,
                what=lambda: f"two refusals in {[r.getMessage() for r in caplog.records]}",
            )
        refusals = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
        assert "check request refused, queue full" in refusals[0]
        assert "U4" in refusals[0] and "U5" in refusals[1]
        release.set()
        await wait_for(lambda: len(broker.ends) == 3, 5, what="three answers")
        # one more check, answered after whatever was queued before it (one worker)
        await broker.check(half_record("U6"), uniq="U6")
        await wait_for(lambda: len(broker.ends) == 4, 5, what="the last check's answer")
    assert checked == ["U1", "U2", "U3", "U6"]
    assert [e.header.msg_id for e in broker.ends] == ["U1", "U2", "U3", "U6"]


async def test_a_check_that_does_not_decode_is_dropped_with_a_warning(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    listener = Listener(UNKNOW, COMMIT)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        await _announced(broker, producer)
        with caplog.at_level(logging.WARNING, logger="hamq.client.broker_requests"):
            await broker.check(b"not a message record at all", uniq="BAD")
            await broker.check(half_record("GOOD"), uniq="GOOD")  # the connection goes on
            await wait_for(lambda: broker.ends, 5, what="the good check's answer")
    [warning] = [r for r in caplog.records if "does not decode" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert broker.addr in warning.getMessage()
    assert [m.msg_id for m, _ in listener.checked] == ["GOOD"]
    assert [e.header.msg_id for e in broker.ends] == ["GOOD"]


async def test_a_check_for_a_group_not_here_is_dropped(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    listener = Listener(UNKNOW, COMMIT)
    async with TransactionProducer(GROUP, broker.addr, listener) as producer:
        await _announced(broker, producer)
        with caplog.at_level(logging.INFO, logger="hamq.client.broker_requests"):
            await broker.check(half_record("OTHER-1", group="OTHER"), uniq="OTHER-1")
            await broker.check(half_record("MINE-1"), uniq="MINE-1")
            await wait_for(lambda: broker.ends, 5, what="the answer to our own group's check")
            # the other group's check came first on the connection: dropped as it was
            # read (the log line), or queued before ours and, with one worker, answered
            # before it
            assert any(
                "OTHER" in r.getMessage() and "no such transaction producer" in r.getMessage()
                for r in caplog.records
            )
    assert [m.msg_id for m, _ in listener.checked] == ["MINE-1"]
    assert [e.header.msg_id for e in broker.ends] == ["MINE-1"]


# ---------------------------------------------------------------- the blocking facade


async def test_the_blocking_facade_sends_in_transaction_and_answers_checks(
    broker: FakeBroker,
) -> None:
    """A listener of plain functions, handed through: execute and check run in worker
    threads of the facade's own loop thread."""
    listener = Listener(COMMIT, ROLLBACK, sync=True)
    producer = BlockingTransactionProducer(GROUP, broker.addr, listener)
    await anyio.to_thread.run_sync(producer.start)
    try:
        result = await anyio.to_thread.run_sync(
            lambda: producer.send_in_transaction(Message(TOPIC, b"order 1"), "arg")
        )
        assert isinstance(result, TransactionSendResult)
        assert result.local_transaction_state is COMMIT
        await wait_for(lambda: broker.ends, 5, what="END_TRANSACTION")
        await wait_for(lambda: any(data.producer_data_set for data, _ in broker.heartbeats), 5)
        await broker.check(half_record("F1"), uniq="F1")
        await wait_for(lambda: len(broker.ends) == 2, 5, what="the check's answer")
    finally:
        await anyio.to_thread.run_sync(producer.shutdown)
    assert [e.header.commit_or_rollback for e in broker.ends] == [8, 12]
    assert [e.header.from_transaction_check for e in broker.ends] == [False, True]
    assert [(m.body, arg) for m, arg, _ in listener.executed] == [(b"order 1", "arg")]
    assert [m.msg_id for m, _ in listener.checked] == ["F1"]


# ---------------------------------------------------------------- against a broker

#: the broker asks back about a half message 0.5 s after it was stored
FAST_CHECKS: dict[str, Any] = {
    "transaction_timeout_s": 0.5,
    "transaction_check_interval_s": 0.1,
    "transaction_check_max": 5,
}


async def _more_passes(broker: BrokerThread) -> int:
    """Wait until the broker's check loop completed two more passes than it had (the
    first may have begun before), and what they stored is dispatched: every half
    message as it stands now has been looked at. How many half messages the broker
    holds then (a check-back puts a copy back before it asks)."""

    def passes(node: BrokerNode) -> int:
        return node.transactions.check_passes

    seen = await broker.call(passes)

    async def passed() -> bool:
        return await broker.call(passes) >= seen + 2

    await wait_for(passed, 10, what="two more check passes")
    await broker.thread.run(_dispatched, broker.thread.value)
    return await broker.call(lambda node: node.store.max_offset_in_queue(TRANS_HALF_TOPIC, 0))


async def _dispatched(node: BrokerNode) -> None:
    await node.store.wait_dispatched()


#: longer than FAST_CHECKS' transaction_timeout_s: a half message read now is due then
PAST_TIMEOUT_S = 0.6


async def _visible(consumer: PullConsumer, topic: str) -> list[MessageExt]:
    """Every message consumers can read in ``topic`` (each queue from its start); none
    while the nameserver has no route for it yet (a topic the broker auto-created just
    now: its route comes with the broker's next registration)."""
    found: list[MessageExt] = []
    try:
        queues = await consumer.queues(topic)
    except NoRouteError:
        return []
    for queue in queues:
        result = await consumer.pull(queue, 0, max_nums=32)
        found += result.messages
    return found


@pytest.mark.slow
async def test_against_a_broker_committed_is_consumed_once_and_rolled_back_never(
    tmp_path: Path,
) -> None:
    class ByBody:
        async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
            return COMMIT if message.body == b"commit me" else ROLLBACK

        def check(self, message: MessageExt) -> LocalTransactionState:
            checked.append(message)
            return COMMIT

    checked: list[MessageExt] = []
    async with broker_thread(tmp_path, **FAST_CHECKS) as broker:
        await broker.create_topic(TOPIC, 2)
        async with (
            TransactionProducer(GROUP, broker.namesrv, ByBody()) as producer,
            PullConsumer("CG", broker.namesrv) as consumer,
        ):
            rolled = await producer.send_in_transaction(Message(TOPIC, b"roll me back"))
            committed = await producer.send_in_transaction(Message(TOPIC, b"commit me"))
            assert rolled.local_transaction_state is ROLLBACK
            assert committed.local_transaction_state is COMMIT
            await wait_for(lambda: _visible(consumer, TOPIC), 10, what="the committed message")
            # past the check time out (0.5 s), then the passes that would ask about a
            # half message left unsettled
            await anyio.sleep(PAST_TIMEOUT_S)
            halves = await _more_passes(broker)
            seen = await _visible(consumer, TOPIC)
    assert [(m.body, m.msg_id) for m in seen] == [(b"commit me", committed.msg_id)]
    assert halves == 2  # no copy put back to ask about
    assert checked == []  # both were settled by their END


@pytest.mark.slow
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_against_a_broker_unknown_is_committed_by_the_check_back(
    tmp_path: Path, sync: bool
) -> None:
    listener = Listener(UNKNOW, COMMIT, sync=sync)
    async with broker_thread(tmp_path, **FAST_CHECKS) as broker:
        await broker.create_topic(TOPIC, 2)
        async with (
            TransactionProducer(GROUP, broker.namesrv, listener) as producer,
            PullConsumer("CG", broker.namesrv) as consumer,
        ):
            result = await producer.send_in_transaction(Message(TOPIC, b"decided later"))
            assert result.local_transaction_state is UNKNOW
            assert await _visible(consumer, TOPIC) == []  # a half message: invisible
            await wait_for(lambda: _visible(consumer, TOPIC), 10, what="the message checked")
            # past the time out of the copy the check put back, then the passes that
            # would ask about it again, were it left unsettled
            await anyio.sleep(PAST_TIMEOUT_S)
            halves = await _more_passes(broker)

            # every copy put back (all but the half message) asked about and its
            # COMMIT taken: committed once, or found committed already
            async def answered() -> bool:
                done = await broker.call(
                    lambda node: node.transactions.committed + node.transactions.duplicates
                )
                return done >= halves - 1

            await wait_for(answered, 10, what="the answers to every check")
            await broker.thread.run(_dispatched, broker.thread.value)
            seen = await _visible(consumer, TOPIC)
    assert [(m.body, m.msg_id) for m in seen] == [(b"decided later", result.msg_id)]
    assert listener.checked, "the broker never asked"
    message, _ = listener.checked[0]
    assert (message.topic, message.msg_id, message.body) == (
        TOPIC,
        result.msg_id,
        b"decided later",
    )
    assert message.queue_id == result.queue.queue_id


@pytest.mark.slow
async def test_against_an_acl_broker_end_and_check_answers_are_signed(tmp_path: Path) -> None:
    """With ACL on, an END_TRANSACTION not signed is refused (oneway: silently), so
    each message is committed only if its END — after the send, and in answer to the
    check-back, over the connection the check came on — carries the account's signature."""

    class ByBody:
        async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
            return COMMIT if message.body == b"at once" else UNKNOW

        async def check(self, message: MessageExt) -> LocalTransactionState:
            return COMMIT

    acl_file = write_acl(tmp_path / "plain_acl.yml", acl_text())
    account = {"access_key": APP.access_key, "secret_key": APP.secret_key}
    async with (
        broker_thread(
            tmp_path / "store",
            acl_enable=True,
            acl_file=str(acl_file),
            access_key=ACL_BROKER.access_key,
            secret_key=ACL_BROKER.secret_key,
            **FAST_CHECKS,
        ) as broker,
        TransactionProducer(GROUP, broker.namesrv, ByBody(), **account) as producer,
        PullConsumer("G", broker.namesrv, **account) as consumer,
    ):
        now = await producer.send_in_transaction(Message("Demo", b"at once"))
        later = await producer.send_in_transaction(Message("Demo", b"after the check"))
        await wait_for(lambda: _count(consumer, "Demo", 2), 10, what="both messages committed")
        seen = await _visible(consumer, "Demo")
    assert sorted((m.body, m.msg_id) for m in seen) == sorted(
        [(b"at once", now.msg_id), (b"after the check", later.msg_id)]
    )


async def _count(consumer: PullConsumer, topic: str, count: int) -> bool:
    return len(await _visible(consumer, topic)) >= count
