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

from hamq.broker import BrokerNode, build_config
from hamq.client import MessageExt, PullConsumer, PullStatus
from hamq.protocol import RemotingCommand, RequestCode
from hamq.protocol.converter import encode_header
from hamq.protocol.headers import SendMessageRequestHeader, to_v2_fields
from hamq.protocol.message import encode_properties
from nameserver import NameServer, NameServerConfig

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


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fails after ``timeout_s``."""
    with trio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - polling state other tasks change
            await trio.sleep(0.01)


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
