"""Never-silent batch skipping and loss watching, in plain Python (no Lightning, easy to test).

A batch may be skipped for a reason the engine can name (a non-finite loss, out of memory).
Each skip is counted by reason, logged with the item ids of the batch (the first few in full,
all of them in `logs/skipped_batches.jsonl`) and bounded: more than `max_fraction` of the last
`window` batches, or more than `max_consecutive` in a row, and the run stops with `RunFailed`
naming the top reasons and ids. Skipping is a safety valve, never a way to hide a broken run.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from voicesmith.errors import RunFailed

log = logging.getLogger(__name__)

PRINT_IN_FULL = 3  # the first skips are logged with every id and the whole detail
EXAMPLE_IDS = 5  # ids kept per reason for the failure message and summary.json
ADVICE = {
    "nonfinite_loss": "lower train.learning_rate or check the items named (text much longer than its audio?)",
    "nonfinite_gradient": "lower train.learning_rate or set train.grad_clip_norm",
    "out_of_memory": "lower train.batch_size or data.max_frames_per_batch",
    "fp16_overflow": "the grad scaler lowers the loss scale by itself; when it keeps happening use "
                     "hardware.precision=bf16-mixed (or 32) or lower train.learning_rate",
}


@dataclass
class SkippedBatch:
    step: int
    reason: str
    ids: list[str]
    detail: str


class SkipGuard:
    """Counts skipped (and recovered) batches and stops the run when they are too many."""

    def __init__(self, window: int = 200, max_fraction: float = 0.05, max_consecutive: int = 10,
                 log_path: Optional[Path] = None):
        self.window: deque[bool] = deque(maxlen=window)
        self.max_fraction = max_fraction
        self.max_consecutive = max_consecutive
        self.log_path = log_path
        self.skipped: Counter[str] = Counter()
        self.recovered: Counter[str] = Counter()
        self.example_ids: dict[str, list[str]] = {}
        self.consecutive = 0

    @classmethod
    def from_config(cls, train_cfg, log_path: Optional[Path] = None) -> "SkipGuard":
        return cls(train_cfg.skip_window, train_cfg.max_skipped_fraction, train_cfg.max_consecutive_skipped,
                   log_path)

    @property
    def limit(self) -> int:
        """Skips allowed within one window: `max_fraction` of the window's full length."""
        return math.floor(self.max_fraction * self.window.maxlen)

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def ok(self) -> None:
        self.window.append(False)
        self.consecutive = 0

    def skip(self, reason: str, ids: list[str], step: int, detail: str) -> None:
        """Count, log and bound one skipped batch; raises RunFailed when the bound is crossed."""
        record = SkippedBatch(step, reason, list(ids), detail)
        self.window.append(True)
        self.consecutive += 1
        self.skipped[reason] += 1
        self._remember(reason, ids)
        self._write(record, "skipped")
        if self.total_skipped <= PRINT_IN_FULL:
            log.warning("Skipped a batch at step %d (%s): %s\n  items: %s", step, reason, detail, ", ".join(ids))
        else:
            log.warning("Skipped a batch at step %d (%s; %d skipped so far): items %s", step, reason,
                        self.total_skipped, _short_ids(ids))
        self.check()

    def recover(self, reason: str, ids: list[str], step: int, detail: str) -> None:
        """A batch that failed once and then trained (e.g. at half size): counted and logged, not skipped."""
        self.recovered[reason] += 1
        self._remember(reason, ids)
        self._write(SkippedBatch(step, reason, list(ids), detail), "recovered")
        log.warning("Recovered a batch at step %d (%s): %s; items %s", step, reason, detail, _short_ids(ids))

    def check(self) -> None:
        in_window = sum(self.window)
        if self.consecutive > self.max_consecutive:
            raise RunFailed(f"Training stopped: {self.consecutive} batches in a row were skipped "
                            f"(train.max_consecutive_skipped={self.max_consecutive}). {self.describe()}")
        if in_window > self.limit:
            raise RunFailed(
                f"Training stopped: {in_window} of the last {len(self.window)} batches were skipped, more than "
                f"train.max_skipped_fraction={self.max_fraction:g} of train.skip_window={self.window.maxlen} "
                f"({self.limit} batches). {self.describe()}")

    def describe(self) -> str:
        """Top reasons with example ids and what to do, for the failure message."""
        parts = []
        for reason, count in self.skipped.most_common(3):
            ids = ", ".join(self.example_ids.get(reason, []))
            advice = ADVICE.get(reason)
            parts.append(f"{reason}: {count} (items {ids})" + (f"; {advice}" if advice else ""))
        where = f" Every skipped batch is listed in {self.log_path}." if self.log_path else ""
        return "Top reasons: " + "; ".join(parts) + "." + where

    def summary(self) -> dict[str, Any]:
        return {"batches_skipped": dict(self.skipped), "batches_recovered": dict(self.recovered),
                "skipped_example_ids": {reason: list(ids) for reason, ids in self.example_ids.items()}}

    def state_dict(self) -> dict[str, Any]:
        """Counts survive a resume (the window restarts: it measures the recent past)."""
        return {"skipped": dict(self.skipped), "recovered": dict(self.recovered),
                "example_ids": {k: list(v) for k, v in self.example_ids.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = Counter(state.get("skipped", {}))
        self.recovered = Counter(state.get("recovered", {}))
        self.example_ids = {k: list(v) for k, v in state.get("example_ids", {}).items()}

    def _remember(self, reason: str, ids: list[str]) -> None:
        examples = self.example_ids.setdefault(reason, [])
        examples.extend(i for i in ids[: EXAMPLE_IDS - len(examples)] if i not in examples)

    def _write(self, record: SkippedBatch, kind: str) -> None:
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"kind": kind, **asdict(record)}, ensure_ascii=False) + "\n")


def _short_ids(ids: list[str], n: int = EXAMPLE_IDS) -> str:
    return ", ".join(ids[:n]) + (f" (+{len(ids) - n} more)" if len(ids) > n else "")


class LossWatch:
    """Warns once when the total loss is exactly 0.0, or has not moved for `patience` steps:
    both usually mean a switched-off loss or a bug, and training on would waste the run."""

    def __init__(self, patience: int = 100, rel_tolerance: float = 1e-7):
        self.patience = patience
        self.rel_tolerance = rel_tolerance
        self.previous: Optional[float] = None
        self.unchanged = 0
        self.warned: set[str] = set()

    def update(self, total: float, step: int) -> Optional[str]:
        """The warning issued at this step, if any (each kind at most once per run)."""
        message = None
        if total == 0.0:
            message = self._warn_once("zero", f"The total loss is exactly 0.0 at step {step}: a loss is switched off "
                                              f"or the model sees its own target. Check model.loss_weights.")
        if self.previous is not None and abs(total - self.previous) <= self.rel_tolerance * max(abs(total), 1e-12):
            self.unchanged += 1
        else:
            self.unchanged = 0
        self.previous = total
        if self.unchanged >= self.patience:
            message = self._warn_once("stalled", f"The total loss has not changed for {self.unchanged} steps "
                                                 f"(step {step}, loss {total:.6g}): the weights are not learning. "
                                                 f"Check train.learning_rate and the optimizer.") or message
        return message

    def _warn_once(self, kind: str, message: str) -> Optional[str]:
        if kind in self.warned:
            return None
        self.warned.add(kind)
        log.warning(message)
        return message
