"""``hamq topic`` refusing what would lose data or names nothing, against a real
``hamq broker`` process: deleting a topic that does not exist, shrinking a topic's
queues that hold messages (unless ``--force``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.brokers import (
    embedded_broker_process,
)
from tests.support.processes import hamq_command

pytestmark = pytest.mark.slow


async def test_deleting_a_topic_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    async with embedded_broker_process(tmp_path) as (_, ns):
        missing = await hamq_command("topic", "delete", "NoSuchTopic", "-n", ns)
        assert missing.returncode == 2, missing.stdout
        assert b"deleted" not in missing.stdout
        assert b"topic NoSuchTopic does not exist" in missing.stderr, missing.stderr
        made = await hamq_command("topic", "create", "Real", "--queues", "2", "-n", ns)
        assert made.returncode == 0, made.stderr
        deleted = await hamq_command("topic", "delete", "Real", "-n", ns)
        assert deleted.returncode == 0, deleted.stderr
        assert b"topic Real deleted" in deleted.stdout


async def test_shrinking_queues_that_hold_messages_needs_force(tmp_path: Path) -> None:
    async with embedded_broker_process(tmp_path) as (_, ns):
        for topic in ("Full", "Empty"):
            made = await hamq_command("topic", "create", topic, "--queues", "4", "-n", ns)
            assert made.returncode == 0, made.stderr
        sent = await hamq_command("produce", "--topic", "Full", "--count", "20", "-n", ns)
        assert sent.returncode == 0, sent.stderr

        refused = await hamq_command("topic", "create", "Full", "--queues", "2", "-n", ns)
        assert refused.returncode == 2, refused.stdout
        text = refused.stderr.decode()
        assert "Full@broker-a:2 holds 5 message(s)" in text, text
        assert "Full@broker-a:3 holds 5 message(s)" in text, text
        assert "Full@broker-a:1" not in text and "--force" in text
        status = await hamq_command("topic", "status", "Full", "-n", ns)
        assert b"Full@broker-a:3" in status.stdout  # nothing changed

        # queues without messages may go; --force hides the others
        shrunk = await hamq_command("topic", "create", "Empty", "--queues", "2", "-n", ns)
        assert shrunk.returncode == 0, shrunk.stderr
        forced = await hamq_command("topic", "create", "Full", "--queues", "2", "--force", "-n", ns)
        assert forced.returncode == 0, forced.stderr
        status = await hamq_command("topic", "status", "Full", "-n", ns)
        assert b"Full@broker-a:1" in status.stdout and b"Full@broker-a:2" not in status.stdout
        grown = await hamq_command("topic", "create", "Full", "--queues", "4", "-n", ns)
        assert grown.returncode == 0, grown.stderr
