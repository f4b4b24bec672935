"""Small callbacks that make a run readable: the loss table, the live progress line, epoch summaries, time budget."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Optional

import lightning as L
from lightning.pytorch.callbacks import Callback

from voicesmith.training.console import PROGRESS, ROUTINE, Console, find_console, format_duration

log = logging.getLogger(__name__)


class LossTable(Callback):
    """Prints what the run trains, on what, and the active loss weights, once: never a guess."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        model = pl_module.model
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        counts = trainer.datamodule.counts() if trainer.datamodule is not None else {}
        data = (f"{counts.get('items_train', 0)} training and {counts.get('items_val', 0)} validation items, "
                f"{counts.get('items_excluded', 0)} excluded (see data_report.json)") if counts else "data"
        parts = getattr(model, "parameter_counts", lambda: {})()  # GANs: generator and discriminator apart
        split = f" ({', '.join(f'{name} {n / 1e6:.2f} M' for name, n in parts.items())})" if parts else ""
        log.info(f"Model: {type(model).__name__} (preset {pl_module.config.preset}), {parameters / 1e6:.2f} M "
                 f"trainable parameters{split}; {data}.")
        log.info(format_loss_table(pl_module.weights))


def format_loss_table(weights: dict[str, float]) -> str:
    width = max([len(name) for name in weights] + [4])
    rows = [f"  {name:<{width}}  {weight:g}" + ("  (off)" if weight == 0 else "") for name, weight in weights.items()]
    return "\n".join(["Loss weights (model.loss_weights):", f"  {'loss':<{width}}  weight", *rows])


def format_losses(losses: dict[str, float]) -> str:
    total = losses.get("total")
    parts = ", ".join(f"{name} {value:.4g}" for name, value in losses.items() if name != "total")
    return f"loss {total:.4g} ({parts})" if total is not None else parts


class TrainingLog(Callback):
    """The run as it goes: a live line on a terminal (step, losses, steps/s, time left), a progress
    record every `every_n_steps` steps and an epoch summary; the console thins the last two on
    screen (see voicesmith.training.console), train.log keeps them all."""

    def __init__(self, every_n_steps: int, live_line: bool = True):
        self.every_n_steps = every_n_steps
        self.live_line = live_line  # logging.progress_bar: false keeps the screen to plain lines
        self.seen_step = 0
        self.skipped_at_start = 0
        self.rate = StepRate()
        self.console: Optional[Console] = None
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, Any] = {}
        self.steps = 0
        self.started = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()  # a resumed run may start mid-epoch, without on_train_epoch_start
        self.seen_step = trainer.global_step
        self.skipped_at_start = pl_module.guard.total_skipped
        self.rate = StepRate()
        self.console = find_console() if trainer.is_global_zero else None
        if self.console is not None:
            log.info("On screen: epoch summaries at most every %g s; every one of them is in logs/train.log.",
                     self.console.interval)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()
        self.skipped_at_start = pl_module.guard.total_skipped

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.seen_step:
            return  # the batch was skipped: no step, no losses
        self.seen_step = step
        self.steps += 1
        self.rate.add(step)
        for name, value in pl_module.last_losses.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if not trainer.is_global_zero:
            return
        losses = {name: float(value) for name, value in pl_module.last_losses.items()}
        if self.console is not None and self.live_line:
            self.console.set_status(self.progress(trainer, pl_module, losses))
            if 0 < trainer.max_steps <= step:
                self.console.clear_status()  # Lightning says "max_steps reached" on its own stream next
        if step % self.every_n_steps == 0:  # on screen where no live line shows it, thinned
            log.info("%s", self.progress(trainer, pl_module, losses), extra=PROGRESS if self.live_line else ROUTINE)

    def progress(self, trainer: L.Trainer, pl_module: L.LightningModule, losses: dict[str, float]) -> str:
        """'step 120/2000 | 4.20 steps/s | 7 min 28 s left | 2 batch(es) skipped | loss 1.5 (mel 0.3, ...)':
        the parts that matter most first, since a terminal's width cuts the line."""
        parts = [f"step {trainer.global_step}/{_limit(trainer.max_steps)}", f"{self.rate.per_second():.2f} steps/s"]
        left = time_left(trainer, self.rate.per_second())
        if left is not None:
            parts.append(f"{format_duration(left)} left")
        skipped = pl_module.guard.total_skipped
        if skipped:
            parts.append(f"{skipped} batch(es) skipped")
        return " | ".join([*parts, format_losses(losses)])

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        means = {name: float(total) / self.steps for name, total in self.sums.items()} if self.steps else {}
        for name, value in means.items():
            pl_module.log(f"epoch/loss_{name}", value, on_step=False, on_epoch=True, sync_dist=True)
        if trainer.is_global_zero:
            if self.console is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1:
                self.console.clear_status()  # Lightning says "max_epochs reached" on its own stream next
            skipped = pl_module.guard.total_skipped - self.skipped_at_start
            log.info("Epoch %d: %d steps in %.1f s (now at step %d), mean %s, %d batch(es) skipped.",
                     trainer.current_epoch, self.steps, time.perf_counter() - self.started, trainer.global_step,
                     format_losses(means) if means else "no losses", skipped, extra=ROUTINE)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.console is not None:
            self.console.clear_status()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)


class StepRate:
    """Steps per second over the last `window` seconds: follows a run that speeds up or slows down
    (validation, samples) without the first step's warm-up weighing on it forever."""

    def __init__(self, window: float = 60.0, clock=time.monotonic):
        self.window, self.clock = window, clock
        self.marks: deque[tuple[float, int]] = deque()

    def add(self, step: int) -> None:
        now = self.clock()
        self.marks.append((now, step))
        while len(self.marks) > 2 and now - self.marks[1][0] > self.window:
            self.marks.popleft()

    def per_second(self) -> float:
        if len(self.marks) < 2:
            return 0.0
        (start, first), (end, last) = self.marks[0], self.marks[-1]
        return (last - first) / (end - start) if end > start else 0.0


def time_left(trainer: L.Trainer, steps_per_second: float) -> Optional[float]:
    """Seconds until the run stops: by max_steps at this rate, or by its time budget, whichever is first."""
    estimates = []
    if trainer.max_steps and trainer.max_steps > 0 and steps_per_second > 0:
        estimates.append((trainer.max_steps - trainer.global_step) / steps_per_second)
    budget = next((callback for callback in trainer.callbacks if isinstance(callback, TimeBudget)), None)
    if budget is not None and budget.started is not None:
        estimates.append(budget.seconds - (time.monotonic() - budget.started))
    return max(0.0, min(estimates)) if estimates else None


def _limit(max_steps: int) -> str:
    return str(max_steps) if max_steps and max_steps > 0 else "?"


class TimeBudget(Callback):
    """Stops after `minutes` of training in this invocation (train.max_minutes), saving as at any end."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.started: Optional[float] = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        over = time.monotonic() - self.started >= self.seconds
        if trainer.strategy.reduce_boolean_decision(over, all=False):
            if not trainer.should_stop:
                log.info("Time budget of %.1f min (train.max_minutes) reached at step %d.",
                         self.seconds / 60, trainer.global_step)
            trainer.should_stop = True
