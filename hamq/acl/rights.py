"""What a request needs: the admin flag, and a permission on each topic and group it
touches (PlainAccessValidator.parse, with hamq's additions marked).

Resources, by request code (wire field names in quotes):

    SEND_MESSAGE 10, SEND_MESSAGE_V2 310, SEND_BATCH_MESSAGE 320 (hamq: RocketMQ forgot 320)
                                 PUB on the topic the broker stores to: the header as
                                 the send processor decodes it (decode_send_header:
                                 "topic" for 10, "b" for 310/320); a retry topic
                                 %RETRY%G is group G's: SUB on the group (a consumer
                                 sending a message back); %DLQ%G is a topic like any other
    CONSUMER_SEND_MSG_BACK 36    SUB on the group ("group"), and (hamq) SUB on the topic
                                 of the message at "offset": the broker copies that
                                 message, whatever its topic, into the group's retry
                                 topic, where the group may pull it (``message_offset``;
                                 check.py asks the broker for the topic)
    PULL_MESSAGE 11              SUB on the topic ("topic"; a retry topic: its group) and
                                 on the group ("consumerGroup")
    END_TRANSACTION 37 (hamq)    PUB on the topic of the half message at
                                 "commitLogOffset" (its real topic: the broker tells,
                                 ``message_offset``); RocketMQ checks only the signature,
                                 so any account could commit another's transaction
    QUERY_MESSAGE 12             SUB on the topic
    HEART_BEAT 34                SUB on every consumer group of the body and on each topic
                                 it subscribes to
    UNREGISTER_CLIENT 35, GET_CONSUMER_LIST_BY_GROUP 38
                                 SUB on the group ("consumerGroup"; an empty one is none)
    QUERY_CONSUMER_OFFSET 14 (hamq), UPDATE_CONSUMER_OFFSET 15
                                 SUB on the group and on the topic
    LOCK_BATCH_MQ 41, UNLOCK_BATCH_MQ 42 (hamq)
                                 SUB on the body's consumerGroup: a stranger's lock would
                                 keep the group's orderly consumers off those queues
    POP_MESSAGE 200050, ACK_MESSAGE 200051, CHANGE_MESSAGE_INVISIBLETIME 200053,
    NOTIFICATION 200054, POLLING_INFO 200055
                                 SUB on the topic ("topic"; the group's own pop retry
                                 topic %RETRY%G_T or %RETRY%G+T: T) and on the group
                                 ("consumerGroup")
    BATCH_ACK_MESSAGE 200151     the same for each ack of the body ("c" and "t")

Admin codes (the account's ``admin`` flag): RocketMQ's five (UPDATE_AND_CREATE_TOPIC,
UPDATE_BROKER_CONFIG, DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
DELETE_SUBSCRIPTIONGROUP) and hamq's: what resets offsets, deletes or changes
cluster state (INVOKE_BROKER_TO_RESET_OFFSET, DELETE_TOPIC_IN_NAMESRV, the nameserver's
REGISTER_BROKER / UNREGISTER_BROKER / BROKER_HEARTBEAT, the controller's
REGISTER_BROKER / APPLY_BROKER_ID / ALTER_SYNC_STATE_SET / ELECT_MASTER, ...), and
VIEW_MESSAGE_BY_ID, which reads any message of any topic by its commit-log offset
(operators' ``hamq admin query-message --id``). A broker therefore signs with an
admin account.

Policies: a broker checks every request (RocketMQ's broker does); a nameserver or a
controller checks only the admin codes: routes, cluster info and the controllers'
read-outs stay readable by anyone who reaches the port.

Resources are read from what the processors act on, never from a field they ignore:
a send's topic is decoded by the send processor's own decoder (a SEND_MESSAGE carrying
a "b" field, or a SEND_MESSAGE_V2 whose fast decoding falls back to the renamed
fields, must be checked on the topic it is stored to). Pure: a header or body that
does not decode adds no resource (the request's own processor refuses it with the same
decoder's error); any other exception propagates, and the dispatcher then refuses the
request.
"""

from __future__ import annotations

import json

import attrs

from hamq.acl.permission import Perm
from hamq.protocol import RemotingCommand, RequestCode, RequestError
from hamq.protocol.bodies import (
    HeartbeatData,
    LockBatchRequestBody,
    UnlockBatchRequestBody,
    decode_body,
)
from hamq.protocol.headers import ConsumerSendMsgBackRequestHeader, EndTransactionRequestHeader
from hamq.protocol.message import RETRY_GROUP_TOPIC_PREFIX
from hamq.protocol.send_fields import decode_send_header

#: RocketMQ's TopicValidator.RMQ_SYS_TRACE_TOPIC: anyone signed may publish traces
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"

ADMIN_CODES = frozenset(
    {
        # RocketMQ's Permission.ADMIN_CODE
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        # hamq's: the rest of what changes a broker, a nameserver or a controller
        RequestCode.UPDATE_AND_CREATE_TOPIC_LIST,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        RequestCode.TRIGGER_DELETE_FILES,
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.BROKER_HEARTBEAT,
        RequestCode.QUERY_DATA_VERSION,  # (it keeps a broker alive in the nameserver)
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
        RequestCode.CONTROLLER_REGISTER_BROKER,
        RequestCode.CONTROLLER_APPLY_BROKER_ID,
        RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
        RequestCode.CONTROLLER_ELECT_MASTER,
        RequestCode.UPDATE_CONTROLLER_CONFIG,
        RequestCode.CLEAN_BROKER_DATA,
        # reads any message by its commit-log offset, whatever its topic
        RequestCode.VIEW_MESSAGE_BY_ID,
    }
)

_POP_CODES = frozenset(
    {
        RequestCode.POP_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        RequestCode.NOTIFICATION,
        RequestCode.POLLING_INFO,
    }
)
_SEND_CODES = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)


@attrs.frozen
class Resource:
    kind: str  # "topic" or "group"
    name: str
    perm: Perm


@attrs.frozen
class Needs:
    admin: bool = False
    resources: tuple[Resource, ...] = ()
    #: the commit-log offset of a stored message the request reads (SUB on its topic)
    #: or ends the transaction of (PUB on its real topic): ``message_perm``
    message_offset: int | None = None
    message_perm: Perm = Perm.SUB


@attrs.frozen
class AclPolicy:
    """Which requests a server checks: all of them, or only the admin codes."""

    name: str
    check_all: bool

    def needs(self, request: RemotingCommand) -> Needs | None:
        """What ``request`` needs, or None: it is not checked here."""
        admin = request.code in ADMIN_CODES
        if not admin and not self.check_all:
            return None
        message_perm = Perm.PUB if request.code == RequestCode.END_TRANSACTION else Perm.SUB
        return Needs(admin, tuple(_resources(request)), _message_offset(request), message_perm)


BROKER_POLICY = AclPolicy("broker", check_all=True)
NAMESERVER_POLICY = AclPolicy("nameserver", check_all=False)
CONTROLLER_POLICY = AclPolicy("controller", check_all=False)


def topic_resources(topic: str | None, perm: Perm) -> list[Resource]:
    """What ``perm`` on ``topic`` needs: the topic's, or a retry topic's group's SUB."""
    if not topic:
        return []
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return _group(topic.removeprefix(RETRY_GROUP_TOPIC_PREFIX), Perm.SUB)
    return [Resource("topic", topic, perm)]


def _group(group: str | None, perm: Perm = Perm.SUB) -> list[Resource]:
    return [Resource("group", group, perm)] if group else []


def _send(request: RemotingCommand) -> list[Resource]:
    try:
        header = decode_send_header(request.ext_fields, v2=request.code != RequestCode.SEND_MESSAGE)
    except RequestError:  # (the send processor says what is wrong with it)
        return []
    return topic_resources(header.topic, Perm.PUB)


def _heartbeat(request: RemotingCommand) -> list[Resource]:
    try:
        data = decode_body(HeartbeatData, request.body)
    except RequestError:  # (the processor says what is wrong with it)
        return []
    found: list[Resource] = []
    for consumer in data.consumer_data_set:
        found += _group(consumer.group_name)
        for subscription in consumer.subscription_data_set:
            found += topic_resources(subscription.topic, Perm.SUB)
    return found


def _lock(request: RemotingCommand) -> list[Resource]:
    try:
        if request.code == RequestCode.LOCK_BATCH_MQ:
            group = decode_body(LockBatchRequestBody, request.body).consumer_group
        else:
            group = decode_body(UnlockBatchRequestBody, request.body).consumer_group
    except RequestError:  # (the processor says what is wrong with it)
        return []
    return _group(group)


def _popped(group: str | None, topic: str | None) -> list[Resource]:
    """SUB on a pop's group and topic; the group's own pop retry topic counts as the
    topic it retries (its messages are the group's, of that topic)."""
    if group and topic:
        for separator in "_+":
            prefix = f"{RETRY_GROUP_TOPIC_PREFIX}{group}{separator}"
            if topic.startswith(prefix):
                topic = topic[len(prefix) :]
                break
    return topic_resources(topic, Perm.SUB) + _group(group)


def _batch_ack(request: RemotingCommand) -> list[Resource]:
    try:
        acks = json.loads(request.body or b"{}").get("acks") or []
        named = [(a.get("c", a.get("consumerGroup")), a.get("t", a.get("topic"))) for a in acks]
    except (ValueError, AttributeError, TypeError):  # (the processor says what is wrong)
        return []
    return [
        resource
        for group, topic in named
        for resource in _popped(str(group) if group else None, str(topic) if topic else None)
    ]


def _message_offset(request: RemotingCommand) -> int | None:
    try:
        if request.code == RequestCode.CONSUMER_SEND_MSG_BACK:
            return request.header(ConsumerSendMsgBackRequestHeader).offset
        if request.code == RequestCode.END_TRANSACTION:
            return request.header(EndTransactionRequestHeader).commit_log_offset
    except RequestError:  # (the processor says what is wrong with it)
        return None
    return None


def _resources(request: RemotingCommand) -> list[Resource]:
    fields = request.ext_fields
    code = request.code
    if code in _SEND_CODES:
        return _send(request)
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return _group(fields.get("group"))
    if code == RequestCode.PULL_MESSAGE:
        return topic_resources(fields.get("topic"), Perm.SUB) + _group(fields.get("consumerGroup"))
    if code == RequestCode.QUERY_MESSAGE:
        return topic_resources(fields.get("topic"), Perm.SUB)
    if code == RequestCode.HEART_BEAT:
        return _heartbeat(request)
    if code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        return _group(fields.get("consumerGroup"))
    if code in (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET):
        return _group(fields.get("consumerGroup")) + topic_resources(fields.get("topic"), Perm.SUB)
    if code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        return _lock(request)
    if code in _POP_CODES:
        return _popped(fields.get("consumerGroup"), fields.get("topic"))
    if code == RequestCode.BATCH_ACK_MESSAGE:
        return _batch_ack(request)
    return []
