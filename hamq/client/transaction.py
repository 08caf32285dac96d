"""TransactionProducer: RocketMQ's transactional messages, client side.

    class Orders:
        async def execute(self, message, arg):      # the local transaction
            await db.insert_order(arg)
            return LocalTransactionState.COMMIT_MESSAGE

        async def check(self, message):             # the broker asks: what became of it?
            found = await db.order_exists(message.keys)
            return COMMIT_MESSAGE if found else ROLLBACK_MESSAGE

    async with TransactionProducer("orders", "127.0.0.1:9876", Orders()) as producer:
        result = await producer.send_in_transaction(Message("Orders", b"..."), arg=order)

``send_in_transaction`` (RocketMQ's sendMessageInTransaction):
1. sends the message as a *prepared* (half) message: properties TRAN_MSG=true and
   PGROUP=<group>, sysflag TRANSACTION_PREPARED; the broker keeps it invisible to
   consumers. Same retries and time out as ``send``; a SendError propagates (nothing is
   stored, so nothing is ended). A delay level is refused (RocketMQ silently drops it).
2. SEND_OK: runs ``listener.execute(message, arg)``; the message it is given carries its
   UNIQ_KEY in ``properties`` (the transaction id: ``check`` sees the same value as
   ``message.msg_id``). A stored answer short of SEND_OK (FLUSH_DISK_TIMEOUT ...) is
   rolled back without running ``execute``, as RocketMQ does.
3. sends END_TRANSACTION (oneway) to the master of the broker that stored it: COMMIT
   (the message goes to its topic), ROLLBACK (it never does) or UNKNOW (nothing yet: the
   broker asks back later). A failure to send END is logged, not raised: the broker
   asks back. ``execute`` returning None counts as UNKNOW (RocketMQ's null).
   ``execute`` raising: END says UNKNOW (its remark names the exception) and *then the
   exception is raised to the caller* (RocketMQ only logs it; here the caller learns
   that its local transaction failed, and the broker's check-back settles the message).
   Cancelled once the half message is stored: no END is sent, the check-back settles it.

Check-backs: a half message left without END past the broker's transaction time out
(6 s) makes the broker send CHECK_TRANSACTION_STATE over this producer's connection
(it must have heartbeated its group there: done at once after the first transactional
send to a broker, then every ``heartbeat_broker_interval_s``). The ClientInstance hands
it here without blocking its reader: a bounded queue of ``check_request_hold_max``
(2000) checks — a check that finds it full is refused with a warning (the broker asks
again later) — and ``check_thread_pool_max_size`` (1) workers that call
``listener.check(message)`` (the stored message: real topic and queue, the body inflated)
and answer END_TRANSACTION (fromTransactionCheck) over the connection the check came
on. ``check`` raising (or returning None or a wrong value) answers UNKNOW, logged.

Listeners: each method may be ``async def`` (run in the event loop) or a plain function
(run in a worker thread: ``execute`` in AnyIO's default pool, ``check`` in at most
``check_thread_pool_max_size`` threads of its own).
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from hamq.client.config import ClientConfig
from hamq.client.errors import NETWORK_ERRORS, ClientError, InvalidArgumentError
from hamq.client.instance import ClientInstance
from hamq.client.message import Message, MessageExt, SendResult, SendStatus
from hamq.client.producer import Producer
from hamq.protocol import RequestCode
from hamq.protocol.bodies import MASTER_ID
from hamq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)
from hamq.protocol.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    MessageFormatError,
    parse_offset_msg_id,
)
from hamq.remoting import Connection

log = logging.getLogger(__name__)

#: RocketMQ's TransactionMQProducer defaults (checkThreadPoolMaxSize, checkRequestHoldMax)
CHECK_THREAD_POOL_MAX_SIZE = 1
CHECK_REQUEST_HOLD_MAX = 2000


class LocalTransactionState(enum.Enum):
    """What became of the local transaction (RocketMQ's names, UNKNOW as it spells it)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
    #: the same member as UNKNOW, spelled in English
    UNKNOWN = "UNKNOW"


#: END_TRANSACTION's commitOrRollback per state (MessageSysFlag's transaction types)
_END_TYPES = {
    LocalTransactionState.COMMIT_MESSAGE: SYSFLAG_TRANSACTION_COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: SYSFLAG_TRANSACTION_ROLLBACK,
    LocalTransactionState.UNKNOW: SYSFLAG_TRANSACTION_NOT_TYPE,
}

StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState] | None


class TransactionListener(Protocol):
    """What a TransactionProducer asks (RocketMQ's TransactionListener). Either method
    may be a coroutine function (run in the loop) or a plain one (run in a thread)."""

    def execute(self, message: Message, arg: Any) -> StateOrAwaitable:
        """Run the local transaction that goes with ``message`` (stored, not yet
        visible); ``arg`` is ``send_in_transaction``'s. RocketMQ's
        executeLocalTransaction."""

    def check(self, message: MessageExt) -> StateOrAwaitable:
        """The broker asks what became of the local transaction of ``message`` (a
        half message without END after the broker's time out). RocketMQ's
        checkLocalTransaction."""


@attrs.frozen
class TransactionSendResult(SendResult):
    """SendResult and the state END_TRANSACTION reported (RocketMQ's
    TransactionSendResult.localTransactionState)."""

    local_transaction_state: LocalTransactionState = attrs.field(kw_only=True)


@attrs.frozen
class _Check:
    """A broker's CHECK_TRANSACTION_STATE, queued for a worker."""

    header: CheckTransactionStateRequestHeader
    message: MessageExt
    conn: Connection


class TransactionProducer(Producer):
    """A Producer that also sends transactional messages (this module's comment).

    ``listener``: a TransactionListener. ``check_thread_pool_max_size`` (1): how many
    check-backs are answered at once; ``check_request_hold_max`` (2000): how many wait
    for a worker before new ones are refused. Other options are Producer's.
    """

    _kind = "transaction producer"

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | ClientConfig,
        listener: TransactionListener,
        *,
        check_thread_pool_max_size: int = CHECK_THREAD_POOL_MAX_SIZE,
        check_request_hold_max: int = CHECK_REQUEST_HOLD_MAX,
        **producer_options: Any,
    ) -> None:
        for name, value in (
            ("check_thread_pool_max_size", check_thread_pool_max_size),
            ("check_request_hold_max", check_request_hold_max),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, not {value!r}")
            if value < 1:
                raise InvalidArgumentError(f"{name} {value} is below 1")
        for method in ("execute", "check"):
            if not callable(getattr(listener, method, None)):
                raise InvalidArgumentError(
                    f"the transaction listener {listener!r} has no callable {method}()"
                )
        super().__init__(group, namesrv, **producer_options)
        self.listener = listener
        self.check_thread_pool_max_size = check_thread_pool_max_size
        self.check_request_hold_max = check_request_hold_max
        self._execute_is_async = _is_async(listener.execute)
        self._check_is_async = _is_async(listener.check)
        self._check_threads: anyio.CapacityLimiter | None = None
        self._checks: MemoryObjectSendStream[_Check] | None = None
        #: broker addresses told of this group since it started (heartbeat at once)
        self._announced: set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    def _started(self, instance: ClientInstance) -> None:
        super()._started(instance)
        send, receive = anyio.create_memory_object_stream[_Check](self.check_request_hold_max)
        self._checks = send
        self._check_threads = anyio.CapacityLimiter(self.check_thread_pool_max_size)
        with receive:
            for _ in range(self.check_thread_pool_max_size):
                instance.nursery.start_soon(self._check_worker, instance, receive.clone())
        self._announced.clear()
        instance.transaction_producers[self.group] = self

    async def _stopping(self, instance: ClientInstance) -> None:
        if instance.transaction_producers.get(self.group) is self:
            del instance.transaction_producers[self.group]
        if self._checks is not None:
            self._checks.close()  # checks still queued are dropped: the broker asks again
            self._checks = None
        await super()._stopping(instance)

    # ------------------------------------------------------------------ sending
    async def send_in_transaction(
        self, message: Message, arg: Any = None, *, timeout_s: float | None = None
    ) -> TransactionSendResult:
        """Send ``message`` prepared, run ``listener.execute(message, arg)``, end the
        transaction as it says (this module's comment has the whole story).

        Errors: InvalidArgumentError (nothing sent) for a message ``send`` refuses, a
        delay level, a bad ``timeout_s``; SendError when the half message was not
        stored (nothing to end); whatever ``execute`` raised, after END said UNKNOW (a
        ClientError when it returned something not a LocalTransactionState)."""
        timeout = self._timeout(timeout_s)
        request = self._request(message)
        if message.delay_level > 0:
            raise InvalidArgumentError(
                f"a transactional message cannot have a delay level (delay_level "
                f"{message.delay_level}): send it with delay_level 0"
            )
        request = attrs.evolve(
            request,
            sys_flag=request.sys_flag | SYSFLAG_TRANSACTION_PREPARED,
            properties={
                **request.properties,
                PROPERTY_TRANSACTION_PREPARED: "true",
                PROPERTY_PRODUCER_GROUP: self.group,
            },
        )
        result = await self._send_alone(request, None, None, None, timeout)
        self._announce(result)
        error: Exception | None = None
        if result.status is not SendStatus.SEND_OK:
            log.info(
                "producer %s: half message %s stored %s: rolled back without executing",
                self.group,
                result.msg_id,
                result.status.value,
            )
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            executed = attrs.evolve(
                message, properties={**message.properties, PROPERTY_UNIQ_KEY: request.ids[0]}
            )
            try:
                state = await self._execute(executed, arg)
            except Exception as exc:
                log.info(
                    "producer %s: the local transaction of %s failed: %r",
                    self.group,
                    result.msg_id,
                    exc,
                )
                state, error = LocalTransactionState.UNKNOW, exc
        await self._end(result, state, error)
        if error is not None:
            raise error
        return TransactionSendResult(
            **attrs.asdict(result, recurse=False), local_transaction_state=state
        )

    async def _execute(self, message: Message, arg: Any) -> LocalTransactionState:
        """``listener.execute``'s state (in a worker thread when it is a plain
        function); None is UNKNOW; ClientError for anything else not a state."""
        if self._execute_is_async:
            outcome = await self.listener.execute(message, arg)  # type: ignore[misc]
        else:
            outcome = await anyio.to_thread.run_sync(
                self.listener.execute, message, arg, abandon_on_cancel=True
            )
            if isinstance(outcome, Awaitable):  # a plain function that returned a coroutine
                outcome = await outcome
        return _state("execute", outcome)

    def _announce(self, result: SendResult) -> None:
        """Heartbeat at once to a broker that stored a half message of ours for the
        first time, so that its check-backs find this producer (the periodic heartbeat
        may be 30 s away)."""
        instance = self.instance
        addr = instance.broker_addr(result.queue.broker_name)
        if addr is not None and addr not in self._announced:
            self._announced.add(addr)
            instance.nursery.start_soon(instance.heartbeat)

    async def _end(
        self, result: SendResult, state: LocalTransactionState, error: Exception | None
    ) -> None:
        """END_TRANSACTION for ``result``'s half message, oneway to its broker's master;
        a failure is logged (the broker asks back later), never raised."""
        instance = self.instance
        try:
            _, commit_log_offset = parse_offset_msg_id(result.offset_msg_id)
        except MessageFormatError as exc:
            log.warning(
                "producer %s: cannot end the transaction of %s (%s): the broker answered "
                "the offset id %r: %s; it will ask back",
                self.group,
                result.msg_id,
                state.value,
                result.offset_msg_id,
                exc,
            )
            return
        header = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=result.queue_offset,
            commit_log_offset=commit_log_offset,
            commit_or_rollback=_END_TYPES[state],
            msg_id=result.msg_id,
            topic=result.queue.topic,
            from_transaction_check=False,
            transaction_id=result.transaction_id or result.msg_id,
        )
        request = instance.request(RequestCode.END_TRANSACTION, header, oneway=True)
        if error is not None:
            request.remark = f"executeLocalTransactionBranch exception: {error!r}"
        try:
            addr = await self._master_addr(result)
            await instance.remoting.invoke_oneway(addr, request, instance.config.request_timeout_s)
        except NETWORK_ERRORS as exc:
            log.warning(
                "producer %s: sending END_TRANSACTION %s for %s failed (the broker will "
                "ask back): %s",
                self.group,
                state.value,
                result.msg_id,
                exc,
            )

    async def _master_addr(self, result: SendResult) -> str:
        """The master of the broker that stored ``result`` (END goes to no slave)."""
        instance = self.instance
        name = result.queue.broker_name
        addr = instance.broker_addr(name, MASTER_ID, only_this=True)
        if addr is None:
            await instance.update_route(result.queue.topic)
            addr = instance.broker_addr(name, MASTER_ID, only_this=True)
        if addr is None:
            raise ClientError(f"no master of broker {name} is known")
        return addr

    # ------------------------------------------------------------------ check-backs
    def check_requested(
        self, header: CheckTransactionStateRequestHeader, message: MessageExt, conn: Connection
    ) -> None:
        """Queue a broker's check (called by the ClientInstance in its connection's
        reader: never blocks); refused with a warning when the queue is full."""
        checks = self._checks
        if checks is None:
            log.info("producer %s stopped: check of %s dropped", self.group, message.msg_id)
            return
        try:
            checks.send_nowait(_Check(header, message, conn))
        except anyio.WouldBlock:
            log.warning(
                "producer %s: check request refused, queue full (check_request_hold_max "
                "%d): message %s from broker %s; the broker asks again later",
                self.group,
                self.check_request_hold_max,
                message.msg_id,
                conn.peer,
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.info("producer %s stopped: check of %s dropped", self.group, message.msg_id)

    async def _check_worker(
        self, instance: ClientInstance, checks: MemoryObjectReceiveStream[_Check]
    ) -> None:
        async with checks:
            async for check in checks:
                try:
                    await self._answer(instance, check)
                except Exception:  # (a bug here must not end the producer's checks)
                    log.exception("producer %s: answering a check failed", self.group)

    async def _answer(self, instance: ClientInstance, check: _Check) -> None:
        """Ask the listener, answer END_TRANSACTION (fromTransactionCheck) over the
        connection the check came on; failures are logged."""
        message, header = check.message, check.header
        error: Exception | None = None
        try:
            state = await self._ask_listener(message)
        except Exception as exc:
            log.error(
                "producer %s: the listener's check of %s failed; answering UNKNOW",
                self.group,
                message.msg_id,
                exc_info=exc,
            )
            state, error = LocalTransactionState.UNKNOW, exc
        uniq = message.properties.get(PROPERTY_UNIQ_KEY) or header.msg_id or message.msg_id
        end = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=_END_TYPES[state],
            msg_id=uniq,
            topic=message.topic,
            from_transaction_check=True,
            transaction_id=header.transaction_id or uniq,
        )
        request = instance.request(RequestCode.END_TRANSACTION, end, oneway=True)
        if error is not None:
            request.remark = f"checkLocalTransactionState Exception: {error!r}"
        try:
            await instance.invoke_oneway_on(check.conn, request)
        except NETWORK_ERRORS as exc:
            log.warning(
                "producer %s: answering the check of %s (%s) to broker %s failed: %s",
                self.group,
                uniq,
                state.value,
                check.conn.peer,
                exc,
            )

    async def _ask_listener(self, message: MessageExt) -> LocalTransactionState:
        if self._check_is_async:
            outcome = await self.listener.check(message)  # type: ignore[misc]
        else:
            outcome = await anyio.to_thread.run_sync(
                self.listener.check,
                message,
                limiter=self._check_threads,
                abandon_on_cancel=True,
            )
            if isinstance(outcome, Awaitable):
                outcome = await outcome
        return _state("check", outcome)


def _is_async(method: object) -> bool:
    """An ``async def`` method, a partial of one, or an object whose ``__call__`` is one
    (PushConsumer tells its handlers apart the same way)."""
    call = type(method).__call__ if not inspect.isroutine(method) else None
    return inspect.iscoroutinefunction(method) or inspect.iscoroutinefunction(call)


def _state(method: str, outcome: object) -> LocalTransactionState:
    """A listener's answer as a state: None is UNKNOW (RocketMQ's null); ClientError
    for anything else that is not a LocalTransactionState."""
    if outcome is None:
        return LocalTransactionState.UNKNOW
    if not isinstance(outcome, LocalTransactionState):
        raise ClientError(
            f"the transaction listener's {method}() returned {outcome!r}, not a "
            "LocalTransactionState"
        )
    return outcome


__all__ = [
    "LocalTransactionState",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]
