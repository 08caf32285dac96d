"""The README's code and the examples run as documented."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hamq.client import Message, PullStatus
from hamq.client.blocking import Producer, PullConsumer
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
    # every store file is reserved whole: with the snippet's (the demo) sizes, ~73 MB for
    # one message, not the 1.4 GB of the production defaults
    reserved = sum(f.stat().st_size for f in (tmp_path / "data" / "store").rglob("*"))
    assert reserved < 100_000_000, reserved


def test_remoting_echo_example_runs() -> None:
    out = run_python((ROOT / "examples" / "remoting_echo.py").read_text())
    assert "code 1 MSGPACK: response code 0 body b'hello hamq'" in out
    assert "code 2 JSON   : response code 0 body b'HELLO HAMQ'" in out


@pytest.fixture(scope="module")
def broker_namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``hamq broker`` process (embedded nameserver on a free port) for the examples;
    it checks transactions back within seconds (make run's brokers: every 5 s)."""
    fast_checks = "transaction_timeout_s = 1.0\ntransaction_check_interval_s = 0.5"
    with broker_process(tmp_path_factory.mktemp("examples-broker"), fast_checks) as (_, namesrv):
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
def test_timer_example_delivers_at_its_time(broker_namesrv: str) -> None:
    out = run_example("timer.py", broker_namesrv)
    match = re.search(r"delivered at \S+, ([\d.]+)s after sending", out)
    assert match, out
    assert float(match.group(1)) >= 2.9


@pytest.mark.slow
def test_transaction_example_delivers_the_committed_and_the_checked_back_order(
    broker_namesrv: str,
) -> None:
    out = run_example("transaction.py", broker_namesrv)
    assert re.search(r"A-\w+: COMMIT_MESSAGE", out) and re.search(r"B-\w+: ROLLBACK_MESSAGE", out)
    assert re.search(r"C-\w+: UNKNOW", out), out
    assert re.search(r"broker asks about C-\w+: answered COMMIT_MESSAGE", out), out
    delivered = re.findall(r"delivered: order (\w)-", out)
    assert sorted(delivered) == ["A", "C"], out
    assert "not the failed one" in out


@pytest.mark.slow
def test_readme_transaction_snippet_runs(broker_namesrv: str) -> None:
    code = readme_snippet('TransactionProducer("order-service"')
    assert run_python(code.replace("127.0.0.1:9876", broker_namesrv)).strip() == (
        "SEND_OK COMMIT_MESSAGE"
    )


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["trio.run(main)", "asyncio.run(main())"])
def test_readme_client_snippet_runs(broker_namesrv: str, runner: str) -> None:
    """The same program on both loops: only the runner line differs."""
    code = readme_snippet("hash_selector").replace("127.0.0.1:9876", broker_namesrv)
    assert "\ntrio.run(main)" in code and "# asyncio.run(main())" in code
    code = code.replace("\ntrio.run(main)", f"\n{runner}")
    assert run_python(code).split("\n")[:2] == ["SEND_OK True", "[b'created']"]


@pytest.mark.slow
def test_readme_asyncio_snippet_runs(broker_namesrv: str) -> None:
    code = readme_snippet('PullConsumer("my-pullers"').replace("127.0.0.1:9876", broker_namesrv)
    assert "asyncio.run(main())" in code and "trio" not in code
    assert run_python(code).strip() == "b'created'"


@pytest.mark.slow
def test_asyncio_quickstart_example_creates_sends_pulls_and_pushes(broker_namesrv: str) -> None:
    """asyncio.run with the Trio examples' calls: an admin call, sends, pulls, and a push
    consumer whose async handler runs on the program's own loop."""
    out = run_example("asyncio_quickstart.py", broker_namesrv)
    assert re.search(r"^topic example-asyncio on 127\.0\.0\.1:\d+$", out, flags=re.M), out
    assert "cluster DefaultCluster: broker group(s) broker-a" in out
    assert out.count(": SEND_OK to example-asyncio@broker-a:") == 5
    assert len(re.findall(r"^pulled '\w+ hello #\d'", out, flags=re.M)) == 5
    assert out.count("(handled on the program's loop: True)") == 5
    assert "consumed 5 message(s) of this run" in out


T = TypeVar("T")
#: bounded waits of the web service tests: for its first line, an answer, its exit
SERVICE_READY_S = 30.0
HTTP_TIMEOUT_S = 15.0
SERVICE_STOP_S = 20.0


@contextmanager
def web_service(namesrv: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """examples/asyncio_service.py on a free port while the block runs; yields the
    process and its base URL. Killed by PID at the end unless the block stopped it."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "asyncio_service.py"), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HAMQ_NAMESRV": namesrv},
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(SERVICE_READY_S), "the service printed nothing in time"
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            raise AssertionError(f"the service exited: {proc.stderr.read() if proc.stderr else ''}")
        match = re.match(r"listening on (http://127\.0\.0\.1:\d+) ", line)
        assert match, f"not a listening line: {line!r}"
        yield proc, match.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def stop_with_sigint(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C for the service; what it printed after its first line, once it has exited
    cleanly (code 0, no traceback) within SERVICE_STOP_S."""
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=SERVICE_STOP_S)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return out


def http(url: str, body: bytes | None = None) -> tuple[int, Any]:
    """(status, the JSON answer) of a GET, or of a POST of ``body``."""
    try:
        with urllib.request.urlopen(url, data=body, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def recent(base: str, count: int) -> list[dict[str, Any]] | None:
    """GET /recent once it lists ``count`` messages."""
    messages: list[dict[str, Any]] = http(f"{base}/recent")[1]
    return messages if len(messages) == count else None


def poll(condition: Callable[[], T], timeout_s: float = 15.0, every_s: float = 0.1) -> T:
    """``condition()`` once it is true (bounded: an AssertionError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {found!r}"
        time.sleep(every_s)
    return found


@pytest.mark.slow
def test_asyncio_web_service_example_sends_per_request_and_consumes_in_its_loop(
    broker_namesrv: str,
) -> None:
    topic = f"web-{uuid.uuid4().hex[:8]}"
    args = ("--topic", topic, "--group", f"{topic}-group", "--recent", "5")
    with web_service(broker_namesrv, *args) as (proc, base):
        status, order = http(f"{base}/orders", b"two apples")
        assert status == 200 and order["status"] == "SEND_OK", order
        status, text = http(f"{base}/send?text=hello%20there")
        assert status == 200 and text["status"] == "SEND_OK", text
        for sent in (order, text):
            assert sent["queue"].startswith(f"{topic}@broker-a:") and sent["queue_offset"] >= 0
        assert order["msg_id"] != text["msg_id"]
        # mistakes are answered, and named
        assert http(f"{base}/send") == (400, {"error": "GET /send needs ?text=..."})
        assert http(f"{base}/orders", b"") == (
            400,
            {"error": f"the message body to topic {topic} is empty"},
        )
        assert http(f"{base}/nowhere")[0] == 404
        assert http(f"{base}/recent", b"x") == (405, {"error": "/recent takes GET"})
        # the consumer in the same loop got both, newest first
        consumed = poll(lambda: recent(base, 2))
        assert [m["msg_id"] for m in consumed] == [text["msg_id"], order["msg_id"]]
        assert [(m["body"], m["tags"], m["topic"]) for m in consumed] == [
            ("hello there", "text", topic),
            ("two apples", "order", topic),
        ]
        out = stop_with_sigint(proc)
    assert "stopped; consumed 2 message(s)" in out

    # sent while it is down: restarted, the group goes on from the offsets it committed
    with Producer("web-test-producer", broker_namesrv) as producer:
        while_down = producer.send(Message(topic, "sent while it was down"))
    with web_service(broker_namesrv, *args) as (proc, base):
        consumed = poll(lambda: http(f"{base}/recent")[1])  # not the two before again
        assert [(m["msg_id"], m["body"]) for m in consumed] == [
            (while_down.msg_id, "sent while it was down")
        ]
        assert "consumed 1 message(s)" in stop_with_sigint(proc)


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
