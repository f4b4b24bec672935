"""Files that are either completely written or not there at all.

Everything voicesmith writes for later (checkpoints, caches, reports, summaries) goes to a
temporary file beside the target and is renamed over it, so a crash or kill -9 mid-write never
leaves a half-written file behind. Standard library and voicesmith.errors only: any layer may use it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

from voicesmith.errors import DiskFull

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_TEMPORARY_MARK = ".tmp-"


def temporary_path(path: Path) -> Path:
    """Where `path` is written before the rename: `.NAME.tmp-<pid>-<random>`. The pid lets orphans of a
    killed writer be found; the random part keeps two threads (or two hosts) of one pid apart."""
    return path.with_name(f".{path.name}{_TEMPORARY_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def temporary_writer(tmp: Path) -> Optional[int]:
    """The pid that wrote temporary file `tmp` (see temporary_path); None for any other name."""
    _, _, tail = tmp.name.rpartition(_TEMPORARY_MARK)
    pid = tail.split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def atomic_write(path: Path, write: Callable[[BinaryIO], None], durable: bool = True, to_free: str = "") -> Path:
    """Write through `write(handle)` to a temporary file, then rename it over `path`.

    `durable` also fsyncs the file and its folder, so the rename survives a power cut: worth it for
    checkpoints and reports, not for thousands of cache files that can be rebuilt. A full disk raises
    DiskFull (the old `path` is untouched) with `to_free`, the caller's advice on what to delete.
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
    except (OSError, RuntimeError) as exc:  # torch.save turns a failed write into a RuntimeError on cleanup
        if _caused_by_full_disk(exc):
            raise DiskFull(disk_full_message(path, to_free)) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        _fsync_dir(path.parent)
    return path


def write_text(path: Path, text: str, durable: bool = True, to_free: str = "") -> Path:
    """`atomic_write` for UTF-8 text (configs, symbol tables, JSON)."""
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")), durable, to_free)


def _caused_by_full_disk(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT anywhere in the exception's chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_message(path: Path, to_free: str = "") -> str:
    """What a full disk stopped, how much room is left there, and what to delete."""
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.0f} MB free"
    except OSError:
        free = "free space unknown"
    advice = to_free or "delete files you no longer need on that disk"
    return (f"The disk is full: {path} could not be written ({free} on that disk); the previous version of the "
            f"file, if any, is untouched. Free space: {advice}. Then run the same command again.")


def atomic_write_json(path: Path, data: Any, indent: int | None = None, durable: bool = True,
                      to_free: str = "") -> Path:
    return write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str), durable, to_free)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); Windows has no directory handles to sync."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
