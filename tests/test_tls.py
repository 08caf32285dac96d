"""TLS on the remoting and HA ports: the CLI and replication over TLS, refusals, bad
files. The client's half on every event loop (round trips, an untrusted CA, mutual TLS)
is tests/test_tls_clients.py.

Certificates are made at test time by trustme (a CA, server and client certificates
for 127.0.0.1), written as PEM files into the test's directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from cryptography.hazmat.primitives import serialization

from cli.main import run_command
from hamq.client import Message, Producer
from hamq.protocol import ResponseCode
from hamq.remoting import RemotingClient, RemotingConfig, RemotingError
from hamq.remoting.tls import TlsConfig, TlsConfigError
from tests.support.brokers import running_broker, running_nameserver
from tests.support.metrics import scrape, value
from tests.support.processes import hamq_command
from tests.support.timing import wait_for
from tests.support.tls import Pki, ask_clusters


# ---------------------------------------------------------------- round trips
@pytest.mark.slow
async def test_every_client_command_speaks_tls_with_hamq_tls_ca(tmp_path: Path, pki: Pki) -> None:
    """``hamq --tls-ca`` is a root option: produce, consume, topic and admin (the real
    command, in a subprocess) all reach a TLS-only cluster; without it, a clear failure."""
    async with (
        running_nameserver(remoting=RemotingConfig(tls=pki.server)) as (_, ns),
        running_broker(tmp_path, namesrv_addrs=[ns], remoting=pki.broker_tls()),
    ):
        tls = ("--tls-ca", str(pki.ca))
        sent = await hamq_command(*tls, "produce", "-t", "CliTls", "-c", "3", "-n", ns, "m{i}")
        assert sent.returncode == 0, sent.stderr
        got = await hamq_command(*tls, "consume", "-t", "CliTls", "-g", "G", "-c", "3", "-n", ns)
        assert got.returncode == 0, got.stderr
        printed = got.stdout.decode()
        assert all(body in printed for body in ("m0", "m1", "m2")), printed
        listed = await hamq_command(*tls, "topic", "list", "-n", ns)
        assert listed.returncode == 0 and b"CliTls" in listed.stdout, listed.stderr
        clusters = await hamq_command(*tls, "admin", "cluster", "-n", ns)
        assert clusters.returncode == 0 and b"broker" in clusters.stdout, clusters.stderr
        plain = await hamq_command("topic", "list", "-n", ns)
        assert plain.returncode == 1 and b"Traceback" not in plain.stderr, plain.stderr


async def test_a_key_in_the_certificate_file_serves_too(pki: Pki) -> None:
    tls = TlsConfig(cert_file=pki.combined)
    async with (
        running_nameserver(remoting=RemotingConfig(tls=tls)) as (_, ns),
        RemotingClient(config=pki.client) as client,
    ):
        assert (await ask_clusters(client, ns)).code == ResponseCode.SUCCESS


@pytest.mark.slow
async def test_a_slave_replicates_from_its_master_over_tls(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_nameserver(remoting=RemotingConfig(tls=pki.server)) as (_, ns):
        common: dict[str, Any] = {"namesrv_addrs": [ns], "remoting": pki.broker_tls()}
        async with (
            running_broker(tmp_path / "master", **common) as master,
            running_broker(
                tmp_path / "slave", broker_id=1, store={"role": "SLAVE"}, **common
            ) as slave,
            Producer("PG", ns, remoting=pki.client) as producer,
        ):
            ha = master.ha_service
            assert ha is not None
            await wait_for(ha.transfer.available)
            for i in range(50):
                await producer.send(Message("Replicated", b"r" * (i * 97 % 2000 + 1)))
            await wait_for(
                lambda: slave.store.commitlog_max_offset == master.store.commitlog_max_offset
            )
            # a plain-TCP peer on the HA port (a classic report: offset 0) is refused at
            # the handshake, having been sent nothing; the real slave carries on
            host, port = ha.address.rsplit(":", 1)
            with trio.socket.socket() as sock:
                await sock.connect((host, int(port)))
                await sock.send((0).to_bytes(8, "big"))
                with trio.fail_after(5):
                    assert await sock.recv(65536) == b""
            refusal = f"HA service {ha.address}: closed"
            await wait_for(lambda: any(refusal in r.getMessage() for r in caplog.records))
            await producer.send(Message("Replicated", b"after"))
            await wait_for(
                lambda: slave.store.commitlog_max_offset == master.store.commitlog_max_offset
            )
            assert len(ha.connections) == 1 and slave.ha_status()["slave"]["state"] == "TRANSFER"


# ---------------------------------------------------------------- refusals
async def test_a_plain_client_is_refused_and_the_server_carries_on(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_nameserver(remoting=RemotingConfig(tls=pki.server)) as (server, ns):
        async with RemotingClient() as plain:
            with pytest.raises(RemotingError):
                await ask_clusters(plain, ns)
        await wait_for(lambda: server.server.statistics().tls_handshake_failures == 1)
        lines = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "127.0.0.1:" in lines[0] and "TLS handshake failed" in lines[0]
        async with RemotingClient(config=pki.client) as client:
            assert (await ask_clusters(client, ns)).code == ResponseCode.SUCCESS
        assert server.server.statistics().connections_accepted == 1  # the TLS one only


async def test_a_silent_peer_is_cut_when_the_handshake_times_out(pki: Pki) -> None:
    tls = attrs.evolve(pki.server, handshake_timeout_s=0.3)
    async with running_nameserver(remoting=RemotingConfig(tls=tls)) as (server, ns):
        host, port = ns.rsplit(":", 1)
        with trio.socket.socket() as sock:
            await sock.connect((host, int(port)))
            with trio.fail_after(5):
                assert await sock.recv(1024) == b""  # closed by the server
        await wait_for(lambda: server.server.statistics().tls_handshake_failures == 1)


async def test_failed_handshakes_show_in_the_metrics_by_listener(tmp_path: Path, pki: Pki) -> None:
    """Plain-TCP peers on a TLS broker's remoting port (twice), its HA port and its
    embedded nameserver's port: each a failed handshake, counted where it happened."""
    async with running_broker(tmp_path, remoting=pki.broker_tls(), metrics_port=0) as node:
        assert node.metrics_port is not None and node.ha_service is not None
        targets = [node.address, node.address, node.ha_service.address, node.namesrv_addrs[0]]
        for address in targets:
            host, port = address.rsplit(":", 1)
            with trio.socket.socket() as sock:
                await sock.connect((host, int(port)))
                await sock.send((0).to_bytes(8, "big"))  # not a ClientHello
                with trio.fail_after(5):
                    assert await sock.recv(65536) == b""
        nameserver, ha = node.nameserver, node.ha_service
        assert nameserver is not None
        await wait_for(  # (each is counted as its connection closes)
            lambda: (
                node.server.statistics().tls_handshake_failures == 2
                and ha.statistics().tls_handshake_failures == 1
                and nameserver.server.statistics().tls_handshake_failures == 1
            )
        )
        shown = await scrape(node.metrics_port)
    failures = "hamq_broker_tls_handshake_failures"
    assert value(shown, failures, "_total", listener="remoting") == 2
    assert value(shown, failures, "_total", listener="ha") == 1
    assert value(shown, "hamq_nameserver_tls_handshake_failures", "_total") == 1


# ---------------------------------------------------------------- bad files
def _encrypted_key(pki: Pki, directory: Path) -> Path:
    key = serialization.load_pem_private_key(pki.key.read_bytes(), password=None)
    path = directory / "encrypted.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing cert", r"tls cert_file .*missing.pem: cannot read it \(No such file"),
        ("cert not PEM", r"tls cert_file .*not-pem.txt holds no PEM certificate"),
        ("no key", r"tls cert_file .*server.pem holds no PEM private key \(give key_file\)"),
        ("wrong key", r"tls key_file .*client.key is not the key of cert_file .*server.pem"),
        ("encrypted key", r"tls key_file .*encrypted.key is encrypted"),
        ("ca not PEM", r"tls ca_file .*not-pem.txt holds no PEM certificate"),
        ("verify without ca", r"verify_client needs ca_file"),
        ("key without cert", r"tls key_file .*server.key is given without cert_file"),
    ],
)
def test_a_bad_tls_file_is_named(pki: Pki, tmp_path: Path, case: str, message: str) -> None:
    not_pem = tmp_path / "not-pem.txt"
    not_pem.write_text("hello\n")
    options: dict[str, Any] = {
        "missing cert": {"cert_file": tmp_path / "missing.pem"},
        "cert not PEM": {"cert_file": not_pem},
        "no key": {"cert_file": pki.cert},
        "wrong key": {"cert_file": pki.cert, "key_file": pki.client_key},
        "encrypted key": {"cert_file": pki.cert, "key_file": _encrypted_key(pki, tmp_path)},
        "ca not PEM": {"ca_file": not_pem},
        "verify without ca": {"cert_file": pki.combined, "verify_client": True},
        "key without cert": {"key_file": pki.key},
    }[case]
    with pytest.raises(TlsConfigError, match=message):
        TlsConfig(**options)


def test_the_servers_commands_say_which_tls_file_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.pem"
    for command in (
        ["nameserver", "--port", "0", "--tls-cert", str(missing)],
        ["controller", "--port", "0", "--raft-address", "127.0.0.1:1", "--tls-cert", str(missing)],
        ["broker", "--port", "0", "--store-dir", str(tmp_path / "s"), "--tls-cert", str(missing)],
    ):
        assert run_command(command) == 2
        err = capsys.readouterr().err
        assert f"tls cert_file {missing}: cannot read it" in err, err
        assert "Traceback" not in err
    assert run_command(["nameserver", "--port", "0", "--tls-ca", str(missing)]) == 2
    assert "need --tls-cert" in capsys.readouterr().err
    assert run_command(["--tls-ca", str(missing), "produce", "-t", "T", "x"]) == 2
    assert f"tls ca_file {missing}: cannot read it" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # nothing started
