"""BrokerRequests: what brokers ask of a client, over the client's own connections.

Registered on the client instance's dispatcher (hamq/client/instance.py); each
handler runs in the connection's reader, so none blocks: it hands the request to the
consumer or transaction producer it names, which does the work in its own tasks.

- NOTIFY_CONSUMER_IDS_CHANGED (oneway): the group's consumer rebalances at once;
- RESET_CONSUMER_CLIENT_OFFSET (oneway; an operator reset the group's offsets in a
  topic, e.g. ``hamq admin reset-offset``): the group's consumer goes on from the
  offsets given in the queues it holds (the broker has committed them already);
- GET_CONSUMER_STATUS_FROM_CLIENT: the group's consumer's offsets in a topic
  (GetConsumerStatusBody; empty when no consumer of the group runs here);
- CHECK_TRANSACTION_STATE (oneway): what became of a half message's local transaction;
  decoded here (header, and the message in the body) and handed, without blocking, to
  the TransactionProducer of the message's PGROUP group, which answers END_TRANSACTION
  over the same connection (hamq.client.transaction); dropped with a log line when no
  such producer runs here or the body does not decode.

A request for a group with no consumer here is answered (or dropped, oneway) and
logged; nothing is kept of it. The registries (``consumers``,
``transaction_producers``) are the client instance's: consumers and transaction
producers add themselves while they run.
"""

from __future__ import annotations

import logging
from typing import Protocol

from hamq.client.message import inflate
from hamq.protocol import RemotingCommand, RequestCode, RequestError
from hamq.protocol.bodies import (
    ConsumerData,
    GetConsumerStatusBody,
    MessageQueue,
    decode_reset_offsets,
    encode_body,
)
from hamq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    GetConsumerStatusRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    ResetOffsetRequestHeader,
)
from hamq.protocol.message import PROPERTY_PRODUCER_GROUP
from hamq.protocol.record import StoredMessage, decode_message
from hamq.remoting import Connection, Dispatcher

log = logging.getLogger(__name__)


class GroupMember(Protocol):
    """A consumer as the instance sees it."""

    def consumer_data(self) -> ConsumerData: ...

    def members_changed(self) -> None: ...

    def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Go on from ``offsets`` in the queues of ``topic`` it holds (soon: it may have
        to stop handling what it pulled first)."""

    def consume_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """Its offsets (next to consume) in the queues of ``topic`` it holds."""


class TransactionChecker(Protocol):
    """A transaction producer as the instance sees it."""

    def check_requested(
        self, header: CheckTransactionStateRequestHeader, message: StoredMessage, conn: Connection
    ) -> None:
        """Take a broker's check of a half message of its group (in the connection's
        reader: it must not block)."""


class BrokerRequests:
    """The handlers of what brokers ask (the module doc), over the client instance's
    registries of consumers and transaction producers, by group."""

    def __init__(
        self,
        consumers: dict[str, GroupMember],
        transaction_producers: dict[str, TransactionChecker],
    ) -> None:
        self._consumers = consumers
        self._transaction_producers = transaction_producers

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._notified)
        dispatcher.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._reset_offsets)
        dispatcher.register(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, self._consumer_status)
        dispatcher.register(RequestCode.CHECK_TRANSACTION_STATE, self._check_transaction)

    def _notified(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        header = request.header(NotifyConsumerIdsChangedRequestHeader)
        member = self._consumers.get(header.consumer_group)
        if member is not None:
            log.info("broker %s: members of %s changed", conn.peer, header.consumer_group)
            member.members_changed()
        return None if request.is_oneway else request.response_to()

    def _reset_offsets(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        header = request.header(ResetOffsetRequestHeader)
        offsets = decode_reset_offsets(request.body)
        member = self._consumers.get(header.group)
        if member is None:
            log.info(
                "broker %s reset the offsets of %s: no such consumer here", conn.peer, header.group
            )
        else:
            log.info(
                "broker %s reset the offsets of %s in %s: %s",
                conn.peer,
                header.group,
                header.topic,
                ", ".join(f"{q} -> {o}" for q, o in sorted(offsets.items(), key=str)),
            )
            member.reset_offsets(header.topic, offsets)
        return None if request.is_oneway else request.response_to()

    def _check_transaction(
        self, request: RemotingCommand, conn: Connection
    ) -> RemotingCommand | None:
        answer = None if request.is_oneway else request.response_to()
        try:
            header = request.header(CheckTransactionStateRequestHeader)
            message = inflate(decode_message(request.body, check_crc=False))
        except (RequestError, ValueError) as exc:  # (MessageFormatError is a ValueError)
            log.warning(
                "broker %s sent a transaction check that does not decode (dropped): %s",
                conn.peer,
                exc,
            )
            return answer
        group = message.properties.get(PROPERTY_PRODUCER_GROUP)
        producer = self._transaction_producers.get(group) if group else None
        if producer is None:
            log.info(
                "broker %s asked about transaction %s of producer group %s: no such "
                "transaction producer here (dropped)",
                conn.peer,
                message.msg_id,
                group or "(none given)",
            )
            return answer
        producer.check_requested(header, message, conn)
        return answer

    def _consumer_status(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetConsumerStatusRequestHeader)
        member = self._consumers.get(header.group)
        offsets = member.consume_offsets(header.topic) if member is not None else {}
        return request.response_to(body=encode_body(GetConsumerStatusBody(offsets)))
