"""hamq/protocol/v2: the committed protobuf modules are what `make protos` makes of the
.proto files, and those speak RocketMQ 5's wire (rocketmq-apis, apache.rocketmq.v2):
bytes worked out by hand from its field numbers, the service's paths, types and
streaming kinds, and the Code values."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from grpc_tools import protoc

from hamq.broker.grpc.service import _RPCS, SERVICE
from hamq.protocol.v2 import definition_pb2 as pb
from hamq.protocol.v2 import service_pb2 as spb

ROOT = Path(__file__).resolve().parents[1]
PROTOS = ("hamq/protocol/v2/definition.proto", "hamq/protocol/v2/service.proto")


def test_the_generated_modules_match_the_proto_files(tmp_path: Path) -> None:
    # protoc in this process (what `make protos` runs, with the same include paths)
    well_known = files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    args = [f"-I{ROOT}", f"-I{well_known}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    assert protoc.main(["grpc_tools.protoc", *args, *(str(ROOT / p) for p in PROTOS)]) == 0
    for proto in PROTOS:
        for suffix in ("_pb2.py", "_pb2.pyi"):
            name = proto.removesuffix(".proto") + suffix
            assert (tmp_path / name).read_bytes() == (ROOT / name).read_bytes(), (
                f"{name} is not what protoc makes of {proto}: run `make protos`"
            )


def test_a_send_request_is_the_bytes_rocketmq_defines() -> None:
    request = spb.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name="T"),
                body=b"hi",
                system_properties=pb.SystemProperties(
                    tag="a", keys=["k"], message_id="M", message_type=pb.FIFO, message_group="g"
                ),
            )
        ]
    )
    # SendMessageRequest: messages (1). Message: topic (1) = Resource{name (2)},
    # system_properties (3), body (4). A key is field << 3 | wire type (0 varint, 2 bytes).
    resource = b"\x0a\x03" + b"\x12\x01T"
    system = (
        b"\x0a\x01a"  # tag = 1
        b"\x12\x01k"  # keys = 2
        b"\x1a\x01M"  # message_id = 3
        b"\x30\x02"  # message_type = 6 (varint): FIFO = 2
        b"\x8a\x01\x01g"  # message_group = 17: 17 << 3 | 2 = 138, a two-byte varint
    )
    message = resource + b"\x1a" + bytes([len(system)]) + system + b"\x22\x02hi"
    encoded = b"\x0a" + bytes([len(message)]) + message
    assert request.SerializeToString() == encoded
    assert spb.SendMessageRequest.FromString(encoded) == request


def test_answers_are_the_bytes_rocketmq_defines() -> None:
    # Status: code (1, varint), message (2). OK = 20000 = varint a0 9c 01.
    status = pb.Status(code=pb.OK, message="x")
    assert status.SerializeToString() == b"\x08\xa0\x9c\x01\x12\x01x"
    # ReceiveMessageResponse: oneof content {status = 1, message = 2, delivery_timestamp = 3}
    answer = spb.ReceiveMessageResponse(status=pb.Status(code=pb.MESSAGE_NOT_FOUND))
    assert answer.SerializeToString() == b"\x0a\x04\x08\xd1\xbb\x02"  # 40401 = d1 bb 02
    # TelemetryCommand: status (1), oneof command: settings = 2, ...; Settings'
    # client_type (1) is proto3 optional, so PRODUCER is written although it is set alone
    command = spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))
    assert command.SerializeToString() == b"\x12\x02\x08\x01"
    assert command.WhichOneof("command") == "settings"


# name: (request, response, client streaming, server streaming), as rocketmq-apis has them
RPCS = {
    "QueryRoute": ("QueryRouteRequest", "QueryRouteResponse", False, False),
    "Heartbeat": ("HeartbeatRequest", "HeartbeatResponse", False, False),
    "SendMessage": ("SendMessageRequest", "SendMessageResponse", False, False),
    "QueryAssignment": ("QueryAssignmentRequest", "QueryAssignmentResponse", False, False),
    "ReceiveMessage": ("ReceiveMessageRequest", "ReceiveMessageResponse", False, True),
    "AckMessage": ("AckMessageRequest", "AckMessageResponse", False, False),
    "ForwardMessageToDeadLetterQueue": (
        "ForwardMessageToDeadLetterQueueRequest",
        "ForwardMessageToDeadLetterQueueResponse",
        False,
        False,
    ),
    "PullMessage": ("PullMessageRequest", "PullMessageResponse", False, True),
    "UpdateOffset": ("UpdateOffsetRequest", "UpdateOffsetResponse", False, False),
    "GetOffset": ("GetOffsetRequest", "GetOffsetResponse", False, False),
    "QueryOffset": ("QueryOffsetRequest", "QueryOffsetResponse", False, False),
    "EndTransaction": ("EndTransactionRequest", "EndTransactionResponse", False, False),
    "Telemetry": ("TelemetryCommand", "TelemetryCommand", True, True),
    "NotifyClientTermination": (
        "NotifyClientTerminationRequest",
        "NotifyClientTerminationResponse",
        False,
        False,
    ),
    "ChangeInvisibleDuration": (
        "ChangeInvisibleDurationRequest",
        "ChangeInvisibleDurationResponse",
        False,
        False,
    ),
    "RecallMessage": ("RecallMessageRequest", "RecallMessageResponse", False, False),
    "SyncLiteSubscription": (
        "SyncLiteSubscriptionRequest",
        "SyncLiteSubscriptionResponse",
        False,
        False,
    ),
}


def test_the_service_has_rocketmqs_paths_types_and_streaming_kinds() -> None:
    service = spb.DESCRIPTOR.services_by_name["MessagingService"]
    assert service.full_name == "apache.rocketmq.v2.MessagingService"
    assert [m.name for m in service.methods] == list(RPCS)
    for method in service.methods:
        request, response, client_streaming, server_streaming = RPCS[method.name]
        path = f"/{service.full_name}/{method.name}"  # the HTTP/2 :path of a call
        assert path == f"/apache.rocketmq.v2.MessagingService/{method.name}"
        assert method.input_type.full_name == f"apache.rocketmq.v2.{request}", path
        assert method.output_type.full_name == f"apache.rocketmq.v2.{response}", path
        assert (method.client_streaming, method.server_streaming) == (
            client_streaming,
            server_streaming,
        ), path


def test_the_brokers_rpc_table_names_the_services_request_types() -> None:
    service = spb.DESCRIPTOR.services_by_name["MessagingService"]
    assert f"/{service.full_name}/" == SERVICE
    for name, (_kind, request_type, _attribute) in _RPCS.items():
        method = service.methods_by_name[name]
        assert method.input_type.full_name == request_type.DESCRIPTOR.full_name


# enum apache.rocketmq.v2.Code, every value, as rocketmq-apis numbers them
CODES = """
    CODE_UNSPECIFIED=0 OK=20000 MULTIPLE_RESULTS=30000
    BAD_REQUEST=40000 ILLEGAL_ACCESS_POINT=40001 ILLEGAL_TOPIC=40002 ILLEGAL_CONSUMER_GROUP=40003
    ILLEGAL_MESSAGE_TAG=40004 ILLEGAL_MESSAGE_KEY=40005 ILLEGAL_MESSAGE_GROUP=40006
    ILLEGAL_MESSAGE_PROPERTY_KEY=40007 INVALID_TRANSACTION_ID=40008 ILLEGAL_MESSAGE_ID=40009
    ILLEGAL_FILTER_EXPRESSION=40010 ILLEGAL_INVISIBLE_TIME=40011 ILLEGAL_DELIVERY_TIME=40012
    INVALID_RECEIPT_HANDLE=40013 MESSAGE_PROPERTY_CONFLICT_WITH_TYPE=40014
    UNRECOGNIZED_CLIENT_TYPE=40015 MESSAGE_CORRUPTED=40016 CLIENT_ID_REQUIRED=40017
    ILLEGAL_POLLING_TIME=40018 ILLEGAL_OFFSET=40019 ILLEGAL_LITE_TOPIC=40020
    INVALID_CLIENT_PROPERTIES=40021 UNAUTHORIZED=40100 PAYMENT_REQUIRED=40200 FORBIDDEN=40300
    NOT_FOUND=40400 MESSAGE_NOT_FOUND=40401 TOPIC_NOT_FOUND=40402 CONSUMER_GROUP_NOT_FOUND=40403
    OFFSET_NOT_FOUND=40404 REQUEST_TIMEOUT=40800 PAYLOAD_TOO_LARGE=41300
    MESSAGE_BODY_TOO_LARGE=41301 MESSAGE_BODY_EMPTY=41302 PRECONDITION_FAILED=42800
    TOO_MANY_REQUESTS=42900 LITE_TOPIC_QUOTA_EXCEEDED=42901 LITE_SUBSCRIPTION_QUOTA_EXCEEDED=42902
    REQUEST_HEADER_FIELDS_TOO_LARGE=43100 MESSAGE_PROPERTIES_TOO_LARGE=43101
    INTERNAL_ERROR=50000 INTERNAL_SERVER_ERROR=50001 HA_NOT_AVAILABLE=50002
    NOT_IMPLEMENTED=50100 PROXY_TIMEOUT=50400 MASTER_PERSISTENCE_TIMEOUT=50401
    SLAVE_PERSISTENCE_TIMEOUT=50402 UNSUPPORTED=50500 VERSION_UNSUPPORTED=50501
    VERIFY_FIFO_MESSAGE_UNSUPPORTED=50502 FAILED_TO_CONSUME_MESSAGE=60000
"""


def test_codes_and_enums_have_rocketmqs_numbers() -> None:
    expected = {name: int(number) for name, number in (e.split("=") for e in CODES.split())}
    assert dict(pb.Code.items()) == expected
    assert (pb.OK, pb.BAD_REQUEST, pb.UNAUTHORIZED, pb.FORBIDDEN) == (20000, 40000, 40100, 40300)
    assert (pb.NOT_FOUND, pb.TOPIC_NOT_FOUND, pb.CONSUMER_GROUP_NOT_FOUND) == (40400, 40402, 40403)
    assert (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION, pb.LITE, pb.PRIORITY) == (
        1,
        2,
        3,
        4,
        5,
        6,
    )
    assert (pb.NONE, pb.READ, pb.WRITE, pb.READ_WRITE) == (1, 2, 3, 4)
    assert (pb.PRODUCER, pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER, pb.PULL_CONSUMER) == (1, 2, 3, 4)
    assert (pb.TAG, pb.SQL, pb.COMMIT, pb.ROLLBACK) == (1, 2, 1, 2)
    assert (pb.IPv4, pb.IPv6, pb.DOMAIN_NAME) == (1, 2, 3)
    assert (pb.SOURCE_CLIENT, pb.SOURCE_SERVER_CHECK, pb.IDENTITY, pb.GZIP) == (1, 2, 1, 2)
    assert (pb.CRC32, pb.MD5, pb.SHA1, pb.PYTHON, pb.JAVA) == (1, 2, 3, 6, 1)
