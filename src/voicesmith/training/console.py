"""What a person sees while a run trains: one live progress line, routine lines thinned out, and
warnings that stand out.

`logs/train.log` keeps every record. The screen (a `Console` handler on stderr) gets:
- on a terminal, one live line at the bottom (step, losses, steps/s, time left), redrawn in place;
- routine records (epoch summaries, samples written: `extra=ROUTINE`) at most once per
  `interval` seconds for each kind of line: 10 s on a terminal, 30 s in a log file or CI, so a
  six-minute run prints a screenful, not hundreds of epoch lines;
- progress records (`extra=PROGRESS`): thinned like routine ones where there is no live line,
  left out where the live line already shows them;
- every warning and error, marked so it stands out (in colour on a terminal) and printed above
  the live line, then recapped when the run ends so that no routine line scrolls one away.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
import threading
import time
from collections import Counter
from typing import Callable, Optional, TextIO

ROUTINE = {"console": "routine"}
PROGRESS = {"console": "progress"}
TERMINAL_INTERVAL_S = 10.0
LOG_INTERVAL_S = 30.0
REDRAW_INTERVAL_S = 0.25  # the live line is redrawn at most 4 times a second
RECAP_LINES = 8
_CLEAR_LINE = "\r\x1b[2K"
_COLOURS = {logging.WARNING: "\x1b[1;33m", logging.ERROR: "\x1b[1;31m"}
_RESET = "\x1b[0m"


class Console(logging.Handler):
    """A logging handler for the screen: thins routine records, keeps a live line, recaps warnings."""

    def __init__(self, stream: Optional[TextIO] = None, interactive: Optional[bool] = None,
                 interval: Optional[float] = None, clock: Callable[[], float] = time.monotonic,
                 log_path: str = "logs/train.log"):
        super().__init__(logging.INFO)
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self.interval = interval if interval is not None else (
            TERMINAL_INTERVAL_S if self.interactive else LOG_INTERVAL_S)
        self.clock = clock
        self.shown_at: dict[str, float] = {}  # kind of routine line -> when one was last shown
        self.thinned = 0  # routine and progress records kept off the screen (all are in train.log)
        self.warnings: Counter[str] = Counter()  # first line of each warning or error -> how often
        self.status = ""
        self.status_drawn_at = -math.inf
        self.log_path = log_path  # named in the recap: where every line is
        self.setFormatter(logging.Formatter("%(message)s"))
        self._lock_screen = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not self._shows(record):
                self.thinned += 1
                return
            text = self.format(record)
            if record.levelno >= logging.WARNING:
                self.warnings[text.splitlines()[0]] += 1
                text = self._mark(text, record.levelno)
            self._print(text)
        except Exception:  # noqa: BLE001 - logging's own contract: a handler reports, never raises
            self.handleError(record)

    def _shows(self, record: logging.LogRecord) -> bool:
        role = getattr(record, "console", None)
        if record.levelno >= logging.WARNING or role is None:
            return True
        if role == "progress" and self.interactive:
            return False  # the live line shows it
        kind = f"{record.name}:{record.msg}"  # the message template: one clock per kind of line
        now = self.clock()
        if now - self.shown_at.get(kind, -math.inf) < self.interval:
            return False
        self.shown_at[kind] = now
        return True

    def _mark(self, text: str, level: int) -> str:
        """'WARNING: ...' or 'ERROR: ...', in colour on a terminal."""
        key = logging.ERROR if level >= logging.ERROR else logging.WARNING
        label = logging.getLevelName(key)
        return f"{_COLOURS[key]}{label}:{_RESET} {text}" if self.interactive else f"{label}: {text}"

    def set_status(self, text: str) -> None:
        """The live line (terminal only), cut to the terminal's width so it never wraps."""
        if not self.interactive:
            return
        self.status = text
        now = self.clock()
        if now - self.status_drawn_at >= REDRAW_INTERVAL_S:
            self.status_drawn_at = now
            with self._lock_screen:
                self.stream.write(_CLEAR_LINE + self._fitted_status())
                self.stream.flush()

    def _fitted_status(self) -> str:
        return self.status[: max(20, shutil.get_terminal_size().columns - 1)]

    def clear_status(self) -> None:
        """Leaves the cursor at the start of an empty line, for whatever prints next."""
        if self.interactive and self.status:
            with self._lock_screen:
                self.stream.write(_CLEAR_LINE)
                self.stream.flush()
        self.status = ""

    def _print(self, text: str) -> None:
        with self._lock_screen:
            if self.interactive and self.status:
                self.stream.write(_CLEAR_LINE)
            self.stream.write(text + "\n")
            if self.interactive and self.status:
                self.stream.write(self._fitted_status())
            self.stream.flush()

    def recap(self) -> Optional[str]:
        """The run's warnings and errors once more, most frequent first; None when there were none."""
        if not self.warnings:
            return None
        total = sum(self.warnings.values())
        lines = [f"{total} warning(s) during this run (all of them in {self.log_path}):"]
        for message, count in self.warnings.most_common(RECAP_LINES):
            lines.append(f"  {count}x {message}" if count > 1 else f"  {message}")
        if len(self.warnings) > RECAP_LINES:
            lines.append(f"  ... and {len(self.warnings) - RECAP_LINES} other kind(s)")
        return "\n".join(lines)

    def close(self) -> None:
        """Clears the live line and prints the recap, once (logging closes every handler again at exit)."""
        self.clear_status()
        recap = self.recap()
        if recap:
            self._print(self._mark(recap, logging.WARNING) if self.interactive else recap)
        self.warnings.clear()
        super().close()


def find_console(logger_name: str = "voicesmith") -> Optional[Console]:
    """The Console that `run_logging` attached, if any (a program with its own logging has none)."""
    return next((handler for handler in logging.getLogger(logger_name).handlers if isinstance(handler, Console)),
                None)


def format_duration(seconds: float) -> str:
    """'45 s', '12 min 5 s', '3 h 20 min': what a person reads at a glance."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without isatty
        return False
