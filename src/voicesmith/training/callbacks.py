"""Small callbacks that make a run readable: the loss table, progress lines, epoch summaries, time budget."""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import lightning as L
from lightning.pytorch.callbacks import Callback, TQDMProgressBar

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
        log.info(f"Model: {type(model).__name__}, {parameters / 1e6:.2f} M trainable parameters; {data}.")
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
    """A progress line every `every_n_steps` steps (for logs without a progress bar) and an epoch summary."""

    def __init__(self, every_n_steps: int):
        self.every_n_steps = every_n_steps
        self.seen_step = 0
        self.skipped_at_start = 0
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, Any] = {}
        self.steps = 0
        self.started = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()  # a resumed run may start mid-epoch, without on_train_epoch_start
        self.seen_step = trainer.global_step
        self.skipped_at_start = pl_module.guard.total_skipped

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()
        self.skipped_at_start = pl_module.guard.total_skipped

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.seen_step:
            return  # the batch was skipped: no step, no losses
        self.seen_step = step
        self.steps += 1
        for name, value in pl_module.last_losses.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if trainer.is_global_zero and step % self.every_n_steps == 0:
            losses = {name: float(value) for name, value in pl_module.last_losses.items()}
            elapsed = time.perf_counter() - self.started
            log.info("step %d/%s  %s  %.2f steps/s", step, _limit(trainer.max_steps), format_losses(losses),
                     self.steps / elapsed if elapsed > 0 else 0.0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        means = {name: float(total) / self.steps for name, total in self.sums.items()} if self.steps else {}
        for name, value in means.items():
            pl_module.log(f"epoch/loss_{name}", value, on_step=False, on_epoch=True, sync_dist=True)
        if trainer.is_global_zero:
            skipped = pl_module.guard.total_skipped - self.skipped_at_start
            log.info("Epoch %d: %d steps in %.1f s (now at step %d), mean %s, %d batch(es) skipped.",
                     trainer.current_epoch, self.steps, time.perf_counter() - self.started, trainer.global_step,
                     format_losses(means) if means else "no losses", skipped)


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


class CompactProgressBar(TQDMProgressBar):
    """The progress bar shows `loss` and its raw components by their short names."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return {_short(name): value for name, value in metrics.items()}


def _short(name: str) -> str:
    return "loss" if name == "loss/total" else name.removeprefix("loss/")
