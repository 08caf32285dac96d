"""Certificates for TLS tests, made at test time by trustme (a CA and a server
certificate for 127.0.0.1), written as PEM files."""

from __future__ import annotations

from pathlib import Path

import attrs
import trustme


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
