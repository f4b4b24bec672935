"""Inverse STFT written with a transposed convolution, so it exports to ONNX (which has no ISTFT).

The inverse real DFT of each frame, times the synthesis window, is one matrix `[2F, n_fft]`
(real and imaginary rows); applying it to every frame and overlap-adding the frames `hop` apart is
exactly `conv_transpose1d(spec, basis, stride=hop)`. The squared-window envelope is overlap-added
the same way (from a tensor of ones, so its length follows the input's) and divided out, as
`torch.istft` does.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ENVELOPE_FLOOR = 1e-11  # torch.istft's threshold for a vanishing window envelope


def inverse_dft_basis(n_fft: int, window: Tensor) -> Tensor:
    """`[2 * (n_fft // 2 + 1), 1, n_fft]`: rows map Re X_k and Im X_k to the windowed time frame (irfft)."""
    n_freq = n_fft // 2 + 1
    k = torch.arange(n_freq, dtype=torch.float64)[:, None]
    n = torch.arange(n_fft, dtype=torch.float64)[None, :]
    angle = 2 * math.pi * k * n / n_fft
    scale = torch.full((n_freq, 1), 2.0 / n_fft, dtype=torch.float64)
    scale[0] = 1.0 / n_fft  # DC and Nyquist appear once in the full spectrum
    if n_fft % 2 == 0:
        scale[-1] = 1.0 / n_fft
    basis = torch.cat([scale * torch.cos(angle), -scale * torch.sin(angle)]) * window.double()[None, :]
    return basis.float().unsqueeze(1)


class InverseStft(nn.Module):
    """Complex spectrogram (as real and imaginary parts `[B, n_fft // 2 + 1, T]`) -> audio `[B, samples]`.

    padding "center": like `torch.istft(center=True)`, `(T - 1) * hop` samples.
    padding "same": cuts `(n_fft - hop) / 2` samples at the start, `T * hop` samples: the inverse of
    voicesmith's own framing (`audio.stft`), so T mel frames give T * hop samples (Vocos's choice).
    """

    def __init__(self, n_fft: int, hop_length: int, win_length: int, padding: Literal["center", "same"] = "same"):
        super().__init__()
        if padding not in ("center", "same"):
            raise ValueError(f"padding must be 'center' or 'same', got {padding!r}")
        if win_length > n_fft:
            raise ValueError(f"win_length {win_length} is longer than n_fft {n_fft}")
        self.n_fft, self.hop_length, self.padding = n_fft, hop_length, padding
        window = torch.hann_window(win_length, dtype=torch.float64)
        left = (n_fft - win_length) // 2
        window = F.pad(window, (left, n_fft - win_length - left))  # centred in the frame, as torch.istft
        self.register_buffer("basis", inverse_dft_basis(n_fft, window), persistent=False)
        self.register_buffer("window_square", window.square().float().view(1, 1, n_fft), persistent=False)
        self.trim = n_fft // 2 if padding == "center" else (n_fft - hop_length) // 2  # audio.stft_padding

    def forward(self, real: Tensor, imag: Tensor) -> Tensor:
        spec = torch.cat([real, imag], dim=1)
        signal = F.conv_transpose1d(spec, self.basis, stride=self.hop_length)  # [B, 1, (T - 1) * hop + n_fft]
        ones = torch.ones_like(real[:1, :1])
        envelope = F.conv_transpose1d(ones, self.window_square, stride=self.hop_length)
        end = signal.shape[-1] - self.trim
        if self.padding == "same":
            end = self.trim + real.shape[-1] * self.hop_length
        signal = signal[..., self.trim:end]
        envelope = envelope[..., self.trim:end]
        return (signal / envelope.clamp(min=ENVELOPE_FLOOR)).squeeze(1)
