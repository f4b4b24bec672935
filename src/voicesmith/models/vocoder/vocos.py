"""Vocos-style vocoder: a ConvNeXt backbone at frame rate and an inverse-STFT head.

All the work happens at the mel frame rate (T frames, not T * hop samples as in HiFi-GAN); the
head predicts log-magnitude and phase per STFT bin and `InverseStft` turns them into audio. That
makes it far cheaper to train and to run than HiFi-GAN, and the transposed-convolution iSTFT keeps
it exportable to ONNX.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicesmith.models.vocoder.istft import InverseStft

MAX_MAGNITUDE = 100.0  # Vocos clips exp(log-magnitude) here: a safe ceiling for audio in [-1, 1]


class ConvNeXtBlock(nn.Module):
    """Depthwise conv (k 7), LayerNorm, pointwise MLP with GELU, layer scale, residual. `[B, C, T]` -> same."""

    def __init__(self, dim: int, intermediate_dim: int, layer_scale: float):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))
        y = self.pwconv2(F.gelu(self.pwconv1(y))) * self.gamma
        return x + y.transpose(1, 2)


class VocosGenerator(nn.Module):
    """Log-mel `[B, n_mels, T]` -> audio `[B, 1, T * hop_length]`."""

    def __init__(self, n_mels: int, dim: int, intermediate_dim: int, num_layers: int, n_fft: int,
                 hop_length: int, win_length: int):
        super().__init__()
        self.hop_length = hop_length
        self.embed = nn.Conv1d(n_mels, dim, kernel_size=7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.convnext = nn.ModuleList(ConvNeXtBlock(dim, intermediate_dim, 1.0 / num_layers)
                                      for _ in range(num_layers))
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, n_fft + 2)  # log-magnitude and phase of n_fft // 2 + 1 bins
        self.istft = InverseStft(n_fft, hop_length, win_length, padding="same")
        self.apply(_init_weights)

    def forward(self, mel: Tensor) -> Tensor:
        x = self.norm(self.embed(mel).transpose(1, 2)).transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        x = self.head(self.final_layer_norm(x.transpose(1, 2))).transpose(1, 2)
        log_magnitude, phase = x.chunk(2, dim=1)
        magnitude = torch.exp(log_magnitude).clamp(max=MAX_MAGNITUDE)
        audio = self.istft(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return audio.unsqueeze(1)

    def remove_weight_norm(self) -> None:
        """Nothing to fold (no weight norm); here so every generator exports the same way."""


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Conv1d, nn.Linear)):
        nn.init.trunc_normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)
