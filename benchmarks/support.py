"""What the benchmarks share: process CPU time, percentiles, TOML for broker configs.

The benchmarks run as scripts (``python benchmarks/NAME.py``), so this is imported as a
sibling module (``import support``).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads (Linux /proc), else NaN."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def write_toml(path: Path, values: dict[str, Any]) -> Path:
    """Top-level keys and one level of tables ([store], [ha])."""
    lines = [f"{k} = {toml_value(v)}" for k, v in values.items() if not isinstance(v, dict)]
    for name, table in values.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    path.write_text("\n".join(lines) + "\n")
    return path
