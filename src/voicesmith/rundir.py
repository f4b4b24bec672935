"""One owner per run directory, and starting over without mixing two runs.

`train` and `prepare` hold `RUN_DIR/.lock` while they run: an OS file lock (flock; msvcrt on Windows)
plus the holder's pid, host and command written inside it, so a second command is refused with who
holds the run. The operating system drops the lock of a process that dies, even under kill -9, so a
crashed holder's lock never sticks: the next command takes it over and says whose it was. Where the
file system has no locks (some network mounts), the pid and host decide instead.

`--resume never` moves the old run's outputs (checkpoints, logs, samples, summary) into
`RUN_DIR/previous-<timestamp>/`, so a later `--resume auto` can never jump back into the abandoned
run. The config, the data report and the feature cache stay: they describe the data, not the run.

Standard library, psutil and voicesmith.errors only: the data layer (`prepare`) uses it too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from voicesmith.errors import UserInputError

log = logging.getLogger("voicesmith")

LOCK_FILE = ".lock"
PREVIOUS_PREFIX = "previous-"
RUN_OUTPUTS = ("checkpoints", "logs", "samples", "summary.json", "report.html")  # what one run writes


class RunDirBusy(UserInputError):
    """Another process owns the run directory."""


@dataclass
class Claim:
    """What taking the run directory did: whose dead lock was taken over, where the old run went."""

    run_dir: Path
    taken_over: Optional[dict] = None
    moved_to: Optional[Path] = None

    @property
    def note(self) -> str:
        """One sentence per thing the user should know ('' when there is nothing)."""
        parts = []
        if self.taken_over:
            parts.append(f" The lock of {describe_holder(self.taken_over)} was taken over: that process is gone.")
        if self.moved_to:
            parts.append(f" The previous run (--resume never) was moved to {self.moved_to}; delete that folder "
                         f"when you no longer need it.")
        return "".join(parts)


def global_rank() -> int:
    """This process's rank under torchrun or SLURM (0 alone): only rank 0 takes the lock for all."""
    for name in ("RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


@contextmanager
def owned_run_dir(run_dir: Path, command: str, fresh: bool = False) -> Iterator[Claim]:
    """Hold RUN_DIR/.lock for `command`; `fresh` (--resume never) first moves the old run aside.

    Raises RunDirBusy, naming the holder's pid, host and command, when another process holds it.
    """
    run_dir = Path(run_dir)
    claim = Claim(run_dir)
    if global_rank() != 0:
        yield claim
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = _RunLock(run_dir / LOCK_FILE)
    claim.taken_over = lock.acquire(command)
    try:
        if fresh:
            claim.moved_to = move_previous_run(run_dir)
        yield claim
    finally:
        lock.release()


def describe_holder(holder: dict) -> str:
    """'pid 123 on host box (`voicesmith train`, since 2026-01-01 10:00:00)'."""
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("command"):
        text += f" (`voicesmith {holder['command']}`, since {holder.get('since', '?')})"
    return text


def move_previous_run(run_dir: Path) -> Optional[Path]:
    """Move what an earlier run wrote into RUN_DIR/previous-<timestamp>/; None when there was nothing."""
    present = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir / f"{PREVIOUS_PREFIX}{stamp}", 1
    while target.exists():
        n += 1
        target = run_dir / f"{PREVIOUS_PREFIX}{stamp}-{n}"
    target.mkdir()
    for path in present:
        os.replace(path, target / path.name)
    return target


class _RunLock:
    def __init__(self, path: Path):
        self.path = path
        self.fd: Optional[int] = None

    def acquire(self, command: str) -> Optional[dict]:
        """Take the lock; the previous holder's record when it died holding it (None otherwise)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock_file(fd)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise self._busy(holder) from None
        except OSError:  # no locks on this file system: the recorded pid and host decide
            holder = _read(fd)
            if holder and _alive_here(holder) is not False:
                os.close(fd)
                raise self._busy(holder) from None
        previous = _read(fd)
        self.fd = fd
        _write(fd, {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                    "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        return previous or None

    def release(self) -> None:
        if self.fd is None:
            return
        _write(self.fd, None)  # an empty lock file names nobody
        try:
            _unlock_file(self.fd)
        except OSError:
            pass  # a file system without locks: the emptied file is the release
        os.close(self.fd)
        self.fd = None

    def _busy(self, holder: Optional[dict]) -> RunDirBusy:
        who = describe_holder(holder) if holder else "another process (it is just starting)"
        return RunDirBusy(
            f"{self.path.parent} is in use by {who}. One process owns a run directory at a time: wait for it to "
            f"finish or stop it (Ctrl-C, or `kill {holder.get('pid', 'PID') if holder else 'PID'}` on its host), "
            f"or use another run directory. A holder that crashed releases the lock by itself.")


def _alive_here(holder: dict) -> Optional[bool]:
    """Whether the holder still runs; None when it runs on another host (which cannot be checked from here)."""
    import psutil

    if holder.get("host") != socket.gethostname():
        return None
    return isinstance(holder.get("pid"), int) and psutil.pid_exists(holder["pid"])


def _read(fd: int) -> Optional[dict]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (OSError, UnicodeDecodeError, ValueError):  # unreadable or half-written: the holder is unknown
        return None
    return holder if isinstance(holder, dict) else None


def _write(fd: int, holder: Optional[dict]) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    if holder is not None:
        os.write(fd, json.dumps(holder).encode("utf-8"))
    os.fsync(fd)


if os.name == "nt":
    import msvcrt

    def _lock_file(fd: int) -> None:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(str(exc)) from None

    def _unlock_file(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock_file(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock_file(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
