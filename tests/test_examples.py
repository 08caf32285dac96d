"""The README's code and the examples run as documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


def test_readme_remoting_snippet_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    [snippet] = [
        block
        for block in re.findall(r"```python\n(.*?)```", readme, flags=re.S)
        if "RemotingServer" in block
    ]
    assert run_python(snippet).strip() == "17 no route for demo"


def test_remoting_echo_example_runs() -> None:
    out = run_python((ROOT / "examples" / "remoting_echo.py").read_text())
    assert "code 1 MSGPACK: response code 0 body b'hello hamq'" in out
    assert "code 2 JSON   : response code 0 body b'HELLO HAMQ'" in out
