"""Models: plain `nn.Module`s with their losses. They import `align`, `audio` and `text` at most.

Model modules are imported inside `build_model`, so that importing a light
neighbour (e.g. `voicesmith.models.griffin_lim`) does not build every model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from voicesmith.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from voicesmith.config import AudioConfig, ModelConfig


def build_model(model_cfg: "ModelConfig", n_symbols: int, n_mels: int, n_speakers: int = 1,
                config_path_resolver: Optional[Callable[[str], Path]] = None,
                audio_cfg: Optional["AudioConfig"] = None) -> "nn.Module":
    """The model of `model_cfg.type`. `config_path_resolver` turns a path from the config into a real one
    (pass `config.resolve`); files the model needs (a speaker encoder) are checked here, before training.
    Models that make or read waveforms (VITS, vocoders) need `audio_cfg` (pass `config.audio`)."""
    if model_cfg.type == "vits":
        from voicesmith.config import AudioConfig
        from voicesmith.models.vits import build_vits_model

        return build_vits_model(model_cfg, audio_cfg or AudioConfig(n_mels=n_mels), n_symbols, n_speakers)
    if model_cfg.type == "acoustic":
        from voicesmith.models.acoustic import build_acoustic_model

        return build_acoustic_model(model_cfg, n_symbols, n_mels, n_speakers, config_path_resolver)
    if model_cfg.type == "vocoder":
        from voicesmith.config import AudioConfig
        from voicesmith.models.vocoder import VocoderModel

        return VocoderModel(model_cfg, audio_cfg or AudioConfig(n_mels=n_mels))
    raise ConfigError(f"model.type={model_cfg.type!r} is not a model voicesmith knows; use acoustic, vits or vocoder.")
