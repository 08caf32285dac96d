"""Secrets kept out of configuration files, and every command's answer to a secret, key
or CA file it cannot use: one ``error:`` line naming the option or key and the file,
exit code 2, nothing started.

A broker reads ``secret_key_file`` / ``[ha] secret_file`` (relative to its file);
``hamq cluster up`` checks them with the rest of a profile; the controllers read
``--raft-secret-file``; client commands take ``--tls-ca`` and ``--access-key`` /
``--secret-key`` (root options).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cli.main import run_command
from hamq.acl import Credentials
from hamq.broker import ConfigError, load_config
from tests.support.processes import write_toml

SECRET = "broker-secret-from-a-file"
HA_SECRET = "ha-secret-of-the-group-0123456789"


def broker_file(directory: Path, **values: object) -> Path:
    """A broker's TOML file in ``directory`` with ``values`` (tables as dicts)."""
    return write_toml(
        directory / "broker.toml",
        {"access_key": "hamq-broker", **values, "store": {"store_dir": str(directory / "s")}},
    )


def secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_broker_reads_its_secrets_from_files_beside_its_configuration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "secrets").mkdir()
    secret_file(tmp_path / "secrets" / "broker.secret", f"{SECRET}\n")
    secret_file(tmp_path / "secrets" / "ha.secret", f"  {HA_SECRET}\r\n")
    config_file = broker_file(
        tmp_path,
        secret_key_file="secrets/broker.secret",  # relative: to the file's directory
        ha={"secret_file": str(tmp_path / "secrets" / "ha.secret")},
    )
    with caplog.at_level(logging.WARNING, logger="hamq.broker.config"):
        config = load_config(config_file)
    assert config.credentials == Credentials("hamq-broker", SECRET)
    assert config.ha.secret == HA_SECRET
    assert SECRET not in repr(config) and HA_SECRET not in repr(config)
    assert not caplog.records  # (0600: nobody else may read them)


def test_a_secret_file_others_may_read_gets_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = secret_file(tmp_path / "broker.secret", SECRET, mode=0o644)
    with caplog.at_level(logging.WARNING, logger="hamq.broker.config"):
        load_config(broker_file(tmp_path, secret_key_file=str(shared)))
    [record] = caplog.records
    assert record.getMessage() == (
        f"secret_key_file {shared} may be read by other users (mode 644): chmod 600 {shared}"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"secret_key_file": "missing.secret"}, "secret_key_file {dir}/missing.secret: "
                                                "cannot read it (No such file or directory)"),
        ({"secret_key_file": "dir"}, "secret_key_file {dir}/dir: cannot read it (Is a directory)"),
        ({"secret_key_file": "empty.secret"}, "secret_key_file {dir}/empty.secret is empty"),
        ({"secret_key_file": "binary.secret"}, "secret_key_file {dir}/binary.secret is not "
                                               "UTF-8 text"),
        ({"secret_key_file": 7}, "secret_key_file must be a path (a string), not the integer 7"),
        ({"secret_key_file": "ok.secret", "secret_key": "x" * 8},
         "give secret_key or secret_key_file, not both"),
        ({"ha": {"secret_file": "missing.secret"}}, "[ha] secret_file {dir}/missing.secret: "
                                                    "cannot read it (No such file or directory)"),
        ({"ha": {"secret_file": "ok.secret", "secret": HA_SECRET}},
         "give [ha] secret or [ha] secret_file, not both"),
        ({"ha": {"secret_file": "short.secret"}}, "[ha] secret must be at least 16 characters"),
    ],
)  # fmt: skip
def test_a_secret_file_that_cannot_be_used_is_named(
    tmp_path: Path, values: dict[str, object], message: str
) -> None:
    secret_file(tmp_path / "empty.secret", " \n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "binary.secret").write_bytes(b"\xff\xfe secret")
    secret_file(tmp_path / "ok.secret", SECRET)
    secret_file(tmp_path / "short.secret", "too-short")
    with pytest.raises(ConfigError) as caught:
        load_config(broker_file(tmp_path, **values))
    assert message.format(dir=tmp_path) in str(caught.value)


def test_each_command_says_in_one_line_which_secret_or_ca_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path a secret, key or CA file takes through the CLI: exit code 2 and one
    line naming it; nothing started (no store directory made)."""
    for name in ("HAMQ_SECRET_KEY", "HAMQ_ACCESS_KEY", "HAMQ_TLS_CA", "HAMQ_RAFT_SECRET"):
        monkeypatch.delenv(name, raising=False)
    missing = tmp_path / "missing"
    empty = secret_file(tmp_path / "empty", "")
    broker = broker_file(tmp_path, secret_key_file="missing")
    (tmp_path / "profile").mkdir()
    in_profile = broker_file(tmp_path / "profile", ha={"secret_file": str(missing)})
    raft = ["--port", "0", "--raft-address", "127.0.0.1:1", "--raft-peers", "127.0.0.1:1;h:2"]
    cases = [
        (["broker", "-c", str(broker)], f"secret_key_file {missing}: cannot read it"),
        (["cluster", "up", "--profile", str(tmp_path / "profile")],
         f"{in_profile}: [ha] secret_file {missing}: cannot read it (No such file or directory)"),
        (["controller", *raft, "--raft-secret-file", str(missing)],
         f"--raft-secret-file {missing}: cannot read it (No such file or directory)"),
        (["nameserver", "--controller", *raft, "--raft-secret-file", str(empty)],
         f"--raft-secret-file {empty} is empty"),
        (["--tls-ca", str(empty), "admin", "sync-state-set", "--controller", "127.0.0.1:1"],
         f"tls ca_file {empty} holds no PEM certificate"),
        (["--tls", "--tls-ca", str(missing), "topic", "list"], f"tls ca_file {missing}: cannot"),
        (["--access-key", "app-key1", "consume", "-t", "T", "-g", "G"],
         "access key 'app-key1' is given without a secret key"),
        (["--secret-key", "app-secret", "produce", "-t", "T", "x"],
         "a secret key is given without an access key"),
    ]  # fmt: skip
    for args, message in cases:
        assert run_command(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert message in err, err
    assert not (tmp_path / "s").exists() and not (tmp_path / "profile" / "s").exists()


def test_the_root_options_end_with_their_command() -> None:
    """``--access-key`` / ``--tls-ca`` hold for the command they were given to, not for
    the next one run in the same process."""
    from cli.common import access

    assert access().credentials is None
    run_command(["--access-key", "app-key1", "--secret-key", "app-secret", "version"])
    assert access().credentials is None and access().remoting is None
