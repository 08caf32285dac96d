"""SendBack: a push consumer's failed messages, sent back to be delivered again.

A message the handler failed (RECONSUME_LATER, or it raised) in concurrent mode, or
one past ``max_reconsume_times`` in orderly mode (to the DLQ), goes back to the
broker, one message at a time, the first way that takes it:

1. CONSUMER_SEND_MSG_BACK to the current master of the broker group the message was
   pulled from (by broker name, as RocketMQ's client does: after a failover the
   message's store host may be a slave; the store host when no master is known). The
   broker stores it in ``%RETRY%group`` with a delay that grows with each attempt, or
   in ``%DLQ%group`` past the maximum reconsume times.
2. After the first failure of a call, once: the topic's route is looked up again and,
   if it names another master, the request goes there (a batch asks the nameserver
   once).
3. Else RocketMQ's fallback: the message, as a new one (``retry_message``), to
   ``%RETRY%group`` through a producer of the client's own (INNER_PRODUCER_GROUP),
   started on first use in the run's task group and stopped with it.

What neither way took is returned to the caller, which handles it again after a
pause. A SendBack lives for one run of its consumer (hamq/client/push_run.py): it is
made with the run's client instance and task group and dropped with them.
``retry_message`` and ``original_topic`` are pure.
"""

from __future__ import annotations

import contextlib
import logging

import anyio
import anyio.abc
import attrs

from hamq.client.errors import NETWORK_ERRORS
from hamq.client.instance import ClientInstance
from hamq.client.message import Message, MessageExt
from hamq.client.producer import Producer
from hamq.protocol import RequestCode
from hamq.protocol.bodies import MessageQueue
from hamq.protocol.headers import ConsumerSendMsgBackRequestHeader
from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT,
    is_retry_topic,
    retry_topic,
)

log = logging.getLogger(__name__)

#: the producer group of the producer that sends retries no broker took back (Java's)
INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
#: a retry sent through that producer waits this delay level plus its reconsume times
RETRY_BASE_DELAY_LEVEL = 3


def original_topic(message: MessageExt) -> MessageExt:
    """A message from the retry topic shows its original topic, as RocketMQ's do."""
    original = message.properties.get(PROPERTY_RETRY_TOPIC)
    if original and is_retry_topic(message.topic):
        return attrs.evolve(message, topic=original)
    return message


def retry_message(
    message: MessageExt, group: str, max_reconsume_times: int, delay_level: int
) -> Message:
    """RocketMQ's fallback when no broker takes a send-back: ``message`` as a new one to
    ``group``'s retry topic, with RETRY_TOPIC, ORIGIN_MESSAGE_ID and reconsume times + 1;
    delayed by ``delay_level`` when positive, else by level 3 + reconsume times (0 is
    "the broker's choice"). ``delay_level`` -1 sends it to the DLQ: its reconsume times
    are past ``max_reconsume_times`` (at least 0), which the broker takes as the DLQ's.
    ``max_reconsume_times`` -1: the broker's default (no MAX_RECONSUME_TIMES property)."""
    original = original_topic(message)
    properties = dict(message.properties)
    tags = properties.pop(PROPERTY_TAGS, None)
    keys = properties.pop(PROPERTY_KEYS, "")
    wait = properties.pop(PROPERTY_WAIT, None) != "false"
    for name in (PROPERTY_DELAY, PROPERTY_TRANSACTION_PREPARED):
        properties.pop(name, None)
    properties[PROPERTY_RETRY_TOPIC] = original.topic
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
    if delay_level < 0:
        most = max(max_reconsume_times, 0)
        reconsume, level = most + 1, 0
    else:
        most = max_reconsume_times
        reconsume = message.reconsume_times + 1
        # 0 is a value here, not a missing one: the broker's choice, 3 + reconsume times
        level = delay_level if delay_level > 0 else RETRY_BASE_DELAY_LEVEL + message.reconsume_times
    properties[PROPERTY_RECONSUME_TIME] = str(reconsume)
    if most >= 0:
        properties[PROPERTY_MAX_RECONSUME_TIMES] = str(most)
    return Message(
        retry_topic(group),
        message.body,
        tags=tags,
        keys=keys,
        flag=message.flag,
        delay_level=level,
        wait_store_msg_ok=wait,
        properties=properties,
    )


class SendBack:
    """The send-back of one consumer run (the module doc)."""

    def __init__(
        self,
        instance: ClientInstance,
        group: str,
        max_reconsume_times: int,
        nursery: anyio.abc.TaskGroup,
    ) -> None:
        self._instance = instance
        self._group = group
        self._max_reconsume_times = max_reconsume_times
        #: where the retry producer runs: the run's task group
        self._nursery = nursery
        #: sends the retries no broker took back; started when first needed
        self._producer: Producer | None = None
        self._producer_lock = anyio.Lock()

    async def send_back(
        self, queue: MessageQueue, messages: list[MessageExt], *, delay_level: int
    ) -> list[MessageExt]:
        """Send each message (pulled from ``queue``) back for a retry (``delay_level``
        0: the broker's choice; -1: to the DLQ), each the first way that takes it (the
        module doc). Returns the messages neither way took; raises nothing a server
        does (failures are logged)."""
        instance = self._instance
        failed = []
        looked_up = False
        for message in messages:
            try:
                addr = self._addr(queue, message)
                try:
                    await self._send_msg_back(addr, message, delay_level)
                except NETWORK_ERRORS as exc:
                    if looked_up:
                        raise
                    looked_up = True  # (once per call: a batch asks the nameserver once)
                    log.info("sending %s back to %s failed: %s", message.msg_id, addr, exc)
                    with contextlib.suppress(*NETWORK_ERRORS):
                        await instance.update_route(queue.topic)
                    master = instance.broker_addr(queue.broker_name, only_this=True)
                    if master is None or master == addr:
                        raise
                    await self._send_msg_back(master, message, delay_level)
            except NETWORK_ERRORS as exc:
                log.warning(
                    "sending %s back for retry failed (%s); sending it to %s instead",
                    message.msg_id,
                    exc,
                    retry_topic(self._group),
                )
                try:
                    await self._send_to_retry_topic(message, delay_level)
                except NETWORK_ERRORS as again:
                    log.warning("sending %s to the retry topic failed: %s", message.msg_id, again)
                    failed.append(message)
        return failed

    def _addr(self, queue: MessageQueue, message: MessageExt) -> str:
        """The master of ``queue``'s broker group (RocketMQ's client: by broker name;
        after a failover the message's store host may be a slave), else the store host."""
        master = self._instance.broker_addr(queue.broker_name, only_this=True)
        return master or message.store_host

    async def _send_msg_back(self, addr: str, message: MessageExt, delay_level: int) -> None:
        """CONSUMER_SEND_MSG_BACK of ``message`` to ``addr``; NETWORK_ERRORS if it fails."""
        instance = self._instance
        most = self._max_reconsume_times
        header = ConsumerSendMsgBackRequestHeader(
            offset=message.physical_offset,
            group=self._group,
            delay_level=delay_level,
            origin_msg_id=message.msg_id,
            origin_topic=original_topic(message).topic,
            max_reconsume_times=most if most >= 0 else None,
        )
        await instance.invoke_ok(addr, instance.request(RequestCode.CONSUMER_SEND_MSG_BACK, header))

    async def _send_to_retry_topic(self, message: MessageExt, delay_level: int) -> None:
        """``retry_message`` of ``message``, sent through the retry producer."""
        retry = retry_message(message, self._group, self._max_reconsume_times, delay_level)
        producer = await self._retry_producer()
        await producer.send(retry)

    async def _retry_producer(self) -> Producer:
        """The producer of the retries no broker took back, started on first use in
        the run's task group (it stops with the run)."""
        async with self._producer_lock:
            if self._producer is None:
                self._producer = await self._nursery.start(self._run_producer)
            return self._producer

    async def _run_producer(self, *, task_status: anyio.abc.TaskStatus[Producer]) -> None:
        async with Producer(INNER_PRODUCER_GROUP, self._instance.config) as producer:
            task_status.started(producer)
            await anyio.sleep_forever()
