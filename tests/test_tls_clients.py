"""The client's half of TLS on every event loop: Trio, asyncio and uvloop.

The servers (a nameserver, a broker) run on Trio in a thread; the client runs in the
test's loop, so its TLS is AnyIO's (``ClientTls.wrap_anyio``) on each backend. The Trio
side of TLS (listeners, the HA slave, bad files) is tests/test_tls.py's.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from hamq.client import Message, Producer, PullConsumer, PullStatus, SendStatus
from hamq.protocol import ResponseCode
from hamq.remoting import RemotingClient, RemotingConfig, RemotingError
from hamq.remoting.tls import TlsConfig
from tests.support.backends import broker_thread, nameserver_thread
from tests.support.tls import Pki, ask_clusters

pytestmark = pytest.mark.anyio


@pytest.mark.slow
async def test_produce_and_pull_over_tls(tmp_path: Path, pki: Pki) -> None:
    async with broker_thread(tmp_path, remoting=pki.broker_tls()) as broker:
        sent = [f"secret {i}".encode() for i in range(10)]
        async with Producer("PG", broker.namesrv, remoting=pki.client) as producer:
            for body in sent:
                result = await producer.send(Message("Tls", body))
                assert result.status is SendStatus.SEND_OK
        received: list[bytes] = []
        async with PullConsumer("CG", broker.namesrv, remoting=pki.client) as consumer:
            for queue in await consumer.queues("Tls"):
                pulled = await consumer.pull(queue, 0, max_nums=64)
                if pulled.status is PullStatus.FOUND:
                    received += [m.body for m in pulled.messages]
        assert sorted(received) == sorted(sent)
        async with RemotingClient() as plain:  # nothing in clear on the broker's port
            with pytest.raises(RemotingError):
                await ask_clusters(plain, broker.address)


async def test_a_client_that_does_not_trust_the_servers_ca_is_refused(pki: Pki) -> None:
    untrusting = RemotingConfig(tls=TlsConfig(ca_file=pki.stranger_ca))
    async with (
        nameserver_thread(remoting=RemotingConfig(tls=pki.server)) as ns,
        RemotingClient(config=untrusting) as client,
    ):
        with pytest.raises(RemotingError, match="certificate verify failed"):
            await ask_clusters(client, ns.addr)


async def test_mutual_tls_serves_only_clients_with_a_certificate_of_the_ca(pki: Pki) -> None:
    server = attrs.evolve(pki.server, verify_client=True)
    with_cert = TlsConfig(cert_file=pki.client_cert, key_file=pki.client_key, ca_file=pki.ca)
    async with nameserver_thread(remoting=RemotingConfig(tls=server)) as ns:
        async with RemotingClient(config=pki.client) as anonymous:
            with pytest.raises(RemotingError):
                await ask_clusters(anonymous, ns.addr)
        async with RemotingClient(config=RemotingConfig(tls=with_cert)) as known:
            assert (await ask_clusters(known, ns.addr)).code == ResponseCode.SUCCESS


async def test_a_tls_client_on_a_plain_server_fails_clearly() -> None:
    async with nameserver_thread() as ns:
        pki_less = RemotingConfig(tls=TlsConfig(check_hostname=False))
        async with RemotingClient(config=pki_less) as client:
            with pytest.raises(RemotingError, match="TLS handshake failed"):
                await ask_clusters(client, ns.addr)
