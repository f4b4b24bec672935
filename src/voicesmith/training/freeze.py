"""A fine-tune's warm-up: imported parts held fixed while the parts that start fresh learn against them.

A voice published only as ONNX lacks what only training uses: the posterior encoder, the duration
predictor's posterior flows and the discriminator. Trained at once with the rest, their first random
outputs (alignments from a random posterior, duration targets, a KL term in the hundreds) pull the
imported text encoder, flow and decoder away from the voice. Measured on joe-medium
(benchmarks/RESULTS_finetune.md):
- without the hold, CER went from 0.11 to 0.85 in 30 steps;
- after 33 steps held, CER was 0.10;
- the hold postpones the loss rather than preventing it.

`train.freeze` names parameter prefixes held fixed for the first `train.freeze_steps` steps. Gradients
still flow through them into the fresh parts, so the posterior encoder learns what the imported decoder
and flow expect. `import-voice` sets both when its source lacks generator weights.
"""

from __future__ import annotations

import logging
from typing import Optional

from torch import nn

from voicesmith.config import TrainConfig
from voicesmith.errors import ConfigError

log = logging.getLogger(__name__)


class FrozenWarmup:
    """Holds the parameters under `prefixes` fixed while the step is below `steps` (decided each step from
    the step count, so a resumed run holds exactly as long as one that never stopped)."""

    def __init__(self, model: nn.Module, prefixes: list[str], steps: int):
        self.prefixes, self.steps = list(prefixes), steps
        self.parameters = held_parameters(model, prefixes)
        self.holding: Optional[bool] = None

    @classmethod
    def from_config(cls, model: nn.Module, train: TrainConfig) -> Optional["FrozenWarmup"]:
        return cls(model, train.freeze, train.freeze_steps) if train.freeze and train.freeze_steps else None

    def apply(self, step: int) -> None:
        """requires_grad for this step: off while warming up, on after (changed only when it changes)."""
        hold = step < self.steps
        if hold == self.holding:
            return
        for parameter in self.parameters:
            parameter.requires_grad_(not hold)
        self.holding = hold
        names = ", ".join(self.prefixes)
        if hold:
            log.info("Warm-up: %s stay fixed until step %d while the other parts learn against them "
                     "(train.freeze, train.freeze_steps).", names, self.steps)
        else:
            log.info("Step %d: the warm-up is over; %s train from here on.", step, names)


def held_parameters(model: nn.Module, prefixes: list[str]) -> list[nn.Parameter]:
    """The trainable parameters under each prefix (a name, or a name followed by '.'); a prefix that
    matches nothing is a ConfigError naming the model's top-level parts."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    held: dict[int, nn.Parameter] = {}  # by identity: overlapping prefixes hold a parameter once
    for prefix in prefixes:
        matched = [p for name, p in named if name == prefix or name.startswith(prefix + ".")]
        if not matched:
            parts = ", ".join(name for name, _ in model.named_children())
            raise ConfigError(f"train.freeze names {prefix!r}, which matches no trainable parameter of "
                              f"{type(model).__name__}. Its parts: {parts} (a prefix may go deeper, e.g. dp.flows.0).")
        held.update((id(p), p) for p in matched)
    return list(held.values())


def whole_parts(model: nn.Module, fresh: set[str], skip: tuple[str, ...] = ()) -> list[str]:
    """The largest sub-modules none of whose parameters are in `fresh`, skipping modules with nothing
    but fresh parameters and the top-level parts in `skip`: what an import filled completely."""
    def walk(module: nn.Module, prefix: str) -> list[str]:
        names = [prefix + name for name, _ in module.named_parameters()]
        if not names or all(name in fresh for name in names):
            return []
        if not any(name in fresh for name in names):
            return [prefix.rstrip(".")]
        return [part for child_name, child in module.named_children() for part in walk(child, f"{prefix}{child_name}.")]

    return [part for name, child in model.named_children() if name not in skip for part in walk(child, name + ".")]
