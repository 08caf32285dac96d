"""ACL (RocketMQ ACL 1.0): signatures, the account file and its reloads, and refusals by
real brokers, nameservers and controllers on loopback for each family of request.

The signature is checked against RocketMQ's algorithm by known vectors: RFC 2202's
HMAC-SHA1 case (the primitive, base64 as AclSigner does), and two requests captured from
RocketMQ's C++ client (docs/PROTOCOL.md#rocketmq-clients), decoded by hamq's own JSON decoder, whose
Signature fields the client computed over its sorted ext fields and body.
"""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from cli.main import run_command
from hamq.acl import (
    BROKER_POLICY,
    CONTROLLER_POLICY,
    NAMESERVER_POLICY,
    AclFileError,
    AclGuard,
    AclPolicy,
    Credentials,
    Perm,
    Reason,
    Refusal,
    Secret,
    check,
    load_acl_file,
    parse_acl,
    parse_pattern,
    sign,
    signature,
    signature_matches,
)
from hamq.broker import BrokerNode, build_config
from hamq.client import (
    AdminClient,
    ClientError,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    SendError,
)
from hamq.controller import ControllerConfig, ControllerServer
from hamq.controller.metrics import ControllerCollector
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import (
    ClusterInfo,
    ConsumerData,
    HeartbeatData,
    LockBatchRequestBody,
    MessageQueue,
    RegisterBrokerBody,
    SubscriptionData,
    UnlockBatchRequestBody,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    BrokerHeartbeatRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    ElectMasterRequestHeader,
    EndTransactionRequestHeader,
    QueryConsumerOffsetRequestHeader,
    RegisterBrokerRequestHeader,
    ResetOffsetRequestHeader,
    UnregisterBrokerRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from hamq.protocol.message import parse_offset_msg_id
from hamq.protocol.serialization import decode_json_header
from hamq.remoting import Connection, Dispatcher, RemotingClient, RemotingConfig
from hamq.remoting.address import ip_of
from hamq.remoting.trio_stream import TrioByteStream
from tests.support.acl import ADMIN, APP, BROKER, acl_text, write_acl
from tests.support.brokers import (
    broker_config,
    invoke,
    pull_request,
    running_broker,
    running_nameserver,
    send_request,
)
from tests.support.cluster import READY_S, cluster_up
from tests.support.processes import HAMQ, ROOT, copy_profile, free_ports, user_env
from tests.support.timing import wait_for

# ====================================================================== signatures


def test_the_signature_is_base64_hmac_sha1_as_rocketmq_computes_it() -> None:
    # RFC 2202 test case 2: HMAC-SHA1("Jefe", "what do ya want for nothing?")
    # = effcdf6ae5eb2fa2d27416d5f184df9c259a7c79
    assert signature(b"what do ya want for nothing?", "Jefe") == "7/zfauXrL6LSdBbV8YTfnCWafHk="


#: requests RocketMQ's C++ client sent (empty credentials: its Signature is an HMAC with
#: an empty key over AccessKey "", OnsChannel "ALIYUN", the header fields and the body)
CAPTURED = [
    (
        b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
        b'"Signature":"N/YT7X6tJe5UfutmW+uNwTTJ7Fc=","topic":"TopicTest"},"flag":0,'
        b'"language":"CPP","opaque":0,"remark":"","version":63}\n',
        b"",
    ),
    (
        b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
        b'"Signature":"/6eBTC7IAbbWd2RMu95BRquKmlQ=","batch":"0",'
        b'"bornTimestamp":"1795267292855","defaultTopic":"TBW102","defaultTopicQueueNums":4,'
        b'"flag":0,"producerGroup":"PID_TEST","properties":"KEYS\\u0001key0\\u0002TAGS'
        b"\\u0001tagA\\u0002UNIQ_KEY\\u00010100007F0000EC70000037513A6F0100\\u0002WAIT"
        b'\\u0001true\\u0002myprop\\u0001v0\\u0002","queueId":0,"reconsumeTimes":"0",'
        b'"sysFlag":0,"topic":"TopicTest","unitMode":"0"},"flag":0,"language":"CPP",'
        b'"opaque":1,"remark":"","version":63}\n',
        b"hello-0",
    ),
]


@pytest.mark.parametrize(("header", "body"), CAPTURED)
def test_signatures_the_cpp_client_made_verify_and_any_change_breaks_them(
    header: bytes, body: bytes
) -> None:
    request = decode_json_header(header, body)
    assert signature_matches(request, "")  # (numbers such as queueId:0 signed as "0")
    assert not signature_matches(request, "another-secret")
    request.body = body + b"!"
    assert not signature_matches(request, "")
    request.body = body
    request.ext_fields["topic"] += "x"
    assert not signature_matches(request, "")


def test_signing_adds_the_keys_and_signing_again_replaces_the_signature() -> None:
    request = send_request("Demo", b"payload")
    sign(request, Credentials("access-key", "secret-key", security_token="token"))
    fields = request.ext_fields
    assert (fields["AccessKey"], fields["SecurityToken"]) == ("access-key", "token")
    assert signature_matches(request, "secret-key")
    # the content: every field's value but Signature's, by key, then the body
    values = "".join(fields[k] for k in sorted(fields) if k != "Signature")
    assert fields["Signature"] == signature(values.encode() + b"payload", "secret-key")
    first = fields["Signature"]
    fields["b"] = "Other"  # a retry to another topic
    sign(request, Credentials("access-key", "secret-key", security_token="token"))
    assert fields["Signature"] != first and signature_matches(request, "secret-key")
    # RocketMQ's checking side leaves _UNIQUE_KEY_QUERY out, its client signs it: both pass
    query = RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext_fields={"topic": "T"})
    query.ext_fields["_UNIQUE_KEY_QUERY"] = "true"
    sign(query, APP)
    assert signature_matches(query, APP.secret_key)
    query.ext_fields["Signature"] = signature(b"T", "x")
    assert not signature_matches(query, APP.secret_key)


def test_a_secret_never_shows_itself() -> None:
    secret = Secret("broker-secret")
    assert str(secret) == "******" and "broker-secret" not in repr(secret)
    assert secret.reveal() == "broker-secret" and secret == Secret("broker-secret")
    config = broker_config(Path("/nonexistent"), access_key="hamq-broker", secret_key="s3cret!!")
    assert "s3cret" not in repr(config) and config.credentials == Credentials(
        "hamq-broker", "s3cret!!"
    )


# ====================================================================== the file


def test_a_plain_acl_file_reads_as_rocketmq_writes_it() -> None:
    table = parse_acl(
        textwrap.dedent(
            """\
            globalWhiteRemoteAddresses:
              - 10.10.103.*
              - 192.168.0.{1,2}
            accounts:
              - accessKey: RocketMQ
                secretKey: 012345678
                whiteRemoteAddress:
                admin: false
                defaultTopicPerm: DENY
                defaultGroupPerm: SUB
                topicPerms:
                  - topicA=DENY
                  - topicB=PUB|SUB
                  - topicC=SUB
                groupPerms:
                  - groupA=DENY
                  - groupB=SUB|PUB
              - accessKey: rocketmq2
                secretKey: "12345678"
                whiteRemoteAddress: 192.168.1.*
                admin: true
            dataVersion:
              - counter: 1
                timestamp: 1
            """
        ),
        "test",
    )
    first, second = table.accounts["RocketMQ"], table.accounts["rocketmq2"]
    assert first.secret_key == "012345678"  # text, not an octal number
    assert first.topic_perms == {
        "topicA": Perm.DENY,
        "topicB": Perm.PUB | Perm.SUB,
        "topicC": Perm.SUB,
    }
    assert first.group_perms == {"groupA": Perm.DENY, "groupB": Perm.PUB | Perm.SUB}
    assert (first.default_topic_perm, first.default_group_perm) == (Perm.DENY, Perm.SUB)
    assert second.admin and not first.admin
    assert second.default_topic_perm == Perm.DENY  # absent: DENY
    assert second.white_remote_address.matches(ip_of("192.168.1.77"))
    assert not first.white_remote_address.matches(ip_of("192.168.1.77"))
    assert [p.text for p in table.global_white] == ["10.10.103.*", "192.168.0.{1,2}"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "is empty"),
        ("accounts: [\n", "not valid YAML"),
        ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "accounts[0].accessKey"),
        ("accounts:\n  - accessKey: abcdefgh\n", "secretKey is missing"),
        (
            "accounts:\n  - accessKey: abcdefgh\n    secretKey: 12345678\n    topicPerms:\n"
            "      - t=WRITE\n",
            "topicPerms[0]: permission 'WRITE' is not one of PUB, SUB, PUB|SUB or DENY",
        ),
        (
            "accounts:\n  - accessKey: abcdefgh\n    secretKey: 12345678\n    groupPerms:\n"
            "      - nothing\n",
            "is not name=PERM",
        ),
        (
            "accounts:\n  - accessKey: abcdefgh\n    secretKey: 12345678\n"
            "  - accessKey: abcdefgh\n    secretKey: 87654321\n",
            "accessKey abcdefgh is listed twice",
        ),
        ("accounts: []\nwhite: []\n", "unknown key(s) white"),
        ("globalWhiteRemoteAddresses:\n  - 300.1.1.*\n", "'300' is not within 0-255"),
        (
            "accounts:\n  - accessKey: abcdefgh\n    secretKey: 12345678\n    admin: maybe\n",
            "admin must be true or false",
        ),
    ],
)
def test_a_bad_acl_file_is_one_line_naming_the_file_and_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    with pytest.raises(AclFileError) as caught:
        load_acl_file(path)
    message = str(caught.value)
    assert message.startswith(f"ACL file {path}: ") and problem in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("", [], ["127.0.0.1"]),
        ("*", ["127.0.0.1", "::1"], []),
        ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1"]),
        ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101"]),
        ("10.*.*.*", ["10.9.8.7"], ["11.0.0.1"]),
        ("192.168.0.{1,2}", ["192.168.0.2"], ["192.168.0.3"]),
        ("127.0.0.1,::1", ["127.0.0.1", "::1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
        ("::1", ["0:0:0:0:0:0:0:1"], ["::2"]),
    ],
)
def test_whitelist_patterns(pattern: str, inside: list[str], outside: list[str]) -> None:
    parsed = parse_pattern(pattern)
    assert all(parsed.matches(ip_of(a)) for a in inside)
    assert not any(parsed.matches(ip_of(a)) for a in outside)


async def test_a_changed_file_is_read_again_and_a_bad_one_keeps_the_last_good_accounts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_acl(tmp_path / "plain_acl.yml", acl_text())
    guard = AclGuard(path, BROKER_POLICY, reload_interval_s=0.05)
    assert not await guard.reload_if_changed()  # unchanged: not read again
    async with trio.open_nursery() as nursery:
        await nursery.start(guard.run)
        write_acl(path, acl_text().replace("app-key1", "app-key2"))
        await wait_for(lambda: "app-key2" in guard.table.accounts, 5)
        good = guard.table
        write_acl(path, "accounts:\n  - accessKey: x\n")  # a typo
        await wait_for(lambda: guard.reload_failures >= 1, 5)
        path.unlink()  # deleted: the same
        await wait_for(lambda: guard.reload_failures >= 2, 5)
        assert guard.table is good and guard.reloads == 1
        nursery.cancel_scope.cancel()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(
        f"ACL file {path}: accounts[0].accessKey" in e and "keeping the 3 account(s)" in e
        for e in errors
    ), errors
    assert any("does not exist; keeping" in e for e in errors), errors


# ====================================================================== the decision


def _request(code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
    return RemotingCommand.request(code, ext_fields=dict(fields), body=body)


def _heartbeat(group: str, topic: str) -> bytes:
    data = HeartbeatData(
        "c1",
        consumer_data_set=[ConsumerData(group, subscription_data_set=[SubscriptionData(topic)])],
    )
    return encode_body(data)


def _lock(code: int, group: str) -> bytes:
    body = LockBatchRequestBody if code == RequestCode.LOCK_BATCH_MQ else UnlockBatchRequestBody
    return encode_body(body(group, "c1", [MessageQueue("Demo", "broker-a", 0)]))


def _send(topic: str, code: int = RequestCode.SEND_MESSAGE_V2, /, **more: str) -> dict[str, str]:
    """A whole send header's ext fields (``code``'s spelling), changed by ``more``."""
    return {**send_request(topic, code=code).ext_fields, **more}


LOCAL = ip_of("127.0.0.1")


@pytest.mark.parametrize(
    ("code", "fields", "body", "refusal"),
    [
        (RequestCode.SEND_MESSAGE_V2, _send("Demo"), b"x", None),
        (
            RequestCode.SEND_MESSAGE,
            _send("Other", RequestCode.SEND_MESSAGE),
            b"x",
            "No PUB permission for topic Other",
        ),
        # checked on the topic the broker stores to, never on a field it ignores: a
        # SEND_MESSAGE's "b", a SEND_MESSAGE_V2's "topic" (which its decoder takes when
        # the one-letter fields need its slow path: a negative bornTimestamp here)
        (
            RequestCode.SEND_MESSAGE,
            _send("Other", RequestCode.SEND_MESSAGE, b="Demo"),
            b"x",
            "No PUB permission for topic Other",
        ),
        (
            RequestCode.SEND_MESSAGE_V2,
            _send("Demo", g="-1", topic="Other"),
            b"x",
            "No PUB permission for topic Other",
        ),
        # a message sent back to a group's retry topic needs SUB on the group
        (RequestCode.SEND_MESSAGE_V2, _send("%RETRY%G"), b"", None),
        (RequestCode.SEND_MESSAGE_V2, _send("%RETRY%H"), b"", "No SUB permission for group H"),
        (
            RequestCode.SEND_BATCH_MESSAGE,
            _send("Other", RequestCode.SEND_BATCH_MESSAGE),
            b"",
            "No PUB permission for topic Other",
        ),
        # traces: anyone signed may publish them
        (RequestCode.SEND_MESSAGE_V2, _send("RMQ_SYS_TRACE_TOPIC"), b"", None),
        # a send whose header does not decode: the send processor refuses it
        (RequestCode.SEND_MESSAGE_V2, {"b": "Other"}, b"", None),
        # a stranger's lock would keep the group's orderly consumers off its queues
        (RequestCode.LOCK_BATCH_MQ, {}, _lock(RequestCode.LOCK_BATCH_MQ, "G"), None),
        (
            RequestCode.LOCK_BATCH_MQ,
            {},
            _lock(RequestCode.LOCK_BATCH_MQ, "H"),
            "No SUB permission for group H",
        ),
        (
            RequestCode.UNLOCK_BATCH_MQ,
            {},
            _lock(RequestCode.UNLOCK_BATCH_MQ, "H"),
            "No SUB permission for group H",
        ),
        # any message of any topic, by its offset: operators only
        (
            RequestCode.VIEW_MESSAGE_BY_ID,
            {"offset": "0"},
            b"",
            "is not admin (VIEW_MESSAGE_BY_ID)",
        ),
        (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "H"}, b"", "No SUB permission for group H"),
        (RequestCode.PULL_MESSAGE, {"topic": "Demo", "consumerGroup": "G"}, b"", None),
        (RequestCode.PULL_MESSAGE, {"topic": "%RETRY%G", "consumerGroup": "G"}, b"", None),
        (
            RequestCode.PULL_MESSAGE,
            {"topic": "Demo", "consumerGroup": "H"},
            b"",
            "No SUB permission for group H",
        ),
        (
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"topic": "Other", "consumerGroup": "G"},
            b"",
            "No SUB permission for topic Other",
        ),
        (
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"topic": "Demo", "consumerGroup": "H"},
            b"",
            "No SUB permission for group H",
        ),
        (RequestCode.POP_MESSAGE, {"topic": "Demo", "consumerGroup": "G"}, b"", None),
        (
            RequestCode.POP_MESSAGE,
            {"topic": "Other", "consumerGroup": "G"},
            b"",
            "No SUB permission for topic Other",
        ),
        (
            RequestCode.ACK_MESSAGE,
            {"topic": "Demo", "consumerGroup": "H"},
            b"",
            "No SUB permission for group H",
        ),
        # (an ack naming the group's own pop retry topic: its topic's right)
        (RequestCode.ACK_MESSAGE, {"topic": "%RETRY%G_Demo", "consumerGroup": "G"}, b"", None),
        (
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            {"topic": "%RETRY%G+Other", "consumerGroup": "G"},
            b"",
            "No SUB permission for topic Other",
        ),
        (
            RequestCode.NOTIFICATION,
            {"topic": "%RETRY%H", "consumerGroup": "G"},
            b"",
            "No SUB permission for group H",
        ),
        (RequestCode.POLLING_INFO, {"topic": "Demo", "consumerGroup": "G"}, b"", None),
        (RequestCode.BATCH_ACK_MESSAGE, {}, b'{"acks": [{"c": "G", "t": "Demo"}]}', None),
        (
            RequestCode.BATCH_ACK_MESSAGE,
            {},
            b'{"acks": [{"c": "G", "t": "Demo"}, {"consumerGroup": "H", "topic": "Demo"}]}',
            "No SUB permission for group H",
        ),
        (RequestCode.HEART_BEAT, {}, _heartbeat("G", "Demo"), None),
        (RequestCode.HEART_BEAT, {}, _heartbeat("G", "Other"), "for topic Other"),
        (RequestCode.UNREGISTER_CLIENT, {"consumerGroup": ""}, b"", None),  # a producer
        (RequestCode.GET_MAX_OFFSET, {"topic": "Other"}, b"", None),  # signed is enough
        (
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "Demo"},
            b"",
            "AccessKey app-key1 is not admin (UPDATE_AND_CREATE_TOPIC)",
        ),
        (
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "Demo", "group": "G"},
            b"",
            "is not admin (INVOKE_BROKER_TO_RESET_OFFSET)",
        ),
    ],
)
def test_what_the_broker_asks_of_a_signed_request(
    code: int, fields: dict[str, str], body: bytes, refusal: str | None
) -> None:
    table = parse_acl(acl_text(), "test")
    request = _request(code, fields, body)
    sign(request, APP)
    found = check(table, BROKER_POLICY, request, LOCAL)
    if refusal is None:
        assert found is None, found
    else:
        assert found is not None and refusal in found.remark, found


def test_who_gets_through_and_why_not() -> None:
    table = parse_acl(acl_text(white="['10.0.0.*']", app_white="127.0.0.3"), "test")
    send = _request(RequestCode.SEND_MESSAGE_V2, _send("Demo"), b"x")
    assert check(table, BROKER_POLICY, send, LOCAL) == Refusal(
        Reason.UNSIGNED, "No AccessKey: the request is not signed and 127.0.0.1 is not whitelisted"
    )
    assert check(table, BROKER_POLICY, send, ip_of("10.0.0.9")) is None  # global
    unknown = _request(RequestCode.SEND_MESSAGE_V2, _send("Demo"), b"x")
    sign(unknown, Credentials("nobody-at-all", "whatever"))
    assert check(table, BROKER_POLICY, unknown, LOCAL) == Refusal(
        Reason.UNKNOWN_ACCESS_KEY, "No account for AccessKey nobody-at-all"
    )
    forged = _request(RequestCode.SEND_MESSAGE_V2, _send("Demo"), b"x")
    sign(forged, Credentials(APP.access_key, "guessed-secret"))
    assert check(table, BROKER_POLICY, forged, LOCAL) == Refusal(
        Reason.BAD_SIGNATURE, "Signature check failed for AccessKey app-key1"
    )
    # the account's own whitelist: its key, from there, without a signature
    named = _request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"AccessKey": "app-key1"})
    assert check(table, BROKER_POLICY, named, ip_of("127.0.0.3")) is None
    refused = check(table, BROKER_POLICY, named, LOCAL)
    assert refused is not None and refused.reason is Reason.BAD_SIGNATURE
    # an admin account without topic or group lists may do anything
    anything = _request(RequestCode.PULL_MESSAGE, {"topic": "X", "consumerGroup": "Y"})
    sign(anything, ADMIN)
    assert check(table, BROKER_POLICY, anything, LOCAL) is None


def _send_back(offset: int, group: str = "G") -> RemotingCommand:
    header = ConsumerSendMsgBackRequestHeader(offset, group, 0)
    return RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header)


@pytest.mark.parametrize(
    ("offset", "refusal"),
    [
        (0, "No SUB permission for topic Secret"),  # another topic's message
        (100, None),  # a message of Demo
        (200, None),  # a message of G's retry topic
        (300, None),  # no message there: the processor refuses it
    ],
)
def test_a_send_back_needs_sub_on_the_topic_of_the_message_it_copies(
    offset: int, refusal: str | None
) -> None:
    """The broker copies the message at the offset, whatever its topic, into the group's
    retry topic, where the group pulls it: without this check SUB on a group reads
    every topic."""
    topics = {0: "Secret", 100: "Demo", 200: "%RETRY%G"}
    table = parse_acl(acl_text(), "test")
    request = _send_back(offset)
    sign(request, APP)
    found = check(table, BROKER_POLICY, request, LOCAL, topics.get)
    if refusal is None:
        assert found is None, found
    else:
        assert found is not None and refusal in found.remark, found
    unknowable = check(table, BROKER_POLICY, request, LOCAL)  # no store to ask
    assert unknowable is not None and "cannot be checked here" in unknowable.remark


@pytest.mark.parametrize(
    ("offset", "refusal"),
    [
        (0, "No PUB permission for topic Secret"),  # a half message of another topic
        (100, None),  # a half message of Demo
        (300, None),  # no message there: the processor refuses it
    ],
)
def test_an_end_transaction_needs_pub_on_the_topic_of_its_half_message(
    offset: int, refusal: str | None
) -> None:
    """Committing or rolling back another topic's transaction is publishing to it (the
    broker names a half message's real topic: BrokerNode._message_topic)."""
    topics = {0: "Secret", 100: "Demo"}
    table = parse_acl(acl_text(), "test")
    header = EndTransactionRequestHeader("PG", 0, offset, 8, "ID")
    request = RemotingCommand.request(RequestCode.END_TRANSACTION, header)
    sign(request, APP)
    found = check(table, BROKER_POLICY, request, LOCAL, topics.get)
    if refusal is None:
        assert found is None, found
    else:
        assert found is not None and refusal in found.remark, found


def test_what_a_peer_wrote_shows_escaped_and_cut_in_a_refusal() -> None:
    """A refusal's remark is logged: an access key or topic forging a log line, or a
    megabyte long, shows as one short line."""
    table = parse_acl(acl_text(), "test")
    forged = "x\n2026-01-01 00:00:00 CRITICAL broker: all data deleted"
    for name in (forged, "k" * 1_000_000):
        unknown = _request(RequestCode.SEND_MESSAGE_V2, {"AccessKey": name, "Signature": "x"})
        topic = _request(RequestCode.PULL_MESSAGE, {"topic": name, "consumerGroup": "G"})
        sign(topic, APP)
        for request in (unknown, topic):
            refused = check(table, BROKER_POLICY, request, LOCAL)
            assert refused is not None
            assert "\n" not in refused.remark and len(refused.remark) < 150, refused.remark


@pytest.mark.parametrize("policy", [NAMESERVER_POLICY, CONTROLLER_POLICY])
def test_name_services_check_only_what_changes_them(policy: AclPolicy) -> None:
    table = parse_acl(acl_text(), "test")
    assert check(table, policy, _request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {}), LOCAL) is None
    for code in (
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.BROKER_HEARTBEAT,
        RequestCode.CONTROLLER_ELECT_MASTER,
    ):
        unsigned = _request(code, {})
        assert "not signed" in str(check(table, policy, unsigned, LOCAL))
        signed = _request(code, {})
        sign(signed, APP)
        refused = check(table, policy, signed, LOCAL)
        assert refused is not None and refused.reason is Reason.NOT_ADMIN, refused
        assert "is not admin" in refused.remark
        sign(signed, BROKER)
        assert check(table, policy, signed, LOCAL) is None


# ====================================================================== real servers


def assert_refused(response: RemotingCommand, remark: str) -> None:
    assert response.code == ResponseCode.NO_PERMISSION, (response.code, response.remark)
    assert remark in (response.remark or ""), response.remark


@asynccontextmanager
async def acl_broker(tmp_path: Path, text: str | None = None) -> AsyncIterator[BrokerNode]:
    """A broker with ACL on and its embedded nameserver (ACL on too), signing with BROKER."""
    path = write_acl(tmp_path / "plain_acl.yml", text or acl_text())
    async with running_broker(
        tmp_path / "store",
        acl_enable=True,
        acl_file=str(path),
        access_key=BROKER.access_key,
        secret_key=BROKER.secret_key,
    ) as node:
        yield node


def ns_of(node: BrokerNode) -> str:
    return node.namesrv_addrs[0]


@pytest.mark.slow
async def test_sends_pulls_and_offsets_need_their_rights(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as node:
        addr, ns = node.address, ns_of(node)
        # send
        async with Producer("P", ns, access_key=APP.access_key, secret_key=APP.secret_key) as p:
            result = await p.send(Message("Demo", b"hello"))
        assert result.status.name == "SEND_OK"
        assert_refused(await invoke(addr, send_request("Demo")), "No AccessKey: the request")
        assert_refused(
            await invoke(addr, send_request("Other"), APP), "No PUB permission for topic Other"
        )
        wrong = Credentials(APP.access_key, "not-the-secret")
        assert_refused(
            await invoke(addr, send_request("Demo"), wrong), "Signature check failed for AccessKey"
        )
        with pytest.raises(SendError) as refused:
            async with Producer(
                "P", ns, access_key=APP.access_key, secret_key=APP.secret_key
            ) as producer:
                await producer.send(Message("Other", b"x"))
        # its tries (1 + retry_times_when_send_failed), then the refusal: no failover
        # lifts it, so it is not sent again and again until the send timeout
        assert len(refused.value.attempts) == 3, refused.value.attempts
        assert all("No PUB permission for topic Other" in a for a in refused.value.attempts)
        # pull
        async with PullConsumer("G", ns, access_key=APP.access_key, secret_key=APP.secret_key) as c:
            queue = next(q for q in await c.queues("Demo") if q.queue_id == result.queue.queue_id)
            found = await c.pull(queue, 0)
        assert found.status is PullStatus.FOUND and found.messages[0].body == b"hello"
        assert_refused(await invoke(addr, pull_request("Demo", group="H"), APP), "for group H")
        assert_refused(await invoke(addr, pull_request("Demo", group="G")), "not signed")
        assert (
            await invoke(addr, pull_request("Demo", group="G"), APP)
        ).code != ResponseCode.NO_PERMISSION
        # offsets
        update = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader("H", "Demo", 0, 1)
        )
        assert_refused(await invoke(addr, update, APP), "No SUB permission for group H")
        query = RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET, QueryConsumerOffsetRequestHeader("H", "Demo", 0)
        )
        assert_refused(await invoke(addr, query, APP), "No SUB permission for group H")
        assert node.acl is not None and node.acl.refused >= 7


async def test_a_hostile_account_gets_nothing_past_the_rights_it_has(tmp_path: Path) -> None:
    """An application account (PUB|SUB on Demo, SUB on group G) tries a live broker:
    a send whose checked field is not the one stored to, sending another topic's
    message back into its group's retry topic, a lock on another group's queues,
    reading a message of another topic by its offset, an unsigned oneway offset
    commit."""
    async with acl_broker(tmp_path) as node, RemotingClient() as client:
        addr = node.address

        async def signed(request: RemotingCommand) -> RemotingCommand:
            sign(request, APP)
            return await client.invoke(addr, request, 10)

        tricks = [
            (RequestCode.SEND_MESSAGE, _send("Other", RequestCode.SEND_MESSAGE, b="Demo")),
            (RequestCode.SEND_MESSAGE_V2, _send("Demo", g="-1", topic="Other")),
        ]
        for code, fields in tricks:
            answer = await signed(_request(code, fields, b"smuggled"))
            assert_refused(answer, "No PUB permission for topic Other")
        assert "Other" not in node.ctx.topics.table
        admin = {"access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key}
        async with Producer("P", ns_of(node), **admin) as producer:
            secret = await producer.send(Message("Secret", b"not for app-key1"))
        offset = parse_offset_msg_id(secret.offset_msg_id)[1]
        answer = await signed(_send_back(offset))  # copied to %RETRY%G, which G may pull
        assert_refused(answer, "No SUB permission for topic Secret")
        assert node.store.max_offset_in_queue("%RETRY%G", 0) <= 0
        lock = _request(RequestCode.LOCK_BATCH_MQ, {}, _lock(RequestCode.LOCK_BATCH_MQ, "H"))
        assert_refused(await signed(lock), "No SUB permission for group H")
        queue = MessageQueue("Demo", "broker-a", 0)
        assert node.ctx.locks.owner("H", queue, node.ctx.clock()) is None
        view = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(0))
        assert_refused(await signed(view), "is not admin (VIEW_MESSAGE_BY_ID)")
        commit = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader("H", "Demo", 0, 5)
        )
        await client.invoke_oneway(addr, commit, 10)  # no answer to wait for ...
        await wait_for(lambda: node.acl is not None and node.acl.refused == 6)
        assert node.ctx.offsets.query("H", "Demo", 0) == -1  # ... and nothing changed
        assert node.acl is not None
        assert node.acl.statistics().refused_by_reason == {
            "no_permission": 4,
            "not_admin": 1,
            "unsigned": 1,
        }


@pytest.mark.slow
async def test_topic_administration_and_resets_need_an_admin_account(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as node:
        ns, addr = ns_of(node), node.address
        app = {"access_key": APP.access_key, "secret_key": APP.secret_key}
        admin = {"access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key}
        async with AdminClient(ns, **app) as client:
            with pytest.raises(ClientError, match=r"is not admin \(UPDATE_AND_CREATE_TOPIC\)"):
                await client.create_topic("NewTopic", queue_nums=2)
        async with AdminClient(ns, **admin) as client:
            await client.create_topic("NewTopic", queue_nums=2)
        assert "NewTopic" in node.ctx.topics.table

        def delete() -> RemotingCommand:
            header = DeleteTopicRequestHeader("NewTopic")
            return RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, header)

        assert_refused(await invoke(addr, delete(), APP), "is not admin (DELETE_TOPIC_IN_BROKER)")
        assert_refused(await invoke(addr, delete()), "not signed")
        assert "NewTopic" in node.ctx.topics.table
        reset = RemotingCommand.request(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ResetOffsetRequestHeader("Demo", "G", -1)
        )
        assert_refused(await invoke(addr, reset, APP), "(INVOKE_BROKER_TO_RESET_OFFSET)")
        config = RemotingCommand.request(
            RequestCode.UPDATE_BROKER_CONFIG, body=b"long_polling_max_s=5"
        )
        assert_refused(await invoke(addr, config, APP), "(UPDATE_BROKER_CONFIG)")
        create = RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            CreateTopicRequestHeader("Evil", "TBW102", 1, 1, 6),
        )
        assert_refused(await invoke(addr, create), "not signed")
        assert (await invoke(addr, delete(), ADMIN)).code == ResponseCode.SUCCESS
        # what the broker shows of its configuration never has its secret
        shown = await invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), ADMIN)
        assert b"broker-secret" not in shown.body and b"secret_key=******" in shown.body


def register_request(name: str, addr: str) -> RemotingCommand:
    header = RegisterBrokerRequestHeader(name, addr, "DefaultCluster", "127.0.0.1:1", 0)
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER, header, body=encode_body(RegisterBrokerBody())
    )


async def cluster_brokers(ns: str) -> set[str]:
    response = await invoke(ns, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert response.code == ResponseCode.SUCCESS  # (readable by anyone)
    return set(decode_body(ClusterInfo, response.body).broker_addr_table)


@pytest.mark.slow
async def test_only_admin_accounts_register_and_unregister_brokers(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as node:
        ns = ns_of(node)
        assert await cluster_brokers(ns) == {"broker-a"}  # it signed its registration
        hijack = register_request("broker-a", "127.0.0.1:1")
        assert_refused(await invoke(ns, hijack), "not signed")
        assert_refused(
            await invoke(ns, hijack, APP), "AccessKey app-key1 is not admin (REGISTER_BROKER)"
        )
        assert_refused(await invoke(ns, register_request("evil", "127.0.0.1:2")), "not signed")
        unregister = RemotingCommand.request(
            RequestCode.UNREGISTER_BROKER,
            UnregisterBrokerRequestHeader("broker-a", node.address, "DefaultCluster", 0),
        )
        assert_refused(await invoke(ns, unregister), "not signed")
        beat = RemotingCommand.request(
            RequestCode.BROKER_HEARTBEAT,
            BrokerHeartbeatRequestHeader("DefaultCluster", "127.0.0.1:1", "broker-a"),
        )
        assert_refused(await invoke(ns, beat), "not signed")
        delete = RemotingCommand.request(
            RequestCode.DELETE_TOPIC_IN_NAMESRV, DeleteTopicRequestHeader("Demo")
        )
        assert_refused(await invoke(ns, delete, APP), "is not admin (DELETE_TOPIC_IN_NAMESRV)")
        route = node.nameserver.table.route("TBW102") if node.nameserver else None
        assert route is not None and [b.broker_addrs for b in route.broker_datas] == [
            {0: node.address}
        ]
        assert await cluster_brokers(ns) == {"broker-a"}


@pytest.mark.slow
async def test_a_broker_signs_its_registration_with_its_account(tmp_path: Path) -> None:
    path = write_acl(tmp_path / "plain_acl.yml", acl_text())
    async with running_nameserver(acl_file=path) as (_server, ns):
        async with running_broker(tmp_path / "anonymous", namesrv_addrs=[ns]):
            assert await cluster_brokers(ns) == set()  # refused: it has no account
        async with running_broker(
            tmp_path / "signed",
            namesrv_addrs=[ns],
            broker_name="broker-b",
            access_key=BROKER.access_key,
            secret_key=BROKER.secret_key,
        ):
            assert await cluster_brokers(ns) == {"broker-b"}


@pytest.mark.slow
async def test_the_controllers_elect_only_for_admin_accounts(tmp_path: Path) -> None:
    path = write_acl(tmp_path / "plain_acl.yml", acl_text())
    raft = f"127.0.0.1:{free_ports(1)[0]}"
    config = ControllerConfig(raft_address=raft, data_dir=tmp_path / "raft", acl_file=path)
    server = ControllerServer(config, port=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        addr = server.address
        elect = RemotingCommand.request(
            RequestCode.CONTROLLER_ELECT_MASTER, ElectMasterRequestHeader("c", "b", 1, True)
        )
        assert_refused(await invoke(addr, elect), "not signed")
        assert_refused(await invoke(addr, elect, APP), "is not admin (CONTROLLER_ELECT_MASTER)")
        answer = await invoke(addr, elect, ADMIN)  # through the ACL: the controller answers
        assert answer.code not in (ResponseCode.NO_PERMISSION, ResponseCode.SUCCESS), answer
        data = RemotingCommand.request(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=b"[]")
        assert (await invoke(addr, data)).code == ResponseCode.SUCCESS  # read-outs stay open
        [refused] = [
            family
            for family in ControllerCollector(server.controller).collect()
            if family.name == "hamq_controller_acl_refused"
        ]
        assert {s.labels["reason"]: s.value for s in refused.samples} == {
            "unsigned": 1,
            "not_admin": 1,
        }
        nursery.cancel_scope.cancel()


async def raw_invoke(
    port: int, request: RemotingCommand, *, local: str, credentials: Credentials | None = None
) -> RemotingCommand:
    """``request`` over a connection made from the local address ``local`` (127.0.0.x)."""
    if credentials is not None:
        sign(request, credentials)
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local)
    conn = Connection(
        TrioByteStream(stream),
        peer=f"127.0.0.1:{port}",
        dispatcher=Dispatcher(),
        config=RemotingConfig(),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        try:
            return await conn.invoke(request, 10)
        finally:
            conn.close()


@pytest.mark.slow
async def test_whitelisted_addresses_pass_unsigned(tmp_path: Path) -> None:
    text = acl_text(white="['127.0.0.2']", app_white="127.0.0.3")
    async with acl_broker(tmp_path, text) as node:
        port = node.ctx.port
        ok = await raw_invoke(port, send_request("Anything"), local="127.0.0.2")
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        assert_refused(
            await raw_invoke(port, send_request("Anything"), local="127.0.0.1"),
            "127.0.0.1 is not whitelisted",
        )
        named = send_request("Other")
        named.ext_fields["AccessKey"] = APP.access_key  # the account's whitelist: no signature
        assert (await raw_invoke(port, named, local="127.0.0.3")).code == ResponseCode.SUCCESS
        named = send_request("Other")
        named.ext_fields["AccessKey"] = APP.access_key
        assert_refused(await raw_invoke(port, named, local="127.0.0.4"), "Signature check failed")


@pytest.mark.slow
async def test_a_running_broker_follows_changes_of_its_acl_file(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as node:
        assert node.acl is not None
        node.acl.reload_interval_s = 0.05
        addr, path = node.address, node.acl.path
        assert_refused(await invoke(addr, send_request("Other"), APP), "topic Other")
        write_acl(path, acl_text(extra_topics=("Other=PUB",)))
        with trio.fail_after(5):
            while True:  # (the guard reads the file in its own task)
                response = await invoke(addr, send_request("Other"), APP)
                if response.code == ResponseCode.SUCCESS:
                    break
                await trio.sleep(0.05)
        write_acl(path, "accounts: [")  # broken: the accounts before stay
        await wait_for(lambda: node.acl.reload_failures >= 1, 5)
        assert (await invoke(addr, send_request("Other"), APP)).code == ResponseCode.SUCCESS


def test_a_server_with_a_bad_acl_file_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "plain_acl.yml"
    bad.write_text("accounts:\n  - accessKey: abcdefgh\n    secretKey: short\n")
    assert run_command(["nameserver", "--port", "0", "--acl-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: ACL file {bad}: accounts[0] (accessKey abcdefgh).secretKey must be longer "
        "than 6 characters (RocketMQ's rule)\n"
    )
    with pytest.raises(AclFileError, match="does not exist"):
        BrokerNode(build_config({"acl_enable": True, "acl_file": str(tmp_path / "none.yml")}))


@pytest.mark.slow
async def test_the_cli_signs_with_its_access_key_options(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as node:
        ns = ns_of(node)

        def hamq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*HAMQ, *args],
                capture_output=True,
                text=True,
                timeout=60,
                env={**user_env(), **(env or {})},
            )

        create = ("topic", "create", "CliTopic", "-n", ns, "--queues", "2")
        refused = await trio.to_thread.run_sync(lambda: hamq(*create))
        assert refused.returncode == 1 and "not signed" in refused.stderr, refused.stderr
        keys = {"HAMQ_ACCESS_KEY": ADMIN.access_key, "HAMQ_SECRET_KEY": ADMIN.secret_key}
        done = await trio.to_thread.run_sync(lambda: hamq(*create, env=keys))
        assert done.returncode == 0, done.stderr
        assert "CliTopic" in node.ctx.topics.table
        options = ("--access-key", APP.access_key, "--secret-key", APP.secret_key)
        sent = await trio.to_thread.run_sync(
            lambda: hamq(*options, "produce", "-t", "Demo", "-c", "2", "-n", ns, "m{i}")
        )
        assert sent.returncode == 0, sent.stderr


def test_an_access_key_without_its_secret_is_refused_by_the_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HAMQ_SECRET_KEY", raising=False)
    assert run_command(["--access-key", APP.access_key, "topic", "list"]) == 2
    assert "access key 'app-key1' is given without a secret key" in capsys.readouterr().err


@pytest.mark.slow
async def test_the_acl_profile_runs_with_its_accounts(tmp_path: Path) -> None:
    """conf/acl (ports moved to free ones): the brokers register with both embedded
    nameservers, signed; the demo account sends and consumes Demo and nothing else."""
    profile = tmp_path / "acl"
    moved = copy_profile("acl", profile, tmp_path / "data")
    (profile / "plain_acl.yml").write_text((ROOT / "conf" / "acl" / "plain_acl.yml").read_text())
    namesrv = f"127.0.0.1:{moved[9876]};127.0.0.1:{moved[9877]}"
    demo = {"access_key": "demo-app", "secret_key": "demo-app-secret"}
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: acl", READY_S)
        for ns in namesrv.split(";"):  # each knows master and slave (signed registrations)
            async with AdminClient(ns) as admin:
                info = await admin.cluster_info()
            assert set(info.broker_addr_table["broker-a"].broker_addrs) == {0, 1}, ns
        async with Producer("demo-producer", namesrv, **demo) as producer:
            sent = await producer.send(Message("Demo", b"signed"))
            with pytest.raises(ClientError, match="No PUB permission for topic Other"):
                await producer.send(Message("Other", b"x"), timeout_s=5)
        async with PullConsumer("demo-group", namesrv, **demo) as consumer:
            found = await consumer.pull(sent.queue, sent.queue_offset)
        assert [m.body for m in found.messages] == [b"signed"]
        async with Producer("anonymous", namesrv) as producer:
            with pytest.raises(ClientError, match="not signed"):
                await producer.send(Message("Demo", b"x"), timeout_s=5)
        # the slave copies the master's metadata with its (signed) requests
        admin_keys = {"access_key": "hamq-admin", "secret_key": "admin-secret-change-me"}
        async with AdminClient(namesrv, **admin_keys) as admin:
            with trio.fail_after(20):
                while True:
                    status = await admin.ha_status(f"127.0.0.1:{moved[10921]}")
                    sync = status["metadataSync"]
                    if sync["rounds"]:
                        break
                    await trio.sleep(0.2)
        assert sync["last_round_ok"], sync
