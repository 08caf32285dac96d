"""The ``hamq`` command."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_version_names_the_protocol_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert "RocketMQ remoting protocol version 479" in result.output


def test_bad_log_level_is_refused_by_name() -> None:
    result = runner.invoke(app, ["--log-level", "loud", "version"])
    assert result.exit_code == 2
    assert "'loud' is not a log level" in result.output


def test_bench_lists_the_remoting_benchmark() -> None:
    result = runner.invoke(app, ["bench", "--help"])
    assert result.exit_code == 0
    assert "remoting" in result.output
    assert "store" in result.output


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("hamq ")
