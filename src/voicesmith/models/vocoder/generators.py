"""The generator of a vocoder config: HiFi-GAN (V1/V2/V3 are presets of its sizes) or Vocos-style."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from voicesmith.errors import ConfigError
from voicesmith.models.gan import HifiGanGenerator
from voicesmith.models.vocoder.vocos import VocosGenerator

if TYPE_CHECKING:
    from voicesmith.config import AudioConfig, ModelConfig


def build_generator(model_cfg: "ModelConfig", audio_cfg: "AudioConfig") -> nn.Module:
    """Log-mel `[B, n_mels, T]` -> audio `[B, 1, T * audio.hop_length]`, sized by `model_cfg`."""
    if model_cfg.vocoder_generator == "vocos":
        return VocosGenerator(audio_cfg.n_mels, model_cfg.vocoder_vocos_dim,
                              model_cfg.vocoder_vocos_intermediate_channels, model_cfg.vocoder_vocos_layers,
                              audio_cfg.n_fft, audio_cfg.hop_length, audio_cfg.win_length)
    generator = HifiGanGenerator(audio_cfg.n_mels, model_cfg.resblock, model_cfg.resblock_kernel_sizes,
                                 model_cfg.resblock_dilation_sizes, model_cfg.upsample_rates,
                                 model_cfg.upsample_initial_channel, model_cfg.upsample_kernel_sizes)
    if generator.hop_length != audio_cfg.hop_length:
        raise ConfigError(f"model.upsample_rates {list(model_cfg.upsample_rates)} multiply to "
                          f"{generator.hop_length}, but audio.hop_length is {audio_cfg.hop_length}; the product "
                          f"must equal the hop length (e.g. [8, 8, 4] for 256).")
    return generator
