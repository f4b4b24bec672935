"""The training engine: one Lightning-based engine for every voicesmith model.

`train_command` is `voicesmith train`; `train(config)` is the same from Python and returns the
summary; `VoiceModule` is the LightningModule. Names are imported on first use, so importing a
light part (e.g. `voicesmith.training.guard`) does not import Lightning.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {"train": "run", "train_command": "run", "resolve_limits": "run", "VoiceModule": "module",
            "VoiceDataModule": "datamodule", "SkipGuard": "guard", "LossWatch": "guard"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'voicesmith.training' has no attribute {name!r}")
    return getattr(import_module(f"voicesmith.training.{_EXPORTS[name]}"), name)
