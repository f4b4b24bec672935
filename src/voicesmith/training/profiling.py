"""Where the time and the memory go. Both callbacks are opt-in (logging.profile, logging.memory) and
nothing depends on them: a run without them trains the same.

StepProfiler splits each step into data wait (the loop blocked on the DataLoader), forward,
backward and optimizer (clipping, the update, the scheduler, logging), and reports samples/s,
frames/s and the padding fraction of the batches; it warns when the run is data-bound. On CUDA it
synchronises at each boundary, which costs a little speed for true numbers.

MemoryMonitor logs allocated / reserved / peak memory (CUDA, MPS; resident set size on CPU),
classifies the pressure and frees the allocator's cache only when pressure is high, since emptying
it costs time on every later allocation.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Optional

import lightning as L
import psutil
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import Profiler

from voicesmith.training.module import free_accelerator_memory

log = logging.getLogger(__name__)

DATA_BOUND_FRACTION = 0.2
PRESSURE_LEVELS = ("low", "moderate", "high", "critical")
PRESSURE_BOUNDS = (0.6, 0.8, 0.92)  # used share of the device's memory where each next level starts
FREE_AT = 2  # "high": free the allocator cache from here on


class DataWaitProfiler(Profiler):
    """Lightning's profiler hook, used for one thing: the time spent in `next()` on the train loader."""

    ACTION = "train_dataloader_next"

    def __init__(self) -> None:
        super().__init__()
        self.fetch_seconds = 0.0
        self._started: Optional[float] = None

    def start(self, action_name: str) -> None:
        if action_name.endswith(self.ACTION):
            self._started = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if self._started is not None and action_name.endswith(self.ACTION):
            self.fetch_seconds += time.perf_counter() - self._started
            self._started = None

    def summary(self) -> str:
        return ""


class StepProfiler(Callback):
    PHASES = ("data_wait", "forward", "backward", "optimizer", "step")

    def __init__(self, data_wait: DataWaitProfiler, every_n_steps: int = 10):
        self.data_wait, self.every_n_steps = data_wait, every_n_steps
        self.window: dict[str, float] = defaultdict(float)
        self.totals: dict[str, float] = defaultdict(float)
        self.fetch_mark = 0.0
        self.mark = self.step_start = 0.0
        self.sync = False
        self.warned_data_bound = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sync = pl_module.device.type == "cuda"
        self.fetch_mark = self.data_wait.fetch_seconds

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _phase(self, name: str) -> None:
        now = self._now()
        self.window[name] += now - self.mark
        self.mark = now

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: dict,
                             batch_idx: int) -> None:
        self.window["data_wait"] += self.data_wait.fetch_seconds - self.fetch_mark
        self.fetch_mark = self.data_wait.fetch_seconds
        self.mark = self.step_start = self._now()
        lengths = batch["mel_lengths"]
        self.window["samples"] += len(lengths)
        self.window["frames"] += float(lengths.sum())
        self.window["padded_frames"] += float(lengths.max()) * len(lengths)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._phase("forward")

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._phase("backward")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._phase("optimizer")
        self.window["step"] += self.mark - self.step_start
        self.window["batches"] += 1
        if self.window["batches"] >= self.every_n_steps:
            self._flush(trainer)

    def _flush(self, trainer: L.Trainer) -> None:
        metrics = rates(self.window)
        for key, value in self.window.items():
            self.totals[key] += value
        self.window = defaultdict(float)
        for logger in trainer.loggers:
            logger.log_metrics({f"perf/{key}": value for key, value in metrics.items()}, step=trainer.global_step)
        if metrics["data_wait_fraction"] > DATA_BOUND_FRACTION and not self.warned_data_bound:
            self.warned_data_bound = True
            log.warning("Training is data-bound: the loop waited for data %.0f%% of the time. Raise "
                        "data.num_workers, or move the feature cache to a faster disk.",
                        100 * metrics["data_wait_fraction"])

    def summary(self) -> dict[str, Any]:
        totals = defaultdict(float, self.totals)
        for key, value in self.window.items():
            totals[key] += value
        return {"perf": rates(totals)} if totals["batches"] else {}


def rates(window: dict[str, float]) -> dict[str, float]:
    """Per-step means of the phases, throughput, padding and the data-wait share of the loop."""
    batches = max(window["batches"], 1)
    step, wait = window["step"], window["data_wait"]
    busy = step + wait
    metrics = {f"{phase}_s": window[phase] / batches for phase in StepProfiler.PHASES}
    metrics.update(
        samples_per_s=window["samples"] / busy if busy else 0.0,
        frames_per_s=window["frames"] / busy if busy else 0.0,
        padding_fraction=1.0 - window["frames"] / window["padded_frames"] if window["padded_frames"] else 0.0,
        data_wait_fraction=wait / busy if busy else 0.0)
    return metrics


# --- memory ------------------------------------------------------------------------------------------

def memory_snapshot(device: torch.device) -> dict[str, float]:
    """Bytes allocated / reserved / peak and the used share of the device (system RAM on CPU)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
                "peak": torch.cuda.max_memory_allocated(device), "used_fraction": 1.0 - free / total}
    if device.type == "mps":
        reserved = torch.mps.driver_allocated_memory()
        return {"allocated": torch.mps.current_allocated_memory(), "reserved": reserved, "peak": reserved,
                "used_fraction": reserved / max(torch.mps.recommended_max_memory(), 1)}
    rss = psutil.Process().memory_info().rss  # the peak on CPU is the largest RSS the monitor has seen
    return {"allocated": rss, "reserved": rss, "peak": rss, "used_fraction": psutil.virtual_memory().percent / 100}


def pressure_level(used_fraction: float) -> int:
    return sum(used_fraction >= bound for bound in PRESSURE_BOUNDS)


class MemoryMonitor(Callback):
    def __init__(self, every_n_steps: int = 10):
        self.every_n_steps = every_n_steps
        self.seconds = 0.0
        self.checks = self.frees = 0
        self.worst = 0
        self.peak = 0.0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if batch_idx % self.every_n_steps:
            return
        started = time.perf_counter()
        snapshot = memory_snapshot(pl_module.device)
        level = pressure_level(snapshot["used_fraction"])
        if level >= FREE_AT:
            free_accelerator_memory()
            self.frees += 1
            if level > self.worst:
                log.warning("Memory pressure is %s (%.0f%% used) at step %d; freed the allocator cache. Lower "
                            "train.batch_size or data.max_frames_per_batch if it stays there.",
                            PRESSURE_LEVELS[level], 100 * snapshot["used_fraction"], trainer.global_step)
        self.worst = max(self.worst, level)
        self.peak = max(self.peak, snapshot["peak"])
        metrics = {f"memory/{key}_mb": snapshot[key] / 2**20 for key in ("allocated", "reserved", "peak")}
        metrics.update({"memory/used_fraction": snapshot["used_fraction"], "memory/pressure": level})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self.checks += 1
        self.seconds += time.perf_counter() - started

    def summary(self) -> dict[str, Any]:
        return {"memory": {"peak_mb": self.peak / 2**20, "worst_pressure": PRESSURE_LEVELS[self.worst],
                           "cache_frees": self.frees, "monitor_seconds": self.seconds, "checks": self.checks}}
