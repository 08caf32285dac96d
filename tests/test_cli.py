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


def test_bench_produce_consume_takes_a_backend() -> None:
    shown = runner.invoke(app, ["bench", "produce-consume", "--help"], env={"COLUMNS": "200"})
    assert "trio|asyncio|uvloop" in shown.output
    bad = runner.invoke(
        app, ["bench", "produce-consume", "--backend", "curio"], env={"COLUMNS": "200"}
    )
    assert bad.exit_code == 2
    assert "'curio' is not one of 'trio', 'asyncio', 'uvloop'" in bad.output


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("hamq ")


def test_help_texts_read_as_written() -> None:
    """Help is shown as markdown: a summary that spans source lines reads as one
    sentence, and ``[ha]`` is text (rich markup took it for a style and dropped it)."""
    wide = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}

    def shown(*args: str) -> str:
        result = runner.invoke(app, [*args, "--help"], env=wide)
        assert result.exit_code == 0, result.output
        return result.output

    assert "never talk to each other (embedded controllers do, over Raft)." in shown()
    assert "sync_flush_timeout_s and [ha]" in shown("produce")
    assert "last message it consumed was stored (GET_CONSUME_STATS)" in shown("admin")
    assert ", acl, autoswitch) or a directory" in shown("cluster", "up")
