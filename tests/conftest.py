"""Shared test settings: hypothesis profiles and small helpers.

Set HYPOTHESIS_PROFILE=thorough for a longer search than the CI default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------- figures tests report
# Some tests measure something worth seeing (acked messages in flight at a kill, the
# loss window of an async master); they hand a line to ``report`` and it is printed
# at the end of the run.

_REPORTS: list[str] = []


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def add(line: str) -> None:
        _REPORTS.append(f"{request.node.name}: {line}")

    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORTS:
        terminalreporter.section("measured by tests")
        for line in _REPORTS:
            terminalreporter.write_line(line)
