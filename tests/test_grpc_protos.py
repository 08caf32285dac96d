"""hamq/protocol/v2: the committed protobuf modules are what `make protos` makes of the
.proto files, and those speak RocketMQ 5's wire (bytes worked out by hand from
rocketmq-apis' field numbers, the service's paths and streaming kinds, Code values)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hamq.broker.grpc.service import _RPCS, SERVICE
from hamq.protocol.v2 import definition_pb2 as pb
from hamq.protocol.v2 import service_pb2 as spb

ROOT = Path(__file__).resolve().parents[1]
PROTOS = ("hamq/protocol/v2/definition.proto", "hamq/protocol/v2/service.proto")


def test_the_generated_modules_match_the_proto_files(tmp_path: Path) -> None:
    for proto in PROTOS:
        (tmp_path / proto).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / proto, tmp_path / proto)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.",
         *PROTOS],
        cwd=tmp_path,
        check=True,
    )  # fmt: skip
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
    # Message: topic (1) = Resource{name (2)}, system_properties (3), body (4)
    resource = b"\x0a\x03" + b"\x12\x01T"
    system = (
        b"\x0a\x01a"  # tag = 1
        b"\x12\x01k"  # keys = 2
        b"\x1a\x01M"  # message_id = 3
        b"\x30\x02"  # message_type = 6 (varint): FIFO = 2
        b"\x8a\x01\x01g"  # message_group = 17 (length-delimited): tag 17 << 3 | 2 = 138
    )
    message = resource + b"\x1a" + bytes([len(system)]) + system + b"\x22\x02hi"
    assert request.SerializeToString() == b"\x0a" + bytes([len(message)]) + message


def test_codes_and_enums_have_rocketmqs_numbers() -> None:
    assert (pb.OK, pb.BAD_REQUEST, pb.UNAUTHORIZED, pb.FORBIDDEN) == (20000, 40000, 40100, 40300)
    assert (pb.MESSAGE_NOT_FOUND, pb.TOPIC_NOT_FOUND, pb.INVALID_RECEIPT_HANDLE) == (
        40401,
        40402,
        40013,
    )
    assert (pb.TOO_MANY_REQUESTS, pb.INTERNAL_SERVER_ERROR, pb.HA_NOT_AVAILABLE) == (
        42900,
        50001,
        50002,
    )
    assert (pb.MASTER_PERSISTENCE_TIMEOUT, pb.SLAVE_PERSISTENCE_TIMEOUT) == (50401, 50402)
    assert (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION) == (1, 2, 3, 4)
    assert (pb.READ, pb.WRITE, pb.READ_WRITE) == (2, 3, 4)
    assert (pb.PRODUCER, pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER) == (1, 2, 3)


def test_the_service_has_rocketmqs_paths_and_streaming_kinds() -> None:
    service = spb.DESCRIPTOR.services_by_name["MessagingService"]
    assert service.full_name == "apache.rocketmq.v2.MessagingService"
    kinds = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert kinds["ReceiveMessage"] == (False, True)
    assert kinds["Telemetry"] == (True, True)
    assert kinds["SendMessage"] == (False, False)
    assert SERVICE == "/apache.rocketmq.v2.MessagingService/"
    for name, (_kind, request_type, _attribute) in _RPCS.items():
        method = service.methods_by_name[name]
        assert method.input_type.full_name == request_type.DESCRIPTOR.full_name
