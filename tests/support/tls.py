"""Certificates for TLS tests, made at test time by trustme (a CA and a server
certificate for 127.0.0.1), written as PEM files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trustme

from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient, RemotingConfig
from hamq.remoting.tls import TlsConfig


@attrs.frozen
class ServerFiles:
    ca: Path
    cert: Path
    key: Path


def server_files(directory: Path, *hosts: str) -> ServerFiles:
    """A fresh CA and a certificate it signed for ``hosts`` (default 127.0.0.1), as
    ``ca.pem``, ``server.pem`` (the chain) and ``server.key`` in ``directory``."""
    ca = trustme.CA()
    server = ca.issue_cert(*(hosts or ("127.0.0.1",)))
    files = ServerFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca))
    files.cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(files.key))
    return files


@attrs.frozen
class Pki:
    ca: Path
    cert: Path
    key: Path
    #: key and certificate chain in one file
    combined: Path
    client_cert: Path
    client_key: Path
    #: a CA that signed nothing here
    stranger_ca: Path

    @property
    def server(self) -> TlsConfig:
        return TlsConfig(cert_file=self.cert, key_file=self.key, ca_file=self.ca)

    @property
    def client(self) -> RemotingConfig:
        return RemotingConfig(tls=TlsConfig(ca_file=self.ca))

    def broker_tls(self) -> dict[str, Any]:
        """A broker's ``remoting`` table (as its TOML file would have it)."""
        return {
            "tls": {"cert_file": str(self.cert), "key_file": str(self.key), "ca_file": str(self.ca)}
        }


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and localhost, a client certificate and a
    stranger CA, as PEM files in ``directory``."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@hamq.test")
    paths = Pki(
        ca=directory / "ca.pem",
        cert=directory / "server.pem",
        key=directory / "server.key",
        combined=directory / "server-and-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        stranger_ca=directory / "stranger-ca.pem",
    )
    ca.cert_pem.write_to_path(str(paths.ca))
    paths.cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(paths.key))
    server.private_key_and_cert_chain_pem.write_to_path(str(paths.combined))
    paths.client_cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(paths.client_key))
    trustme.CA().cert_pem.write_to_path(str(paths.stranger_ca))
    return paths


async def ask_clusters(client: RemotingClient, addr: str) -> RemotingCommand:
    """GET_BROKER_CLUSTER_INFO to ``addr``: any request will do to try a connection."""
    request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
    return await client.invoke(addr, request, timeout_s=5)
