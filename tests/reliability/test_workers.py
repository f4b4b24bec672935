"""A crashed worker process loses no healthy item: only the item that killed it is marked."""

from __future__ import annotations

from crashing_work import crashed, square_or_die

from voicesmith.data.parallel import run_parallel


def test_a_worker_killed_by_one_item_marks_only_that_item():
    items = list(range(48))  # 12 chunks of 4 over 2 workers: the crash breaks the pool with chunks in flight
    results = run_parallel(square_or_die, items, 13, crashed, min_items=1, workers=2)
    assert results[13] == {"item": 13, "error": "the worker died"}
    assert [row for row in results if "error" in row] == [results[13]]
    assert [row["square"] for row in results if "square" in row] == [i * i for i in items if i != 13]
