"""Run a per-item function over many items in spawned worker processes, in order, with progress.

`spawn` everywhere (the default on Windows and macOS, and safe with torch and espeak-ng loaded in
the parent): workers import the module of the function afresh, so nothing may happen at import time. Small jobs run in-process, where
starting workers (each imports numpy, torch and espeak-ng) would cost more than it saves.

A worker that dies (a decoder crash, the OOM killer) breaks the whole pool, and every unfinished
chunk fails with it. Only the item that killed its worker may be lost: chunks that had not started
run again in a new pool, and the items of chunks that had started are retried one at a time, so the
item whose own run kills a worker is found and reported (`on_crash`), and every other item gets its result.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Optional

_WORKER_STATE: Any = None  # the `state` of run_parallel, set once in each worker process
_STARTED: Any = None  # a queue on which each worker announces the chunk it starts


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _init_worker(state: Any, started: Any = None) -> None:
    global _WORKER_STATE, _STARTED
    _WORKER_STATE, _STARTED = state, started
    import torch

    torch.set_num_threads(1)  # one process per core: threads inside each would fight over the cores


@contextmanager
def single_thread():
    """Per-item work on small tensors: torch's thread pool costs far more than it gains (10x on a busy machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run_chunk(function: Callable[[Any, list], list], chunk: list, index: int = -1) -> list:
    if _STARTED is not None:
        _STARTED.put(index)
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
        with single_thread():
            for chunk in chunks:
                results.append(function(state, chunk))
                bar.update(len(chunk))
    bar.close()
    return [row for rows in results for row in rows]


def _in_workers(function: Callable[[Any, list], list], chunks: list[list], state: Any,
                on_crash: Callable[[Any], Any], workers: int, bar) -> list[list]:
    """Results per chunk; after a worker died, unstarted chunks run again and started ones are isolated."""
    results: list[Optional[list]] = [None] * len(chunks)
    context = multiprocessing.get_context("spawn")
    started_queue = context.SimpleQueue()
    broken: list[int] = []
    started: set[int] = set()
    with futures.ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context, initializer=_init_worker,
                                     initargs=(state, started_queue)) as pool:
        pending = {pool.submit(_run_chunk, function, chunk, index): index for index, chunk in enumerate(chunks)}
        for done in futures.as_completed(pending):
            index = pending[done]
            _drain(started_queue, started)  # as it goes: a full pipe would block the workers
            try:
                results[index] = done.result()
                bar.update(len(chunks[index]))
            except futures.process.BrokenProcessPool:
                broken.append(index)
    if broken:
        _drain(started_queue, started)
        unstarted = [index for index in broken if index not in started]
        for index, rows in zip(unstarted, _in_workers(function, [chunks[i] for i in unstarted], state, on_crash,
                                                      workers, bar) if unstarted else []):
            results[index] = rows
        for index in sorted(set(broken) - set(unstarted)):
            results[index] = _isolate(function, chunks[index], state, on_crash)
            bar.update(len(chunks[index]))
    return results


def _drain(queue: Any, into: set[int]) -> None:
    while not queue.empty():
        into.add(queue.get())


def _isolate(function: Callable[[Any, list], list], items: list, state: Any, on_crash: Callable[[Any], Any]) -> list:
    """Items that were in flight when a worker died, each alone in a one-worker pool: only an item whose
    own run kills the worker gets `on_crash(item)`."""
    results, pool = [], None
    try:
        for item in items:
            if pool is None:
                pool = futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                   initializer=_init_worker, initargs=(state,))
            try:
                results.extend(pool.submit(_run_chunk, function, [item]).result())
            except futures.process.BrokenProcessPool:
                results.append(on_crash(item))
                pool.shutdown()
                pool = None
    finally:
        if pool is not None:
            pool.shutdown()
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
