"""VocoderModel: a mel -> waveform GAN on random segments of the feature cache, for the training engine.

It satisfies the engine's GAN protocol (`training.module.GanModel`): `forward(batch)` runs the
generator on one random `vocoder_segment_frames`-frame window per item; `discriminator_losses`
and `generator_losses` score it against the same window of the recording. Losses (raw; the engine
weighs them with model.loss_weights): mel L1 (HiFi-GAN weighs it 45), adversarial and feature
matching (LSGAN), and the discriminator's own.

For the second stage of a two-stage run, `set_teacher(acoustic_model)` replaces each batch's mels
with the acoustic model's teacher-forced prediction (its MAS alignment of the recording), so the
vocoder learns to turn the acoustic model's mels, errors included, into the recorded audio. The
teacher is frozen and is no part of this module's state dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.audio import MEL_FLOOR, mel_spectrogram
from voicesmith.models.gan import (CombinedDiscriminator, MultiPeriodDiscriminator, MultiResolutionDiscriminator,
                                   discriminator_loss, feature_matching_loss, generator_adversarial_loss,
                                   split_real_fake)
from voicesmith.models.vocoder.generators import build_generator

if TYPE_CHECKING:
    from voicesmith.config import AudioConfig, ModelConfig


@dataclass
class VocoderOutput:
    """One generator pass: the window of the recording and the audio generated from its mel."""

    real: Tensor  # [B, 1, segment_frames * hop] recorded audio
    fake: Tensor  # [B, 1, segment_frames * hop] generated audio
    mel: Tensor  # [B, n_mels, segment_frames] the log-mel the generator was given


class VocoderModel(nn.Module):
    """`generator` (HiFi-GAN or Vocos-style) plus `discriminator` (multi-period, optionally + multi-resolution)."""

    is_gan = True

    def __init__(self, model_cfg: "ModelConfig", audio_cfg: "AudioConfig"):
        super().__init__()
        self.audio_cfg = audio_cfg
        self.segment_frames = model_cfg.vocoder_segment_frames
        self.generator = build_generator(model_cfg, audio_cfg)
        discriminator = MultiPeriodDiscriminator(model_cfg.discriminator_periods,
                                                 model_cfg.vocoder_discriminator_channel_divisor)
        if model_cfg.multi_resolution_discriminator:
            discriminator = CombinedDiscriminator(discriminator, MultiResolutionDiscriminator())
        self.discriminator = discriminator
        self._teacher: list[nn.Module] = []  # a list keeps the frozen acoustic model out of state_dict

    # --- the engine's GAN protocol ---------------------------------------------------------------------

    def loss_names(self) -> list[str]:
        return ["discriminator", "mel", "adversarial", "feature_matching"]

    def generator_parameters(self) -> Iterable[nn.Parameter]:
        return self.generator.parameters()

    def discriminator_parameters(self) -> Iterable[nn.Parameter]:
        return self.discriminator.parameters()

    def forward(self, batch: dict) -> VocoderOutput:
        mels = self.teacher_mels(batch) if self._teacher else batch["mels"]
        starts = self.segment_starts(batch["mel_lengths"])
        mel = cut_segments(mels, starts, self.segment_frames, MEL_FLOOR)
        hop = self.audio_cfg.hop_length
        real = cut_segments(batch["audio"].unsqueeze(1), starts * hop, self.segment_frames * hop, 0.0)
        return VocoderOutput(real=real, fake=self.generator(mel), mel=mel)

    def discriminator_losses(self, batch: dict, output: VocoderOutput) -> dict[str, Tensor]:
        scores, _ = self.discriminator(torch.cat([output.real, output.fake.detach()]))  # one pass for both
        real_scores, fake_scores = split_real_fake(scores, len(output.real))
        return {"discriminator": discriminator_loss(real_scores, fake_scores)}

    def generator_losses(self, batch: dict, output: VocoderOutput) -> dict[str, Tensor]:
        with torch.no_grad():
            _, real_features = self.discriminator(output.real)
        fake_scores, fake_features = self.discriminator(output.fake)
        return {"mel": self.mel_loss(output), "adversarial": generator_adversarial_loss(fake_scores),
                "feature_matching": feature_matching_loss(real_features, fake_features)}

    # --- pieces ----------------------------------------------------------------------------------------

    def mel_loss(self, output: VocoderOutput) -> Tensor:
        """L1 between the log-mels of the generated and the recorded window (fp32)."""
        with torch.autocast(output.fake.device.type, enabled=False):
            fake = mel_spectrogram(output.fake.squeeze(1).float(), self.audio_cfg)
            real = mel_spectrogram(output.real.squeeze(1).float(), self.audio_cfg)
        return F.l1_loss(fake, real)

    def segment_starts(self, mel_lengths: Tensor) -> Tensor:
        """A random window start per item while training; the first window in eval mode (stable val_loss)."""
        room = (mel_lengths - self.segment_frames).clamp(min=0)
        if not self.training:
            return torch.zeros_like(room)
        return (torch.rand(room.shape, device=room.device) * (room + 1).float()).long().clamp(max=room)

    @torch.no_grad()
    def vocode(self, mel: Tensor) -> Tensor:
        """Log-mel `[B, n_mels, T]` -> audio `[B, T * hop]`."""
        return self.generator(mel).squeeze(1)

    def set_teacher(self, acoustic_model: Optional[nn.Module]) -> None:
        """Train on `acoustic_model`'s teacher-forced mels (frozen, eval mode); None: on the cached mels."""
        self._teacher = []
        if acoustic_model is not None:
            acoustic_model.requires_grad_(False).eval()
            self._teacher.append(acoustic_model)

    def teacher_mels(self, batch: dict) -> Tensor:
        """The acoustic model's prediction of the batch's mels along its MAS alignment `[B, n_mels, T]`."""
        teacher = self._teacher[0]
        mels = batch["mels"]
        teacher.to(mels.device)
        with torch.no_grad():
            return teacher(batch).mel.to(mels.dtype)


def cut_segments(padded: Tensor, starts: Tensor, length: int, pad_value: float) -> Tensor:
    """`[B, C, T]` -> `[B, C, length]`: row b from `starts[b]`; past the end of the batch, `pad_value`."""
    short = length + int(starts.max()) - padded.shape[-1]
    if short > 0:
        padded = F.pad(padded, (0, short), value=pad_value)
    index = starts.view(-1, 1, 1) + torch.arange(length, device=padded.device).view(1, 1, -1)
    return padded.gather(-1, index.expand(-1, padded.shape[1], -1))
