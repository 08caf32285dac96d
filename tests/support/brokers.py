"""Helpers for broker and client tests: brokers in this process, on loopback.

``running_broker`` starts a BrokerNode on a free port with its store under the test's
tmp_path; with ``namesrv_addrs`` empty it embeds a nameserver on a free port too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from hamq.acl import Credentials, signer
from hamq.broker import BrokerNode, build_config
from hamq.client import (
    AdminClient,
    ClientError,
    MessageExt,
    NoRouteError,
    PullConsumer,
    PullStatus,
)
from hamq.protocol import RemotingCommand, RequestCode
from hamq.protocol.converter import encode_header
from hamq.protocol.headers import (
    CreateTopicRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from hamq.protocol.message import encode_properties
from hamq.protocol.send_fields import to_v2_fields
from hamq.remoting import RemotingClient
from nameserver import NameServer, NameServerConfig
from tests.support.processes import hamq_server, ready_addresses
from tests.support.timing import wait_for

#: store files small enough for many brokers per test run (the defaults reserve ~1.5 GB)
SMALL_STORE = {
    "commitlog_segment_bytes": 8 * 1024 * 1024,
    "consume_queue_entries_per_file": 10_000,
    "index_hash_slots": 10_007,
    "index_max_entries": 40_000,
}


def small_store_toml(directory: Path) -> Path:
    """A broker config file with SMALL_STORE, for ``hamq broker -c``."""
    path = directory / "small-store.toml"
    path.write_text("[store]\n" + "".join(f"{k} = {v}\n" for k, v in SMALL_STORE.items()))
    return path


def broker_config(store_dir: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "listen_port": 0,
        "embedded_namesrv_port": 0,
        "store": {"store_dir": str(store_dir), **SMALL_STORE},
    }
    store = overrides.pop("store", {})
    values["store"].update(store)
    values.update(overrides)
    return build_config(values)


@asynccontextmanager
async def running_broker(
    store_dir: Path, *, clock: Callable[[], int] | None = None, **overrides: Any
) -> AsyncIterator[BrokerNode]:
    """A broker for the block; it stops (cleanly) at the end."""
    node = BrokerNode(broker_config(store_dir, **overrides), **({"clock": clock} if clock else {}))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        yield node
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def running_nameserver(
    *, clock: Callable[[], int] | None = None, **options: Any
) -> AsyncIterator[tuple[NameServer, str]]:
    server = NameServer(NameServerConfig(port=0, **options), **({"clock": clock} if clock else {}))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield server, f"127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def namesrv(node: BrokerNode) -> str:
    return ";".join(node.namesrv_addrs)


def send_header(**changes: Any) -> SendMessageRequestHeader:
    """A SEND_MESSAGE header as the C++ client fills it, with ``changes``."""
    fields: dict[str, Any] = {
        "producer_group": "PID",
        "topic": "TopicTest",
        "default_topic": "TBW102",
        "default_topic_queue_nums": 4,
        "queue_id": 0,
        "sys_flag": 0,
        "born_timestamp": 1795267292855,
        "flag": 0,
    }
    fields.update(changes)
    return SendMessageRequestHeader(**fields)


@asynccontextmanager
async def embedded_broker_process(
    tmp_path: Path, store: str = "store"
) -> AsyncIterator[tuple[Any, str]]:
    """A ``hamq broker`` process with an embedded nameserver, small store files and free
    ports: (process, nameserver address); killed by PID at the end."""
    args = ["-c", str(small_store_toml(tmp_path)), "--port", "0", "--namesrv-port", "0"]
    async with hamq_server("broker", *args, "--store-dir", str(tmp_path / store)) as (
        proc,
        line,
    ):
        yield proc, ready_addresses(line)[1]


def send_request(
    topic: str,
    body: bytes = b"body",
    *,
    queue_id: int = 0,
    code: int = RequestCode.SEND_MESSAGE_V2,
    flag: int = 0,
    batch: bool | None = None,
    **properties: str,
) -> RemotingCommand:
    """A raw SEND_MESSAGE_V2 (or _BATCH) request as Java clients make it."""
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=1,
        flag=flag,
        properties=encode_properties(properties),
        batch=batch,
    )
    fields = encode_header(header)
    if code != RequestCode.SEND_MESSAGE:
        fields = to_v2_fields(fields)
    return RemotingCommand.request(code, ext_fields=fields, body=body)


def pull_request(
    topic: str,
    queue_id: int = 0,
    offset: int = 0,
    *,
    group: str = "G",
    suspend_ms: int = 0,
    subscription: str = "*",
    commit_offset: int = 0,
    sys_flag: int = 0x4,
) -> RemotingCommand:
    """A raw PULL_MESSAGE request (with its subscription, FLAG_SUBSCRIPTION; long
    polling when ``suspend_ms`` is given)."""
    header = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=sys_flag | (0x2 if suspend_ms else 0),
        commit_offset=commit_offset,
        suspend_timeout_millis=suspend_ms,
        sub_version=0,
        subscription=subscription,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, header)


def create_topic_request(topic: str, queues: int = 4, perm: int = 6) -> RemotingCommand:
    """A raw UPDATE_AND_CREATE_TOPIC request, as ``mqadmin updateTopic`` sends it."""
    return RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        CreateTopicRequestHeader(
            topic=topic,
            default_topic="TBW102",
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=perm,
        ),
    )


async def invoke(
    addr: str, request: RemotingCommand, credentials: Credentials | None = None
) -> RemotingCommand:
    """One request to ``addr`` over a client of its own, signed with ``credentials``
    when given."""
    hook = signer(credentials) if credentials is not None else None
    async with RemotingClient(rpc_hook=hook) as client:
        return await client.invoke(addr, request, 10)


async def create_topic(namesrv: str, topic: str, queues: int = 4) -> None:
    """Create ``topic`` (or change its queue count) through the admin API, then wait
    (bounded) until the nameserver routes it, so that a client started next finds it."""
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(topic, queues)

        async def routed() -> bool:
            try:
                return await admin.topic_route(topic) is not None
            except NoRouteError:
                return False

        await wait_for(routed, 10, what=f"a route for topic {topic}")


async def stored(namesrv: str, topic: str) -> int:
    """How many messages ``topic``'s queues hold (0 while it has no route or its
    queues cannot be asked)."""
    async with AdminClient(namesrv) as admin:
        try:
            return sum(s.max_offset - s.min_offset for s in await admin.queue_status(topic))
        except ClientError:
            return 0


async def topic_messages(namesrv: str, topic: str, *, group: str = "check") -> list[MessageExt]:
    """Every message ``topic``'s queues hold (on their masters), queue by queue."""
    found: list[MessageExt] = []
    async with PullConsumer(group, namesrv) as consumer:
        for queue in await consumer.queues(topic):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, max_nums=1024)
                if result.status is not PullStatus.FOUND:
                    break
                found += result.messages
                offset = result.next_begin_offset
    return found
