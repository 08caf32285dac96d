"""The README's code and the examples run as documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=cwd,
    )
    return result.stdout


def readme_snippet(marker: str) -> str:
    readme = (ROOT / "README.md").read_text()
    [snippet] = [
        block for block in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if marker in block
    ]
    return snippet


def test_readme_remoting_snippet_runs() -> None:
    assert run_python(readme_snippet("RemotingServer")).strip() == "17 no route for demo"


def test_readme_store_snippet_runs(tmp_path: Path) -> None:
    assert run_python(readme_snippet("MessageStore"), cwd=tmp_path).strip() == "PUT_OK FOUND 1"
    assert (tmp_path / "data" / "store" / "checkpoint").exists()
    assert not (tmp_path / "data" / "store" / "abort").exists()  # stopped cleanly


def test_remoting_echo_example_runs() -> None:
    out = run_python((ROOT / "examples" / "remoting_echo.py").read_text())
    assert "code 1 MSGPACK: response code 0 body b'hello hamq'" in out
    assert "code 2 JSON   : response code 0 body b'HELLO HAMQ'" in out
