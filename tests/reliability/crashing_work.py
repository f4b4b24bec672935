"""Per-item work for the worker-crash check, importable by spawned workers (no work at import time)."""

from __future__ import annotations

import os
import signal


def square_or_die(doomed: int, items: list[int]) -> list[dict]:
    """Each item's square; the `doomed` item kills its worker process outright, as a decoder segfault would."""
    rows = []
    for item in items:
        if item == doomed:
            os.kill(os.getpid(), signal.SIGKILL)
        rows.append({"item": item, "square": item * item})
    return rows


def crashed(item: int) -> dict:
    return {"item": item, "error": "the worker died"}
