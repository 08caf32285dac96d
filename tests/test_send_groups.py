"""The grouped send path (hamq/broker/processors/send.py, ``Connection.at_group_end``):
the requests of one read are one group — their puts announced to the store once, the
sends that wait for their durability sharing one ticket and one wait — and each request
is still answered with its own result, in order per connection; a request that fails
(a bad header, a refused topic, a full disk) fails alone.

Requests go as raw frames with JSON headers, as RocketMQ's clients send them; each
connection writes all of its frames in one write, so the broker reads them together
(``request_groups`` on the broker's side of the connection says how many groups they
came in).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from hamq.broker import BrokerNode
from hamq.protocol import (
    FrameDecoder,
    RemotingCommand,
    ResponseCode,
    SerializeType,
    encode_frame,
)
from hamq.protocol.record import decode_messages
from hamq.remoting import Connection
from hamq.store import segment as segment_module
from tests.support.brokers import (
    create_topic,
    namesrv,
    pull_request,
    running_broker,
    send_request,
)
from tests.support.ha import in_sync_fake_slave
from tests.support.timing import wait_for

TIMEOUT_S = 10.0
TOPIC = "Grouped"
QUEUES = 4
SECRET = "a-long-random-secret-for-grouped-sends"


class RawClient:
    """One TCP connection to a broker that writes requests as it is told and reads the
    answers in the order they come."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.answers: list[RemotingCommand] = []
        self._next_opaque = 1

    @classmethod
    async def connect(cls, node: BrokerNode) -> RawClient:
        host, port = node.server.address.rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    def frames(self, requests: list[RemotingCommand]) -> bytes:
        """The requests as one buffer of JSON-header frames, opaques assigned in order."""
        data = bytearray()
        for request in requests:
            request.opaque = self._next_opaque
            self._next_opaque += 1
            request.serialize_type = SerializeType.JSON
            data += encode_frame(request)
        return bytes(data)

    def unread(self) -> bytes:
        """What the broker sent that was not read yet, without waiting (b"": nothing)."""
        try:
            return os.read(self.stream.socket.fileno(), 65536)
        except BlockingIOError:
            return b""

    async def receive(self, count: int) -> list[RemotingCommand]:
        """Read until ``count`` more answers came; those answers."""
        start = len(self.answers)
        with trio.fail_after(TIMEOUT_S):
            while len(self.answers) < start + count:
                data = await self.stream.receive_some(65536)
                assert data, "the broker closed the connection"
                self.decoder.feed(data)
                self.answers.extend(self.decoder.commands())
        return self.answers[start:]


def broker_side(node: BrokerNode, client: RawClient) -> Connection:
    """The broker's side of ``client``'s connection (its statistics)."""
    host, port = client.stream.socket.getsockname()[:2]
    local = f"{host}:{port}"
    [conn] = [c for c in node.server.connections if c.peer == local]
    return conn


def bad_header() -> RemotingCommand:
    """A SEND_MESSAGE_V2 without its topic field ("b")."""
    request = send_request(TOPIC, b"no topic")
    del request.ext_fields["b"]
    return request


async def test_requests_of_many_connections_and_queues_in_groups_get_their_own_answers(
    tmp_path: Path,
) -> None:
    """Three connections each write sends to every queue, a send with a bad header, one
    to a system topic and one to a topic that does not exist, in one write: every
    request is answered, in order, with its own result; the stored ones have their own
    queue offsets (each queue's numbered without gaps across the connections) and read
    back in that order; the refusals store nothing."""
    async with running_broker(tmp_path / "store", auto_create_topic_enable=False) as node:
        await create_topic(namesrv(node), TOPIC, QUEUES)
        clients = [await RawClient.connect(node) for _ in range(3)]
        plans: list[list[tuple[str, int | None]]] = []  # per client: (body, queue or None)
        buffers = []
        for c, client in enumerate(clients):
            requests, plan = [], []
            for round_no in range(3):
                for queue in range(QUEUES):
                    body = f"c{c}-r{round_no}-q{queue}"
                    requests.append(send_request(TOPIC, body.encode(), queue_id=queue))
                    plan.append((body, queue))
                requests.append(bad_header())
                plan.append(("bad header", None))
                requests.append(send_request("SCHEDULE_TOPIC_XXXX", b"system"))
                plan.append(("system topic", None))
                requests.append(send_request("NoSuchTopic", b"missing"))
                plan.append(("missing topic", None))
            buffers.append(client.frames(requests))
            plans.append(plan)
        async with trio.open_nursery() as nursery:  # (the three writes at once)
            for client, data in zip(clients, buffers, strict=True):
                nursery.start_soon(client.stream.send_all, data)
        stored: dict[int, list[tuple[int, str]]] = {q: [] for q in range(QUEUES)}
        for client, plan in zip(clients, plans, strict=True):
            answers = await client.receive(len(plan))
            assert [a.opaque for a in answers] == list(range(1, len(plan) + 1))  # in order
            for (body, queue), answer in zip(plan, answers, strict=True):
                if queue is None:
                    expected = {
                        "bad header": ResponseCode.INVALID_PARAMETER,
                        "system topic": ResponseCode.SYSTEM_ERROR,
                        "missing topic": ResponseCode.TOPIC_NOT_EXIST,
                    }[body]
                    assert answer.code == expected, (body, answer.code, answer.remark)
                    assert answer.remark, body
                    continue
                assert answer.code == ResponseCode.SUCCESS, (body, answer.remark)
                assert int(answer.ext_fields["queueId"]) == queue
                stored[queue].append((int(answer.ext_fields["queueOffset"]), body))
            stats = broker_side(node, client).statistics()
            assert stats.requests_received == len(plan)
            assert stats.request_groups < len(plan)  # read and handled in groups
        for queue, entries in stored.items():
            offsets = sorted(offset for offset, _ in entries)
            assert offsets == list(range(len(entries))), (queue, offsets)
            read = await pull_bodies(node, queue, len(entries))
            assert read == [body for _, body in sorted(entries)], queue


async def pull_bodies(node: BrokerNode, queue: int, count: int) -> list[str]:
    """The bodies of queue ``queue`` of TOPIC, pulled raw."""
    client = await RawClient.connect(node)
    async with client.stream:
        await client.stream.send_all(client.frames([pull_request(TOPIC, queue, 0)]))
        [answer] = await client.receive(1)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    messages = decode_messages(answer.body)
    assert len(messages) == count
    return [m.body.decode() for m in messages]


async def test_a_group_waiting_for_its_slave_is_answered_together_each_with_its_own_offset(
    tmp_path: Path,
) -> None:
    """On a SYNC_MASTER the sends of one group wait for the slave's ack of the group's
    end: a refusal before the first of them is answered at once, one after them with
    them; the stored ones only once the slave has everything they wrote (an ack short of
    that answers none), then all of them, in order: SEND_OK each with its own queue and
    offset, the refusal in its place."""
    async with running_broker(
        tmp_path / "store",
        broker_name="g",
        store={"role": "SYNC_MASTER"},
        ha_listen_port=0,
        ha={"secret": SECRET, "sync_timeout_s": 30.0},
        auto_create_topic_enable=False,
    ) as node:
        await create_topic(namesrv(node), TOPIC, QUEUES)
        async with in_sync_fake_slave(node, SECRET, "g") as slave:
            start = node.store.commitlog_max_offset
            client = await RawClient.connect(node)
            requests = [send_request(TOPIC, b"w%d" % i, queue_id=i % QUEUES) for i in range(8)]
            requests.insert(0, bad_header())
            requests.insert(4, send_request("NoSuchTopic", b"missing"))
            await client.stream.send_all(client.frames(requests))
            [refused] = await client.receive(1)
            assert refused.opaque == 1 and refused.code == ResponseCode.INVALID_PARAMETER
            end = node.store.commitlog_max_offset
            await wait_for(lambda: len(slave.received) >= end - start)  # (pushed to it)
            await slave.report_classic(end - 1)  # one byte short: nobody is answered
            await wait_for(lambda: node.ha_service.transfer.replicated_offset() >= end - 1)
            # the master counted that ack: answers it gave would be in the socket now
            assert client.unread() == b""
            await slave.report_classic(end)
            answers = await client.receive(9)
        assert [a.opaque for a in answers] == list(range(2, 11))  # in order
        assert answers[3].code == ResponseCode.TOPIC_NOT_EXIST, answers[3].remark
        del answers[3]
        assert all(a.code == ResponseCode.SUCCESS for a in answers), [a.remark for a in answers]
        assert [int(a.ext_fields["queueId"]) for a in answers] == [i % QUEUES for i in range(8)]
        assert [int(a.ext_fields["queueOffset"]) for a in answers] == [0] * 4 + [1] * 4
        assert len({a.ext_fields["msgId"] for a in answers}) == 8


async def test_a_group_whose_slave_does_not_ack_is_answered_flush_slave_timeout_each(
    tmp_path: Path,
) -> None:
    """No ack within the sync timeout: each send of the group is answered
    FLUSH_SLAVE_TIMEOUT (stored on the master), each with its own offset."""
    async with running_broker(
        tmp_path / "store",
        broker_name="g",
        store={"role": "SYNC_MASTER"},
        ha_listen_port=0,
        ha={"secret": SECRET, "sync_timeout_s": 0.5},
    ) as node:
        await create_topic(namesrv(node), TOPIC, QUEUES)
        async with in_sync_fake_slave(node, SECRET, "g"):
            client = await RawClient.connect(node)
            requests = [send_request(TOPIC, b"t%d" % i, queue_id=0) for i in range(5)]
            await client.stream.send_all(client.frames(requests))
            answers = await client.receive(5)
        assert [a.code for a in answers] == [ResponseCode.FLUSH_SLAVE_TIMEOUT] * 5
        assert [int(a.ext_fields["queueOffset"]) for a in answers] == list(range(5))
        assert "stored on this master only" in answers[0].remark


class FullOnce:
    """A disk with no room for the next new CommitLog segment, once (room is freed right
    after): reserving its blocks fails with ENOSPC as posix_fallocate does."""

    def __init__(self) -> None:
        self.full = False
        self.refused: list[Path] = []

    def __call__(self, fd: int, size: int, path: Path) -> None:
        if self.full and "commitlog" in str(path):
            self.full = False
            self.refused.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, 0, size)


async def test_a_full_disk_fails_the_one_send_that_needed_the_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one group, the send whose record needs a new CommitLog segment finds no room:
    it alone is refused (SYSTEM_ERROR naming the failure); the sends before it in the
    group, and the one after it (which finds room), are stored and answered SEND_OK with
    consecutive queue offsets."""
    disk = FullOnce()
    monkeypatch.setattr(segment_module, "reserve_blocks", disk)
    segment = 256 * 1024
    body = b"." * 20_000  # 13 such records fill a segment
    async with running_broker(
        tmp_path / "store", store={"commitlog_segment_bytes": segment, "max_message_bytes": 65536}
    ) as node:
        await create_topic(namesrv(node), TOPIC, QUEUES)
        client = await RawClient.connect(node)
        await client.stream.send_all(
            client.frames([send_request(TOPIC, body, queue_id=0) for _ in range(12)])
        )
        assert all(a.code == ResponseCode.SUCCESS for a in await client.receive(12))
        disk.full = True
        group = [send_request(TOPIC, body, queue_id=0) for _ in range(3)]
        await client.stream.send_all(client.frames(group))
        answers = await client.receive(3)
        assert len(disk.refused) == 1
        assert [a.code for a in answers] == [
            ResponseCode.SUCCESS,
            ResponseCode.SYSTEM_ERROR,
            ResponseCode.SUCCESS,
        ], [a.remark for a in answers]
        assert "CREATE_MAPPED_FILE_FAILED" in answers[1].remark
        assert [int(answers[i].ext_fields["queueOffset"]) for i in (0, 2)] == [12, 13]


async def test_a_stored_send_keeps_the_properties_its_client_sent(tmp_path: Path) -> None:
    """A single send's properties are stored as the client wrote them with the broker's
    pairs (CLUSTER, UNIQ_KEY) added: a consumer reads every one back."""
    async with running_broker(tmp_path / "store") as node:
        await create_topic(namesrv(node), TOPIC, QUEUES)
        client = await RawClient.connect(node)
        request = send_request(TOPIC, b"p", queue_id=1, KEYS="k1 k2", TAGS="t", color="blue")
        await client.stream.send_all(client.frames([request]))
        [answer] = await client.receive(1)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        reader = await RawClient.connect(node)
        await reader.stream.send_all(reader.frames([pull_request(TOPIC, 1, 0)]))
        [pulled] = await reader.receive(1)
        cluster = node.config.cluster_name
    [message] = decode_messages(pulled.body)
    assert message.properties == {
        "KEYS": "k1 k2",
        "TAGS": "t",
        "color": "blue",
        "CLUSTER": cluster,
        "UNIQ_KEY": answer.ext_fields["transactionId"],
    }
