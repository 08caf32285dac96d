"""The client for code that is not async: the same classes, blocking calls.

    from hamq.client import Message
    from hamq.client.blocking import Producer

    with Producer("my-group", namesrv="127.0.0.1:9876") as producer:
        result = producer.send(Message("demo", b"hello"))

Each object runs the async client in a Trio event loop of its own, in a background thread;
a method call hands the work to that loop (``trio.from_thread.run``) and waits for its
answer, so errors are the async client's errors, raised in the caller's thread; if the
client itself fails, the next call (or ``shutdown``) raises ClientError with the cause. A
push consumer's handler is an ordinary function; it runs in worker threads, at most
``consume_thread_max`` (20) at once; one still running at shutdown is left to finish,
and its messages come again later (at least once). ``send_async`` callbacks run in the loop's
thread: keep them short. Objects are thread-safe: any thread may call them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Generic, TypeVar

import trio

from hamq.client import admin, consumer, producer, push_consumer, simple_consumer, transaction
from hamq.client.admin_views import QueueStatus
from hamq.client.config import ClientConfig
from hamq.client.errors import ClientError, InvalidArgumentError
from hamq.client.message import (
    ConsumeResult,
    Message,
    MessageExt,
    PullResult,
    SendResult,
)
from hamq.client.send_attempts import Selector
from hamq.protocol.bodies import ClusterInfo, MessageQueue, TopicRouteData

T = TypeVar("T")
R = TypeVar("R")

#: how long closing may take before the loop thread is left to finish on its own
CLOSE_TIMEOUT_S = 10.0


class _LoopThread(Generic[T]):
    """A Trio loop in a daemon thread that holds an async context open until closed."""

    def __init__(self, name: str, open_: Callable[[], AbstractAsyncContextManager[T]]) -> None:
        self._name = name
        self._open = open_
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.value: T | None = None

    def start(self) -> T:
        if self._thread is not None:
            raise ClientError(f"{self._name} is already started")
        self._thread = threading.Thread(
            target=trio.run, args=(self._main,), name=self._name, daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            error, self._error = self._error, None
            self._thread.join(CLOSE_TIMEOUT_S)
            self._thread = None
            raise error
        assert self.value is not None
        return self.value

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        try:
            async with self._open() as value:
                self.value = value
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # kept for the caller's thread, raised there
            self._error = exc
        finally:
            self._ready.set()

    def call(self, fn: Callable[[], Awaitable[R]]) -> R:
        if self._token is None or self.value is None:
            raise ClientError(f"{self._name} is not started (use `with` or start())")
        try:
            return trio.from_thread.run(fn, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientError(f"{self._name} is closed") from self._error

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        thread.join(CLOSE_TIMEOUT_S)
        self._token = None
        self.value = None
        if thread.is_alive():
            raise ClientError(f"{self._name} did not stop within {CLOSE_TIMEOUT_S:g}s")
        error, self._error = self._error, None
        if error is not None and not isinstance(error, trio.Cancelled):
            raise ClientError(f"{self._name} failed: {error}") from error


class _Blocking(Generic[T]):
    """Start/close and ``with`` for a blocking wrapper around an async client."""

    _loop: _LoopThread[T]

    def start(self) -> Any:
        self._loop.start()
        return self

    def shutdown(self) -> None:
        self._loop.close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    @property
    def _value(self) -> T:
        if self._loop.value is None:
            raise ClientError("not started (use `with` or start())")
        return self._loop.value

    def _call(self, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        return self._loop.call(functools.partial(fn, *args, **kwargs))

    def _read(self, fn: Callable[[], R]) -> R:
        """Read state in the loop's thread."""

        async def read() -> R:
            return fn()

        return self._loop.call(read)


class Producer(_Blocking[producer.Producer]):
    """hamq.client.Producer, blocking. Same arguments."""

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        **options: Any,
    ) -> None:
        self._async = producer.Producer(group, namesrv, **options)
        self._loop = _LoopThread(f"hamq-producer-{group}", lambda: self._async)

    def send(
        self,
        message: Message,
        selector: Selector | None = None,
        arg: Any = None,
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        return self._call(
            self._value.send, message, selector, arg, queue=queue, timeout_s=timeout_s
        )

    def send_oneway(
        self,
        message: Message,
        selector: Selector | None = None,
        arg: Any = None,
        *,
        queue: MessageQueue | None = None,
    ) -> None:
        self._call(self._value.send_oneway, message, selector, arg, queue=queue)

    def send_async(
        self,
        message: Message,
        callback: producer.SendCallback,
        selector: Selector | None = None,
        arg: Any = None,
    ) -> None:
        """Returns once the send started; ``callback`` runs in the client's loop thread."""
        self._call(self._value.send_async, message, callback, selector, arg)

    def send_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        return self._call(self._value.send_batch, messages, queue=queue, timeout_s=timeout_s)

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._call(self._value.queues, topic)


class TransactionProducer(Producer):
    """hamq.client.TransactionProducer, blocking. Same arguments; a listener of plain
    functions runs in worker threads of the client's loop (``check`` in at most
    ``check_thread_pool_max_size`` of them)."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | ClientConfig,
        listener: transaction.TransactionListener,
        **options: Any,
    ) -> None:
        self._transactions = transaction.TransactionProducer(group, namesrv, listener, **options)
        self._async = self._transactions
        self._loop = _LoopThread(f"hamq-transaction-producer-{group}", lambda: self._async)

    def send_in_transaction(
        self, message: Message, arg: Any = None, timeout_s: float | None = None
    ) -> transaction.TransactionSendResult:
        return self._call(self._transactions.send_in_transaction, message, arg, timeout_s=timeout_s)


class PullConsumer(_Blocking[consumer.PullConsumer]):
    """hamq.client.PullConsumer, blocking. Same arguments."""

    def __init__(
        self,
        group: str = "DEFAULT_CONSUMER",
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        **options: Any,
    ) -> None:
        self._async = consumer.PullConsumer(group, namesrv, **options)
        self._loop = _LoopThread(f"hamq-pull-{group}", lambda: self._async)

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._call(self._value.queues, topic)

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        expression: str = "*",
        max_nums: int = 32,
        *,
        wait_s: float = 0.0,
        timeout_s: float = 10.0,
    ) -> PullResult:
        return self._call(
            self._value.pull,
            queue,
            offset,
            expression,
            max_nums,
            wait_s=wait_s,
            timeout_s=timeout_s,
        )

    def committed_offset(self, queue: MessageQueue) -> int | None:
        return self._call(self._value.committed_offset, queue)

    def commit_offset(self, queue: MessageQueue, offset: int) -> None:
        self._call(self._value.commit_offset, queue, offset)

    def min_offset(self, queue: MessageQueue) -> int:
        return self._call(self._value.min_offset, queue)

    def max_offset(self, queue: MessageQueue) -> int:
        return self._call(self._value.max_offset, queue)

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return self._call(self._value.search_offset, queue, timestamp_ms)


class SimpleConsumer(_Blocking[simple_consumer.SimpleConsumer]):
    """hamq.client.SimpleConsumer (pop consumption), blocking. Same arguments."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        **options: Any,
    ) -> None:
        self._async = simple_consumer.SimpleConsumer(group, namesrv, **options)
        self._loop = _LoopThread(f"hamq-pop-{group}", lambda: self._async)

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._async.subscribe(topic, expression)

    def receive(
        self, max_messages: int = 16, invisible_s: float = 30.0, *, await_s: float | None = None
    ) -> list[MessageExt]:
        return self._call(self._value.receive, max_messages, invisible_s, await_s=await_s)

    def ack(self, message: MessageExt) -> None:
        self._call(self._value.ack, message)

    def ack_many(self, messages: Sequence[MessageExt]) -> None:
        self._call(self._value.ack_many, messages)

    def change_invisible_duration(self, message: MessageExt, invisible_s: float) -> None:
        self._call(self._value.change_invisible_duration, message, invisible_s)


class PushConsumer(_Blocking[push_consumer.PushConsumer]):
    """hamq.client.PushConsumer, blocking; the handler is a plain function.

    consumer = PushConsumer("my-group", namesrv="127.0.0.1:9876")
    consumer.subscribe("demo")
    consumer.start(lambda messages: print(messages))
    ...
    consumer.shutdown()
    """

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876",
        *,
        consume_thread_max: int = 20,
        **options: Any,
    ) -> None:
        self._async = push_consumer.PushConsumer(
            group, namesrv, consume_thread_max=consume_thread_max, **options
        )
        self._handler: Callable[[list[MessageExt]], ConsumeResult | None] | None = None
        self._loop = _LoopThread(f"hamq-push-{group}", self._consuming)

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._async.subscribe(topic, expression)

    @asynccontextmanager
    async def _consuming(self) -> AsyncIterator[push_consumer.PushConsumer]:
        # a plain function: the async consumer runs it in its worker threads
        assert self._handler is not None
        async with self._async.consuming(self._handler) as running:
            yield running

    def start(  # type: ignore[override]
        self, handler: Callable[[list[MessageExt]], ConsumeResult | None]
    ) -> PushConsumer:
        """Start consuming; returns after the first rebalance."""
        if not callable(handler):
            raise InvalidArgumentError(f"the handler {handler!r} is not callable")
        self._handler = handler
        self._loop.start()
        return self

    def __enter__(self) -> Any:
        raise ClientError("start a PushConsumer with start(handler); shutdown() stops it")

    @property
    def assigned(self) -> list[MessageQueue]:
        return self._read(lambda: self._value.assigned)

    def statistics(self) -> push_consumer.PushConsumerStatistics:
        return self._read(self._value.statistics)


class AdminClient(_Blocking[admin.AdminClient]):
    """hamq.client.AdminClient, blocking. Same arguments."""

    def __init__(
        self, namesrv: str | Sequence[str] | ClientConfig = "127.0.0.1:9876", **options: Any
    ) -> None:
        self._async = admin.AdminClient(namesrv, **options)
        self._loop = _LoopThread("hamq-admin", lambda: self._async)

    def cluster_info(self) -> ClusterInfo:
        return self._call(self._value.cluster_info)

    def topic_list(self) -> list[str]:
        return self._call(self._value.topic_list)

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._call(self._value.topic_route, topic)

    def queue_status(self, topic: str) -> list[QueueStatus]:
        return self._call(self._value.queue_status, topic)

    def create_topic(self, topic: str, queue_nums: int = 8, **options: Any) -> list[str]:
        return self._call(self._value.create_topic, topic, queue_nums, **options)

    def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        return self._call(self._value.delete_topic, topic, cluster=cluster)
