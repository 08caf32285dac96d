"""Metrics as a scraper sees them: raw HTTP to a metrics port, parsed with
prometheus-client's own parser, and checks against README.md's metrics table. On
AnyIO: for tests on any backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import ROOT


async def http(port: int, request: bytes, host: str = "127.0.0.1") -> bytes:
    """Send ``request`` raw; the whole answer (the server closes after one)."""
    with anyio.fail_after(10):
        async with await anyio.connect_tcp(host, port) as stream:
            await stream.send(request)
            answer = b""
            async for chunk in stream:
                answer += chunk
    return answer


def families(answer: bytes) -> dict[str, Metric]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


async def scrape(port: int) -> dict[str, Metric]:
    return families(await http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))


def value(metrics: dict[str, Metric], name: str, sample: str = "", **labels: str) -> float:
    """The value of ``name``'s sample (``name`` + ``sample`` suffix) with ``labels``."""
    family = metrics[name]
    wanted = family.name + sample
    for s in family.samples:
        if s.name == wanted and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {wanted} {labels} in {family.samples}")


def shows(
    port: int, name: str, holds: Callable[[float], bool], sample: str = "", **labels: str
) -> Callable[[], Awaitable[bool]]:
    """A condition for ``wait_for``: a scrape of ``port`` made then shows ``name``'s
    sample (with ``labels``) at a value that ``holds``."""

    async def check() -> bool:
        return holds(value(await scrape(port), name, sample, **labels))

    return check


def documented(metrics: dict[str, Metric]) -> list[str]:
    """The hamq_* families in ``metrics`` that README.md's metrics table does not name."""
    readme = (ROOT / "README.md").read_text()
    missing = []
    for family in metrics.values():
        if not family.name.startswith("hamq_"):
            continue
        shown = family.name + ("_total" if family.type == "counter" else "")
        if f"`{shown}`" not in readme and f"`{shown}{{" not in readme:
            missing.append(shown)
    return missing
