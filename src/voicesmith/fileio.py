"""Files that are either completely written or not there at all.

Everything voicesmith writes for later (checkpoints, caches, reports, summaries) goes to a
temporary file beside the target and is renamed over it, so a crash or kill -9 mid-write never
leaves a half-written file behind. Standard library only: any layer may use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable


def temporary_path(path: Path) -> Path:
    """Where `path` is written before the rename; the writer's pid names it, so orphans can be found."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write(path: Path, write: Callable[[BinaryIO], None], durable: bool = True) -> Path:
    """Write through `write(handle)` to a temporary file, then rename it over `path`.

    `durable` also fsyncs the file and its folder, so the rename survives a power cut: worth it for
    checkpoints and reports, not for thousands of cache files that can be rebuilt.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        _fsync_dir(path.parent)
    return path


def atomic_write_json(path: Path, data: Any, indent: int | None = None, durable: bool = True) -> Path:
    text = json.dumps(data, indent=indent, ensure_ascii=False, default=str)
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")), durable)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); Windows has no directory handles to sync."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
