"""The README's RocketMQ 5 quick start, its python block run as written by RocketMQ's
official Python client (its own virtualenv: tests/support/rocketmq5.py) against a
``hamq broker`` process's gRPC endpoint (the block's 127.0.0.1:8081 moved to the
broker's free port, the one change)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from tests.support.processes import ROOT, broker_process, free_ports
from tests.support.rocketmq5 import ensure_venv

pytestmark = pytest.mark.slow

SECTION = "\n## RocketMQ 5 clients (gRPC)\n"


def quick_start() -> str:
    section = (ROOT / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "no python block in the README's RocketMQ 5 section"
    assert "127.0.0.1:8081" in block.group(1)
    return block.group(1)


async def test_the_readme_rocketmq5_quick_start(tmp_path: Path) -> None:
    python = await trio.to_thread.run_sync(ensure_venv)
    (port,) = free_ports(1)
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start().replace("127.0.0.1:8081", f"127.0.0.1:{port}"))
    with broker_process(tmp_path, f"grpc_port = {port}\n"):
        with trio.fail_after(120):
            done = await trio.run_process(
                [str(python), str(script)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
            )
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    assert re.search(r"^sent [0-9A-F]{34}$", output, re.M), output
    assert "received hello from RocketMQ 5 attempt 1\n" in output, output
