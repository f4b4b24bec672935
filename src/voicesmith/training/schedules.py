"""Learning-rate schedules as plain factor functions of the optimizer step (LambdaLR, stepped per update).

`train.warmup_steps` of linear warmup come first in every schedule (0 turns it off). The shape
comes from the config each time a run starts, while the step count comes from the checkpoint, so a
resumed run with a longer `--max-steps` stretches its cosine instead of restarting it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from voicesmith.config import TrainConfig


def warmup_factor(step: int, warmup_steps: int) -> float:
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def constant(step: int, warmup_steps: int) -> float:
    return warmup_factor(step, warmup_steps)


def exponential(step: int, warmup_steps: int, decay: float) -> float:
    """VITS: lr * decay^step (per optimizer step here, after the warmup)."""
    return warmup_factor(step, warmup_steps) * decay ** max(0, step - warmup_steps)


def _cosine(progress: float, min_ratio: float) -> float:
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup, then one cosine down to `min_ratio` at the last step of the run."""
    if step < warmup_steps:
        return warmup_factor(step, warmup_steps)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return _cosine(min(progress, 1.0), min_ratio)


def cosine_restarts(step: int, warmup_steps: int, first_period: int, min_ratio: float) -> float:
    """SGDR with doubling periods: first_period, 2*first_period, 4*first_period, ..."""
    if step < warmup_steps:
        return warmup_factor(step, warmup_steps)
    position, period = step - warmup_steps, first_period
    while position >= period:
        position -= period
        period *= 2
    return _cosine(position / period, min_ratio)


def lr_factor(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The factor function of `cfg.lr_schedule` (a partial: picklable, and LambdaLR saves no shape of it)."""
    if cfg.lr_schedule == "constant":
        return partial(constant, warmup_steps=cfg.warmup_steps)
    if cfg.lr_schedule == "exponential":
        return partial(exponential, warmup_steps=cfg.warmup_steps, decay=cfg.lr_decay)
    if cfg.lr_schedule == "cosine_restarts":
        return partial(cosine_restarts, warmup_steps=cfg.warmup_steps, first_period=cfg.restart_steps,
                       min_ratio=cfg.min_lr_ratio)
    if cfg.lr_schedule == "warmup_cosine":
        return partial(warmup_cosine, warmup_steps=cfg.warmup_steps, total_steps=total_steps,
                       min_ratio=cfg.min_lr_ratio)
    raise ValueError(f"unknown train.lr_schedule {cfg.lr_schedule!r}")


def build_scheduler(optimizer: Optimizer, cfg: TrainConfig, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lr_factor(cfg, total_steps))
