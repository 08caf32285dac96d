"""The README's code and the examples run as documented."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamq.client import PullStatus
from hamq.client.blocking import PullConsumer
from tests.support.processes import HAMQ, broker_process

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, cwd: Path | None = None, timeout_s: float = 60) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
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


@pytest.fixture(scope="module")
def broker_namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``hamq broker`` process (embedded nameserver on a free port) for the examples."""
    with broker_process(tmp_path_factory.mktemp("examples-broker")) as (_, namesrv):
        yield namesrv


def run_example(name: str, namesrv: str, *args: str, timeout_s: float = 90) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "HAMQ_NAMESRV": namesrv, "IDLE_EXIT_S": "2"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_producer_consumer_and_blocking_examples_run(broker_namesrv: str) -> None:
    sent = run_example("producer.py", broker_namesrv)
    assert sent.count(": SEND_OK to example-topic@broker-a:") == 10
    blocking = run_example("blocking_producer.py", broker_namesrv)
    assert blocking.count("SEND_OK") == 6
    consumed = run_example("consumer.py", broker_namesrv)
    assert consumed.count("got 'hello #") == 10
    assert consumed.count("got 'from plain code #") == 5
    assert "consumed 15 message(s)" in consumed  # 'even || odd': the untagged batch is skipped
    again = run_example("consumer.py", broker_namesrv)
    assert "consumed 0 message(s)" in again  # offsets were committed


@pytest.mark.slow
def test_ordered_example_keeps_each_order_in_order(broker_namesrv: str) -> None:
    out = run_example("ordered.py", broker_namesrv)
    assert out.count("(in order)") == 4 and "OUT OF ORDER" not in out


@pytest.mark.slow
def test_delayed_example_delivers_after_its_level(broker_namesrv: str) -> None:
    out = run_example("delayed.py", broker_namesrv)
    match = re.search(r"delivered at \S+, ([\d.]+)s after sending", out)
    assert match, out
    assert float(match.group(1)) >= 4.5


@pytest.mark.slow
def test_readme_client_snippet_runs(broker_namesrv: str) -> None:
    code = readme_snippet("PushConsumer").replace("127.0.0.1:9876", broker_namesrv)
    assert run_python(code).split("\n")[:2] == ["SEND_OK True", "[b'created']"]


@pytest.mark.slow
def test_spark_pipeline_example_totals_the_orders(broker_namesrv: str, tmp_path: Path) -> None:
    sent = run_example("produce_orders.py", broker_namesrv, "--count", "400", "--seed", "7")
    match = re.search(r"sent 400 orders to orders \((\d+) items", sent)
    assert match, sent
    out = run_example("spark_pipeline.py", broker_namesrv, timeout_s=300)
    done = re.search(r"wrote (\d+) per-minute totals to order-totals: 400 orders, (\d+) items", out)
    assert done, out
    assert done.group(2) == match.group(1)
    assert "|minute " in out and "|revenue|" in out  # the table was printed
    with PullConsumer("examples-check", broker_namesrv) as consumer:
        totals = []
        for queue in consumer.queues("order-totals"):
            result = consumer.pull(queue, 0, max_nums=32)
            while result.status is PullStatus.FOUND:
                totals += [json.loads(m.body) for m in result.messages]
                result = consumer.pull(queue, result.next_begin_offset, max_nums=32)
    assert len(totals) == int(done.group(1))
    assert sum(t["quantity"] for t in totals) == int(match.group(1))
    assert {m["product"] for m in totals} <= {"apple", "bread", "cheese", "dates", "eggs"}
    # the README's Spark snippet, on the same orders
    created = subprocess.run(
        [*HAMQ, "topic", "create", "orders-copy", "--namesrv", broker_namesrv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    code = (
        readme_snippet("HamqDataSource")
        .replace("127.0.0.1:9876", broker_namesrv)
        .replace("/tmp/orders-copy", str(tmp_path / "checkpoint"))
    )
    env_code = f"import os; os.environ['SPARK_LOCAL_IP'] = '127.0.0.1'\n{code}"
    shown = run_python(env_code, timeout_s=300)
    assert "queue_offset" in shown
    with PullConsumer("examples-check", broker_namesrv) as consumer:
        copies = []
        for queue in consumer.queues("orders-copy"):
            result = consumer.pull(queue, 0, max_nums=32)
            while result.status is PullStatus.FOUND:
                copies += [m.body for m in result.messages]
                result = consumer.pull(queue, result.next_begin_offset, max_nums=32)
        orders = sum(consumer.max_offset(q) for q in consumer.queues("orders"))
    assert len(copies) == orders  # the 400 orders, and what the README's client snippet sent
    assert len([c for c in copies if c.startswith(b'{"order_id"')]) == 400
