"""The benchmarks the README says to run by hand (not through ``hamq bench``) run and
print their figure: ``benchmarks/send_cpu.py`` and ``benchmarks/send_path.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_send_cpu_prints_the_cpu_per_send() -> None:
    out = run("benchmarks/send_cpu.py", "--sends", "600", "--group", "6")
    match = re.search(r"^600 sends in reads of 6: ([0-9.]+) us CPU a send$", out, re.M)
    assert match, out
    assert float(match.group(1)) > 0


def test_send_cpu_refuses_a_group_it_cannot_make() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/send_cpu.py", "--group", "65"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--group 65 is not in 1..64" in done.stderr


def test_send_path_lists_the_modules_a_send_crosses() -> None:
    out = run("benchmarks/send_path.py")
    assert re.search(r"^\d+ modules in 5 packages of hamq", out, re.M), out
    assert "  hamq/broker/processors/send.py" in out.splitlines()
