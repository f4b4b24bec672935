"""Discriminators of HiFi-GAN / VITS (multi-period + scale) and UnivNet (multi-resolution).

Every discriminator takes ONE batch of audio, `forward(audio: [B, 1, S])`, and returns
`(scores, features)`: one score tensor per sub-discriminator and, per sub-discriminator, the list
of its feature maps. A caller can then batch real and fake audio into one pass (see
`losses.split_real_fake`) or run the real audio alone under `no_grad`.
Names follow VITS / Piper (`discriminators.{i}.convs.{j}`, `conv_post`).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from voicesmith.audio import hann_window
from voicesmith.models.gan.generator import LRELU_SLOPE, get_padding

Scores = list[Tensor]
Features = list[list[Tensor]]


def _run_convs(convs: nn.ModuleList, conv_post: nn.Module, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Leaky-ReLU conv stack then a 1-channel head: (flattened score [B, N], feature maps).

    The activation runs in place on the conv's output, which no backward needs: one tensor per layer
    stays alive for the backward pass instead of two (the same gradients, bit for bit; about 170 MB
    less at the peak of a CPU training step, measured in benchmarks/RESULTS_vits.md).
    """
    features = []
    for conv in convs:
        x = F.leaky_relu(conv(x), LRELU_SLOPE, inplace=True)
        features.append(x)
    x = conv_post(x)
    features.append(x)
    return torch.flatten(x, 1, -1), features


def _narrow(channels: int, divisor: int) -> int:
    """A layer's width divided by `divisor` (1: the published size), at least 1."""
    return max(1, channels // divisor)


class DiscriminatorP(nn.Module):
    """Looks at every `period`-th sample: audio `[B, 1, S]` folded to `[B, 1, S / period, period]`.

    `channel_divisor` > 1 narrows every layer (a cheap discriminator for CPU runs; 1 is HiFi-GAN's).
    """

    def __init__(self, period: int, kernel_size: int = 5, stride: int = 3, channel_divisor: int = 1):
        super().__init__()
        self.period = period
        widths = (1, *(_narrow(c, channel_divisor) for c in (32, 128, 512, 1024, 1024)))
        padding = (get_padding(kernel_size, 1), 0)
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(c_in, c_out, (kernel_size, 1), (stride if i < 4 else 1, 1), padding=padding))
            for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:])))
        self.conv_post = weight_norm(nn.Conv2d(widths[-1], 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, audio: Tensor) -> tuple[Tensor, list[Tensor]]:
        batch, channels, length = audio.shape
        pad = (-length) % self.period
        if pad:
            audio = F.pad(audio, (0, pad), "reflect")
        x = audio.view(batch, channels, (length + pad) // self.period, self.period)
        return _run_convs(self.convs, self.conv_post, x)


class DiscriminatorS(nn.Module):
    """Grouped strided Conv1d stack on the raw waveform `[B, 1, S]` (MelGAN's scale discriminator).

    `channel_divisor` > 1 narrows every layer and its groups alike (1 is HiFi-GAN's size).
    """

    def __init__(self, channel_divisor: int = 1):
        super().__init__()
        layers = ((1, 16, 15, 1, 1), (16, 64, 41, 4, 4), (64, 256, 41, 4, 16), (256, 1024, 41, 4, 64),
                  (1024, 1024, 41, 4, 256), (1024, 1024, 5, 1, 1))
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv1d(c_in if c_in == 1 else _narrow(c_in, channel_divisor),
                                  _narrow(c_out, channel_divisor), kernel, stride,
                                  groups=_narrow(groups, channel_divisor), padding=get_padding(kernel)))
            for c_in, c_out, kernel, stride, groups in layers)
        self.conv_post = weight_norm(nn.Conv1d(_narrow(1024, channel_divisor), 1, 3, 1, padding=1))

    def forward(self, audio: Tensor) -> tuple[Tensor, list[Tensor]]:
        return _run_convs(self.convs, self.conv_post, audio)


class DiscriminatorR(nn.Module):
    """UnivNet's resolution discriminator on one STFT magnitude `[B, 1, n_fft // 2 + 1, frames]`."""

    def __init__(self, resolution: Sequence[int]):
        super().__init__()
        self.n_fft, self.hop_length, self.win_length = (int(v) for v in resolution)
        strides = (1, 2, 2, 2, 1)
        kernels = ((3, 9),) * 4 + ((3, 3),)
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(1 if i == 0 else 32, 32, kernel, stride=(1, stride),
                                  padding=(kernel[0] // 2, kernel[1] // 2)))
            for i, (kernel, stride) in enumerate(zip(kernels, strides)))
        self.conv_post = weight_norm(nn.Conv2d(32, 1, (3, 3), padding=(1, 1)))

    def spectrogram(self, audio: Tensor) -> Tensor:
        """`[B, 1, S]` -> magnitude `[B, 1, n_fft // 2 + 1, frames]`, always in fp32."""
        pad = (self.n_fft - self.hop_length) // 2
        with torch.autocast(audio.device.type, enabled=False):
            x = F.pad(audio.float(), (pad, pad), mode="reflect").squeeze(1)
            spec = torch.stft(x, self.n_fft, self.hop_length, self.win_length,
                              window=hann_window(self.win_length, x.device, x.dtype),
                              center=False, return_complex=True)
            return spec.abs().unsqueeze(1)

    def forward(self, audio: Tensor) -> tuple[Tensor, list[Tensor]]:
        return _run_convs(self.convs, self.conv_post, self.spectrogram(audio))


class _DiscriminatorSet(nn.Module):
    """Runs every sub-discriminator in `discriminators` on the same audio."""

    discriminators: nn.ModuleList

    def forward(self, audio: Tensor) -> tuple[Scores, Features]:
        scores, features = [], []
        for discriminator in self.discriminators:
            score, feature_maps = discriminator(audio)
            scores.append(score)
            features.append(feature_maps)
        return scores, features


class MultiPeriodDiscriminator(_DiscriminatorSet):
    """VITS's discriminator: index 0 is the scale discriminator, then one DiscriminatorP per period."""

    def __init__(self, periods: Sequence[int] = (2, 3, 5, 7, 11), channel_divisor: int = 1):
        super().__init__()
        self.discriminators = nn.ModuleList([DiscriminatorS(channel_divisor),
                                             *(DiscriminatorP(p, channel_divisor=channel_divisor) for p in periods)])


class MultiResolutionDiscriminator(_DiscriminatorSet):
    """UnivNet's discriminator: one DiscriminatorR per (n_fft, hop_length, win_length)."""

    def __init__(self, resolutions: Sequence[Sequence[int]] = ((1024, 120, 600), (2048, 240, 1200), (512, 50, 240))):
        super().__init__()
        self.discriminators = nn.ModuleList(DiscriminatorR(r) for r in resolutions)


class CombinedDiscriminator(_DiscriminatorSet):
    """Several discriminator sets as one: their sub-discriminators in order (the first keeps its indices,
    so a multi-period discriminator's weights load by the same names with or without a second set)."""

    def __init__(self, *sets: _DiscriminatorSet):
        super().__init__()
        self.discriminators = nn.ModuleList(sub for discriminator_set in sets for sub in discriminator_set.discriminators)
