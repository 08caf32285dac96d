"""Requests the broker sends its consumers for operators (RocketMQ's Broker2Client).

- RESET_CONSUMER_CLIENT_OFFSET (220), oneway: the group's offsets in a topic were
  reset; each member drops what it had pulled of the queues named and goes on from the
  offsets given. The body is ResetOffsetBody, or for a C++ client (which cannot read
  inline object keys) ResetOffsetBodyForC.
- GET_CONSUMER_STATUS_FROM_CLIENT (221): a member's own offsets in a topic.

Each request goes over the member's own connection (the one its heartbeat came on),
in the serialize type it speaks, bounded by CLIENT_CALL_TIMEOUT_S; a member that
cannot be reached is logged and skipped, never an error for the whole group.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from hamq.broker.clients import ClientChannel
from hamq.protocol import LanguageCode, RemotingCommand, RequestCode, SerializeType
from hamq.protocol.bodies import (
    GetConsumerStatusBody,
    MessageQueue,
    MessageQueueForC,
    ResetOffsetBody,
    ResetOffsetBodyForC,
    decode_body,
    encode_body,
)
from hamq.protocol.errors import RequestError
from hamq.protocol.headers import GetConsumerStatusRequestHeader, ResetOffsetRequestHeader
from hamq.remoting import RemotingError

log = logging.getLogger(__name__)

#: how long one request to a client may take (RocketMQ: 5 s)
CLIENT_CALL_TIMEOUT_S = 5.0


def _request(channel: ClientChannel, code: int, header: object, body: bytes) -> RemotingCommand:
    return RemotingCommand.request(
        code,
        header,
        body=body,
        oneway=code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
        # as the client speaks (its heartbeat said); JSON every client reads
        serialize_type=channel.connection.attributes.get("serialize_type", SerializeType.JSON),
    )


def reset_body(channel: ClientChannel, offsets: Mapping[MessageQueue, int]) -> bytes:
    """RESET_CONSUMER_CLIENT_OFFSET's body in the form ``channel``'s client reads."""
    if channel.language is LanguageCode.CPP:
        listed = [
            MessageQueueForC(q.topic, q.broker_name, q.queue_id, offset)
            for q, offset in offsets.items()
        ]
        return encode_body(ResetOffsetBodyForC(listed))
    return encode_body(ResetOffsetBody(dict(offsets)))


async def tell_reset(
    channels: list[ClientChannel],
    header: ResetOffsetRequestHeader,
    offsets: Mapping[MessageQueue, int],
) -> int:
    """Tell each member of a group its offsets in a topic were reset; how many were
    told (sent to: the request is oneway)."""
    told = 0
    for channel in channels:
        request = _request(
            channel, RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header, reset_body(channel, offsets)
        )
        try:
            await channel.connection.invoke_oneway(request, CLIENT_CALL_TIMEOUT_S)
        except RemotingError as exc:
            log.warning(
                "telling %s of group %s its offsets were reset failed: %s",
                channel.client_id,
                header.group,
                exc,
            )
            continue
        log.info("told %s of group %s: %s reset", channel.client_id, header.group, header.topic)
        told += 1
    return told


async def consumer_status(
    channels: list[ClientChannel], header: GetConsumerStatusRequestHeader
) -> dict[str, dict[MessageQueue, int]]:
    """Each member's offsets in ``header.topic`` as it holds them (client id -> queue ->
    offset); members that do not answer are left out."""
    found: dict[str, dict[MessageQueue, int]] = {}
    for channel in channels:
        if header.client_addr and header.client_addr not in (
            channel.client_id,
            channel.connection.peer,
        ):
            continue
        request = _request(channel, RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, header, b"")
        try:
            response = await channel.connection.invoke(request, CLIENT_CALL_TIMEOUT_S)
            if response.code == 0 and response.body:
                body = decode_body(GetConsumerStatusBody, response.body)
                found[channel.client_id] = body.message_queue_table
        except (RemotingError, RequestError) as exc:
            log.info("status of %s of group %s: %s", channel.client_id, header.group, exc)
    return found
