"""RocketMQ's official Python 5.x client against a broker's gRPC endpoint with TLS on
(``--tls-*``: the client's ``tls_enable``, the test CA given to grpcio by
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) and with the ACL on (the client's Credentials, its
MQv2-HMAC-SHA1 signature checked against plain_acl.yml's accounts). ``hamq broker``
processes, loopback, free ports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import broker_process, free_ports
from tests.support.rocketmq5 import ensure_venv, run_driver
from tests.support.tls import server_files

pytestmark = pytest.mark.slow

ACL = """
accounts:
  - accessKey: grpc-broker
    secretKey: grpc-broker-secret
    admin: true
  - accessKey: grpc-writer
    secretKey: grpc-writer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Secure=PUB|SUB]
    groupPerms: [Reader=SUB]
"""


@pytest.fixture(scope="module")
def python() -> Path:
    return ensure_venv()


async def test_send_and_receive_over_tls(python: Path, tmp_path: Path) -> None:
    files = server_files(tmp_path)
    (port,) = free_ports(1)
    config = (
        f"grpc_port = {port}\n[remoting.tls]\ncert_file = '{files.cert}'\n"
        f"key_file = '{files.key}'\nca_file = '{files.ca}'\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(files.ca)}
    common = ("--endpoints", f"127.0.0.1:{port}", "--topic", "Tls", "--tls")
    with broker_process(tmp_path, config):
        sent = await run_driver(
            python, "produce", *common, "--count", "3", home=home, extra_env=env
        )
        got = await run_driver(
            python, "simple", *common, "--group", "G", "--count", "3", home=home, extra_env=env
        )
    assert len(sent.all("sent")) == 3, sent.records
    assert sorted(m["body"] for m in got.all("received")) == ["body 0", "body 1", "body 2"]


async def test_the_acl_checks_the_clients_credentials(python: Path, tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    (port,) = free_ports(1)
    config = (
        f"grpc_port = {port}\nacl_enable = true\nacl_file = '{acl}'\n"
        "access_key = 'grpc-broker'\nsecret_key = 'grpc-broker-secret'\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    endpoint = ("--endpoints", f"127.0.0.1:{port}")
    good = ("--access-key", "grpc-writer", "--secret-key", "grpc-writer-secret")
    with broker_process(tmp_path, config):
        sent = await run_driver(
            python, "produce", *endpoint, "--topic", "Secure", *good, "--count", "2",
            home=home,
        )  # fmt: skip
        wrong = await run_driver(
            python, "produce", *endpoint, "--topic", "Secure", "--count", "1",
            "--access-key", "grpc-writer", "--secret-key", "not-the-secret", "--keep-going",
            home=home, timeout_s=60,
        )  # fmt: skip
        other = await run_driver(
            python, "produce", *endpoint, "--topic", "Elsewhere", *good, "--count", "1",
            "--keep-going", home=home, timeout_s=60,
        )  # fmt: skip
        got = await run_driver(
            python, "simple", *endpoint, "--topic", "Secure", "--group", "Reader", *good,
            "--count", "2", home=home,
        )  # fmt: skip
    assert len(sent.all("sent")) == 2, sent.records
    assert wrong.all("sent") == [] and "40100" in " ".join(wrong.all("error")), wrong.records
    assert other.all("sent") == [] and "40300" in " ".join(other.all("error")), other.records
    assert sorted(m["body"] for m in got.all("received")) == ["body 0", "body 1"]
