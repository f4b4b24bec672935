"""Run a per-item function over many items in spawned worker processes, in order, with progress.

`spawn` everywhere (the default on Windows and macOS, and safe with torch and espeak-ng loaded in
the parent): workers import the module of the function afresh, so nothing may happen at import time. Small jobs run in-process, where
starting workers (each imports numpy, torch and espeak-ng) would cost more than it saves.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Optional

_WORKER_STATE: Any = None  # the `state` of run_parallel, set once in each worker process


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _init_worker(state: Any) -> None:
    global _WORKER_STATE
    _WORKER_STATE = state
    import torch

    torch.set_num_threads(1)  # one process per core: threads inside each would fight over the cores


@contextmanager
def _single_thread():
    """Per-item work on small tensors: torch's thread pool costs far more than it gains (10x on a busy machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run_chunk(function: Callable[[Any, list], list], chunk: list) -> list:
    return function(_WORKER_STATE, chunk)


def run_parallel(function: Callable[[Any, list], list], items: list, state: Any, on_crash: Callable[[Any], Any],
                 min_items: int, workers: Optional[int] = None, progress: bool = False, desc: str = "") -> list:
    """`function(state, chunk)` over chunks of items, results in item order, in processes when worth it.

    `function` must be a module-level function (picklable) that returns one result per item and
    never raises for bad data. Workers start only for `min_items` items or more: each costs seconds
    of CPU to start (it imports torch and loads espeak-ng). When a worker process dies (e.g. a
    decoder crash), each item of its chunk gets `on_crash(item)` instead, so nothing goes missing.
    """
    workers = default_workers() if workers is None else max(1, workers)
    parallel = workers > 1 and len(items) >= min_items
    size = max(4, min(64, len(items) // (workers * 8))) if parallel else 32
    chunks = [items[start:start + size] for start in range(0, len(items), size)]
    bar = _progress(progress, desc, len(items))
    if parallel:
        results = _in_workers(function, chunks, state, on_crash, workers, bar)
    else:
        results = []
        with _single_thread():
            for chunk in chunks:
                results.append(function(state, chunk))
                bar.update(len(chunk))
    bar.close()
    return [row for rows in results for row in rows]


def _in_workers(function: Callable[[Any, list], list], chunks: list[list], state: Any,
                on_crash: Callable[[Any], Any], workers: int, bar) -> list[list]:
    results: list[list] = [[] for _ in chunks]
    with futures.ProcessPoolExecutor(min(workers, len(chunks)), mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker, initargs=(state,)) as pool:
        pending = {pool.submit(_run_chunk, function, chunk): index for index, chunk in enumerate(chunks)}
        for done in futures.as_completed(pending):
            index = pending[done]
            try:
                results[index] = done.result()
            except futures.process.BrokenProcessPool:
                results[index] = [on_crash(item) for item in chunks[index]]
            bar.update(len(chunks[index]))
    return results


class _NoProgress:
    def update(self, n: int) -> None:
        """Progress is off: nothing to show."""

    def close(self) -> None:
        """Progress is off: nothing to close."""


def _progress(enabled: bool, desc: str, total: int):
    if not enabled or not total:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(desc=desc, total=total, unit="item", file=sys.stderr, leave=False)
