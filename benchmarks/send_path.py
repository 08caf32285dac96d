"""Which of hamq's modules one SYNC_MASTER + SYNC_FLUSH send crosses (docs/ARCHITECTURE.md,
"The send path"): from the request leaving a RemotingClient to its answer, every module
of hamq/ a function of which runs in this thread meanwhile (the fsync's worker thread
aside: it runs segment.py only). A broker in this process on loopback, its slave the
tests' FakeSlave, which acks what the master sent it (a polling task of this script: it
reads the store's end and the connections' sent offsets, which the send crosses anyway).

Run by hand: ``python benchmarks/send_path.py`` (about 2 s).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)

import trio  # noqa: E402

from hamq.remoting import RemotingClient  # noqa: E402
from tests.support.brokers import running_broker, send_request  # noqa: E402
from tests.support.ha import in_sync_fake_slave  # noqa: E402

REPO = ROOT

SECRET, GROUP = "a-long-random-secret-of-group-a", "broker-a"
seen: set[str] = set()


def profile(frame: FrameType, event: str, arg: Any) -> None:
    name = frame.f_code.co_filename
    if name.startswith(REPO + "/hamq/"):
        seen.add(name[len(REPO) + 1 :])


def sent_end(connection: Any) -> int:
    return int(connection.session.sent_end)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await _measure(Path(tmp))
    packages = {m.split("/")[1] for m in seen}
    print(f"{len(seen)} modules in {len(packages)} packages of hamq: {sorted(packages)}")
    for m in sorted(seen):
        print(" ", m)


async def _measure(tmp: Path) -> None:
    store = {"role": "SYNC_MASTER", "flush_disk_type": "SYNC_FLUSH"}
    ha = {"secret": SECRET}
    async with running_broker(tmp / "b", broker_name=GROUP, store=store, ha=ha) as node:
        service = node.ha_service
        assert service is not None
        async with (
            in_sync_fake_slave(node, SECRET, GROUP) as fake,
            trio.open_nursery() as nursery,
        ):

            async def acker() -> None:
                acked = 0
                while True:
                    end = node.store.commitlog_max_offset
                    if end > acked and any(sent_end(c) >= end for c in service.connections):
                        await fake.report_classic(end)
                        acked = end
                    await trio.sleep(0.001)

            nursery.start_soon(acker)
            async with RemotingClient() as client:
                for _ in range(3):  # warm up: the topic, connections
                    r = await client.invoke(node.address, send_request("Crossed", b"w"), 10)
                    assert r.code == 0, r.remark
                sys.setprofile(profile)
                r = await client.invoke(node.address, send_request("Crossed", b"x"), 10)
                sys.setprofile(None)
                assert r.code == 0, r.remark
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
