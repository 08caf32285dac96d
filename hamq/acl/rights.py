"""What a request needs: the admin flag, and a permission on each topic and group it
touches (PlainAccessValidator.parse, with hamq's additions marked).

Resources, by request code (wire field names in quotes):

    SEND_MESSAGE 10, SEND_MESSAGE_V2 310, SEND_BATCH_MESSAGE 320 (hamq: RocketMQ forgot 320)
                                 PUB on the topic ("topic" / "b"); a retry topic
                                 %RETRY%G is group G's: SUB on the group (a consumer
                                 sending a message back); %DLQ%G is a topic like any other
    CONSUMER_SEND_MSG_BACK 36    SUB on the group ("group")
    PULL_MESSAGE 11              SUB on the topic ("topic"; a retry topic: its group) and
                                 on the group ("consumerGroup")
    QUERY_MESSAGE 12             SUB on the topic
    HEART_BEAT 34                SUB on every consumer group of the body and on each topic
                                 it subscribes to
    UNREGISTER_CLIENT 35, GET_CONSUMER_LIST_BY_GROUP 38
                                 SUB on the group ("consumerGroup"; an empty one is none)
    QUERY_CONSUMER_OFFSET 14 (hamq), UPDATE_CONSUMER_OFFSET 15
                                 SUB on the group and on the topic

Admin codes (the account's ``admin`` flag): RocketMQ's five (UPDATE_AND_CREATE_TOPIC,
UPDATE_BROKER_CONFIG, DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
DELETE_SUBSCRIPTIONGROUP) and hamq's: what resets offsets, deletes or changes
cluster state (INVOKE_BROKER_TO_RESET_OFFSET, DELETE_TOPIC_IN_NAMESRV, the nameserver's
REGISTER_BROKER / UNREGISTER_BROKER / BROKER_HEARTBEAT, the controller's
REGISTER_BROKER / APPLY_BROKER_ID / ALTER_SYNC_STATE_SET / ELECT_MASTER, ...). A broker
therefore signs with an admin account.

Policies: a broker checks every request (RocketMQ's broker does); a nameserver or a
controller checks only the admin codes: routes, cluster info and the controllers'
read-outs stay readable by anyone who reaches the port.

Pure: a body or header that does not decode adds no resource (the request's own
processor refuses it).
"""

from __future__ import annotations

import attrs

from hamq.acl.permission import Perm
from hamq.protocol import RemotingCommand, RequestCode
from hamq.protocol.bodies import HeartbeatData, decode_body
from hamq.protocol.message import RETRY_GROUP_TOPIC_PREFIX

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
    }
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
        return Needs(admin, tuple(_resources(request)))


BROKER_POLICY = AclPolicy("broker", check_all=True)
NAMESERVER_POLICY = AclPolicy("nameserver", check_all=False)
CONTROLLER_POLICY = AclPolicy("controller", check_all=False)


def _topic(topic: str | None, perm: Perm) -> list[Resource]:
    if not topic:
        return []
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return _group(topic.removeprefix(RETRY_GROUP_TOPIC_PREFIX), Perm.SUB)
    return [Resource("topic", topic, perm)]


def _group(group: str | None, perm: Perm = Perm.SUB) -> list[Resource]:
    return [Resource("group", group, perm)] if group else []


def _heartbeat(request: RemotingCommand) -> list[Resource]:
    try:
        data = decode_body(HeartbeatData, request.body)
    except Exception:  # (the processor says what is wrong with it)
        return []
    found: list[Resource] = []
    for consumer in data.consumer_data_set:
        found += _group(consumer.group_name)
        for subscription in consumer.subscription_data_set:
            found += _topic(subscription.topic, Perm.SUB)
    return found


def _resources(request: RemotingCommand) -> list[Resource]:
    fields = request.ext_fields
    code = request.code
    if code in (
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
    ):
        return _topic(fields.get("b", fields.get("topic")), Perm.PUB)
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return _group(fields.get("group"))
    if code == RequestCode.PULL_MESSAGE:
        return _topic(fields.get("topic"), Perm.SUB) + _group(fields.get("consumerGroup"))
    if code == RequestCode.QUERY_MESSAGE:
        return _topic(fields.get("topic"), Perm.SUB)
    if code == RequestCode.HEART_BEAT:
        return _heartbeat(request)
    if code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        return _group(fields.get("consumerGroup"))
    if code in (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET):
        return _group(fields.get("consumerGroup")) + _topic(fields.get("topic"), Perm.SUB)
    return []
