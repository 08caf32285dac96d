"""hamq/broker/grpc: the MessagingService of a broker, spoken by grpcio (in a thread)
with hamq's own v2 messages, for what the official client would never send: bad input,
forged handles, signatures. The official client's own runs are in
tests/test_grpc_clients.py. A broker in this process, loopback, free ports.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
import trio
from google.protobuf.duration_pb2 import Duration

from hamq.broker import BrokerNode
from hamq.broker.grpc import renewal, routes, service
from hamq.client import AdminClient
from hamq.protocol import ResponseCode
from hamq.protocol.v2 import definition_pb2 as pb
from hamq.protocol.v2 import service_pb2 as spb
from tests.support.acl import write_acl
from tests.support.brokers import (
    create_topic_request,
    invoke,
    namesrv,
    running_broker,
    running_nameserver,
)
from tests.support.metrics import documented, scrape, value
from tests.support.processes import free_ports
from tests.support.timing import wait_for

pytestmark = [pytest.mark.slow]

SERVICE = "/apache.rocketmq.v2.MessagingService/"
#: (request type, response type, streaming answer) of the methods used here
METHODS: dict[str, tuple[Any, Any, bool]] = {
    "QueryRoute": (spb.QueryRouteRequest, spb.QueryRouteResponse, False),
    "SendMessage": (spb.SendMessageRequest, spb.SendMessageResponse, False),
    "ReceiveMessage": (spb.ReceiveMessageRequest, spb.ReceiveMessageResponse, True),
    "AckMessage": (spb.AckMessageRequest, spb.AckMessageResponse, False),
    "ChangeInvisibleDuration": (
        spb.ChangeInvisibleDurationRequest,
        spb.ChangeInvisibleDurationResponse,
        False,
    ),
    "EndTransaction": (spb.EndTransactionRequest, spb.EndTransactionResponse, False),
    "Heartbeat": (spb.HeartbeatRequest, spb.HeartbeatResponse, False),
    "PullMessage": (spb.PullMessageRequest, spb.PullMessageResponse, True),
    "QueryAssignment": (spb.QueryAssignmentRequest, spb.QueryAssignmentResponse, False),
    "ForwardMessageToDeadLetterQueue": (
        spb.ForwardMessageToDeadLetterQueueRequest,
        spb.ForwardMessageToDeadLetterQueueResponse,
        False,
    ),
}


class Client:
    """Blocking calls of the MessagingService (run them in a thread)."""

    def __init__(self, address: str, metadata: list[tuple[str, str]] | None = None) -> None:
        self.channel = grpc.insecure_channel(address)
        self.metadata = [("x-mq-client-id", "test-client"), *(metadata or [])]

    def __call__(self, method: str, request: Any, timeout: float = 10) -> Any:
        request_type, response_type, streaming = METHODS[method]
        assert isinstance(request, request_type)
        factory = self.channel.unary_stream if streaming else self.channel.unary_unary
        stub = factory(
            SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        answer = stub(request, timeout=timeout, metadata=self.metadata)
        return list(answer) if streaming else answer

    def close(self) -> None:
        self.channel.close()


@asynccontextmanager
async def serving(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[BrokerNode, str]]:
    async with running_broker(tmp_path / "store", grpc_port=0, **overrides) as node:
        yield node, f"127.0.0.1:{node.ctx.grpc_port}"


async def call(client: Client, method: str, request: Any, wait_s: float = 10) -> Any:
    return await trio.to_thread.run_sync(lambda: client(method, request, wait_s))


def message(topic: str, body: bytes = b"hello", **system: Any) -> pb.Message:
    fields: dict[str, Any] = {"message_id": f"id-{time.monotonic_ns()}", "message_type": pb.NORMAL}
    fields.update(system)
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(**fields),
    )


def receive_request(topic: str, group: str, *, wait_s: int = 1) -> spb.ReceiveMessageRequest:
    return spb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=32,
        invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=wait_s),
    )


async def test_route_send_receive_ack_as_a_client_sees_them(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, address):
        client = Client(address)
        route = await call(client, "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="T")))
        assert route.status.code == pb.OK
        assert len(route.message_queues) == node.config.default_topic_queue_nums
        endpoint = route.message_queues[0].broker.endpoints
        assert [(a.host, a.port) for a in endpoint.addresses] == [("127.0.0.1", node.ctx.grpc_port)]
        assert route.message_queues[0].permission == pb.READ_WRITE

        sent = await call(
            client,
            "SendMessage",
            spb.SendMessageRequest(
                messages=[message("T", b"body-1", tag="a", keys=["k1", "k2"], message_id="M1")]
            ),
        )
        assert sent.status.code == pb.OK, sent
        assert sent.entries[0].message_id == "M1"

        frames = await call(client, "ReceiveMessage", receive_request("T", "G"))
        kinds = [frame.WhichOneof("content") for frame in frames]
        assert kinds == ["status", "message", "delivery_timestamp"], frames
        assert frames[0].status.code == pb.OK
        got = frames[1].message
        system = got.system_properties
        assert (got.body, system.tag, list(system.keys), system.message_id) == (
            b"body-1",
            "a",
            ["k1", "k2"],
            "M1",
        )
        assert system.body_digest.type == pb.CRC32
        assert system.body_digest.checksum == f"{zlib.crc32(b'body-1'):08X}"
        assert system.delivery_attempt == 1
        assert system.invisible_duration.seconds == 30

        ack = spb.AckMessageRequest(
            group=pb.Resource(name="G"),
            topic=pb.Resource(name="T"),
            entries=[spb.AckMessageEntry(message_id="M1", receipt_handle=system.receipt_handle)],
        )
        acked = await call(client, "AckMessage", ack)
        assert acked.status.code == pb.OK
        again = await call(client, "AckMessage", ack)  # (acked twice: the handle is spent)
        assert again.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE, again

        empty = await call(client, "ReceiveMessage", receive_request("T", "G"))
        assert [f.status.code for f in empty] == [pb.MESSAGE_NOT_FOUND]
        client.close()


async def test_forwarding_to_the_dlq_stores_it_there_and_spends_the_handle(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (_node, address):
        client = Client(address)
        sent = spb.SendMessageRequest(messages=[message("T", b"poison", message_id="P1")])
        assert (await call(client, "SendMessage", sent)).status.code == pb.OK
        frames = await call(client, "ReceiveMessage", receive_request("T", "G"))
        handle = frames[1].message.system_properties.receipt_handle
        forward = spb.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name="G"),
            topic=pb.Resource(name="T"),
            receipt_handle=handle,
            message_id="P1",
            delivery_attempt=1,
            max_delivery_attempts=1,
        )
        forwarded = await call(client, "ForwardMessageToDeadLetterQueue", forward)
        assert forwarded.status.code == pb.OK, forwarded
        ack = spb.AckMessageRequest(
            group=pb.Resource(name="G"),
            topic=pb.Resource(name="T"),
            entries=[spb.AckMessageEntry(message_id="P1", receipt_handle=handle)],
        )
        spent = await call(client, "AckMessage", ack)
        assert spent.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE  # (acked by it)
        dead = await call(client, "ReceiveMessage", receive_request("%DLQ%G", "dlq-reader"))
        bodies = [f.message.body for f in dead if f.WhichOneof("content") == "message"]
        assert bodies == [b"poison"], dead
        client.close()


async def test_a_route_names_every_broker_group_and_its_own_endpoint(tmp_path: Path) -> None:
    async with (
        running_nameserver() as (_ns, namesrv),
        running_broker(
            tmp_path / "a", grpc_port=0, broker_name="broker-a", namesrv_addrs=[namesrv]
        ) as a,
        running_broker(
            tmp_path / "b", grpc_port=0, broker_name="broker-b", namesrv_addrs=[namesrv]
        ) as b,
    ):
        endpoints = {a.config.broker_name: a.ctx.grpc_port, b.config.broker_name: b.ctx.grpc_port}
        clients = [Client(f"127.0.0.1:{node.ctx.grpc_port}") for node in (a, b)]
        request = spb.QueryRouteRequest(topic=pb.Resource(name="Both"))
        for client in clients:  # (each creates the topic in its group, as a send would)
            assert (await call(client, "QueryRoute", request)).status.code == pb.OK

        async def both() -> dict[str, set[int]]:
            route = await call(clients[0], "QueryRoute", request)
            found: dict[str, set[int]] = {}
            for queue in route.message_queues:
                ports = {address.port for address in queue.broker.endpoints.addresses}
                found.setdefault(queue.broker.name, set()).update(ports)
            return found if len(found) == 2 else {}

        found = await wait_for(both, 20, what="both groups in broker-a's route")
        assert found == {name: {port} for name, port in endpoints.items()}
        assignment = await call(
            clients[1],
            "QueryAssignment",
            spb.QueryAssignmentRequest(topic=pb.Resource(name="Both"), group=pb.Resource(name="G")),
        )
        assert sorted(x.message_queue.broker.name for x in assignment.assignments) == [
            "broker-a",
            "broker-b",
        ]
        assert {x.message_queue.id for x in assignment.assignments} == {-1}
        for client in clients:
            client.close()


async def test_a_master_that_served_no_grpc_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group whose master serves no gRPC is left out of routes; once that broker
    serves it (restarted at the same address), the route names it again."""
    monkeypatch.setattr(routes, "KNOWN_FOR_S", 0.2)
    port_b, ha_port_b = free_ports(2)
    request = spb.QueryRouteRequest(topic=pb.Resource(name="Both"))
    async with (
        running_nameserver() as (_ns, namesrv),
        running_broker(
            tmp_path / "a", grpc_port=0, broker_name="broker-a", namesrv_addrs=[namesrv]
        ) as a,
    ):
        assert a.grpc is not None
        client = Client(f"127.0.0.1:{a.ctx.grpc_port}")

        async def groups() -> set[str]:
            route = await call(client, "QueryRoute", request)  # (broker-a creates the topic)
            return {queue.broker.name for queue in route.message_queues}

        common: dict[str, Any] = {
            "listen_port": port_b,
            "ha_listen_port": ha_port_b,
            "broker_name": "broker-b",
        }
        async with running_broker(tmp_path / "b", namesrv_addrs=[namesrv], **common):
            created = await invoke(f"127.0.0.1:{port_b}", create_topic_request("Both"))
            assert created.code == ResponseCode.SUCCESS

            async def asked_twice() -> bool:
                assert await groups() == {"broker-a"}
                return a.grpc is not None and a.grpc.routes.asked >= 2

            await wait_for(asked_twice, 20, what="broker-b asked for its gRPC endpoint, twice")
        async with running_broker(
            tmp_path / "b", grpc_port=0, namesrv_addrs=[namesrv], **common
        ) as b:

            async def both() -> bool:
                return await groups() == {"broker-a", "broker-b"}

            await wait_for(both, 20, what="broker-b in broker-a's route, serving gRPC")
            assert b.ctx.grpc_port
        client.close()


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (message("T", b""), pb.MESSAGE_BODY_EMPTY),
        (message("T", b"x" * (4 * 1024 * 1024 + 1)), pb.MESSAGE_BODY_TOO_LARGE),
        (message("T", message_type=pb.FIFO), pb.ILLEGAL_MESSAGE_GROUP),
        (message("T", message_group="g"), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (message("T", message_type=pb.DELAY), pb.ILLEGAL_DELIVERY_TIME),
        (message("T", tag="a|b"), pb.ILLEGAL_MESSAGE_TAG),
        (message("T", keys=["has space"]), pb.ILLEGAL_MESSAGE_KEY),
        (message("T", message_id=""), pb.ILLEGAL_MESSAGE_ID),
        (message("bad topic!"), pb.ILLEGAL_TOPIC),
        (message("T", message_type=pb.LITE), pb.UNSUPPORTED),
    ],
)
async def test_bad_messages_are_refused_by_name(tmp_path: Path, bad: pb.Message, code: int) -> None:
    async with serving(tmp_path) as (node, address):
        client = Client(address)
        answer = await call(client, "SendMessage", spb.SendMessageRequest(messages=[bad]))
        assert answer.status.code == code, answer
        assert answer.status.message
        assert node.store.commitlog_max_offset == 0  # (nothing stored)
        client.close()


async def test_a_reserved_user_property_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_node, address):
        client = Client(address)
        bad = message("T")
        bad.user_properties["HAMQ_POP_CK"] = "forged"
        answer = await call(client, "SendMessage", spb.SendMessageRequest(messages=[bad]))
        assert answer.status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
        client.close()


async def test_forged_handles_and_transaction_ids_change_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, address):
        client = Client(address)
        for handle in ("", "not a handle", "1 2 3 4 0 broker-a 0 99999"):
            answer = await call(
                client,
                "AckMessage",
                spb.AckMessageRequest(
                    group=pb.Resource(name="G"),
                    topic=pb.Resource(name="T"),
                    entries=[spb.AckMessageEntry(message_id="x", receipt_handle=handle)],
                ),
            )
            assert answer.entries[0].status.code != pb.OK, (handle, answer)
            changed = await call(
                client,
                "ChangeInvisibleDuration",
                spb.ChangeInvisibleDurationRequest(
                    group=pb.Resource(name="G"),
                    topic=pb.Resource(name="T"),
                    receipt_handle=handle,
                    invisible_duration=Duration(seconds=5),
                ),
            )
            assert changed.status.code != pb.OK, (handle, changed)
        ended = await call(
            client,
            "EndTransaction",
            spb.EndTransactionRequest(
                topic=pb.Resource(name="T"),
                message_id="x",
                transaction_id="garbage",
                resolution=pb.COMMIT,
            ),
        )
        assert ended.status.code == pb.INVALID_TRANSACTION_ID
        assert node.store.commitlog_max_offset == 0
        client.close()


async def test_methods_hamq_does_not_serve_are_unimplemented(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_node, address):
        client = Client(address)
        with pytest.raises(grpc.RpcError) as caught:
            await call(client, "PullMessage", spb.PullMessageRequest())
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        client.close()


def signed(access_key: str, secret_key: str) -> list[tuple[str, str]]:
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    signature = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return [
        ("x-mq-date-time", date_time),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        ),
    ]


async def test_the_acl_decides_as_for_remoting(tmp_path: Path) -> None:
    acl = write_acl(
        tmp_path / "plain_acl.yml",
        """
accounts:
  - accessKey: writer01
    secretKey: writer-secret
    defaultTopicPerm: DENY
    topicPerms: [T=PUB]
  - accessKey: admin0001
    secretKey: admin-secret
    admin: true
""",
    )
    async with serving(tmp_path, acl_enable=True, acl_file=str(acl)) as (node, address):
        request = spb.SendMessageRequest(messages=[message("T")])
        outcomes: dict[str, int] = {}
        cases: dict[str, list[tuple[str, str]]] = {
            "unsigned": [],
            "bad signature": signed("writer01", "wrong"),
            "unknown account": signed("nobody", "x"),
            "writer": signed("writer01", "writer-secret"),
        }
        for name, metadata in cases.items():
            client = Client(address, metadata)
            outcomes[name] = (await call(client, "SendMessage", request)).status.code
            client.close()
        client = Client(address, signed("writer01", "writer-secret"))
        other = await call(client, "SendMessage", spb.SendMessageRequest(messages=[message("U")]))
        client.close()
    assert outcomes == {
        "unsigned": pb.FORBIDDEN,
        "bad signature": pb.UNAUTHORIZED,
        "unknown account": pb.UNAUTHORIZED,
        "writer": pb.OK,
    }
    assert other.status.code == pb.FORBIDDEN  # (no PUB on U)
    del node


async def test_the_sends_of_one_read_are_dispatched_as_one_group_in_stream_order(
    tmp_path: Path,
) -> None:
    """As a remoting connection dispatches the requests of one read: one group (one
    store append announced, one durability wait), in the order the streams opened."""
    async with serving(tmp_path) as (node, address):
        client = Client(address)
        first = spb.SendMessageRequest(messages=[message("T", b"create the topic")])
        assert (await call(client, "SendMessage", first)).status.code == pb.OK
        client.close()
        assert node.grpc_server is not None

        count = 10
        h2_client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        h2_client.initiate_connection()
        for index in range(count):
            stream_id = h2_client.get_next_available_stream_id()
            request = spb.SendMessageRequest(
                messages=[
                    message(
                        "T", f"in order {index}".encode(), message_group="g", message_type=pb.FIFO
                    )
                ]
            ).SerializeToString()
            h2_client.send_headers(
                stream_id,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", SERVICE + "SendMessage"),
                    (":authority", address),
                    ("content-type", "application/grpc"),
                    ("x-mq-client-id", "raw-client"),
                ],
            )
            h2_client.send_data(
                stream_id, b"\0" + len(request).to_bytes(4, "big") + request, end_stream=True
            )
        host, port = address.split(":")
        sock = trio.socket.socket()
        await sock.connect((host, int(port)))
        await sock.send(h2_client.data_to_send())  # (the preface and the 10 calls: one read)

        answers: dict[int, bytes] = {}
        ended: set[int] = set()
        with trio.fail_after(10):
            while len(ended) < count:
                data = await sock.recv(65536)
                assert data, "the server closed the connection"
                for event in h2_client.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        answers[event.stream_id] = answers.get(event.stream_id, b"") + event.data
                    elif isinstance(event, h2.events.StreamEnded):
                        ended.add(event.stream_id)
                await sock.send(h2_client.data_to_send())
        sock.close()

        offsets = []
        for stream_id in sorted(answers):
            answer = spb.SendMessageResponse.FromString(answers[stream_id][5:])
            assert answer.status.code == pb.OK, answer
            offsets.append(answer.entries[0].offset)
        assert offsets == sorted(offsets) and len(set(offsets)) == count, offsets
        (channel,) = [
            attributes["client"].channel
            for attributes in node.grpc_server.connection_attributes()
            if attributes["client"].client_id == "raw-client"
        ] or [None]
        assert channel is not None
        assert (channel.requests, channel.request_groups) == (count, 1)


def _ids(frames: list[spb.ReceiveMessageResponse]) -> dict[str, pb.Message]:
    return {
        frame.message.system_properties.message_id: frame.message
        for frame in frames
        if frame.WhichOneof("content") == "message"
    }


def push_receive(topic: str, group: str) -> spb.ReceiveMessageRequest:
    """A push consumer's receive: auto_renew, no invisible time, one message."""
    request = receive_request(topic, group)
    request.ClearField("invisible_duration")
    request.auto_renew = True
    request.batch_size = 1
    return request


async def test_what_a_push_consumer_holds_is_renewed_until_it_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the proxy's leases, 60 s renewed 10 s ahead, made 2 s renewed 1 s ahead)
    monkeypatch.setattr(service, "AUTO_RENEW_INVISIBLE_MS", 2000)
    monkeypatch.setattr(renewal, "RENEW_STEPS_MS", (2000,))
    monkeypatch.setattr(renewal, "RENEW_AHEAD_S", 1.0)
    monkeypatch.setattr(renewal, "SCAN_EVERY_S", 0.1)
    async with serving(tmp_path) as (node, address):
        assert node.grpc is not None
        client = Client(address)
        both = [message("T", b"held", message_id="HELD"), message("T", b"plain", message_id="P")]
        sent = await call(client, "SendMessage", spb.SendMessageRequest(messages=both))
        assert sent.status.code == pb.OK
        held = _ids(await call(client, "ReceiveMessage", push_receive("T", "G")))
        (held_id,) = held
        plain_id = ({"HELD", "P"} - {held_id}).pop()
        plain = receive_request("T", "G")
        plain.invisible_duration.seconds = 2  # (not renewed: it comes back)
        assert list(_ids(await call(client, "ReceiveMessage", plain))) == [plain_id]

        # the plain message comes back once its 2 s are over; the held one never does
        again = receive_request("T", "G", wait_s=1)

        async def plain_back() -> bool:
            found = _ids(await call(client, "ReceiveMessage", again))
            assert held_id not in found, "a message its push consumer holds came back"
            return plain_id in found

        await wait_for(plain_back, 30, what="the plain message back after its 2 s")
        assert node.grpc.renewals.statistics().renewed >= 1
        # acked by the handle the consumer was given: the renewed one is acked
        handle = held[held_id].system_properties.receipt_handle
        ack = spb.AckMessageRequest(
            group=pb.Resource(name="G"),
            topic=pb.Resource(name="T"),
            entries=[spb.AckMessageEntry(message_id=held_id, receipt_handle=handle)],
        )
        assert (await call(client, "AckMessage", ack)).status.code == pb.OK
        assert node.grpc.renewals.statistics().leases == 0
        async with AdminClient(namesrv(node)) as admin:
            progress = await admin.consumer_progress("G")
        in_flight = sum(queue.in_flight for queue in progress.queues)
        assert in_flight == 1, progress  # (the plain one, received again and not acked)
        client.close()


async def test_what_a_closed_push_consumer_held_comes_back_at_once(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, address):
        assert node.grpc is not None
        pusher, other = Client(address), Client(address)
        sent = await call(
            pusher,
            "SendMessage",
            spb.SendMessageRequest(messages=[message("T", b"x", message_id="X")]),
        )
        assert sent.status.code == pb.OK
        assert list(_ids(await call(pusher, "ReceiveMessage", push_receive("T", "G")))) == ["X"]
        assert node.grpc.renewals.statistics().leases == 1
        pusher.close()  # (its 60 s lease is given up: the message is for the others now)
        await wait_for(
            lambda: node.grpc is not None and node.grpc.renewals.statistics().leases == 0
        )
        again = receive_request("T", "G", wait_s=1)

        async def back() -> bool:
            return "X" in _ids(await call(other, "ReceiveMessage", again))

        with trio.fail_after(30):  # (well within the 60 s it was given)
            await wait_for(back, 30, what="the closed consumer's message back")
        other.close()


async def test_the_metrics_show_the_endpoint_its_calls_and_leases(tmp_path: Path) -> None:
    async with serving(tmp_path, metrics_port=0) as (node, address):
        assert node.metrics_port is not None
        client = Client(address)
        sent = await call(
            client, "SendMessage", spb.SendMessageRequest(messages=[message("T", b"x")])
        )
        assert sent.status.code == pb.OK
        assert len(_ids(await call(client, "ReceiveMessage", push_receive("T", "G")))) == 1
        scraped = await scrape(node.metrics_port)
        assert value(scraped, "hamq_broker_grpc_connections") == 1
        assert value(scraped, "hamq_broker_grpc_calls", "_total") >= 2
        assert value(scraped, "hamq_broker_grpc_calls_open") == 0
        assert value(scraped, "hamq_broker_grpc_push_leases") == 1
        assert value(scraped, "hamq_broker_grpc_renewals", "_total", outcome="renewed") == 0
        assert value(scraped, "hamq_broker_connections_refused", "_total", listener="grpc") == 0
        assert documented(scraped) == []
        client.close()
