"""Recovery's dispatch passes (hamq/store/redispatch.py): the copies of damaged records
under torn/. The passes themselves run in every recovery test (test_store_damage.py,
test_store_promises.py, test_store_crash.py)."""

from __future__ import annotations

from pathlib import Path

from hamq.store.redispatch import copy_damaged, unused_path


def test_a_damaged_record_is_copied_once_and_never_over_another_copy(tmp_path: Path) -> None:
    first = copy_damaged(tmp_path, 4096, b"damaged bytes")
    assert first == tmp_path / f"{4096:020d}.damaged"
    assert first.read_bytes() == b"damaged bytes"
    # met again at the next start: the same copy, not a second one
    assert copy_damaged(tmp_path, 4096, b"damaged bytes") == first
    # other bytes at the same offset (another crash): a copy beside it
    second = copy_damaged(tmp_path, 4096, b"other bytes")
    assert second == tmp_path / f"{4096:020d}.damaged.1"
    assert (first.read_bytes(), second.read_bytes()) == (b"damaged bytes", b"other bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, second.name]


def test_an_unused_path_is_the_path_or_the_first_free_numbered_one(tmp_path: Path) -> None:
    path = tmp_path / "x.tail"
    assert unused_path(path) == path
    path.write_bytes(b"")
    (tmp_path / "x.tail.1").write_bytes(b"")
    assert unused_path(path) == tmp_path / "x.tail.2"
